"""Shard planning and the lease state machine, on SQLite and PostgreSQL."""

from __future__ import annotations

import datetime as dt
import multiprocessing
from collections.abc import Iterator

import pytest

from tunefleet.db import Database, NewMeasurement
from tunefleet.db.tables import utcnow
from tunefleet.planning import shard_queue
from tunefleet.planning.shard_queue import LeaseLostError


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    database.upsert_hardware_class("x86", {"kind": "llvm", "num-cores": 2}, "x86")
    database.upsert_hardware_class("arm", {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, "arm")
    m, _ = database.add_model(name="m", source="zoo", format="x", sha256="a" * 64, artifact_uri="u")
    for i, (h, w, flops) in enumerate([("aa", 1, 10.0), ("bb", 4, 5.0), ("cc", 4, 50.0)]):
        wl, _ = database.add_workload(structural_hash=h, name=f"w{i}", op_kind="dense", flops=flops, tir_json="{}")
        database.link_model_workload(m.id, wl.id, w)
    yield database
    database.close()


def test_plan_cuts_shortfall_and_is_idempotent(db: Database) -> None:
    created, view = shard_queue.plan(db, "x86", target_trials=100, shard_trials=64)
    assert sorted(s.trials for s in created) == [36, 36, 36, 64, 64, 64]
    assert all(v.new_trials == 100 for v in view)
    again, _ = shard_queue.plan(db, "x86", target_trials=100, shard_trials=64)
    assert again == []
    # other hardware classes are planned independently
    arm, _ = shard_queue.plan(db, "arm", target_trials=10)
    assert len(arm) == 3


def test_raising_target_tops_up_and_counts_measurements(db: Database) -> None:
    shard_queue.plan(db, "x86", target_trials=32, shard_trials=64)
    wl = db.workload("aa")
    hw = db.hardware_class("x86")
    shard = shard_queue.lease(db, "x86", "w1", shard_id=[s for s in shard_queue.list_shards(db) if s.workload_id == wl.id][0].id)
    assert shard is not None
    db.commit_measurements(NewMeasurement(wl.id, hw.id, f"t{i}", [0.1], shard_id=shard.id) for i in range(40))
    shard_queue.complete(db, shard.id, "w1")
    created, view = shard_queue.plan(db, "x86", target_trials=64, shard_trials=64)
    by_hash = {v.structural_hash: v for v in view}
    assert by_hash["aa"].measured == 40 and by_hash["aa"].new_trials == 24
    assert by_hash["bb"].outstanding == 32 and by_hash["bb"].new_trials == 32


def test_done_shard_budget_counts_even_if_search_space_ran_out(db: Database) -> None:
    shard_queue.plan(db, "x86", target_trials=16)
    while (s := shard_queue.lease(db, "x86", "w")) is not None:
        shard_queue.complete(db, s.id, "w")  # measured nothing: tiny search space
    created, _ = shard_queue.plan(db, "x86", target_trials=16)
    assert created == []


def test_lease_order_is_by_weight_then_flops(db: Database) -> None:
    shard_queue.plan(db, "x86", target_trials=8)
    order = []
    while (s := shard_queue.lease(db, "x86", "w")) is not None:
        order.append(db.workload(s.workload_id).structural_hash)
    assert order == ["cc", "bb", "aa"]


def test_lease_heartbeat_complete(db: Database) -> None:
    shard_queue.plan(db, "x86", target_trials=8)
    s = shard_queue.lease(db, "x86", "worker-1", lease_s=30)
    assert s is not None and s.state == "leased" and s.leases == 1 and s.lease_owner == "worker-1"
    shard_queue.heartbeat(db, s.id, "worker-1", lease_s=60)
    with pytest.raises(LeaseLostError):
        shard_queue.heartbeat(db, s.id, "someone-else")
    shard_queue.complete(db, s.id, "worker-1")
    assert shard_queue.get_shard(db, s.id).state == "done"
    with pytest.raises(LeaseLostError):
        shard_queue.complete(db, s.id, "worker-1")
    events = [h["event"] for h in shard_queue.get_shard(db, s.id).history]
    assert events == ["planned", "leased", "done"]


def test_expired_lease_is_lost_not_an_attempt_and_backs_off_then_fails(db: Database) -> None:
    shard_queue.plan(db, "x86", target_trials=8, model="m", max_leases=2)
    first = shard_queue.lease(db, "x86", "dead-1", lease_s=10)
    assert first is not None and first.lease_generation == 1
    later = utcnow() + dt.timedelta(seconds=11)
    again = shard_queue.lease(db, "x86", "w2", lease_s=10, now=later, shard_id=first.id, max_lost_leases=3)
    # a lost lease is counted apart from attempts; the first is requeued at once
    assert again is not None and again.id == first.id
    assert (again.leases, again.lost_leases, again.lease_generation) == (1, 1, 2)
    assert "lease of dead-1 (generation 1) expired" in (again.error or "")
    with pytest.raises(LeaseLostError):
        shard_queue.heartbeat(db, first.id, "dead-1")
    # the second loss backs off 5 s on the clock lease times are judged on
    t2 = later + dt.timedelta(seconds=11)
    assert shard_queue.requeue_expired(db, now=t2, max_lost_leases=3) == [first.id]
    assert shard_queue.lease(db, "x86", "w3", now=t2 + dt.timedelta(seconds=4), shard_id=first.id) is None
    third = shard_queue.lease(db, "x86", "w3", lease_s=10, now=t2 + dt.timedelta(seconds=5), shard_id=first.id)
    assert third is not None and (third.leases, third.lost_leases) == (1, 2)
    assert shard_queue.requeue_expired(db, now=t2 + dt.timedelta(seconds=16), max_lost_leases=3) == [first.id]
    failed = shard_queue.get_shard(db, first.id)
    assert failed.state == "failed" and "lost lease 3/3" in (failed.error or "") and "keep dying" in failed.error
    assert shard_queue.retry(db, [first.id]) == [first.id]
    retried = shard_queue.get_shard(db, first.id)
    assert (retried.state, retried.leases, retried.lost_leases, retried.not_before) == ("pending", 0, 0, None)


def test_owner_reclaims_its_own_lease(db: Database) -> None:
    shard_queue.plan(db, "x86", target_trials=8)
    s = shard_queue.lease(db, "x86", "task-run-1", lease_s=30)
    assert s is not None
    # a retry of the same owner (e.g. after a lost connection) gets its shard back, same attempt
    again = shard_queue.lease(db, "x86", "task-run-1", lease_s=30, reclaim=True)
    assert again is not None and again.id == s.id and again.leases == 1 and again.state == "leased"
    assert [h["event"] for h in again.history][-1] == "reclaimed"
    # without reclaim, or for another owner, the shard stays taken: they get the next one
    other = shard_queue.lease(db, "x86", "task-run-2", lease_s=30, reclaim=True)
    assert other is not None and other.id != s.id
    plain = shard_queue.lease(db, "x86", "task-run-1", lease_s=30)
    assert plain is not None and plain.id not in {s.id, other.id}


def test_fail_requeues_until_max_attempts(db: Database) -> None:
    shard_queue.plan(db, "x86", target_trials=8, max_leases=2)
    s = shard_queue.lease(db, "x86", "w")
    assert s is not None
    assert shard_queue.fail(db, s.id, "w", "builder crashed") == "pending"
    s2 = shard_queue.lease(db, "x86", "w", shard_id=s.id)
    assert s2 is not None
    assert shard_queue.fail(db, s2.id, "w", "builder crashed again") == "failed"
    assert shard_queue.get_shard(db, s.id).error == "builder crashed again"


def test_cancel_takes_lease_away(db: Database) -> None:
    shard_queue.plan(db, "x86", target_trials=8)
    s = shard_queue.lease(db, "x86", "w")
    assert s is not None
    cancelled = shard_queue.cancel(db, hardware="x86")
    assert s.id in cancelled and len(cancelled) == 3
    with pytest.raises(LeaseLostError):
        shard_queue.heartbeat(db, s.id, "w")
    assert shard_queue.lease(db, "x86", "w") is None
    assert len(shard_queue.retry(db, hardware="x86")) == 3


def _lease_all(url: str, owner: str, out: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    db = Database(url)
    got = []
    while (s := shard_queue.lease(db, "x86", owner)) is not None:
        got.append(s.id)
        shard_queue.complete(db, s.id, owner, generation=s.lease_generation)
    out.put(got)


def test_concurrent_workers_never_share_a_shard(db_url: str, db: Database) -> None:
    shard_queue.plan(db, "x86", target_trials=400, shard_trials=4)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_lease_all, args=(db_url, f"w{i}", out)) for i in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
    leased = results[0] + results[1]
    assert len(leased) == 300 and len(set(leased)) == 300


def _leased_workloads(db: Database) -> list[int]:
    return sorted(s.workload_id for s in shard_queue.list_shards(db, state="leased"))


def test_one_search_per_workload_at_a_time(db: Database) -> None:
    """A workload being searched by one worker waits for it: another worker takes another
    workload's shard, and the workload's next shard once the first is done."""
    shard_queue.plan(db, "x86", target_trials=16, shard_trials=8)  # two shards per workload
    held = [shard_queue.lease(db, "x86", f"w{i}") for i in range(4)]
    assert held[3] is None, "a second shard of a workload being searched was leased"
    assert len(set(_leased_workloads(db))) == 3
    first = held[0]
    assert first is not None
    shard_queue.complete(db, first.id, "w0", generation=first.lease_generation)
    again = shard_queue.lease(db, "x86", "w3")
    assert again is not None and again.workload_id == first.workload_id and again.id != first.id


def test_racing_leases_of_one_workload_leave_one_leased(db_url: str, db: Database) -> None:
    """Worker A picks a shard of workload cc; before its UPDATE lands, worker B leases cc's other
    shard (interleaved through a SQLAlchemy event). A's UPDATE then breaks the one-lease-per-
    workload index: A moves on to another workload."""
    from sqlalchemy import event

    shard_queue.plan(db, "x86", target_trials=16, shard_trials=8)
    cc = db.workload("cc").id
    first, second = [s for s in shard_queue.list_shards(db) if s.workload_id == cc]
    other = Database(db_url)
    fired: list[int] = []

    def meanwhile(_conn, _cursor, statement, *_args):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("UPDATE SHARDS") and not fired:
            fired.append(1)
            assert shard_queue.lease(other, "x86", "B", shard_id=second.id) is not None

    event.listen(db.engine, "before_cursor_execute", meanwhile)
    try:
        mine = shard_queue.lease(db, "x86", "A")
    finally:
        event.remove(db.engine, "before_cursor_execute", meanwhile)
        other.close()
    assert fired and mine is not None
    assert mine.workload_id != cc
    assert _leased_workloads(db).count(cc) == 1


def test_unknown_state_and_class(db: Database) -> None:
    from tunefleet.errors import NotFoundError, TunefleetError

    with pytest.raises(TunefleetError, match="unknown shard state"):
        shard_queue.list_shards(db, state="sleeping")
    with pytest.raises(NotFoundError, match="unknown hardware class 'tpu'"):
        shard_queue.plan(db, "tpu", target_trials=1)
