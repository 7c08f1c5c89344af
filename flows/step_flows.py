"""One Prefect flow per pipeline step, each usable alone (from a deployment, the UI or Python).

``tune`` is the workhorse of the fleet: each run drains pending shards of one hardware class on
the node it runs on, so N concurrent runs of the ``tune-<class>`` deployment (N Kubernetes Jobs
in that class's node pool) are N workers. Parameters are validated by Prefect against the type
hints and here against the database (unknown hardware class, non-positive budgets) with one clear
error before any work starts.

A flow body reads the database only through task runs (the steps', and the few reads here: its
hardware classes, the pending shards the ``tune`` flow polls, model names, current cost models), so
a blip of the database is retried like any step's — transient errors only, never bad input.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from prefect import flow, tags, task
from prefect.artifacts import create_table_artifact
from tunefleet.tasks import steps

from tunefleet.context import shared_context
from tunefleet.engine.loop import Lease, Refill, Stop, TuneLoop
from tunefleet.errors import ParameterError
from tunefleet.planning.spend import PLAN, TUNE, Spend
from tunefleet.vocab import hardware_tag


# -- the flow bodies' own database reads: task runs retried like every step's ---------------------
# The steps' policy (TRANSIENT_RETRIES retries with backoff, for a TransientError only); never
# cached: each read is asked again because its answer may have changed.
@task(name="hardware_targets", **steps.STEP)
def hardware_targets(hardware: list[str]) -> dict[str, dict[str, Any]]:
    """The target of each hardware class; an unknown class is a :class:`NotFoundError` naming the
    known ones (bad input: not retried)."""
    db = shared_context().db
    return {name: dict(db.hardware_class(name).target) for name in hardware}


@task(name="pending_shards", **steps.STEP)
def pending_shards(hardware: str) -> int:
    """How many shards of a hardware class are pending (the ``tune`` flow's poll while it waits)."""
    db = shared_context().db
    return len(db.pending_shards(db.hardware_class(hardware).id))


@task(name="model_names", **steps.STEP)
def model_names(model_ids: list[int]) -> dict[int, str]:
    """The stored models' names, by id."""
    db = shared_context().db
    return {model_id: db.model(model_id).name for model_id in model_ids}


@task(name="current_cost_models", **steps.STEP)
def current_cost_models(hardware: list[str]) -> dict[str, bool]:
    """Whether each hardware class has a current (promoted) cost model."""
    db = shared_context().db
    return {name: db.current_cost_model(db.hardware_class(name).id) is not None for name in hardware}


def check_hardware(hardware: list[str]) -> dict[str, dict[str, Any]]:
    """Every name must be a hardware class in the database (seeded from configuration); returns
    their targets."""
    if not hardware:
        raise ParameterError("invalid parameter hardware: give at least one hardware class")
    return hardware_targets(hardware)  # NotFoundError lists the known classes


def check_positive(**values: float | None) -> None:
    for name, value in values.items():
        if value is not None and value <= 0:
            raise ParameterError(f"invalid parameter {name}: {value} (must be positive)")


def tune_options(**parameters: Any) -> dict[str, Any]:
    """Tuning-knob parameters (named like :class:`tunefleet.config.TuneKnobs` fields) checked once
    against the settings, here in the flow and before any work; the given ones, to pass to
    ``tune_shard`` tasks."""
    given = {name: value for name, value in parameters.items() if value is not None}
    shared_context().options(**given)  # raises ParameterError naming the first bad parameter
    return given


def check_verify(verify: int) -> None:
    if verify < 0:
        raise ParameterError(f"invalid parameter verify: {verify} (must be >= 0)")


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes) made of ``parts``."""
    import re

    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")


@flow(name="ingest")
def ingest(models: list[str], batch_size: int = 1, image_size: int | None = None,
           seq_len: int | None = None) -> list[dict[str, Any]]:
    """Store models (zoo names, ONNX/.pt2 paths, s3:// URIs) content-addressed; returns their ids."""
    if not models:
        raise ParameterError("invalid parameter models: give at least one model")
    check_positive(batch_size=batch_size, image_size=image_size, seq_len=seq_len)
    return [steps.ingest(m, batch_size=batch_size, image_size=image_size, seq_len=seq_len) for m in models]


@flow(name="extract")
def extract(model_ids: list[int], hardware: list[str]) -> list[dict[str, Any]]:
    """Extract the workloads of stored models for hardware classes."""
    check_hardware(hardware)
    return [steps.extract(m, hw) for hw in hardware for m in model_ids]


@flow(name="plan")
def plan(hardware: list[str], trials: int | None = 8, model_ids: list[int] | None = None,
         shard_trials: int = 64, budget: str | None = None) -> list[dict[str, Any]]:
    """Cut the untuned shortfall into shards (trials = target trials per workload), or split a
    trial ``budget`` (e.g. ``"2000"``) over the models' workloads at once (then ``trials`` is None)."""
    check_hardware(hardware)
    spend = Spend.request(PLAN, budget, trials=trials, model_ids=model_ids, name="parameter budget")
    check_positive(trials=trials, shard_trials=shard_trials)
    return [steps.plan(hw, spend.trials, model_ids=model_ids, shard_trials=shard_trials, budget=spend.budget)
            for hw in hardware]


@flow(name="tune")
def tune(hardware: str = "x86", max_shards: int | None = None, lease_s: float | None = None,
         trials_per_iter: int | None = None, seed: int | None = None, budget: str | None = None,
         model_ids: list[int] | None = None, started_at: float | None = None,
         reserve_builds: int = 0) -> dict[str, Any]:
    """Lease and tune pending shards of one hardware class on this node until none is left.

    ``lease_s``, ``trials_per_iter`` and ``seed`` override the settings of the same names.

    With ``budget`` and ``model_ids``, the models' budget (``"2000"`` trials or a wall time such
    as ``"15m"``) is spent in rounds: when no shard is pending, the next round is planned
    (:func:`tunefleet.planning.rounds.plan_round`), until the budget is spent, its deadline passes or no
    workload can use more trials. With a duration ``budget`` alone, tuning stops at its deadline.
    The clock starts at ``started_at`` (seconds since the epoch; default now), and the deadline
    keeps time for ``reserve_builds`` builds of the models after tuning (the pipeline's build step).

    The steps are a :class:`~tunefleet.engine.loop.TuneLoop`'s, as in a CLI worker: every lease
    is a ``tune_shard`` task run, every round planned a ``plan_round`` one, and the end an
    ``end_rounds`` one; pending shards that cannot be leased yet (their workload searched by
    another worker) are waited for. A shard whose worker died is taken over once its lease
    (``lease_s``) expires and resumes from what was committed; a shard leased by another live
    worker is left alone.
    """
    from tunefleet.tvm import without_torch  # noqa: F401  # before anything imports TVM: tuning needs no torch

    check_hardware([hardware])
    check_positive(max_shards=max_shards)
    options = tune_options(lease_s=lease_s, trials_per_iter=trials_per_iter, seed=seed)
    spend = Spend.request(TUNE, budget, model_ids=model_ids, started_at=started_at, name="parameter budget")
    ctx = shared_context()
    knobs = ctx.options(**options)
    rounds, deadline = spend.tuning(hardware, batch=knobs.trials_per_iter, energy_aware=knobs.energy_aware,
                                    reserve_builds=reserve_builds, confirm_top=ctx.settings.confirm_top)
    loop = TuneLoop(hardware, max_shards=max_shards, rounds=rounds, deadline=deadline,
                    pending=lambda: pending_shards(hardware))
    with tags(hardware_tag(hardware)):
        while not isinstance(step := loop.next_step(), Stop):
            if isinstance(step, Lease):
                loop.leased(steps.tune_shard(hardware, options, deadline_at=step.deadline_at,
                                             allocated=step.allocated))
            elif isinstance(step, Refill):
                loop.refilled(*steps.plan_round(step.rounds.state))
            else:
                time.sleep(step.seconds)
        summary = loop.finish(budget=steps.end_rounds(rounds.state) if rounds is not None else None)
    shards = [asdict(r) for r in loop.results]
    if shards:
        create_table_artifact(
            key=artifact_key("tune", hardware),
            table=[{"shard": r["shard_id"], "state": r["state"], "measured": r["measured"], "errors": r["errors"],
                    "best (ms)": None if r["best_s"] is None else round(r["best_s"] * 1e3, 4),
                    "seconds": round(r["seconds"], 1)} for r in shards],
            description=f"Shards tuned on {hardware}: {summary.shards_done} done, "
                        f"{summary.shards_failed} failed, {summary.measured} candidates measured",
        )
    return {**summary.as_dict(), "shards": shards}


@flow(name="account")
def account(model_ids: list[int] | None = None, hardware: list[str] | None = None) -> list[dict[str, Any]]:
    """Energy (labelled with its source), money and wasted share per model x hardware class."""
    if hardware:
        check_hardware(hardware)
    rows = steps.account(model_ids, hardware)
    if rows:
        create_table_artifact(
            key=artifact_key("energy"),
            table=[{"model": r["model"], "hardware": r["hardware"], "joules": round(r["joules"], 1),
                    "kWh": round(r["kwh"], 6), "money": round(r["cost"], 4),
                    "wasted %": None if r["wasted_pct"] is None else round(r["wasted_pct"], 1),
                    "trials": r["trials"], "source": r["sources"]} for r in rows],
            description="Tuning energy and cost per model and hardware class (wasted = candidates that did not "
                        "beat the best so far)",
        )
    return rows


@flow(name="export")
def export(hardware: str | None = None) -> dict[str, Any] | None:
    """Export new measurements (with program features and labels) as the next dataset version."""
    if hardware:
        check_hardware([hardware])
    return steps.export(hardware)


@flow(name="retrain")
def retrain(hardware: list[str] = ["x86"], objective: str = "reg:squarederror",  # noqa: B006
            seed: int = 0, zero_shot_model_ids: list[int] | None = None, verify: int = 0) -> list[dict[str, Any]]:
    """Export new measurements, then retrain each class's cost model (promoted only if better).

    With ``zero_shot_model_ids``, those models are then built for each class with the current
    model's zero-shot predictions for every workload never measured there (``verify``: measure
    that many proposals in all, the heaviest workloads' best-scored first; 0: pure prediction);
    the build reports are in each result's ``zero_shot_builds``.
    """
    check_hardware(hardware)
    check_verify(verify)
    steps.export()
    results = [steps.retrain(hw, objective=objective, seed=seed) for hw in hardware]
    current = current_cost_models(hardware) if zero_shot_model_ids else {}
    for r in results:
        r["zero_shot_builds"] = []
        if zero_shot_model_ids and not current[r["hardware"]]:
            r["zero_shot_skipped"] = f"no current cost model for {r['hardware']}: {r['reason']}"
            continue
        r["zero_shot_builds"] = [steps.build(m, r["hardware"], zero_shot=True, verify=verify)
                                 for m in zero_shot_model_ids or []]
    create_table_artifact(
        key=artifact_key("retrain"),
        table=[{"hardware": r["hardware"], "version": r["version"], "promoted": r["promoted"],
                "pairwise acc": (r["heldout"] or {}).get("pairwise_accuracy"), "peak@1": (r["heldout"] or {}).get("peak@1"),
                "reason": r["reason"]} for r in results],
        description="Cost models retrained on the held-out workloads' split",
    )
    return results


@flow(name="build")
def build(model_ids: list[int], hardware: list[str], output_dir: str | None = None, zero_shot: bool = False,
          verify: int = 0) -> list[dict[str, Any]]:
    """Compile models with the best stored schedules and compare latency against the untuned build.

    With ``output_dir``, each tuned library is written there as ``<model>-<class>.so``. With
    ``zero_shot``, unmeasured workloads use the current cost model's predictions (``verify``:
    measure that many proposals in all, the heaviest workloads' first; 0: pure prediction).
    """
    import os

    check_hardware(hardware)
    check_verify(verify)
    names = model_names(model_ids) if output_dir else {}
    reports = []
    for hw in hardware:
        for m in model_ids:
            out = os.path.join(output_dir, f"{artifact_key(names[m], hw)}.so") if output_dir else None
            reports.append(steps.build(m, hw, output=out, zero_shot=zero_shot, verify=verify))
    return reports
