"""One thin Prefect task per pipeline step over the ``tunefleet`` core.

The logic lives in :mod:`tunefleet.models.workloads`, :mod:`tunefleet.engine`, :mod:`tunefleet.planning.shard_queue`,
:mod:`tunefleet.delivery.build` and :mod:`tunefleet.models.ingest`; these tasks only add what Prefect is for: retries with backoff
for transient failures (a lost database or S3 connection, a lease conflict — never a corrupt
model or an invalid target), names, and plain-data results (dicts, and the core's own dataclasses
where a flow hands them on: a shard's result, a budget's rounds). Every task opens the process's
shared :class:`~tunefleet.context.Context` from the environment (``TUNEFLEET_*``), so the same
task runs in-process, in a process worker's subprocess or in a Kubernetes Job.

Tags: the flows run tuning tasks under ``tunefleet-hw:<class>``, so a Prefect tag concurrency
limit (``prefect concurrency-limit create tunefleet-hw:gpu 4``) caps parallel tuning per class.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.tasks import exponential_backoff

from tunefleet.context import shared_context
from tunefleet.errors import is_transient
from tunefleet.vocab import EXPORT_TAG, RETRY_BACKOFF_S, RETRY_JITTER, TRANSIENT_RETRIES

if TYPE_CHECKING:
    from tunefleet.budget import Budget
    from tunefleet.engine.shard import ShardResult
    from tunefleet.planning.rounds import RoundsState

log = logging.getLogger("tunefleet.tasks")

def retry_if_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry connection losses and lease conflicts only."""
    try:
        state.result()
    except Exception as exc:  # the task's own exception, re-raised by the failed state
        return is_transient(exc)
    return False


STEP = {
    "retries": TRANSIENT_RETRIES,
    "retry_delay_seconds": exponential_backoff(backoff_factor=RETRY_BACKOFF_S),
    "retry_jitter_factor": RETRY_JITTER,
    "retry_condition_fn": retry_if_transient,
    "cache_policy": NO_CACHE,
}
"""The task options of every step, and of a flow body's database reads (``flows/step_flows.py``):
transient errors retried with backoff; never cached. A step reads and writes the database, so the
same arguments twice (``tune_shard`` leases the next shard with the same ones each time) are not
the same result, and Prefect caches by inputs wherever results are persisted
(``PREFECT_RESULTS_PERSIST_BY_DEFAULT``): a cached ``tune_shard`` would loop forever."""


@task(name="ingest", **STEP)
def ingest(source: str, batch_size: int = 1, image_size: int | None = None, seq_len: int | None = None) -> dict[str, Any]:
    """Store a model (zoo name, ONNX/.pt2 path or s3:// URI); the same bytes again return the same id."""
    from tunefleet.models.kept import ingested

    ctx = shared_context()
    # in a pipeline run, its extract step and build take this import (tunefleet.models.kept)
    res = ingested(ctx.db, ctx.store, source, batch_size=batch_size, image_size=image_size, seq_len=seq_len)
    return {"model_id": res.model.id, "name": res.model.name, "sha256": res.model.sha256, "created": res.created}


@task(name="extract", **STEP)
def extract(model_id: int, hardware: str) -> dict[str, Any]:
    """Extract and store a model's workloads for one hardware class."""
    from dataclasses import asdict

    from tunefleet.models.workloads import extract as extract_workloads

    ctx = shared_context()
    return asdict(extract_workloads(ctx.db, ctx.store, ctx.db.model(model_id), hardware))


@task(name="plan", **STEP)
def plan(hardware: str, trials: int | None, model_ids: list[int] | None = None, shard_trials: int = 64,
         budget: Budget | None = None) -> dict[str, Any]:
    """Cut the untuned shortfall of the models' workloads (all workloads if none given) into shards
    (``trials`` per workload), or split a trial ``budget`` over them at once
    (:func:`tunefleet.planning.rounds.plan_once`; the flow's :class:`~tunefleet.planning.spend.Spend`
    refused a duration)."""
    from tunefleet.planning import shard_queue

    ctx = shared_context()
    created: list[Any] = []
    workloads: set[int] = set()
    if budget is not None:
        from tunefleet.planning.rounds import plan_once

        res = plan_once(ctx.db, hardware, budget, model_ids, shard_trials=shard_trials,
                        batch=ctx.options().trials_per_iter)
        return {"hardware": hardware, "new_shards": len(res.shards), "new_trials": sum(s.trials for s in res.shards),
                "workloads": len(res.workloads), "budget": str(budget), "stop": res.stop}
    for model_id in model_ids or [None]:
        new, view = shard_queue.plan(ctx.db, hardware, target_trials=trials, shard_trials=shard_trials, model=model_id)
        created += new
        workloads.update(v.workload_id for v in view)
    return {"hardware": hardware, "new_shards": len(created), "new_trials": sum(s.trials for s in created),
            "workloads": len(workloads)}


@task(name="tune_shard", **STEP)
def tune_shard(hardware: str, options: dict[str, Any] | None = None, shard_id: int | None = None,
               deadline_at: float | None = None, allocated: bool = False) -> ShardResult | None:
    """Lease the next shard of a hardware class, tune it (heartbeating, committing every batch).

    ``options`` override the settings' tuning knobs by name (see
    :class:`tunefleet.engine.options.TuneOptions`). Returns the shard's result, or None when no
    shard can be leased or ``deadline_at`` (seconds since the epoch) passed (a shard stops before
    a batch that would end after it, and ends done-short). ``allocated``: the queue holds a
    budget's round, whose priorities the allocator set (energy-aware leasing leaves them). The
    lease owner includes the task run id: a retry after a lost connection reclaims its own shard
    at once, while a run whose worker died leaves the shard to whoever leases it after the lease
    expires.
    """
    from prefect.runtime import task_run

    from tunefleet.engine.worker import worker_owner

    ctx = shared_context()
    owner = f"{worker_owner()}:{task_run.id}"
    tuner = ctx.tuner(hardware)
    deadline = tuner.deadline(deadline_at) if deadline_at is not None else None
    return tuner.tune_next(ctx.db, owner, ctx.options(**(options or {})), shard_id=shard_id, deadline=deadline,
                           reprioritise=not allocated)


@task(name="plan_round", **STEP)
def plan_round(rounds: RoundsState) -> tuple[int, RoundsState]:
    """Plan the next round of a model-level budget (:meth:`tunefleet.planning.rounds.Rounds.refill`).

    Returns the budget's shards now pending (0: the rounds are over, and the state's ``stopped``
    says why) and where the rounds stand now (round number, the deadline moved by the build's
    reserve measured again, the trials spent so far).
    """
    from tunefleet.planning.rounds import Rounds

    planning = Rounds.resume(rounds)
    pending = planning.refill(shared_context().db)
    return pending, planning.state


@task(name="end_rounds", **STEP)
def end_rounds(rounds: RoundsState) -> dict[str, Any]:
    """The rounds of a budget are over (their ``stopped`` says why): cancel what a deadline left
    pending and return :meth:`tunefleet.planning.rounds.Rounds.summary`."""
    from tunefleet.planning.rounds import Rounds

    return Rounds.resume(rounds).end(shared_context().db)


@task(name="account", **STEP)
def account(model_ids: list[int] | None = None, hardware: list[str] | None = None) -> list[dict[str, Any]]:
    """Energy, money and wasted share per model x hardware class; pushes the fleet gauges if configured."""
    from tunefleet.energy.accounting import energy_report, publish_fleet_metrics

    ctx = shared_context()
    report = energy_report(ctx.db)  # one pass over the measurements serves the rows and the gauges
    rows = [r for r in report if (model_ids is None or r.model_id in model_ids)
            and (hardware is None or r.hardware in hardware)]
    gateway = ctx.settings.metrics_pushgateway
    if gateway:
        from tunefleet.energy.metrics import FleetMetrics

        metrics = FleetMetrics()
        publish_fleet_metrics(ctx.db, metrics, report)
        metrics.publish(gateway, grouping_key={"instance": "accounting"})  # an outage is a warning, not a failure
    return [r.as_dict() for r in rows]


@task(name="export", tags=[EXPORT_TAG], **STEP)
def export(hardware: str | None = None) -> dict[str, Any] | None:
    """Export the measurements not in any dataset version yet as the next Parquet version."""
    from tunefleet.learning.dataset import export as export_dataset

    ctx = shared_context()
    version = export_dataset(ctx.db, ctx.store, hardware=hardware)
    if version is None:
        return None
    return {"version": version.version, "uri": version.uri, "rows": version.row_count,
            "row_counts": version.row_counts, "measurement_ids": version.measurement_ids}


@task(name="retrain", **STEP)
def retrain(hardware: str, objective: str = "reg:squarederror", seed: int = 0) -> dict[str, Any]:
    """Train a cost model on every dataset version of a class; promote it only if it beats the current one."""
    from tunefleet.learning.costmodel import retrain as retrain_model

    ctx = shared_context()
    res = retrain_model(ctx.db, ctx.store, hardware, objective=objective, seed=seed)
    return {"hardware": res.hardware, "version": res.version, "promoted": res.promoted, "reason": res.reason,
            "artifact_uri": res.artifact_uri, "heldout": res.metrics.get("heldout"),
            "current_on_heldout": res.metrics.get("current_on_heldout"), "baselines": res.metrics.get("baselines")}


@task(name="build", **STEP)
def build(model_id: int, hardware: str, output: str | None = None, zero_shot: bool = False,
          verify: int = 0) -> dict[str, Any]:
    """Compile a model with the best stored schedules; latency untuned / tuned / PyTorch eager.

    With ``zero_shot``, workloads never measured on the class get the current cost model's best
    proposal (stored as predictions); ``verify`` measures that many proposals in all here (the
    heaviest workloads' best-scored first; 0: pure prediction). The
    delivered library goes to ``output`` (if given) and to the artifact store (``library_uri``):
    on a cluster the task's node is gone after it, its scratch space with it.
    """
    import os
    import tempfile

    from tunefleet.delivery.build import build_model, store_library

    ctx = shared_context()
    tuner = ctx.tuner(hardware) if verify else None
    model = ctx.db.model(model_id)
    with tempfile.TemporaryDirectory(prefix="tunefleet-build-") as scratch:
        path = output or os.path.join(scratch, "model.so")
        report = build_model(ctx.db, ctx.store, model, hardware, output=path, zero_shot=zero_shot,
                             top_k=5, verify=verify, tuner=tuner,
                             pretrained=ctx.settings.pretrained_cost_model, confirm_top=ctx.settings.confirm_top)
        if os.path.exists(path):
            report.library_uri = store_library(ctx.store, path, model.name, hardware)
        if output is None:
            report.output = None  # the scratch copy is gone; the store's stays
    return report.as_dict()
