"""Fenced leases on SQLite and PostgreSQL: a stale owner stores nothing, expiry is judged on the
database's clock, a heartbeat beats a concurrent requeue, and a candidate that keeps killing
workers is recorded as a crash instead of failing its shard."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import pytest
from sqlalchemy import event

from tunefleet.db import Database, NewMeasurement
from tunefleet.db.shards import InFlightRow, LeaseFence
from tunefleet.errors import StaleLeaseError
from tunefleet.planning import shard_queue
from tunefleet.vocab import CRASH


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    database.upsert_hardware_class("x86", {"kind": "llvm", "num-cores": 2}, "x86")
    database.add_workload(structural_hash="aa", name="w0", op_kind="dense", flops=1.0, tir_json="{}")
    database.add_workload(structural_hash="bb", name="w1", op_kind="dense", flops=1.0, tir_json="{}")
    yield database
    database.close()


def _shard(db: Database, trials: int = 8, workload: str = "aa") -> int:
    (shard,) = db.add_shards(db.hardware_class("x86").id, [(db.workload(workload).id, trials, 1.0)])
    return shard.id


def _real_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


def _rows(db: Database, shard_id: int, n: int, start: int = 0) -> list[NewMeasurement]:
    wl, hw = db.workload("aa").id, db.hardware_class("x86").id
    return [NewMeasurement(wl, hw, f"trace-{i}", [0.1], shard_id=shard_id) for i in range(start, start + n)]


def _expire(db: Database, shard_id: int, owner: str) -> None:
    """Take the shard's lease as ``owner`` with an expiry already past (the worker then 'dies')."""
    past = _real_now() - dt.timedelta(hours=1)
    assert db.lease_shard(db.hardware_class("x86").id, owner, lease_s=1, shard_id=shard_id, now=past) is not None


@pytest.mark.parametrize("n", [3, 40])  # 40: PostgreSQL's COPY path
def test_stale_owner_commit_is_refused_and_stores_nothing(db: Database, n: int) -> None:
    sid = _shard(db)
    _expire(db, sid, "a")
    stale = LeaseFence(sid, "a", db.shard(sid).lease_generation)
    taken = shard_queue.lease(db, "x86", "b", shard_id=sid)  # requeues a's expired lease, then leases it
    assert taken is not None and taken.lease_generation == stale.generation + 1
    with pytest.raises(StaleLeaseError, match=f"shard {sid}: commit of {n} measurement.*no longer current"):
        db.commit_measurements(_rows(db, sid, n), fence=stale)
    assert db.count_measurements(shard_id=sid) == 0
    assert db.commit_measurements(_rows(db, sid, n), fence=LeaseFence(sid, "b", taken.lease_generation)) == n
    # a reclaim by the same owner string fences out whatever the earlier holder still does
    again = shard_queue.lease(db, "x86", "b", shard_id=sid, reclaim=True)
    assert again is not None and again.lease_generation == taken.lease_generation + 1
    with pytest.raises(StaleLeaseError):
        db.commit_measurements(_rows(db, sid, 2, start=n), fence=LeaseFence(sid, "b", taken.lease_generation))
    with pytest.raises(shard_queue.LeaseLostError):
        shard_queue.heartbeat(db, sid, "b", generation=taken.lease_generation)
    with pytest.raises(shard_queue.LeaseLostError):
        shard_queue.complete(db, sid, "b", generation=taken.lease_generation)
    shard_queue.complete(db, sid, "b", generation=again.lease_generation)
    assert db.count_measurements(shard_id=sid) == n


def test_a_heartbeat_that_extends_the_lease_wins_against_a_concurrent_requeue(db: Database, db_url: str) -> None:
    sid = _shard(db)
    _expire(db, sid, "a")
    other = Database(db_url)  # the heartbeat's worker, on its own connection
    beats: list[bool] = []

    # Interleave: the heartbeat lands after the requeue read the expired lease, before its UPDATE.
    def heartbeat_first(conn, cursor, statement, params, context, executemany):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("UPDATE SHARDS") and not beats:
            beats.append(other.heartbeat_lease(sid, "a", lease_s=60))

    event.listen(db.engine, "before_cursor_execute", heartbeat_first)
    try:
        assert shard_queue.requeue_expired(db) == []
    finally:
        event.remove(db.engine, "before_cursor_execute", heartbeat_first)
        other.close()
    assert beats == [True]
    kept = db.shard(sid)
    assert (kept.state, kept.lease_owner, kept.lost_leases) == ("leased", "a", 0)


def test_a_worker_clock_an_hour_off_neither_expires_others_nor_keeps_its_own(
        db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    mine, theirs = _shard(db), _shard(db, workload="bb")
    fresh = shard_queue.lease(db, "x86", "honest", lease_s=60, shard_id=theirs)
    assert fresh is not None
    ahead = lambda: _real_now() + dt.timedelta(hours=1)
    for module in ("tunefleet.db.tables", "tunefleet.db.shards", "tunefleet.planning.shard_queue"):
        monkeypatch.setattr(f"{module}.utcnow", ahead, raising=False)
    skewed = shard_queue.lease(db, "x86", "skewed", lease_s=60, shard_id=mine)  # requeues what it thinks expired
    assert skewed is not None
    assert db.shard(theirs).state == "leased" and db.shard(theirs).lease_owner == "honest"
    for sid in (mine, theirs):
        shard_queue.heartbeat(db, sid, db.shard(sid).lease_owner or "", lease_s=60)
        expires = db.shard(sid).lease_expires_at
        assert expires is not None and expires < _real_now() + dt.timedelta(seconds=120), "judged on its own clock"


def test_a_candidate_in_flight_alone_at_a_second_death_is_recorded_as_a_crash(db: Database) -> None:
    sid = _shard(db)
    batch = [InFlightRow(f"{c * 64}", f"trace-{c}", [["TENSOR", "float32", [4], None]], "llvm", "0.27")
             for c in "abc"]
    # first death: a batch of three in flight; the lease is lost, not an attempt, no crash yet
    _expire(db, sid, "w1")
    db.set_in_flight(LeaseFence(sid, "w1", 1), batch)
    assert shard_queue.requeue_expired(db) == [sid]
    got = db.shard(sid)
    assert (got.state, got.leases, got.lost_leases) == ("pending", 0, 1)
    assert [s.trace_sha256 for s in db.suspects(sid)] == [r.trace_sha256 for r in batch]
    assert db.count_measurements(shard_id=sid) == 0
    # the next worker measures the suspects one at a time: "a" commits (no longer a suspect) ...
    _expire(db, sid, "w2")
    fence = LeaseFence(sid, "w2", 2)
    db.set_in_flight(fence, batch[:1])
    wl, hw = db.workload("aa").id, db.hardware_class("x86").id
    db.commit_measurements([NewMeasurement(wl, hw, "trace-a", [0.1], shard_id=sid, trace_sha256="a" * 64)],
                           fence=fence)
    assert [s.trace_sha256 for s in db.suspects(sid)] == ["b" * 64, "c" * 64]
    # ... and its worker dies with "b" alone in flight: "b" is a crash, the shard goes on
    db.set_in_flight(fence, batch[1:2])
    assert shard_queue.requeue_expired(db) == [sid]
    crash = [m for m in db.measurements() if m.shard_id == sid and m.error_kind == CRASH]
    assert [(m.trace_sha256, m.trace_json, m.mean_run_s) for m in crash] == [("b" * 64, "trace-b", None)]
    assert "died 2 times" in (crash[0].error_msg or "")
    assert "b" * 64 in db.measured_trace_hashes(wl, hw)  # counted as spent, never proposed again
    assert [s.trace_sha256 for s in db.suspects(sid)] == ["c" * 64]
    got = db.shard(sid)
    assert (got.state, got.leases, got.lost_leases) == ("pending", 0, 2)
    assert got.not_before is not None  # the second loss backs off
    # done: nothing of the shard stays in flight
    now = _real_now() + dt.timedelta(seconds=10)
    done = db.lease_shard(hw, "w3", lease_s=60, shard_id=sid, now=now)
    assert done is not None
    shard_queue.complete(db, sid, "w3", generation=done.lease_generation)
    assert db.suspects(sid) == []
