"""What a worker does with its lease: owner ids unique per process start, a heartbeat whose
thread dies stops the shard's work, and a shard resumed after a worker death measures the
candidates then in flight one at a time (real TVM tuning of the tiny ``mlp``)."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from typing import Any

import pytest

from tunefleet.engine import heartbeat as heartbeat_module
from tunefleet.engine.heartbeat import Heartbeat
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.shard import ShardKit, ShardRun, run_shard
from tunefleet.engine.worker import OWNER_TOKEN_ENV, worker_owner
from tunefleet.errors import HeartbeatStoppedError
from tunefleet.planning import shard_queue
from tunefleet.vocab import DEFAULT_TRACE_JSON, DEFAULT_TRACE_SHA256

pytestmark = pytest.mark.serial  # heartbeats against leases of seconds


def test_owner_ids_are_unique_per_process_start_and_shared_with_children(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two containers sharing a hostname whose tunefleet runs as the same pid (e.g. pid 1 in each).
    monkeypatch.delenv(OWNER_TOKEN_ENV, raising=False)
    first = worker_owner(1)
    monkeypatch.delenv(OWNER_TOKEN_ENV)
    second = worker_owner(1)
    assert first != second and first.rsplit(":", 1)[0] == second.rsplit(":", 1)[0]
    # a process it starts shares its token: the parent can name its children's leases
    code = "import os\nfrom tunefleet.engine.worker import worker_owner\nprint(os.getpid(), worker_owner())"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ})
    pid, owner = child.stdout.split()
    assert owner == worker_owner(int(pid)) and owner != worker_owner()


class _Ticks:
    """An Event stand-in for the heartbeat thread's wait: ``n`` ticks at once, then stop."""

    def __init__(self, n: int) -> None:
        self.n = n

    def wait(self, _timeout: float) -> bool:
        self.n -= 1
        return self.n < 0

    def set(self) -> None:
        self.n = 0


def test_any_exception_that_kills_the_heartbeat_is_raised_to_the_tuning_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("no route to a bug")

    monkeypatch.setattr(heartbeat_module.shard_queue, "heartbeat", broken)
    hb = Heartbeat(None, 7, "w", lease_s=30, generation=1)  # type: ignore[arg-type]
    hb._stop = _Ticks(3)  # type: ignore[assignment]
    hb._run()  # the thread's body, run here: it must end by recording its cause, not by dying silently
    assert hb.reason() == ("heartbeat of shard 7 stopped: RuntimeError: no route to a bug; the lease would lapse")
    with pytest.raises(HeartbeatStoppedError, match="heartbeat of shard 7 stopped"):
        hb.check()


def test_a_shard_keeps_its_lease_while_it_sets_up(engine, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The heartbeat starts with the lease, not with the search: one blocking step of the set-up
    (a first import, a slow read) longer than the lease must not let another worker take the
    shard before its first build (the fault-injection loop, seed 714798: the node whose compiler
    broke lost its shard so, and was never quarantined)."""
    _, db, _ = engine
    hw = db.hardware_class("x86")
    wl, _ = db.add_workload(structural_hash="00ad", name="dense", op_kind="dense", flops=1.0, tir_json="{}")
    (shard,) = db.add_shards(hw.id, [(wl.id, 8, 1.0)])
    lease_s = 3.0
    leased = shard_queue.lease(db, "x86", "w", lease_s=lease_s, shard_id=shard.id)
    assert leased is not None
    seen: list[Any] = []

    def slow_set_up(self: ShardRun, _policies: Any) -> bool:
        time.sleep(2 * lease_s)  # one step, nothing returns meanwhile
        seen.append(shard_queue.requeue_expired(db))  # what another worker's lease does first
        seen.append((db.shard(shard.id).state, db.shard(shard.id).lease_owner))
        raise RuntimeError("set-up ends here")

    monkeypatch.setattr(ShardRun, "resolve", slow_set_up)
    options = TuneOptions(lease_s=lease_s, warm_start_shapes=False, transfer=False)
    with pytest.raises(RuntimeError, match="set-up ends here"):
        run_shard(db, leased, "w", options, ShardKit())
    assert seen == [[], ("leased", "w")]


@pytest.mark.slow
def test_a_resumed_shard_measures_its_suspects_alone_and_a_dead_heartbeat_stops_the_search(
        engine, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from tunefleet.db.shards import InFlightRow, LeaseFence
    from tunefleet.models.ingest import ingest
    from tunefleet.models.workloads import extract

    _, db, store = engine
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    hw = db.hardware_class("x86")
    wl = db.workloads(model.id)[0][0]
    suspect, stuck = db.add_shards(hw.id, [(wl.id, 4, 2.0), (wl.id, 4, 1.0)])
    # a worker died with the default schedule in flight among others: its lease is lost
    past = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(hours=1)
    dead = db.lease_shard(hw.id, "dead", lease_s=1, shard_id=suspect.id, now=past)
    assert dead is not None
    db.set_in_flight(LeaseFence(suspect.id, "dead", dead.lease_generation),
                     [InFlightRow(DEFAULT_TRACE_SHA256, DEFAULT_TRACE_JSON), InFlightRow("f" * 64, DEFAULT_TRACE_JSON)])
    db.set_in_flight(LeaseFence(suspect.id, "dead", dead.lease_generation), [InFlightRow(DEFAULT_TRACE_SHA256,
                                                                                         DEFAULT_TRACE_JSON)])
    shard_queue.requeue_expired(db)
    leased = shard_queue.lease(db, "x86", "w", shard_id=suspect.id)
    assert leased is not None and [s.trace_sha256 for s in db.suspects(suspect.id)] == [DEFAULT_TRACE_SHA256]
    batches: list[list[str]] = []
    options = TuneOptions(seed=0, trials_per_iter=3, warm_start_shapes=False, transfer=False)
    result = run_shard(db, leased, "w", options, ShardKit(on_batch=lambda _s, b: batches.append([h for h, _ in b])))
    assert result.state == "done" and batches[0] == [DEFAULT_TRACE_SHA256] and len(batches[1]) == 3
    assert db.suspects(suspect.id) == []

    # a heartbeat that died before the first round: no batch is measured, the attempt is not spent
    def dead_heartbeat(self: Heartbeat) -> Heartbeat:
        self.stopped = f"heartbeat of shard {self.shard_id} stopped: RuntimeError: gone; the lease would lapse"
        self._stop.set()  # the thread never beats
        return self

    monkeypatch.setattr(Heartbeat, "start", dead_heartbeat)
    leased = shard_queue.lease(db, "x86", "w", shard_id=stuck.id)
    assert leased is not None
    with pytest.raises(HeartbeatStoppedError, match=f"heartbeat of shard {stuck.id} stopped"):
        run_shard(db, leased, "w", options, ShardKit())
    assert db.count_measurements(shard_id=stuck.id) == 0
    left = db.shard(stuck.id)
    assert (left.state, left.leases, left.lease_owner) == ("leased", 1, "w")


@pytest.mark.slow
def test_a_suspect_committed_meanwhile_by_a_sibling_shard_is_not_measured_again(engine) -> None:  # type: ignore[no-untyped-def]
    # The fault loop's one refused commit (a shard's history with "duplicates": 1): a worker died
    # with a candidate in flight, a sibling shard of the workload measured the same candidate while
    # the first waited to be leased again, and the resumed shard handed it out as a suspect anyway.
    import tvm

    from tunefleet.db import NewMeasurement
    from tunefleet.db.shards import InFlightRow, LeaseFence
    from tunefleet.models.ingest import ingest
    from tunefleet.models.workloads import extract

    _, db, store = engine
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    hw = db.hardware_class("x86")
    wl = db.workloads(model.id)[0][0]
    died, sibling = db.add_shards(hw.id, [(wl.id, 3, 2.0), (wl.id, 3, 1.0)])
    past = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(hours=1)
    dead = db.lease_shard(hw.id, "dead", lease_s=1, shard_id=died.id, now=past)
    assert dead is not None
    db.set_in_flight(LeaseFence(died.id, "dead", dead.lease_generation),
                     [InFlightRow(DEFAULT_TRACE_SHA256, DEFAULT_TRACE_JSON)])
    shard_queue.requeue_expired(db)
    assert [s.trace_sha256 for s in db.suspects(died.id)] == [DEFAULT_TRACE_SHA256]
    # meanwhile the sibling's search measured that candidate
    assert db.commit_measurements([NewMeasurement(wl.id, hw.id, DEFAULT_TRACE_JSON, [1e-4, 1e-4], shard_id=sibling.id,
                                                  tvm_version=tvm.__version__)]) == 1
    leased = shard_queue.lease(db, "x86", "w", shard_id=died.id)
    assert leased is not None
    batches: list[list[str]] = []
    options = TuneOptions(seed=0, trials_per_iter=3, warm_start_shapes=False, transfer=False)
    result = run_shard(db, leased, "w", options, ShardKit(on_batch=lambda _s, b: batches.append([h for h, _ in b])))
    assert result.state == "done" and batches and DEFAULT_TRACE_SHA256 not in batches[0]
    history = db.shard(died.id).history or []
    assert not [e for e in history if e.get("duplicates")], history
