"""One shard's tuning, wired like MetaSchedule's own ``tune_tasks``: resolve, search, finish.

:class:`ShardRun` tunes a leased shard to its trial budget with MetaSchedule, plugged into its
extension points — tunefleet's database bridge (:class:`~tunefleet.tvm.bridge.FleetDatabase`),
the resuming search (:class:`~tunefleet.tvm.search.ResumingSearch`), the one commit path
(:class:`~tunefleet.tvm.commit.CommitCallback`) — and follows the rules in
:mod:`tunefleet.engine.policies` (and a budget's deadline, :mod:`tunefleet.planning.rounds`). A
shard leased again after its worker died resumes: its budget is reduced by what it already
committed, and no committed candidate is measured again. It ends done, done-short (its search
stopped before its trials were spent — a deadline, or no new candidate left — with the reason in
its history), failed (a crashed attempt, with what was committed kept), or raises a transient
error (a lost lease or database connection: not the shard's fault; the caller retries).
"""

from __future__ import annotations

import logging
import tempfile
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tunefleet.planning import shard_queue
from tunefleet.engine.heartbeat import Heartbeat, ProgressClock, bound_build_timeout
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.policies import (Accounting, DeadlinePolicy, Filter, Preemption, ShapeWarmStart, ShardPolicy,
                                       ThreadLocal, Transfer, WarmStart)
from tunefleet.planning.rounds import Deadline
from tunefleet.errors import DatabaseError, NodeFaultError, TransientError, WorkerStartError
from tunefleet.planning.shard_queue import LeaseLostError
from tunefleet.tvm.ffi_errors import collect_failures
from tunefleet.tvm.threads import class_threads

if TYPE_CHECKING:
    from tunefleet.learning.costmodel import TrainedModel
    from tunefleet.db import Database
    from tunefleet.db.tables import Shard
    from tunefleet.tvm.commit import CandidateHook

log = logging.getLogger(__name__)

_AUDIT_PAST = 64
"""Committed measurements (the fastest) the filter's and the warm start's models are judged on
when a shard of a workload measured here before starts."""


@dataclass
class ShardKit:
    """What a shard run borrows from its worker: processes and models kept from shard to shard.

    ``builder``/``runner`` None: the run starts (and stops) its own. ``online_model``: the
    MetaSchedule XGBModel learning every shard of the worker, as stock ``tune_tasks`` shares one
    across tasks (None: a fresh one). ``trained_model``: the class's current trained cost model
    (warm start and filter; None: neither)."""

    builder: Any = None
    runner: Any = None
    online_model: Any = None
    trained_model: TrainedModel | None = None
    num_threads: int | None = None
    on_batch: CandidateHook | None = None
    work_dir: str | None = None
    deadline: Deadline | None = None
    """A budget's deadline (None: none): no batch starts that would end after it."""


@dataclass
class ShardResult:
    shard_id: int
    state: str
    measured: int
    errors: int
    skipped_known: int
    best_s: float | None
    seconds: float
    commit_s: float = 0.0
    """Of ``seconds``, the time spent committing measurements and marking the shard done."""
    lease_s: float = 0.0
    """Time spent leasing the shard (set by the caller that leased it)."""
    filtered: int = 0
    """Candidates scored out by the cost model (recorded, never measured)."""
    preempted: str | None = None
    """Why the shard stopped before its budget (plateau preemption), or None."""
    unused_trials: int = 0
    filter_stopped: str | None = None
    """Why filtering stopped in this shard (:class:`tunefleet.learning.filter_audit.FilterAudit`), or None."""
    warm_start_dropped: str | None = None
    """Why the class's trained model stopped guiding this shard's search (it misranked its
    measurements: :class:`tunefleet.engine.learned.FleetCostModel`), or None."""
    search_s: float = 0.0
    """Of ``seconds``: proposing candidates (see :class:`tunefleet.tvm.commit.ShardProgress`)."""
    build_s: float = 0.0
    run_s: float = 0.0
    shape_seeds: int = 0
    """Schedules of the same operator at other shapes the first round measured (:class:`ShapeWarmStart`)."""
    transfer_seeds: int = 0
    """Schedules of other classes (a hub bundle's among them) the first round measured (:class:`Transfer`)."""


def _build_wall(builder: Any) -> Any:
    """The builder's wall-time counter (PersistentBuilder), or None for builders without one."""
    stats = getattr(builder, "stats", None)
    return (lambda: stats.wall_seconds) if stats is not None and hasattr(stats, "wall_seconds") else None


def _is_pool_failure(exc: BaseException) -> bool:
    """Whether an exception MetaSchedule's builder or runner raised means their processes could
    not start (an ``OSError`` from forking, the builder pool's start-up error), not a bad candidate
    (the builder and runner report those as results, never raise)."""
    from tunefleet.tvm.builder import BuilderStartupError

    return isinstance(exc, (OSError, BuilderStartupError))


def new_online_model(threads: int) -> Any:
    """MetaSchedule's XGBModel as stock ``tune_tasks`` creates it for ``cost_model="xgb"``."""
    from tvm.s_tir import meta_schedule as ms

    return ms.cost_model.XGBModel(num_tuning_cores=threads, tree_method="auto")


def run_shard(db: Database, shard: Shard, owner: str, options: TuneOptions | None = None,
              kit: ShardKit | None = None) -> ShardResult:
    """Tune a leased shard (see :class:`ShardRun`); its result."""
    return ShardRun(db, shard, owner, options or TuneOptions(), kit).run()


class ShardRun:
    """A leased shard, tuned once: :meth:`run` resolves the extension points and policies, runs
    MetaSchedule's search to the shard's budget, and finishes the shard."""

    def __init__(self, db: Database, shard: Shard, owner: str, options: TuneOptions, kit: ShardKit | None = None) -> None:
        from tunefleet.tvm.targets import make_target

        self.db, self.shard, self.owner, self.options = db, shard, owner, options
        self.kit = kit or ShardKit()
        self.started = time.monotonic()
        self.hw = db.hardware_class(shard.hardware_class_id)
        self.wl = db.workload(shard.workload_id)
        self.target = make_target(self.hw.target)
        self.threads = self.kit.num_threads or class_threads(self.hw.target)
        done_before = db.count_measurements(shard_id=shard.id)
        self.remaining = shard.trials - done_before
        if done_before and self.remaining > 0:
            log.info("shard %d resumes: %d of %d trials already committed", shard.id, done_before, shard.trials)
        from tunefleet.tvm.commit import ShardProgress

        self.progress = ShardProgress()
        self.progress_clock = ProgressClock()
        """Touched whenever the tuning thread makes progress; the heartbeat renews the lease only
        while it was touched less than a lease ago."""
        self.known: set[str] = set()
        self.builder, self.runner = self.kit.builder, self.kit.runner
        self.online = self.kit.online_model
        self.cost_model: Any = None
        self.ctx: Any = None
        self.search: Any = None
        self.committer: Any = None
        self.callback: Any = None
        self.failure: BaseException | None = None
        self.heartbeat: Heartbeat | None = None  # from run()'s start to tune()'s end
        self.ended = False
        self._past: tuple[list[Any], list[float]] | None | bool = False

    # -- the shape of ms.tune_tasks ------------------------------------------------------------
    def run(self) -> ShardResult:
        if self.remaining <= 0:
            return self.finish([])
        # The heartbeat starts with the lease, not with the search: setting up (the policies, the
        # search, the context) can outlast a short lease, and a shard lost before its first build
        # never shows whether this node can build. It watches the tuning's progress from tune() on.
        hb = self.heartbeat = Heartbeat(self.db, self.shard.id, self.owner, self.options.lease_s,
                                        generation=self.shard.lease_generation).start()
        try:
            policies = self.policies()
            reason = next((r for p in policies if (r := p.start(self))), None)
            own_builder = False if reason else self.resolve(policies)
        except BaseException:
            hb.stop()
            raise
        if reason:
            hb.stop()
            self.progress.stop_reason = reason
            return self.finish(policies)
        seen: list[BaseException] = []
        try:
            with collect_failures() as seen, hb:  # the heartbeat stops before the handlers below
                self.tune(policies)
        except (LeaseLostError, DatabaseError):
            raise  # not this shard's fault: the caller (or Prefect's retry) decides
        except Exception as exc:  # a crashed tuning attempt: record it on the shard, keep what was committed
            # MetaSchedule re-wraps what its Python callbacks raise: look for the original (on
            # this thread's list, or on an extension object C++ called from another thread).
            seen += [f for x in (self.callback, self.search, self.cost_model)
                     if (f := getattr(x, "failure", None)) is not None and f not in seen]
            if (fault := next((e for e in seen if isinstance(e, NodeFaultError)), None)):
                # The node cannot build or run even the default schedule: the shard goes to another
                # node with no attempt spent, and the worker quarantines this node for the class.
                if not shard_queue.give_back(self.db, self.shard.id, self.owner, reason=str(fault)):
                    raise LeaseLostError(f"shard {self.shard.id}: its lease was lost while its batch failed "
                                         f"({fault})") from None
                raise NodeFaultError(f"shard {self.shard.id} ({self.wl.name} on {self.hw.name}): {fault}; its "
                                     "lease was given back") from None
            if (cause := next((e for e in seen if isinstance(e, (TransientError, DatabaseError))), None)):
                raise cause from None
            if (dead := next((e for e in seen if _is_pool_failure(e)), None)):
                # The builder's or runner's processes could not be (re)started: not this shard's
                # fault either. Its lease goes back without spending an attempt.
                shard_queue.give_back(self.db, self.shard.id, self.owner)
                raise WorkerStartError(f"the builder or runner of shard {self.shard.id} stopped and could not "
                                       f"restart ({type(dead).__name__}: {dead}); its lease was given back") from None
            self.failure = seen[0] if seen else exc
        finally:
            if own_builder and hasattr(self.builder, "shutdown"):
                self.builder.shutdown()
        return self.finish(policies)

    def policies(self) -> list[ShardPolicy]:
        """The rules this shard follows, in the order they are called (accounting first, so a
        shard's energy is added before any policy ends it)."""
        o, trained = self.options, self.kit.trained_model
        out: list[ShardPolicy] = [Accounting(), Preemption(o.policy), ThreadLocal()]
        if o.transfer:
            out.append(Transfer())
        if o.warm_start_shapes:
            out.append(ShapeWarmStart(other_classes=o.transfer))
        if trained is not None and o.warm_start:
            out.append(WarmStart(trained, o.warm_start_min_agreement))
        if trained is not None and o.filtering:
            out.append(Filter(trained, o.filter_fraction, o.filter_min_agreement))
        if self.kit.deadline is not None:
            out.append(DeadlinePolicy(self.kit.deadline))
        return out

    def resolve(self, policies: list[ShardPolicy]) -> bool:
        """Build the extension points (search, context, builder, runner, cost model, committer)
        and attach the policies; whether this run owns (and must stop) its builder."""
        import tvm
        from tvm.s_tir import meta_schedule as ms

        from tunefleet.db.shards import LeaseFence
        from tunefleet.tvm.builder import PersistentBuilder, import_tensor_intrinsics
        from tunefleet.tvm.commit import CandidateCommitter
        from tunefleet.tvm.runner import make_runner
        from tunefleet.tvm.search import ResumingSearch
        from tunefleet.tvm.targets import target_fingerprint

        import_tensor_intrinsics()  # the fast way; TuneContext would otherwise import them slowly
        self.known = self.db.measured_trace_hashes(self.wl.id, self.hw.id)
        seeds = [trace for p in policies for trace in p.seeds(self)]
        population = self.options.population(min(self.options.trials_per_iter, self.remaining))
        # Candidates in flight when a worker of this shard died: re-measured first, one per batch,
        # unless committed meanwhile (a sibling shard of the workload, searching from the same
        # database, measured or filtered the same candidate while this one waited to be leased).
        suspects = [(c.trace_json, c.args_info) for c in self.db.suspects(self.shard.id)
                    if c.trace_sha256 not in self.known]
        if suspects:
            log.warning("shard %d resumes after a lost lease: %d candidate(s) in flight then are measured one at "
                        "a time first", self.shard.id, len(suspects))
        self.search = ResumingSearch(ms.search_strategy.EvolutionarySearch(population_size=population), self.known,
                                     include_default=self.target.kind.name == "llvm", progress=self.progress,
                                     seeds=seeds, budget=self.remaining, suspects=suspects)
        policy_stop = self._should_stop(policies)

        def should_stop() -> str | None:
            # A lost lease or a dead heartbeat stops the search at the next round, even one that
            # commits nothing (tune() then raises it).
            self.progress_clock.touch("a round started")
            return (self.heartbeat.reason() if self.heartbeat is not None else None) or policy_stop()

        def on_proposed(cands: list[Any]) -> None:
            self.progress_clock.touch("the search proposed a batch")
            self.committer.in_flight(cands)

        self.search.should_stop = should_stop
        self.search.on_proposed = on_proposed
        seed = self.options.seed
        self.ctx = ms.TuneContext(tvm.ir.load_json(self.wl.tir_json), target=self.target,
                                  space_generator="post-order-apply", search_strategy=self.search,
                                  task_name=self.wl.name, rand_state=seed if seed is not None else -1,
                                  num_threads=self.threads)
        own_builder = self.builder is None
        self.builder = self.builder or PersistentBuilder(max_workers=self.threads)
        self.runner = self.runner or make_runner(self.target)
        self.online = self.online if self.online is not None else new_online_model(self.threads)
        self.cost_model = self.online
        self.committer = CandidateCommitter(self.db, self.wl.id, self.hw.id, shard_id=self.shard.id,
                                            target=target_fingerprint(self.target),
                                            fence=LeaseFence(self.shard.id, self.owner, self.shard.lease_generation))
        for p in policies:
            p.attach(self)
        return own_builder

    def tune(self, policies: list[ShardPolicy]) -> None:
        """MetaSchedule's search to the shard's budget, committing every batch under a heartbeat
        (fenced by the lease's generation) that renews the lease only while rounds start, batches
        are proposed and batches committed, each less than a lease after the last; raises once the
        lease was lost or the heartbeat died. Each build and each run that returns is progress too
        (one batch may take longer than a lease)."""
        from tvm.s_tir import meta_schedule as ms

        from tunefleet.tvm.bridge import FleetDatabase
        from tunefleet.tvm.commit import CommitCallback

        from tunefleet.tvm.runner import ProgressRunner

        accounting = next((p for p in policies if isinstance(p, Accounting)), None)
        bound_build_timeout(self.builder, self.options.lease_s)
        clock = self.progress_clock
        if hasattr(self.builder, "on_returned"):  # PersistentBuilder: each build that returns is progress
            self.builder.on_returned = lambda: clock.touch("a build returned")
        runner = ProgressRunner(self.runner, lambda: clock.touch("a run returned"))
        hb = self.heartbeat
        assert hb is not None, "run() starts the heartbeat (and stops it)"
        hb.watch(self.progress_clock)
        with tempfile.TemporaryDirectory(dir=self.kit.work_dir) as tmp:
            self.callback = CommitCallback(
                self.committer, build_seconds=getattr(self.builder, "pop_build_time", None),
                measure_info=getattr(self.runner, "pop_measure_info", None),
                annotate=accounting.annotate if accounting is not None else None, progress=self.progress,
                build_wall=_build_wall(self.builder), node_check=self._probe_node,
                after_commit=[self._committed, self._report_batch, *(p.after_round for p in policies), hb.check])
            ms.tune_tasks(
                tasks=[self.ctx], task_weights=[1.0], work_dir=tmp, max_trials_global=self.remaining,
                num_trials_per_iter=min(self.options.trials_per_iter, self.remaining), builder=self.builder,
                runner=runner, database=FleetDatabase(self.db, self.hw.name), cost_model=self.cost_model,
                measure_callbacks=[self.callback, ms.measure_callback.RemoveBuildArtifact(),
                                   ms.measure_callback.UpdateCostModel()],
                task_scheduler="round-robin",
            )
            hb.check()  # a search stopped by a lost lease or a dead heartbeat is no finished shard

    def finish(self, policies: list[ShardPolicy]) -> ShardResult:
        """Let every policy close (energy added; a preempted shard ended and its trials handed
        on), then mark the shard failed or done; its result."""
        t0 = time.perf_counter()
        for p in policies:
            p.finish(self)
        state = shard_queue.DONE
        if self.failure is not None:
            log.debug("shard %d traceback", self.shard.id, exc_info=self.failure)
            state = shard_queue.fail(self.db, self.shard.id, self.owner, f"{type(self.failure).__name__}: {self.failure}",
                                generation=self.shard.lease_generation)
            log.error("shard %d failed: %s", self.shard.id, self.failure)
        elif not self.ended:
            short = self.unused() if self.remaining > 0 else 0
            dup = {"duplicates": self.progress.duplicates} if self.progress.duplicates else {}
            if short:  # its search stopped early: a deadline, or no new candidate left
                reason = self.progress.stop_reason
                shard_queue.complete(self.db, self.shard.id, self.owner, event="done-short", unused_trials=short,
                                generation=self.shard.lease_generation,
                                cause="stopped" if reason else "exhausted",
                                reason=reason or "search space exhausted: no new candidate", **dup)
                log.info("shard %d done with %d trial(s) unused: %s", self.shard.id, short,
                         reason or "no new candidate")
            else:
                shard_queue.complete(self.db, self.shard.id, self.owner, generation=self.shard.lease_generation, **dup)
        p = self.progress
        preempted = next((x.ended for x in policies if isinstance(x, Preemption)), None)
        return ShardResult(
            self.shard.id, state, p.measured, p.errors, p.skipped_known, p.best_s, time.monotonic() - self.started,
            commit_s=p.commit_s + time.perf_counter() - t0, filtered=p.filtered, preempted=preempted,
            unused_trials=self.unused() if preempted else 0,
            filter_stopped=next((x.stopped for x in policies if isinstance(x, Filter)), None),
            warm_start_dropped=next((x.dropped for x in policies if isinstance(x, WarmStart)), None),
            search_s=p.search_s, build_s=p.build_s, run_s=p.run_s,
            shape_seeds=next((x.seeded for x in policies if isinstance(x, ShapeWarmStart)), 0),
            transfer_seeds=next((x.seeded for x in policies if isinstance(x, Transfer)), 0))

    # -- what policies ask of the run ------------------------------------------------------------
    def unused(self) -> int:
        """Trials of the shard's budget not spent (measured or filtered) so far."""
        return max(0, self.shard.trials - self.db.count_measurements(shard_id=self.shard.id))

    def past(self) -> tuple[list[Any], list[float]] | None:
        """The workload's fastest committed measurements on this class as candidates with their
        mean run times, to judge a cost model on before the first round (None: none yet)."""
        if self._past is False:
            from tunefleet.tvm.traces import past_candidates

            rows = self.db.best_measurements(self.wl.id, self.hw.id, _AUDIT_PAST) if self.known else []
            self._past = past_candidates(self.ctx.mod, rows) if rows else None
        return self._past  # type: ignore[return-value]

    def _should_stop(self, policies: list[ShardPolicy]) -> Any:
        def should_stop() -> str | None:
            return next((r for p in policies if (r := p.before_round())), None)

        return should_stop

    def _probe_node(self) -> str | None:
        """Why this node cannot build or run the workload's default schedule (None: it can)."""
        from tunefleet.tvm.probe import probe

        self.progress_clock.touch("a batch failed: probing the node")
        return probe(self.target, self.builder, self.runner, self.ctx.mod)

    def _committed(self, rows: list[Any], note: Any) -> None:
        self.progress_clock.touch("a batch was committed")

    def _report_batch(self, rows: list[Any], note: Any) -> None:
        if self.kit.on_batch is not None:
            self.kit.on_batch(self.shard.id, [(r.trace_sha256, r.mean_run_s) for r in rows])
