"""A model-level budget inside a worker: rounds that keep the tuner alive, and a deadline.

:class:`Rounds` is what :func:`tunefleet.engine.worker.drain` asks for the next round's shards
when no shard is pending (:meth:`Rounds.refill`): the worker goes on with the same builder,
runner and online cost model, so re-planning costs a database round trip, not a tuner start.
The rounds end when the trial budget is spent, at the deadline, or when no workload can use more
trials (:func:`tunefleet.allocation.allocate`). Every worker process may refill; the trial count
is read from the database each time, so it holds across workers (see :func:`tunefleet.budget.plan_round`
for the one race left).

:class:`Deadline` is when tuning must stop — a duration budget's end, less the time the build
after it needs — and how long a search batch takes here; :class:`DeadlinePolicy` stops a shard's
search before a batch that would not end in time, and the shard ends done-short with the reason
in its history (not failed).
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tunefleet.allocation import DEFAULT_MIN_TRIALS, Budget, format_duration
from tunefleet.engine.policies import ShardPolicy

if TYPE_CHECKING:
    from tunefleet.db import Database, NewMeasurement
    from tunefleet.engine.policies import ShardRunView

log = logging.getLogger(__name__)

DEADLINE = "deadline"


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


@dataclass
class Rounds:
    """A model-level budget spent in rounds by a worker (:func:`~tunefleet.engine.worker.drain`'s
    refill): which models on which class, the budget, when it started, and the allocator's knobs.

    ``started_at`` (seconds since the epoch) starts the budget's clock: a duration budget's
    tuning ends ``seconds`` later, less the time ``reserve_builds`` builds of the model after it
    need (:func:`tunefleet.allocation.build_reserve_s`, refreshed every round; 0 for a ``tune``
    that builds nothing). Trials are counted from ``started_at`` on.
    """

    hardware: str
    model_ids: list[int]
    budget: Budget
    started_at: float = field(default_factory=time.time)
    reserve_builds: int = 0
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
        from tunefleet.budget import plan_round

        if self.stopped is not None:
            return 0
        if self.deadline is not None and (why := self.deadline.reason()):
            self.stopped = why
            return 0
        if self.spent is not None and self._stalled(db):
            return 0
        res = plan_round(db, self.hardware, self.model_ids, self.budget, self.since, min_trials=self.min_trials,
                         batch=self.batch, energy_aware=self.energy_aware,
                         time_left_s=self.deadline.left_s() if self.deadline is not None else None)
        self.rounds, self.spent = res.round, res.spent
        self._reserve(res.build_reserve_s)
        if not res.open_round_shards:
            self.stopped = res.stop or "nothing left to plan"
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

    def close(self, db: Database) -> list[int]:
        """The rounds are over: cancel the pending shards of a round the deadline cut (the trials
        a trial budget planned are always tuned); their ids."""
        from tunefleet.budget import end_rounds

        if self.stopped is None or not self.stopped.startswith(DEADLINE):
            return []
        return end_rounds(db, self.hardware, self.model_ids, self.since)

    def summary(self, db: Database) -> dict[str, Any]:
        """The budget, what was spent (trials committed by every worker since the start, seconds),
        the rounds and why they stopped."""
        hw = db.hardware_class(self.hardware)
        view = db.budget_view(hw.id, self.model_ids, self.since)
        return {"budget": str(self.budget), "kind": "duration" if self.budget.is_duration else "trials",
                "trials": sum(r.committed_since for r in view.rows), "seconds": round(self.clock() - self.started_at, 1),
                "rounds": max(self.rounds, view.rounds), "stopped": self.stopped,
                "build_reserve_s": round(self.reserve_s, 1) if self.reserve_builds else None,
                "min_trials": self.min_trials, "batch": self.batch}

    # -- across processes --------------------------------------------------------------------
    def spec(self) -> dict[str, Any]:
        """Plain data to rebuild these rounds in another process (:meth:`from_spec`)."""
        return {"hardware": self.hardware, "model_ids": list(self.model_ids), "budget": str(self.budget),
                "started_at": self.started_at, "reserve_builds": self.reserve_builds, "min_trials": self.min_trials,
                "batch": self.batch, "energy_aware": self.energy_aware, "rounds": self.rounds, "stopped": self.stopped,
                "reserve_s": self.reserve_s, "spent": self.spent,
                "deadline_at": self.deadline.at if self.deadline is not None else None}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> Rounds:
        data = dict(spec)
        deadline_at = data.pop("deadline_at", None)
        rounds = cls(**{**data, "budget": Budget.parse(data["budget"])})
        if deadline_at is not None and rounds.deadline is not None:
            rounds.deadline.at = deadline_at
        return rounds

    def describe(self) -> str:
        left = f", {format_duration(max(0.0, self.deadline.left_s()))} left" if self.deadline is not None else ""
        return f"budget {self.budget.describe()}, round {self.rounds}{left}"
