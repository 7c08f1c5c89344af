"""The tuning loop of one hardware class: what to do next, and the summary of what was done.

A worker leases shard after shard until none is left; with a model's budget it plans the next
round when the queue is empty (:class:`~tunefleet.planning.rounds.Rounds`), it stops at a
deadline, and it waits for pending shards it cannot lease yet (their workload searched by another
worker, or backing off after a lost lease). :class:`TuneLoop` decides which — one
:class:`Lease`, :class:`Refill`, :class:`Wait` or :class:`Stop` at a time — and keeps the
:class:`TuneSummary`; a driver carries each step out and tells the loop what happened. There are
two drivers: :func:`tunefleet.engine.worker.drain` (in this process, with its fault handling) and
the Prefect ``tune`` flow (a task run per lease, per round planned, and at the end).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from tunefleet.vocab import DONE

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.engine.shard import ShardResult
    from tunefleet.planning.rounds import Deadline, Rounds, RoundsState

log = logging.getLogger(__name__)

IDLE_POLL_S = 2.0
"""How often a worker that found only pending shards it cannot lease yet looks again."""


@dataclass
class TuneSummary:
    """What a worker's loop did: shards, candidates, time, and why it stopped."""

    hardware: str
    shards_done: int = 0
    shards_failed: int = 0
    measured: int = 0
    errors: int = 0
    skipped_known: int = 0
    seconds: float = 0.0
    filtered: int = 0
    preempted: int = 0
    filter_stopped: int = 0
    """Shards in which filtering stopped because the cost model did not rank their measurements."""
    warm_start_dropped: int = 0
    """Shards whose search the class's trained model stopped guiding because it misranked their
    measurements."""
    stopped: str | None = None
    """Why draining stopped before the queue was empty (a deadline, a spent budget), or None."""
    budget: dict[str, Any] | None = None
    """With a model-level budget: :meth:`~tunefleet.planning.rounds.Rounds.summary`."""
    shard_seconds: float = 0.0
    """Wall time inside shards; of it, proposing candidates, building and measuring them
    (:class:`tunefleet.tvm.commit.ShardProgress`); the rest is each shard's start (tuning
    context, design space), its commits and its end."""
    search_s: float = 0.0
    build_s: float = 0.0
    run_s: float = 0.0

    def add(self, result: ShardResult) -> None:
        """Count one tuned shard."""
        self.shard_seconds += result.seconds
        self.search_s += result.search_s
        self.build_s += result.build_s
        self.run_s += result.run_s
        self.shards_done += result.state == DONE
        self.shards_failed += result.state != DONE
        self.measured += result.measured
        self.errors += result.errors
        self.skipped_known += result.skipped_known
        self.filtered += result.filtered
        self.preempted += result.preempted is not None
        self.filter_stopped += result.filter_stopped is not None
        self.warm_start_dropped += result.warm_start_dropped is not None

    def per_candidate(self) -> dict[str, float] | None:
        """Seconds per measured candidate: search, build, run and the rest of the shards' time."""
        if not self.measured:
            return None
        other = max(0.0, self.shard_seconds - self.search_s - self.build_s - self.run_s)
        return {k: round(v / self.measured, 3) for k, v in (
            ("total", self.shard_seconds), ("search", self.search_s), ("build", self.build_s), ("run", self.run_s),
            ("other", other))}

    def as_dict(self) -> dict[str, Any]:
        """Plain data: the fields and ``seconds_per_candidate`` (:meth:`per_candidate`)."""
        return {**asdict(self), "seconds_per_candidate": self.per_candidate()}


# -- steps -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lease:
    """Lease the next shard and tune it (``Tuner.tune_next``), then :meth:`TuneLoop.leased`."""

    deadline: Deadline | None
    """No batch starts that would end after it (None: none)."""
    allocated: bool
    """The queue holds a budget's rounds, whose priorities the allocator set: leasing leaves them
    as planned (``tune_next(reprioritise=False)``)."""

    @property
    def deadline_at(self) -> float | None:
        """The deadline as seconds since the epoch (what crosses a task boundary)."""
        return None if self.deadline is None else self.deadline.at


@dataclass(frozen=True)
class Refill:
    """Plan the budget's next round — ``rounds.refill(db)`` here, or the ``plan_round`` task on
    ``rounds.state`` — then :meth:`TuneLoop.refilled`."""

    rounds: Rounds


@dataclass(frozen=True)
class Wait:
    """Sleep ``seconds``: pending shards are left that cannot be leased yet."""

    seconds: float


@dataclass(frozen=True)
class Stop:
    """The loop is over (``reason``: why, if not for an empty queue); :meth:`TuneLoop.finish`."""

    reason: str | None


Step = Lease | Refill | Wait | Stop
"""What :meth:`TuneLoop.next_step` returns."""


class TuneLoop:
    """Which step a worker of one hardware class takes next, and what its steps added up to.

    Parameters
    ----------
    hardware : str
        The hardware class whose queue is drained.
    max_shards : int, optional
        Stop after this many shards (done or failed).
    rounds : Rounds, optional
        A model's budget: when nothing can be leased, its next round is planned, until the budget
        is spent, its deadline passes or no workload can use more trials.
    deadline : Deadline, optional
        Stop leasing at this time (default the rounds' deadline, if any).
    pending : Callable[[], int], optional
        Counts the class's pending shards, for a driver that reads the database its own way (the
        Prefect flow: in a task run, retried like every task); default ``next_step``'s ``db``.

    Notes
    -----
    A driver loops ``while not isinstance(step := loop.next_step(db), Stop)``, carries out each
    step and reports it (:meth:`leased`, :meth:`refilled`; a :class:`Wait` needs no report), then
    calls :meth:`finish`. A step that raised (a lost lease, a transient error) is simply not
    reported: the next step is the same kind again. That holds for :meth:`next_step` itself, the
    one place the loop reads the database (how many shards are pending, when a lease found none):
    if that read raises, nothing changed, and the driver retries it as it retries its own steps.
    """

    def __init__(self, hardware: str, *, max_shards: int | None = None, rounds: Rounds | None = None,
                 deadline: Deadline | None = None, pending: Callable[[], int] | None = None) -> None:
        self.hardware = hardware
        self.max_shards = max_shards
        self.rounds = rounds
        self.pending = pending
        self.deadline = deadline or (rounds.deadline if rounds is not None else None)
        self.summary = TuneSummary(hardware)
        self.results: list[ShardResult] = []
        """Every shard tuned, in order."""
        self._started = time.monotonic()
        self._found_nothing = False  # the last lease found no shard
        self._refilled = False  # a round was planned since the last shard (or wait)
        self._waiting = False  # the wait is logged once, until a shard is tuned
        self._stop: Stop | None = None

    def next_step(self, db: Database | None = None) -> Step:
        """What to do next; ``db`` is read only to see whether shards are still pending (not at
        all with a ``pending`` counter)."""
        if self._stop is not None:
            return self._stop
        if self.max_shards is not None and len(self.results) >= self.max_shards:
            return self._end(None)
        if self.deadline is not None and (why := self.deadline.reason()):
            first = self.rounds is not None and self.rounds.stopped is None and self.rounds.rounds == 0
            if first and not self._refilled:
                return Refill(self.rounds)  # type: ignore[arg-type]  # the rounds may still replay the hub
            return self._end(why)
        if not self._found_nothing:
            return Lease(self.deadline, allocated=self.rounds is not None)
        planning = self.rounds if self.rounds is not None and self.rounds.stopped is None else None
        if planning is not None and not self._refilled:
            return Refill(planning)
        if self._pending(db):
            # Pending shards none of which can be leased now: their workload is searched by
            # another worker, or they back off after a lost lease. Wait for them.
            if not self._waiting:
                log.info("waiting for pending shards of %s (workloads searched by another worker, or backing "
                         "off after a lost lease)", self.hardware)
            self._waiting = True
            self._found_nothing = self._refilled = False
            return Wait(IDLE_POLL_S)
        if planning is not None:  # the round planned was leased by other workers meanwhile: plan again
            return Refill(planning)
        return self._end(None)

    def _pending(self, db: Database | None) -> int:
        """How many shards of the class are pending (read before any state changes, so a read
        that raises can simply be retried)."""
        if self.pending is not None:
            return self.pending()
        if db is None:
            raise ValueError("next_step needs db, or the loop a pending counter")
        return len(db.pending_shards(db.hardware_class(self.hardware).id))

    def leased(self, result: ShardResult | None) -> None:
        """A :class:`Lease` tuned ``result``'s shard, or found none to lease (None)."""
        if result is None:
            self._found_nothing = True
            return
        self._found_nothing = self._refilled = self._waiting = False
        self.results.append(result)
        self.summary.add(result)

    def refilled(self, pending: int, state: RoundsState | None = None) -> None:
        """A :class:`Refill` left ``pending`` shards of the budget to lease (0: the rounds are
        over); ``state``: the rounds as another process planned them (the ``plan_round`` task)."""
        if state is not None and self.rounds is not None:
            self.rounds.update(state)
        self._refilled = True
        self._found_nothing = pending == 0

    def finish(self, db: Database | None = None, *, budget: dict[str, Any] | None = None) -> TuneSummary:
        """The summary, once the loop stopped: the wall time, why it stopped and, with rounds, what
        the budget spent after they were closed (a round the deadline cut is cancelled) — here
        with ``db``, or by the driver (``budget``: what ``Rounds.end`` returned, e.g. in the
        ``end_rounds`` task)."""
        if self._stop is None:
            self._end(None)
        self.summary.seconds = time.monotonic() - self._started
        if self.rounds is not None:
            if budget is None:
                if db is None:
                    raise ValueError("finish needs db, or the budget the driver closed the rounds with")
                budget = self.rounds.end(db)
            self.summary.budget = budget
        return self.summary

    def _end(self, why: str | None) -> Stop:
        """Stop, for ``why`` or for what ended the rounds; the rounds learn why too (a deadline
        that stopped the loop cancels the rest of their round when they are closed)."""
        if self.rounds is not None:
            why = why or self.rounds.stopped
            self.rounds.stopped = self.rounds.stopped or why
        self.summary.stopped = why
        self._stop = Stop(why)
        return self._stop
