"""The ``pipeline`` flow: ingest → extract → plan → tune → account → build for models × hardware classes.

Run in-process (``tunefleet run`` uses Prefect's ephemeral mode), from the ``pipeline``
deployment, or from the UI. Tuning happens either here (``tune_on="here"``: this process tunes
each class, so only classes this machine can measure) or through the ``tune-<class>``
deployments (``tune_on="deployments"``: the runs land in each class's work pool, i.e. its node
pool, and this flow waits for them). Every step is idempotent: running the pipeline twice
ingests, extracts and tunes nothing twice with a flat ``trials`` target; a ``budget`` is spent
again each run (it is spending, not a target). ``account`` follows ``tune``; the ``export`` and
``retrain`` steps slot in after it as further subflows.

With a ``budget`` (the default, ``TUNEFLEET_BUDGET``), there is no plan step of its own: the
tune step plans the models' budget in rounds as it tunes (:func:`tunefleet.planning.rounds.plan_round`),
and a duration is the wall time of the whole flow, from ``started_at`` to the end of the build.
"""

from __future__ import annotations

import time
from contextlib import AbstractContextManager
from typing import Any, Literal

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from tunefleet.context import shared_context
from tunefleet.errors import NotSupportedError, ParameterError, TunefleetError
from tunefleet.flows import step_flows
from tunefleet.flows.step_flows import artifact_key, check_hardware, check_positive, tune_options
from tunefleet.models.kept import keeping_models
from tunefleet.planning.spend import RUN, Spend


def tune_through_deployments(hardware: list[str], parameters: dict[str, Any],
                             timeout_s: float | None = None) -> dict[str, dict[str, Any]]:
    """Start the ``tune-<class>`` deployment of every class at once and wait for all of them.

    Their results stay on the workers that ran them; what comes back is each run's name and
    final state (the measurements themselves are in the database).
    """
    from prefect.deployments import run_deployment
    from prefect.flow_runs import wait_for_flow_run
    from prefect.utilities.asyncutils import run_coro_as_sync

    runs = {hw: run_deployment(f"tune/tune-{hw}", parameters={"hardware": hw, **parameters}, timeout=0,
                               as_subflow=True)
            for hw in hardware}
    out: dict[str, dict[str, Any]] = {}
    for hw, run in runs.items():
        final = run_coro_as_sync(wait_for_flow_run(run.id, timeout=timeout_s, log_states=True))
        state = final.state
        if state is None or not state.is_completed():
            raise TunefleetError(f"tune run {final.name} on {hw} ended {state.name if state else 'without a state'}")
        out[hw] = {"hardware": hw, "flow_run": final.name, "state": state.name}
    return out


@flow(name="pipeline")
def pipeline(
    models: list[str] = ["resnet18"],  # noqa: B006 - Prefect parameters are copied per run
    hardware: list[str] = ["x86"],  # noqa: B006
    trials: int | None = None,
    shard_trials: int = 64,
    batch_size: int = 1,
    image_size: int | None = None,
    seq_len: int | None = None,
    tune_on: Literal["here", "deployments"] = "here",
    lease_s: float | None = None,
    trials_per_iter: int | None = None,
    seed: int | None = None,
    build: bool = True,
    output_dir: str | None = None,
    budget: str | None = None,
    started_at: float | None = None,
) -> dict[str, Any]:
    """Tune the workloads of ``models`` on each of ``hardware``, then build.

    ``budget``: trials over each model's workloads (``"2000"``) or the wall time of this whole flow
    (``"15m"``, ``"90s"``, ``"1h30m"``), spent in rounds by the allocator; default
    ``TUNEFLEET_BUDGET`` unless ``trials`` (a flat target per workload, as before) is given — one or
    the other. The wall-time clock starts at ``started_at`` (seconds since the epoch; ``tunefleet
    run`` passes its own start) or when the flow starts; tuning stops early enough to leave the
    build its estimated time. With several classes tuned here, each gets an equal share of the time
    left when its turn comes. ``lease_s``, ``trials_per_iter`` and ``seed`` override the settings
    of the same names (``TUNEFLEET_LEASE_S``, ...). Returns ``{"models", "extracted", "planned",
    "tuned", "energy", "builds", "budget"}`` (plain dicts; ``budget`` None with ``trials``).
    """
    started = started_at if started_at is not None else time.time()
    logger = get_run_logger()
    if not models:
        raise ParameterError("invalid parameter models: give at least one model")
    targets = check_hardware(hardware)
    check_positive(trials=trials, shard_trials=shard_trials, batch_size=batch_size, image_size=image_size,
                   seq_len=seq_len)
    spend = Spend.request(RUN, budget, trials=trials, started_at=started, name="parameter budget",
                          default=shared_context().settings.budget)
    parsed = spend.budget
    tune_params = tune_options(lease_s=lease_s, trials_per_iter=trials_per_iter, seed=seed)
    if tune_on == "here":  # fail before any work, not after ingesting and planning
        from tunefleet.hardware import check_runs_here

        for hw in hardware:
            try:
                check_runs_here(hw, targets[hw])
            except NotSupportedError as exc:
                raise NotSupportedError(f"{exc}; or run the pipeline with tune_on='deployments'") from None

    # Each model is loaded and extracted once: the build takes the extract step's (tunefleet.models.kept).
    with keeping_models():
        ingested = step_flows.ingest(models, batch_size=batch_size, image_size=image_size, seq_len=seq_len)
        model_ids = [m["model_id"] for m in ingested]
        extracted = step_flows.extract(model_ids, hardware)
        if parsed is None:
            planned = step_flows.plan(hardware, trials=trials, model_ids=model_ids, shard_trials=shard_trials)
            if tune_on == "deployments":
                tuned = tune_through_deployments(hardware, tune_params)
            else:
                tuned = {hw: step_flows.tune(hardware=hw, **tune_params) for hw in hardware}
        else:
            builds_after = len(hardware) if build else 0
            if tune_on == "deployments":  # the classes tune at once, and every build follows them
                tuned = tune_through_deployments(hardware, {**tune_params, "budget": str(parsed),
                                                            "model_ids": model_ids, "started_at": started,
                                                            "reserve_builds": builds_after})
            else:
                tuned = {}
                for i, hw in enumerate(hardware):  # one after another: a wall time is shared out as it goes
                    share = spend.share_for(i, len(hardware))
                    tuned[hw] = step_flows.tune(hardware=hw, budget=str(share.budget), model_ids=model_ids,
                                                started_at=share.started_at, reserve_builds=1 if build else 0,
                                                **tune_params)
            planned = [_rounds_planned(hw, tuned[hw], extracted) for hw in hardware]
        if tune_on == "here":  # the build times the model next: no tuning worker process may run beside it
            for hw in hardware:
                shared_context().tuner(hw).close()
        energy = step_flows.account(model_ids, hardware)
        build_started = time.time()
        builds = step_flows.build(model_ids, hardware, output_dir=output_dir) if build else []
        build_s = time.time() - build_started

    rows = []
    for m in ingested:
        for hw in hardware:
            ext = next(e for e in extracted if e["model_id"] == m["model_id"] and e["hardware"] == hw)
            rep = next((b for b in builds if b["model"] == m["name"] and b["hardware"] == hw), None)
            rows.append({
                "model": m["name"], "hardware": hw, "workloads": ext["workloads"],
                "new workloads": ext["new_workloads"],
                "untuned (ms)": _round(rep and rep.get("untuned_ms")), "tuned (ms)": _round(rep and rep.get("tuned_ms")),
                "torch eager (ms)": _round(rep and rep.get("torch_ms")),
                "onnxruntime (ms)": _round(rep and rep.get("onnxruntime_ms")),
            })
    for hw, t in tuned.items():
        if "measured" in t:
            logger.info("tune %s: %d shard(s) done, %d failed, %d candidates measured", hw, t["shards_done"],
                        t["shards_failed"], t["measured"])
        else:
            logger.info("tune %s: run %s %s", hw, t["flow_run"], t["state"])
    spend = f"{trials} trials per workload" if parsed is None else f"a budget of {parsed.describe()}"
    create_table_artifact(key=artifact_key("pipeline", "summary"), table=rows,
                          description=f"tunefleet pipeline: {len(models)} model(s) x {len(hardware)} hardware "
                                      f"class(es), {spend}")
    spent = None
    if parsed is not None:
        per_class = {hw: t.get("budget") for hw, t in tuned.items()}
        spent = {"budget": str(parsed), "kind": parsed.kind,
                 "seconds": round(time.time() - started, 1), "build_s": round(build_s, 1) if build else None,
                 "trials": sum((b or {}).get("trials", 0) for b in per_class.values()),
                 "rounds": sum((b or {}).get("rounds", 0) for b in per_class.values()),
                 "stopped": {hw: (b or {}).get("stopped") for hw, b in per_class.items()},
                 "build_reserve_s": {hw: (b or {}).get("build_reserve_s") for hw, b in per_class.items()}}
    return {"models": ingested, "extracted": extracted, "planned": planned, "tuned": tuned, "energy": energy,
            "builds": builds, "budget": spent}


def head_start(models: list[str], hardware: list[str], *, batch_size: int = 1, image_size: int | None = None,
               seq_len: int | None = None) -> AbstractContextManager[None]:
    """A block around a :func:`pipeline` call in which the flow's ingest and extract steps are
    begun at once, in a thread of their own, while Prefect starts its temporary server (a
    subprocess, 10-20 s, that the calling thread only waits for): the steps take what the thread
    made, or wait for it (:func:`tunefleet.models.kept.head_start`). ``tunefleet run`` uses it;
    the arguments are the pipeline's."""
    from tunefleet.models import kept
    from tunefleet.models.workloads import class_recipe
    from tunefleet.tvm.targets import make_target

    def begin() -> None:
        ctx = shared_context()
        for source in models:
            res = kept.ingested(ctx.db, ctx.store, source, batch_size=batch_size, image_size=image_size,
                                seq_len=seq_len)
            for hw in hardware:
                row = ctx.db.hardware_class(hw)
                kept.extracted(ctx.db, ctx.store, res.model, make_target(row.target), class_recipe(row))

    return kept.head_start(begin)


def _rounds_planned(hardware: str, tuned: dict[str, Any], extracted: list[dict[str, Any]]) -> dict[str, Any]:
    """The plan step's record for a budget: the rounds the tune step planned."""
    shards = tuned.get("shards") or []
    spent = tuned.get("budget") or {}
    return {"hardware": hardware, "budget": spent.get("budget"), "rounds": spent.get("rounds", 0),
            "new_shards": len(shards), "new_trials": spent.get("trials", 0),
            "workloads": sum(e["workloads"] for e in extracted if e["hardware"] == hardware)}


def _round(value: float | None) -> float | None:
    return None if value is None else round(float(value), 3)
