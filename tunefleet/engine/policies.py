"""The rules a shard's tuning follows, each a small object :class:`~tunefleet.engine.shard.ShardRun`
calls at named points, the way MetaSchedule calls its measure callbacks.

The points, in the order a shard meets them:

* ``start(run)`` — before anything is built; a reason (text) ends the shard untuned;
* ``seeds(run)`` — schedules the first round measures besides the search's own;
* ``attach(run)`` — the tune context, search and committer exist: hook into them;
* ``before_round()`` — a reason ends the search before the next round;
* ``after_round(rows, note)`` — a batch was committed (``note``: what :class:`Accounting` added);
* ``finish(run)`` — the search ended (``run.failure`` says whether it crashed); a policy may end
  the shard its own way here (:class:`Preemption` does), else the engine completes it.

The engine knows the order; a policy knows one rule. The rules themselves live in the policy
modules (:mod:`tunefleet.planning.transfer`, :mod:`tunefleet.planning.warm_shapes`, :mod:`tunefleet.planning.preemption`,
:mod:`tunefleet.energy.priorities`, :mod:`tunefleet.learning.filter_audit`, :mod:`tunefleet.energy.accounting`); these classes
only connect them.
"""

from __future__ import annotations

import logging
import math
import time
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from tunefleet.learning.filter_audit import FilterAudit

if TYPE_CHECKING:
    from tunefleet.db import Database, NewMeasurement
    from tunefleet.db.tables import HardwareClass, Shard, Workload
    from tunefleet.energy.accounting import ShardAccountant
    from tunefleet.engine.options import TuneOptions
    from tunefleet.learning.costmodel import TrainedModel
    from tunefleet.planning.preemption import PreemptionPolicy
    from tunefleet.planning.rounds import Deadline
    from tunefleet.tvm.commit import ShardProgress

log = logging.getLogger(__name__)


class ShardRunView(Protocol):
    """What a policy sees of the shard run calling it (:class:`tunefleet.engine.shard.ShardRun`)."""

    db: Database
    shard: Shard
    owner: str
    options: TuneOptions
    hw: HardwareClass
    wl: Workload
    remaining: int
    """Trials of the shard's budget left when the run started."""
    known: set[str]
    """sha256 of every trace already committed for (workload, hardware class)."""
    ctx: Any  # after attach: the TuneContext, its search, the committer, runner and online model
    search: Any
    committer: Any
    runner: Any
    online: Any
    cost_model: Any
    """The cost model the search is guided by; a policy may replace it in ``attach``."""
    progress: ShardProgress
    failure: BaseException | None
    ended: bool
    """Set by a policy that ended the shard itself in ``finish``."""

    def unused(self) -> int: ...

    def past(self) -> tuple[list[Any], list[float]] | None: ...


class ShardPolicy:
    """A rule of a shard's tuning; every hook does nothing unless the rule needs it."""

    def start(self, run: ShardRunView) -> str | None:
        return None

    def seeds(self, run: ShardRunView) -> list[str]:
        return []

    def attach(self, run: ShardRunView) -> None:
        pass

    def before_round(self) -> str | None:
        return None

    def after_round(self, rows: list[NewMeasurement], note: Any) -> None:
        pass

    def finish(self, run: ShardRunView) -> None:
        pass


class Transfer(ShardPolicy):
    """A workload this class never measured first measures the best schedules of the most
    compatible classes that hold it (:func:`tunefleet.planning.transfer.transfer_seeds`): a hub
    bundle's records (tuned on this CPU first) or another class's; at most :data:`SEEDS`, and
    at most half of the shard's trials — all of them but the default schedule's in a shard of a
    replay round (:func:`tunefleet.planning.rounds.plan_replay_round`), which measures nothing else."""

    SEEDS = 5

    def __init__(self) -> None:
        self.seeded = 0

    def seeds(self, run: ShardRunView) -> list[str]:
        if run.known:
            return []
        from tunefleet.planning.transfer import transfer_seeds

        replay = any(e.get("event") == "planned" and e.get("replay") for e in run.shard.history or [])
        limit = max(1, run.remaining - 1) if replay else min(self.SEEDS, max(1, run.remaining // 2))
        found = transfer_seeds(run.db, run.wl, run.hw, limit)
        if found.traces:
            log.info("shard %d is seeded with %d schedule(s) of %s%s", run.shard.id, len(found.traces),
                     ", ".join(sorted(set(found.sources))),
                     f" ({found.skipped} did not replay on the workload)" if found.skipped else "")
        self.seeded = len(found.traces)
        return found.traces


class ThreadLocal(ShardPolicy):
    """A Winograd workload measured here measures, among its next trials, the variant of its
    fastest schedules whose batched products split between the threads by tile
    (:func:`tunefleet.tvm.partition.thread_local`): at most :data:`SEEDS`, at most a quarter of
    the shard's trials, each once (its stages hand no data between cores that share no cache,
    which a measurement shows only when the VM's cores happen to be so). A build times the fastest
    schedule beside its rewrite and takes the rewrite within
    :data:`~tunefleet.tvm.partition.PREFER_WITHIN` of it (:func:`tunefleet.tvm.partition.build_order`).
    CPU classes only: on a GPU the outer tiles are thread blocks, not threads sharing caches."""

    SEEDS = 2

    def __init__(self) -> None:
        self.seeded = 0

    def seeds(self, run: ShardRunView) -> list[str]:
        limit = min(self.SEEDS, run.remaining // 4)
        if not run.known or limit < 1 or run.hw.target.get("kind") != "llvm":
            return []
        from tunefleet.tvm.partition import rewrite_of
        from tunefleet.tvm.threads import class_threads

        threads = class_threads(run.hw.target)
        out: list[str] = []
        for row in run.db.best_measurements(run.wl.id, run.hw.id, self.SEEDS):
            found = rewrite_of(row.trace_json, threads)
            if found is not None and found[1] not in run.known and found[0] not in out:
                out.append(found[0])
        if out[:limit]:
            log.info("shard %d is seeded with %d schedule(s) whose batched products split by tile", run.shard.id,
                     len(out[:limit]))
        self.seeded = len(out[:limit])
        return out[:limit]


class ShapeWarmStart(ShardPolicy):
    """A workload this class never measured first measures the best schedules of the same
    operator at the closest other shapes measured here, then on the compatible classes (a hub
    bundle's), fitted to its shape (:func:`tunefleet.planning.warm_shapes.shape_seeds_near`); at
    most half of the shard's trials. ``other_classes`` off (``transfer`` off): this class's donors only."""

    def __init__(self, *, other_classes: bool = True) -> None:
        self.seeded = 0
        self.other_classes = other_classes

    def seeds(self, run: ShardRunView) -> list[str]:
        if run.known:
            return []
        from tunefleet.planning.warm_shapes import MAX_SEEDS, shape_seeds_near

        found = shape_seeds_near(run.db, run.wl, run.hw, limit=min(MAX_SEEDS, run.remaining // 2),
                                 other_classes=self.other_classes)
        if found.tried:
            log.info("shard %d is seeded with %s", run.shard.id, found.summary())
        self.seeded = len(found.traces)
        return found.traces


class Accounting(ShardPolicy):
    """Every committed candidate gets its share of the round's energy and its useful flag; the
    shard's energy, node time and money are added to it at the end (:mod:`tunefleet.energy.accounting`)."""

    def __init__(self) -> None:
        self.accountant: ShardAccountant | None = None

    def attach(self, run: ShardRunView) -> None:
        from tunefleet.energy.accounting import ShardAccountant

        self.accountant = acc = ShardAccountant(run.db, run.hw, run.wl, pushgateway=run.options.metrics_pushgateway,
                                                shard_id=run.shard.id, lease=run.shard.leases)
        if acc.metrics is not None and hasattr(run.runner, "on_degree"):  # the adaptive parallel runner
            run.runner.on_degree = partial(acc.metrics.set_measure_parallelism, run.hw.name)
            acc.metrics.set_measure_parallelism(run.hw.name, run.runner.degree)

    def annotate(self, rows: list[NewMeasurement]) -> Any:
        return self.accountant.annotate(rows) if self.accountant is not None else None

    def finish(self, run: ShardRunView) -> None:
        if self.accountant is not None:
            from tunefleet.energy.accounting import add_shard_energy

            add_shard_energy(run.db, run.shard.id, self.accountant.finish())


class Preemption(ShardPolicy):
    """Trimmer's plateau preemption: every round updates the (workload, class)'s persisted plateau
    state (:mod:`tunefleet.planning.preemption`); once the policy says stop, the search ends, the shard is
    done with a ``preempted`` event, and its unused trials go to the workloads still improving
    (:func:`tunefleet.energy.priorities.reallocate`). A shard of an already preempted workload ends at once."""

    def __init__(self, policy: PreemptionPolicy) -> None:
        self.policy = policy
        self._db: Any = None
        self.state: Any = None
        self.weight = 1
        self.ended: str | None = None
        """The reason, once this policy ended the shard as preempted."""

    @property
    def reason(self) -> str | None:
        return self.state.reason or "preempted" if self.policy.enabled and self.state.preempted else None

    def start(self, run: ShardRunView) -> str | None:
        from tunefleet.planning.preemption import new_state

        db, wl, hw = run.db, run.wl, run.hw
        self._db = db
        self.state = db.tuning_state(wl.id, hw.id)
        if self.state is None:
            best = db.best_measurements(wl.id, hw.id, 1)
            self.state = new_state(wl.id, hw.id, float(best[0].mean_run_s) if best else None)
        self.weight = db.workload_weight(wl.id, hw.id)
        if self.reason:
            log.info("shard %d: workload %s is preempted on %s (%s); its %d trial(s) go elsewhere", run.shard.id,
                     wl.structural_hash[:12], hw.name, self.reason, run.remaining)
        return self.reason

    def before_round(self) -> str | None:
        return self.reason

    def after_round(self, rows: list[NewMeasurement], note: Any) -> None:
        from tunefleet.planning.preemption import observe_round, stop_reason

        means = [r.mean_run_s for r in rows if r.mean_run_s is not None]
        observe_round(self.state, min(means) if means else None, getattr(note, "joules", 0.0), self.weight,
                      self.policy)
        reason = stop_reason(self.state, self.policy)
        if reason:
            self.state.preempted, self.state.reason = True, reason
        self._db.save_tuning_state(self.state)

    def finish(self, run: ShardRunView) -> None:
        unused = run.unused()
        if run.failure is not None or not self.reason or unused <= 0:  # (a plateau on the last round: simply done)
            return
        from tunefleet.energy.priorities import reallocate
        from tunefleet.planning import shard_queue

        if run.progress.batches:
            log.info("shard %d preempted after %d round(s): %s; %d trial(s) unused", run.shard.id, self.state.rounds,
                     self.reason, unused)
        self.ended = self.reason
        shard_queue.complete(run.db, run.shard.id, run.owner, event="preempted", generation=run.shard.lease_generation,
                        reason=self.reason, unused_trials=unused)
        reallocate(run.db, run.hw.name, unused, from_workload_id=run.wl.id, from_shard_id=run.shard.id,
                   max_leases=run.shard.max_leases)
        run.ended = True


class WarmStart(ShardPolicy):
    """The class's trained cost model guides the search from the first round, refined online
    (:class:`~tunefleet.engine.learned.FleetCostModel`), until it misranks this workload's
    measured candidates (below ``min_agreement``; 0: never dropped), judged first on the
    workload's committed measurements and then after every round."""

    def __init__(self, trained: TrainedModel, min_agreement: float) -> None:
        self.trained, self.min_agreement = trained, min_agreement
        self.model: Any = None

    @property
    def dropped(self) -> str | None:
        return getattr(self.model, "dropped", None)

    def attach(self, run: ShardRunView) -> None:
        from tunefleet.engine.learned import FleetCostModel

        self.model = run.cost_model = FleetCostModel(self.trained, online=run.online,
                                                     audit=FilterAudit(self.min_agreement))
        log.info("shard %d warm-starts with cost model v%s", run.shard.id, self.trained.version)
        past = run.past()
        if past is not None:
            self.model.judge_past(run.ctx, *past)

    def finish(self, run: ShardRunView) -> None:
        m = self.model
        if m is not None and m.predicted:
            log.info("shard %d scored %d schedules in %.1fs: %d feature extractions, %d kept from before",
                     run.shard.id, m.predicted, m.predict_seconds, m.feature_misses, m.feature_hits)


class Filter(ShardPolicy):
    """Trimmer's filter: the class's trained model scores each round's search candidates and only
    the best ``fraction`` is measured; the rest are committed as ``filtered`` and spend their
    trial unmeasured. Filtering starts once the model ranks this workload's measured candidates
    (``min_agreement``; until then rounds are scored and measured in full) and stops for good when
    it no longer does (:class:`~tunefleet.learning.filter_audit.FilterAudit`; 0: from the first round,
    never stopped)."""

    def __init__(self, trained: TrainedModel, fraction: float, min_agreement: float) -> None:
        from tunefleet.engine.learned import FleetCostModel

        self.scorer = FleetCostModel(trained).prior
        self.fraction = fraction
        self.audit = FilterAudit(min_agreement)
        self.task = "this workload"

    @property
    def stopped(self) -> str | None:
        return self.audit.stopped

    def attach(self, run: ShardRunView) -> None:
        self.task = run.wl.name or self.task
        run.search.select, run.search.on_results = self.select, self.on_results
        run.search.on_dropped = run.committer.filtered
        past = run.past()
        if past is not None and len(past[0]) >= 2:
            self.audit.observe([float(x) for x in self.scorer(run.ctx, past[0])], past[1])
            self._check()

    def select(self, context: Any, searched: list[Any]) -> tuple[list[Any], list[Any]]:
        """Keep the best-scored fraction of the round; on probation keep all (scored, to judge)."""
        import numpy as np

        from tunefleet.tvm.traces import trace_sha256_of

        if self.audit.stopped:
            return searched, []
        scores = np.asarray(self.scorer(context, searched), dtype=np.float64)
        if not self.audit.trusted:  # probation: measured in full, to judge the model
            self.audit.kept([trace_sha256_of(c.sch) for c in searched], [float(x) for x in scores])
            return searched, []
        keep_n = max(1, math.ceil(self.fraction * len(searched)))
        order = np.argsort(-np.nan_to_num(scores, nan=-np.inf), kind="stable")
        kept_at = sorted(order[:keep_n])
        self.audit.kept([trace_sha256_of(searched[i].sch) for i in kept_at], [float(scores[i]) for i in kept_at])
        return [searched[i] for i in kept_at], [searched[i] for i in sorted(order[keep_n:])]

    def on_results(self, context: Any, cands: list[Any], results: list[Any]) -> None:
        from tunefleet.tvm.traces import mean_run_s, trace_sha256_of

        if self.audit.stopped:
            return
        for cand, res in zip(cands, results, strict=True):
            self.audit.measured(trace_sha256_of(cand.sch), mean_run_s(res))
        self._check()

    def _check(self) -> None:
        was_trusted = self.audit.trusted
        reason = self.audit.check()
        if self.audit.trusted and not was_trusted:
            log.info("filtering starts for %s: %s", self.task, self.audit.passed)
        if reason:
            log.info("filtering stops for %s: %s; every later candidate is measured", self.task, reason)


class DeadlinePolicy(ShardPolicy):
    """Stops a shard's search before a batch that would end after the deadline — expected to take
    as long as the shard's previous batch (batches of one shard are alike; a shard's first batch
    always runs, and the rounds near the deadline are planned small for that) — and the shard
    then ends done-short (:class:`~tunefleet.engine.shard.ShardRun` records the reason)."""

    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
        self.last_batch_s = 0.0
        self._mark: float | None = None

    def start(self, run: ShardRunView) -> str | None:
        return self.deadline.reason()

    def attach(self, run: ShardRunView) -> None:
        self._mark = time.monotonic()

    def before_round(self) -> str | None:
        return self.deadline.reason(self.last_batch_s)

    def after_round(self, rows: list[NewMeasurement], note: Any) -> None:
        now = time.monotonic()
        if self._mark is not None:
            self.last_batch_s = now - self._mark
        self._mark = now
