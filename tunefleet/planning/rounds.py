"""A model-level budget spent in rounds: planning each round, and the deadline.

:class:`Rounds` is what a worker's loop (:class:`tunefleet.engine.loop.TuneLoop`) asks for the next
round's shards when no shard is pending (:meth:`Rounds.refill`): the worker goes on with the same
builder, runner and online cost model, so re-planning costs a database round trip, not a tuner
start. The rounds end when the trial budget is spent, at the deadline, or when no workload can use
more trials (:func:`tunefleet.planning.allocation.allocate`). Every worker process may refill; the
trial count is read from the database each time, so it holds across workers (see
:func:`plan_round` for the one race left). Where the rounds stand crosses processes and Prefect
tasks as a :class:`RoundsState` (:attr:`Rounds.state`, :meth:`Rounds.resume`).

:class:`Deadline` is when tuning must stop — a duration budget's end, less the time the build
after it needs — and how long a search batch takes here
(:class:`tunefleet.engine.policies.DeadlinePolicy` stops a shard's search before a batch that
would not end in time).

A model-level budget (``tunefleet run --budget``) is spent in rounds planned by
:func:`plan_round`: it reads the model's workloads from the database, asks the allocator
(:func:`tunefleet.planning.allocation.allocate`) for the round and creates its shards, whose priorities are
the allocator's (per joule when energy-aware). Which rule is used when: shards of a budget's round
are leased in the allocator's order (:func:`tunefleet.energy.priorities.reprioritise` is for flat plans, ``--trials``), and the
trials a preempted shard of a round did not use go back to the budget for the next round instead of
to :func:`tunefleet.energy.priorities.reallocate`'s recipients. Which rounds and deadline a request
gets (and its parameter errors) is :class:`tunefleet.planning.spend.Spend`'s.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tunefleet.budget import Budget, format_duration
from tunefleet.db.tables import utcnow
from tunefleet.planning.allocation import DEFAULT_MIN_TRIALS, RoundPlan, WorkloadHistory, allocate, build_reserve_s

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.db.tables import Shard

log = logging.getLogger(__name__)

DEADLINE = "deadline"

#: Schedules of the hub (or of another compatible class) that the replay round measures for each
#: workload, besides its default schedule (:meth:`Rounds.refill`).
REPLAY_SEEDS = 2
#: What a first round is expected to take, in seconds: a shard's start (its search space, its
#: first builds) and each of its trials. Estimates to decide whether a first round fits before the
#: deadline (else the replay round runs instead) and to bound the replay round, not measurements:
#: the run's summary says how long it took (docs/performance.md, the 2-minute run).
SHARD_START_S = 4.0
TRIAL_S = 0.5
#: A worker's own start before its first shard (its builder and runner processes): a replay round
#: of a workload or two, whose deadline is its shards' estimate, ended before its first batch.
WORKER_START_S = 15.0


def first_round_s(trials: Sequence[int]) -> float:
    """The expected seconds of a first round of shards of ``trials`` trials each."""
    return sum(SHARD_START_S + n * TRIAL_S for n in trials)


class Deadline:
    """When tuning must stop: ``at``, seconds since the epoch (so it holds across processes)."""

    def __init__(self, at: float, *, clock: Callable[[], float] = time.time) -> None:
        self.at = at
        self.clock = clock

    def left_s(self) -> float:
        return self.at - self.clock()

    def reason(self, ahead_s: float = 0.0) -> str | None:
        """Why tuning must stop now — the deadline passed, or less than ``ahead_s`` (what the next
        batch is expected to take) is left — or None."""
        left = self.left_s()
        if left > ahead_s:
            return None
        if left > 0:
            return f"{DEADLINE}: {left:.0f}s left, less than the last search batch took ({ahead_s:.0f}s)"
        return f"{DEADLINE}: reached"


@dataclass(frozen=True)
class RoundsState:
    """Where a budget's rounds stand, as plain typed data: what crosses a process (``tune
    --workers``) or a Prefect task (``plan_round``, ``end_rounds``) boundary.

    :attr:`Rounds.state` makes one and :meth:`Rounds.resume` rebuilds the rounds from it; the
    fields are :class:`Rounds`'s (``deadline_at``: its deadline's, None without one).
    """

    hardware: str
    model_ids: tuple[int, ...]
    budget: Budget
    started_at: float
    reserve_builds: int = 0
    confirm_top: int = 0
    min_trials: int = DEFAULT_MIN_TRIALS
    batch: int = 64
    energy_aware: bool = False
    rounds: int = 0
    stopped: str | None = None
    reserve_s: float = 0.0
    spent: int | None = None
    deadline_at: float | None = None


@dataclass
class Rounds:
    """A model-level budget spent in rounds by a worker: which models on which class, the budget,
    when it started, and the allocator's knobs.

    ``started_at`` (seconds since the epoch) starts the budget's clock: a duration budget's
    tuning ends ``seconds`` later, less the time ``reserve_builds`` builds of the model after it
    need (:func:`tunefleet.planning.allocation.build_reserve_s`, refreshed every round; 0 for a ``tune``
    that builds nothing), each re-timing ``confirm_top`` schedules per workload first. Trials are
    counted from ``started_at`` on. Build them from a request with
    :meth:`tunefleet.planning.spend.Spend.tuning`.
    """

    hardware: str
    model_ids: list[int]
    budget: Budget
    started_at: float = field(default_factory=time.time)
    reserve_builds: int = 0
    confirm_top: int = 0
    min_trials: int = DEFAULT_MIN_TRIALS
    batch: int = 64
    energy_aware: bool = False
    clock: Callable[[], float] = time.time
    rounds: int = 0
    stopped: str | None = None
    reserve_s: float = 0.0
    spent: int | None = None
    """Trials spent when the last round was planned (a round that spent none ends the rounds)."""
    deadline: Deadline | None = None

    def __post_init__(self) -> None:
        if self.budget.seconds is not None and self.deadline is None:
            self.deadline = Deadline(self.started_at + self.budget.seconds, clock=self.clock)

    @property
    def since(self) -> dt.datetime:
        """``started_at`` as the database's naive UTC, a second early (SQLite keeps whole seconds)."""
        return dt.datetime.fromtimestamp(self.started_at - 1, dt.timezone.utc).replace(tzinfo=None)

    def refill(self, db: Database) -> int:
        """Plan the next round; the number of the budget's shards now pending (0: the rounds are
        over, and :attr:`stopped` says why). Another worker's round counts: it is there to lease."""
        if self.stopped is not None:
            return 0
        if self.rounds == 0 and self.deadline is not None and not self.deadline.reason():
            # Before the first round: the build's reserve moves the deadline, and a first round
            # that cannot end before it would measure a shard or two and be cancelled.
            dry = plan_round(db, self.hardware, self.model_ids, self.budget, self.since, dry=True,
                             min_trials=self.min_trials, batch=self.batch, confirm_top=self.confirm_top)
            self._reserve(dry.build_reserve_s)
            need, left = first_round_s([g.trials for g in dry.plan.grants]), self.deadline.left_s()
            if 0 < left < need and (replayed := self._replay(db, f"{DEADLINE}: {left:.0f}s left, less than a "
                                                                 f"first round needs (about {need:.0f}s)")):
                return replayed  # (nothing to replay: the first round is planned all the same)
        if self.deadline is not None and (why := self.deadline.reason()):
            return (self.rounds == 0 and self._replay(db, why)) or self._stop(why)
        if self.spent is not None and self._stalled(db):
            return 0
        res = plan_round(db, self.hardware, self.model_ids, self.budget, self.since, min_trials=self.min_trials,
                         batch=self.batch, energy_aware=self.energy_aware, confirm_top=self.confirm_top,
                         time_left_s=self.deadline.left_s() if self.deadline is not None else None)
        self.rounds, self.spent = res.round, res.spent
        self._reserve(res.build_reserve_s)
        if not res.open_round_shards:
            self.stopped = res.stop or "nothing left to plan"
        return len(res.open_round_shards)

    def _stop(self, why: str) -> int:
        self.stopped = why
        return 0

    def _replay(self, db: Database, why: str) -> int:
        """The deadline (less the build's reserve) leaves no time for a first round of search: the
        workloads never measured on the class that the hub (or another compatible class) holds
        measure their default and :data:`REPLAY_SEEDS` of its best schedules instead, the other
        ones never measured their default and as many candidates of a search (of other shapes'
        schedules first, then the cost model's picks) — a default schedule left in a delivered
        model costs far more than two trials — in one round with a deadline of its own
        (:data:`WORKER_START_S` and :func:`first_round_s` of its shards from now), and the rounds
        end. Only when the hub holds at least half of those workloads (:func:`plan_replay_round`).
        A budget too short to search still delivers the fleet's schedules, measured here, for
        a little more time than it allowed. The shards pending (0: nothing to replay, nothing
        planned)."""
        res = plan_replay_round(db, self.hardware, self.model_ids, self.budget, self.since)
        self.rounds = max(self.rounds, res.round)
        if not res.shards:
            return 0
        assert self.deadline is not None
        self.deadline.at = self.clock() + WORKER_START_S + first_round_s([shard.trials for shard in res.shards])
        others = len(res.shards) - res.replayed
        self.stopped = (f"{why} before the first round: {res.replayed} workload(s) measure the hub's schedules only"
                        + (f", {others} with none the first {REPLAY_SEEDS} candidates of a search" if others else ""))
        log.info("budget %s on %s: %s", self.budget, self.hardware, self.stopped)
        return len(res.open_round_shards)

    def _stalled(self, db: Database) -> bool:
        """Whether the last round spent no trial at all (every shard of it ended before its first
        batch): planning again would only repeat it, so the rounds end."""
        hw = db.hardware_class(self.hardware)
        view = db.budget_view(hw.id, self.model_ids, self.since)
        if sum(r.committed_since for r in view.rows) > (self.spent or 0) or view.open_round_shards:
            return False
        self.stopped = f"round {self.rounds} measured nothing: its shards ended before their first batch"
        return True

    def _reserve(self, build_s: float) -> None:
        if self.reserve_builds and self.budget.seconds is not None and self.deadline is not None:
            self.reserve_s = build_s * self.reserve_builds
            self.deadline.at = self.started_at + self.budget.seconds - self.reserve_s

    def why_over(self, db: Database) -> str | None:
        """Why the rounds are over (None if another round could be planned), planning nothing: for
        a process that did not refill itself (the parent of ``tune --workers`` processes)."""
        if self.stopped is not None:
            return self.stopped
        if self.deadline is not None and (why := self.deadline.reason()):
            return why
        return plan_round(db, self.hardware, self.model_ids, self.budget, self.since, min_trials=self.min_trials,
                          batch=self.batch, energy_aware=self.energy_aware, dry=True).plan.stop

    def close(self, db: Database) -> list[int]:
        """The rounds are over: cancel the pending shards of a round the deadline cut (the trials
        a trial budget planned are always tuned); their ids."""
        if self.stopped is None or not self.stopped.startswith(DEADLINE):
            return []
        return end_rounds(db, self.hardware, self.model_ids, self.since)

    def summary(self, db: Database) -> dict[str, Any]:
        """The budget, what was spent (trials committed by every worker since the start, seconds),
        the rounds and why they stopped."""
        hw = db.hardware_class(self.hardware)
        view = db.budget_view(hw.id, self.model_ids, self.since)
        return {"budget": str(self.budget), "kind": self.budget.kind,
                "trials": sum(r.committed_since for r in view.rows), "seconds": round(self.clock() - self.started_at, 1),
                "rounds": max(self.rounds, view.rounds), "stopped": self.stopped,
                "build_reserve_s": round(self.reserve_s, 1) if self.reserve_builds else None,
                "min_trials": self.min_trials, "batch": self.batch}

    def end(self, db: Database) -> dict[str, Any]:
        """:meth:`close`, then :meth:`summary` (what a loop's end reports)."""
        self.close(db)
        return self.summary(db)

    # -- across processes and tasks ------------------------------------------------------------
    @property
    def state(self) -> RoundsState:
        """Where these rounds stand, to rebuild them elsewhere (:meth:`resume`)."""
        return RoundsState(self.hardware, tuple(self.model_ids), self.budget, self.started_at,
                           reserve_builds=self.reserve_builds, confirm_top=self.confirm_top,
                           min_trials=self.min_trials, batch=self.batch,
                           energy_aware=self.energy_aware, rounds=self.rounds, stopped=self.stopped,
                           reserve_s=self.reserve_s, spent=self.spent,
                           deadline_at=self.deadline.at if self.deadline is not None else None)

    @classmethod
    def resume(cls, state: RoundsState, *, clock: Callable[[], float] = time.time) -> Rounds:
        """The rounds a :class:`RoundsState` describes, in this process."""
        rounds = cls(state.hardware, list(state.model_ids), state.budget, started_at=state.started_at,
                     reserve_builds=state.reserve_builds, confirm_top=state.confirm_top,
                     min_trials=state.min_trials, batch=state.batch,
                     energy_aware=state.energy_aware, clock=clock)
        rounds.update(state)
        return rounds

    def update(self, state: RoundsState) -> None:
        """Take over what was planned elsewhere (the ``plan_round`` task): the round, the spent
        trials, why the rounds stopped and the deadline (moved by the build's reserve), in place —
        whoever holds :attr:`deadline` sees it move."""
        self.rounds, self.stopped, self.reserve_s, self.spent = state.rounds, state.stopped, state.reserve_s, state.spent
        if state.deadline_at is not None and self.deadline is not None:
            self.deadline.at = state.deadline_at

    def describe(self) -> str:
        left = f", {format_duration(max(0.0, self.deadline.left_s()))} left" if self.deadline is not None else ""
        return f"budget {self.budget.describe()}, round {self.rounds}{left}"


# -- planning a round ---------------------------------------------------------------------
@dataclass(frozen=True)
class RoundResult:
    """One round of a model's budget as :func:`plan_round` planned it."""

    round: int
    """The round's number (1 for the first); the last round planned when nothing was."""
    shards: list[Shard]
    plan: RoundPlan
    workloads: list[WorkloadHistory]
    spent: int
    """Trials committed on the model's workloads since the budget started."""
    outstanding: int
    """Trials planned and not committed yet (this round's included)."""
    build_reserve_s: float
    """Seconds to keep for building the model afterwards (:func:`tunefleet.planning.allocation.build_reserve_s`)."""
    open_round_shards: list[int]
    replayed: int = 0
    """Of a replay round's shards (:func:`plan_replay_round`), those of workloads a compatible class
    holds (the others search)."""

    @property
    def stop(self) -> str | None:
        return None if self.shards else self.plan.stop


def plan_round(db: Database, hardware: str, model_ids: Sequence[int], budget: Budget, since: dt.datetime, *,
               min_trials: int = DEFAULT_MIN_TRIALS, batch: int = 64, energy_aware: bool = False,
               rounds: bool = True, shard_trials: int | None = None, max_leases: int = 3,
               dry: bool = False, time_left_s: float | None = None, confirm_top: int = 0) -> RoundResult:
    """Plan the next round of ``budget`` over the workloads of ``model_ids`` on a class: the shards.

    The trials a budget has left are its trials minus those committed on the models' workloads
    since ``since`` (errors and filtered candidates count) minus those planned and not committed
    yet — counted in the database, so they hold across worker processes: planners of a class take
    turns (:meth:`~tunefleet.db.shards.ShardsMixin.planning`), so two workers that refill at the
    same instant never plan the same trials twice. A duration budget has no trial count; the engine stops its
    rounds at the deadline. ``rounds=False`` plans the whole budget at once (``tunefleet plan
    --budget``). Each grant is one shard (cut in pieces of at most ``shard_trials``); its
    ``planned`` event records the round and the budget. ``dry``: plan nothing, only say what the
    round would be (or why there is none). ``time_left_s`` (a wall-time budget's time to its
    deadline) caps the round at the trials that fit at the pace so far (wall seconds per trial
    committed since the first one, shard starts included), so that the time left is split by the
    allocator rather than taken by whichever shards lease first. ``confirm_top``: the build after
    tuning re-times that many schedules per workload first (its reserve counts them).
    """
    hw = db.hardware_class(hardware)
    with db.planning(hw.id):  # a concurrent planner of the class waits, then counts these shards
        view = db.budget_view(hw.id, list(model_ids), since)
        workloads = [WorkloadHistory(r.workload_id, r.weight, tuple(r.run_s), r.committed, r.outstanding, r.default_s,
                                     r.flops, r.exhausted, r.preempted, r.joules_per_trial) for r in view.rows]
        spent = sum(r.committed_since for r in view.rows)
        outstanding = sum(r.outstanding for r in view.rows)
        left = None if budget.trials is None else budget.trials - spent - outstanding
        fit = _trials_that_fit(view.first_since, spent, time_left_s)
        cap = left if fit is None else fit if left is None else min(left, fit)
        plan = allocate(workloads, cap, min_trials=min_trials, batch=batch, rounds=rounds, energy_aware=energy_aware)
        if fit is not None and not plan.grants and allocate(workloads, left, min_trials=min_trials, batch=batch,
                                                            rounds=rounds).grants:
            plan = RoundPlan((), f"deadline: about {fit} trial(s) fit in the {time_left_s:.0f}s left, "
                                 "not enough for another round")
        builds = [r.build_s for r in view.rows if r.build_s is not None]
        took = db.step_seconds(model_ids, hw.id)  # this machine's last extraction and build of the models
        # the reserve is for the pipeline's build, which takes the model its extract step kept
        reserve = build_reserve_s(workloads, compile_s=sum(builds) / len(builds) if builds else None,
                                  confirm_top=confirm_top, extract_s=took.get("extract"),
                                  last_build_s=took.get("build"), kept=True)
        number = view.rounds + 1
        created: list[Shard] = []
        if plan.grants and not dry:
            piece = shard_trials or max(g.trials for g in plan.grants)
            cuts = [(g.workload_id, min(piece, g.trials - start), g.priority) for g in plan.grants
                    for start in range(0, g.trials, piece)]
            created = db.add_shards(hw.id, cuts, max_leases=max_leases, info={"round": number, "budget": str(budget)})
    if created:
        log.info("budget %s on %s, round %d: %d trial(s) over %d workload(s) (%s)", budget, hardware, number,
                 plan.trials, len(created), ", ".join(f"{g.workload_id}: {g.trials} {g.why}" for g in plan.grants))
    elif not dry:
        log.info("budget %s on %s: no round %d: %s", budget, hardware, number, plan.stop)
    return RoundResult(number if created else view.rounds, created, plan, workloads, spent,
                       outstanding + sum(s.trials for s in created), reserve,
                       view.open_round_shards + [s.id for s in created])


def plan_replay_round(db: Database, hardware: str, model_ids: Sequence[int], budget: Budget, since: dt.datetime, *,
                      seeds: int = REPLAY_SEEDS, max_leases: int = 3) -> RoundResult:
    """Plan the replay round (:meth:`Rounds._replay`), if no round of ``budget`` was planned yet and
    at least half of the models' workloads with no measurement on the class have a record on a
    compatible class (:func:`~tunefleet.planning.transfer.compatible_classes`: a hub class first;
    else the first round of search is planned, as without a hub): a shard of
    ``1 + seeds`` trials for each workload with no measurement on the class, the heaviest (weight x
    FLOPs) first — the default schedule and ``seeds`` transferred ones (its ``planned`` events carry
    ``replay``: the shard's transfer seeding takes all of its trials but the default's,
    :class:`~tunefleet.engine.policies.Transfer`), or for a workload no class holds, ``seeds``
    candidates of its search. ``RoundResult.replayed`` counts the first kind."""
    from tunefleet.planning.transfer import compatible_classes

    hw = db.hardware_class(hardware)
    with db.planning(hw.id):
        view = db.budget_view(hw.id, list(model_ids), since)
        rows = [r for r in view.rows if r.committed == 0 and r.outstanding == 0] if view.rounds == 0 else []
        others = [c for _, c in compatible_classes(db, hw)] if rows else []  # read once, not per workload
        held = {r.workload_id for r in rows if any(db.best_measurements(r.workload_id, c.id, 1) for c in others)}
        # A model the hub holds less than half of is better served by a first round of search, as
        # without a hub (its shards measure the hub's schedules first all the same): two trials of
        # search for most of its workloads would deliver less than the first round does.
        rows = rows if held and 2 * len(held) >= len(rows) else []
        rows.sort(key=lambda r: -r.weight * r.flops)
        cuts = [(r.workload_id, 1 + seeds, float(len(rows) - i)) for i, r in enumerate(rows)]
        created = db.add_shards(hw.id, cuts, max_leases=max_leases,
                                info={"round": 1, "budget": str(budget), "replay": True}) if cuts else []
    plan = RoundPlan((), None if created else "no workload new to the class has a record on a compatible class")
    return RoundResult(1 if created else view.rounds, created, plan, [], 0, sum(s.trials for s in created), 0.0,
                       view.open_round_shards + [s.id for s in created], replayed=len(held) if created else 0)


def _trials_that_fit(first: dt.datetime | None, spent: int, time_left_s: float | None) -> int | None:
    """Trials that fit in ``time_left_s`` at the pace since ``first`` (None: no deadline or no pace yet)."""
    if time_left_s is None or first is None or spent < 1:
        return None
    elapsed = (utcnow() - first).total_seconds()
    if elapsed <= 0:
        return None
    return max(0, int(time_left_s * spent / elapsed))


def plan_once(db: Database, hardware: str, budget: Budget, model_ids: Sequence[int] | None = None, *,
              shard_trials: int = 64, batch: int = 64, min_trials: int = DEFAULT_MIN_TRIALS,
              energy_aware: bool = False, max_leases: int = 3) -> RoundResult:
    """Split a trial budget over the workloads of ``model_ids`` (default: every model) at once,
    before anything is tuned (``tunefleet plan --budget``): every workload its minimum, the rest by
    the allocator's score, estimated from FLOPs for workloads never measured. Trials already
    planned and not tuned count against it, so planning twice in a row plans nothing new.

    ``budget`` is a number of trials: :meth:`tunefleet.planning.spend.Spend.request` refuses a
    duration for a plan, with the error its caller's user reads.
    """
    ids = list(model_ids) if model_ids else [m.id for m in db.models()]
    return plan_round(db, hardware, ids, budget, utcnow(), min_trials=min_trials, batch=batch,
                      energy_aware=energy_aware, rounds=False, shard_trials=shard_trials, max_leases=max_leases)


def end_rounds(db: Database, hardware: str, model_ids: Sequence[int], since: dt.datetime) -> list[int]:
    """Cancel the pending shards a budget's rounds planned since ``since`` (the budget ended: at
    its deadline a round may be left half done); their ids."""
    hw = db.hardware_class(hardware)
    pending = db.budget_view(hw.id, list(model_ids), since).open_round_shards
    cancelled = db.cancel_shards(pending) if pending else []
    if cancelled:
        log.info("budget over: %d pending shard(s) of its last round cancelled", len(cancelled))
    return cancelled
