"""The pipeline steps as plain functions (no Prefect here): ingest → extract → plan → tune → build.

The CLI calls them directly; the Prefect tasks in ``tunefleet.tasks`` wrap them one to one.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tunefleet import shards
from tunefleet.errors import TunefleetError
from tunefleet.vocab import DEFAULT_MIN_AGREEMENT

if TYPE_CHECKING:
    from tunefleet.config import Settings
    from tunefleet.db import Database
    from tunefleet.db.models import Model
    from tunefleet.efficiency import Efficiency
    from tunefleet.store import ArtifactStore

log = logging.getLogger(__name__)


@dataclass
class ExtractResult:
    model_id: int
    hardware: str
    workloads: int
    new_workloads: int
    total_weight: int


def extract(db: Database, store: ArtifactStore, model: Model, hardware: str) -> ExtractResult:
    """Extract the tuning tasks of a model for one hardware class and store the workloads once."""
    from tunefleet.models.ingest import load_model
    from tunefleet.tvm.extract import extract_workloads
    from tunefleet.tvm.targets import make_target

    hw = db.hardware_class(hardware)
    loaded = load_model(db, store, model)
    found = extract_workloads(loaded.mod, make_target(hw.target), params=loaded.params)
    new = 0
    for w in found:
        row, created = db.add_workload(structural_hash=w.structural_hash, name=w.name, op_kind=w.op_kind,
                                       flops=float(w.flops), tir_json=w.tir_json)
        new += int(created)
        db.link_model_workload(model.id, row.id, int(w.weight))
    log.info("model %s on %s: %d workloads (%d new)", model.name, hardware, len(found), new)
    return ExtractResult(model.id, hardware, len(found), new, sum(int(w.weight) for w in found))


def worker_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class TuneSummary:
    hardware: str
    shards_done: int
    shards_failed: int
    measured: int
    errors: int
    skipped_known: int
    seconds: float
    filtered: int = 0
    preempted: int = 0
    filter_stopped: int = 0
    """Shards in which filtering stopped because the cost model did not rank their measurements."""
    warm_start_dropped: int = 0
    """Shards whose search the class's trained model stopped guiding because it misranked their
    measurements."""


class Tuner:
    """The builder and runner of one hardware class, kept alive from shard to shard.

    Both start worker processes (seconds each), so a worker creates one Tuner per hardware class
    and leases shard after shard through it. Refuses a class this machine cannot measure.

    With an artifact ``store`` and ``warm_start``, every shard starts from the class's current
    cost model, reloaded when a newer one is promoted; a model that cannot be read is logged and
    the shard tunes cold (it is still tuned, only without the head start).

    ``efficiency`` (:class:`tunefleet.efficiency.Efficiency`) turns on plateau preemption,
    cost-model filtering, energy-aware leasing and the adaptive parallel runner.
    """

    def __init__(self, db: Database, hardware: str, *, builder: Any = None, pushgateway: str | None = None,
                 store: ArtifactStore | None = None, warm_start: bool = True,
                 efficiency: Efficiency | None = None, warm_start_min_agreement: float = DEFAULT_MIN_AGREEMENT) -> None:
        from tunefleet.efficiency import Efficiency as _Efficiency
        from tunefleet.hardware import check_runs_here

        hw = db.hardware_class(hardware)
        check_runs_here(hw.name, hw.target)
        self.hardware = hw.name
        self.target = dict(hw.target)
        self.threads = int(hw.target.get("num-cores") or len(os.sched_getaffinity(0)))
        self.pushgateway = pushgateway
        self._own_builder = builder is None
        self._builder = builder
        self._runner: Any = None
        self.hardware_class_id = hw.id
        self.store = store
        self.warm_start = warm_start
        self.warm_start_min_agreement = warm_start_min_agreement
        self._model: Any = None
        self._unreadable: int | None = None
        self._warned_no_filter = False
        self._online: Any = None
        self.efficiency = efficiency or _Efficiency()

    @property
    def online_model(self) -> Any:
        """One MetaSchedule XGBModel learning every shard this tuner measures (see ``tune_shard``)."""
        if self._online is None:
            from tunefleet.tvm.tune import new_online_model

            self._online = new_online_model(self.threads)
        return self._online

    def cost_model(self, db: Database) -> Any:
        """The class's current trained cost model (cached until another is promoted), or None."""
        if self.store is None or not (self.warm_start or self.efficiency.filter_fraction < 1.0):
            return None
        row = db.current_cost_model(self.hardware_class_id)
        if row is None:
            self._model = None
            return None
        if row.id == self._unreadable:
            return None
        if self._model is None or self._model.cost_model_id != row.id:
            from tunefleet.costmodel import load_model

            try:
                self._model = load_model(db, self.store, self.hardware)
            except TunefleetError as exc:
                log.warning("current cost model v%s of %s cannot be loaded, tuning without it: %s",
                            row.version, self.hardware, str(exc).splitlines()[0])
                self._model, self._unreadable = None, row.id  # said once, not again for every shard
        return self._model

    @property
    def builder(self) -> Any:
        if self._builder is None:
            from tunefleet.tvm.builder import PersistentBuilder

            self._builder = PersistentBuilder(max_workers=self.threads)
        return self._builder

    @property
    def runner(self) -> Any:
        if self._runner is None:
            from tunefleet.tvm.targets import make_target

            if self.efficiency.parallel:
                from tunefleet.tvm.parallel_runner import AdaptiveParallelRunner

                self._runner = AdaptiveParallelRunner(make_target(self.target), max_degree=self.efficiency.max_degree)
            else:
                from tunefleet.tvm.runner import make_runner

                self._runner = make_runner(make_target(self.target))
        return self._runner

    def tune_next(
        self,
        db: Database,
        owner: str,
        *,
        lease_s: float = shards.DEFAULT_LEASE_S,
        num_trials_per_iter: int = 64,
        seed: int | None = None,
        shard_id: int | None = None,
        on_batch: Any = None,
    ) -> Any:
        """Lease the next shard (the owner's own first), tune it; its ShardResult, or None if none is left."""
        from tunefleet.tvm.tune import tune_shard

        t0 = time.perf_counter()
        if self.efficiency.energy_aware and shard_id is None:
            from tunefleet.budget import reprioritise

            reprioritise(db, self.hardware)
        shard = shards.lease(db, self.hardware, owner, lease_s=lease_s, shard_id=shard_id, reclaim=True)
        leased_s = time.perf_counter() - t0
        if shard is None:
            return None
        trained = self.cost_model(db)
        filtering = self.efficiency.filter_fraction < 1.0
        if filtering and trained is None and not self._warned_no_filter:
            self._warned_no_filter = True
            log.warning("filtering is on but %s has no current cost model%s: every candidate is measured "
                        "(retrain one with `tunefleet costmodel retrain`)", self.hardware,
                        "" if self.store is not None else " (no artifact store given)")
        result = tune_shard(db, shard, owner, builder=self.builder, runner=self.runner, lease_s=lease_s,
                            num_trials_per_iter=num_trials_per_iter, seed=seed, num_threads=self.threads,
                            on_batch=on_batch, pushgateway=self.pushgateway,
                            cost_model=trained if self.warm_start else None,
                            warm_start_min_agreement=self.warm_start_min_agreement,
                            online_model=self.online_model, policy=self.efficiency.policy,
                            filter_fraction=self.efficiency.filter_fraction,
                            filter_model=trained if filtering else None,
                            filter_min_agreement=self.efficiency.filter_min_agreement)
        result.lease_s = leased_s
        return result

    def close(self) -> None:
        if self._own_builder and self._builder is not None:
            self._builder.shutdown()
        if self._runner is not None and hasattr(self._runner, "shutdown"):
            self._runner.shutdown()
        self._builder = None
        self._runner = None


def drain(
    db: Database,
    hardware: str,
    *,
    max_shards: int | None = None,
    lease_s: float = shards.DEFAULT_LEASE_S,
    num_trials_per_iter: int = 64,
    seed: int | None = None,
    owner: str | None = None,
    on_shard: Any = None,
    on_batch: Any = None,
    builder: Any = None,
    pushgateway: str | None = None,
    store: ArtifactStore | None = None,
    warm_start: bool = True,
    efficiency: Efficiency | None = None,
    warm_start_min_agreement: float = DEFAULT_MIN_AGREEMENT,
) -> TuneSummary:
    """Lease and tune pending shards of one hardware class in this process until none are left.

    With ``store``, shards warm-start from the class's current cost model (see :class:`Tuner`).
    """
    owner = owner or worker_owner()
    started = time.monotonic()
    done = failed = measured = errors = skipped = filtered = preempted = filter_stopped = dropped = 0
    tuner = Tuner(db, hardware, builder=builder, pushgateway=pushgateway, store=store, warm_start=warm_start,
                  efficiency=efficiency, warm_start_min_agreement=warm_start_min_agreement)
    try:
        while max_shards is None or done + failed < max_shards:
            result = tuner.tune_next(db, owner, lease_s=lease_s, num_trials_per_iter=num_trials_per_iter,
                                     seed=seed, on_batch=on_batch)
            if result is None:
                break
            done += result.state == "done"
            failed += result.state != "done"
            measured += result.measured
            errors += result.errors
            skipped += result.skipped_known
            filtered += result.filtered
            preempted += result.preempted is not None
            filter_stopped += result.filter_stopped is not None
            dropped += result.warm_start_dropped is not None
            if on_shard is not None:
                on_shard(result)
    finally:
        tuner.close()
    return TuneSummary(tuner.hardware, done, failed, measured, errors, skipped, time.monotonic() - started,
                       filtered, preempted, filter_stopped, dropped)


def _worker_main(settings_data: dict[str, Any], hardware: str, kwargs: dict[str, Any]) -> None:
    from tunefleet.config import Settings
    from tunefleet.db import Database
    from tunefleet.store import open_store

    settings = Settings(**settings_data)
    logging.basicConfig(level=settings.log_level, format="%(asctime)s %(processName)s %(message)s")
    logging.getLogger("tvm").setLevel(logging.WARNING)
    db = Database.from_settings(settings)
    from tunefleet.efficiency import Efficiency

    drain(db, hardware, pushgateway=settings.metrics_pushgateway, store=open_store(settings),
          warm_start=settings.warm_start, efficiency=Efficiency.from_settings(settings),
          warm_start_min_agreement=settings.warm_start_min_agreement, **kwargs)


def tune_with_workers(settings: Settings, hardware: str, *, workers: int = 1, **kwargs: Any) -> list[int]:
    """Drain the queue with ``workers`` local worker processes; return their exit codes.

    Workers only share the database: a worker that dies leaves its shard leased until the lease
    expires, and another worker (or a later run) resumes it.
    """
    if workers < 1:
        raise TunefleetError("workers must be >= 1")
    ctx = multiprocessing.get_context("spawn")
    data = settings.model_dump()
    procs = [ctx.Process(target=_worker_main, args=(data, hardware, kwargs),
                         name=f"tunefleet-worker-{i}") for i in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return [p.exitcode or 0 for p in procs]
