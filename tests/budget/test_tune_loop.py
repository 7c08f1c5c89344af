"""The tuning loop's steps (:class:`tunefleet.engine.loop.TuneLoop`), driven by hand on SQLite: a
budget's round planned when nothing can be leased, a wait (not another round) for pending shards
that cannot be leased yet, and a stop at the deadline or after ``max_shards``."""

from __future__ import annotations

from tests.budget.test_rounds import Clock, db  # noqa: F401 - the fixture
from tunefleet.budget import Budget
from tunefleet.db import Database
from tunefleet.engine.loop import IDLE_POLL_S, Lease, Refill, Stop, TuneLoop, Wait
from tunefleet.engine.shard import ShardResult
from tunefleet.planning.rounds import Deadline, Rounds
from tunefleet.vocab import DONE


def _shard(shard_id: int) -> ShardResult:
    return ShardResult(shard_id, DONE, 8, 0, 0, 1e-3, 2.0)


def test_a_budget_plans_when_nothing_is_leased_then_waits_for_what_it_cannot_lease(db: tuple[Database, int]) -> None:  # noqa: F811
    database, model = db
    clock = Clock()
    rounds = Rounds("x86", [model], Budget(trials=100), started_at=clock(), min_trials=8, batch=8, clock=clock)
    loop = TuneLoop("x86", rounds=rounds)
    step = loop.next_step(database)
    assert step == Lease(None, allocated=True)  # a round's priorities are the allocator's
    loop.leased(None)
    step = loop.next_step(database)
    assert isinstance(step, Refill) and step.rounds is rounds
    loop.refilled(step.rounds.refill(database))  # round 1: a shard per workload
    assert isinstance(loop.next_step(database), Lease)
    loop.leased(None)  # its shards are pending, but none could be leased (another worker's workloads)
    assert loop.next_step(database) == Wait(IDLE_POLL_S)  # wait for them: planning again would plan nothing
    assert isinstance(loop.next_step(database), Lease)
    loop.leased(_shard(1))
    assert isinstance(loop.next_step(database), Lease)
    loop.leased(None)
    assert isinstance(loop.next_step(database), Refill)  # a shard later, the rounds may go on
    summary = loop.finish(budget={"budget": "100"})  # closed by the driver (the end_rounds task)
    assert (summary.shards_done, summary.measured, summary.budget, summary.stopped) == (1, 8, {"budget": "100"}, None)


def test_a_loop_stops_at_the_deadline_and_after_max_shards(db: tuple[Database, int]) -> None:  # noqa: F811
    database, _ = db
    clock = Clock()
    loop = TuneLoop("x86", deadline=Deadline(clock() + 10, clock=clock))
    assert isinstance(loop.next_step(database), Lease)
    clock.t += 10
    assert loop.next_step(database) == Stop("deadline: reached")
    assert loop.next_step(database) == Stop("deadline: reached")  # over is over
    assert loop.finish().stopped == "deadline: reached"

    capped = TuneLoop("x86", max_shards=1)
    capped.leased(_shard(1))
    assert capped.next_step(database) == Stop(None)
    nothing = TuneLoop("x86")
    nothing.leased(None)
    assert nothing.next_step(database) == Stop(None)  # no pending shard, no budget: the queue is drained
    assert [r.shard_id for r in capped.results] == [1] and capped.finish().as_dict()["seconds_per_candidate"] == {
        "total": 0.25, "search": 0.0, "build": 0.0, "run": 0.0, "other": 0.25}
