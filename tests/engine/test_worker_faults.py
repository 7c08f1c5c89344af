"""Workers that keep going: faults that are not a shard's cost it no attempt, on SQLite and PostgreSQL.

A database error inside a MetaSchedule callback (``get_top_k``, called from C++) is retried, not
charged to the shard; a lost lease moves the worker on; a builder that cannot start never touches
a shard, and after a few failed starts in a row the worker stops with one line. Faults come
through hooks (SQLAlchemy events, the worker's ``on_batch``, an injected builder factory).
"""

from __future__ import annotations

import contextlib
import sqlite3
import traceback
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import make_url

from tests.conftest import on_backend
from tunefleet.db import Database
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.worker import START_FAILURES, Backoff, Tuner, drain
from tunefleet.errors import WorkerStartError
from tunefleet.models.ingest import ingest
from tunefleet.models.workloads import extract
from tunefleet.planning import shard_queue
from tunefleet.testing.tcp_proxy import TcpProxy
from tunefleet.vocab import CANCELLED, DONE, PENDING

NO_WAIT = Backoff(factor=0)


def test_worker_stops_after_k_failed_starts_without_touching_a_shard(engine) -> None:  # type: ignore[no-untyped-def]
    _, db, _ = engine
    hw = db.hardware_class("x86")
    wl, _ = db.add_workload(structural_hash="00ab", name="dense", op_kind="dense", flops=1.0, tir_json="{}")
    (shard,) = db.add_shards(hw.id, [(wl.id, 8, 1.0)])
    starts: list[int] = []

    def broken_builder(threads: int) -> Any:
        starts.append(threads)
        raise OSError(14, "Bad address")  # as TVM's popen pool once failed to fork here

    with pytest.raises(WorkerStartError) as err:
        drain(db, "x86", tuner=Tuner(db, "x86", make_builder=broken_builder), backoff=NO_WAIT)
    message = str(err.value)
    assert "\n" not in message and f"{START_FAILURES} times in a row" in message and "Bad address" in message
    assert len(starts) == START_FAILURES
    after = db.shard(shard.id)
    assert (after.state, after.leases) == (PENDING, 0)  # never leased: no attempt spent


def test_a_worker_with_nothing_to_lease_starts_no_builder(engine) -> None:  # type: ignore[no-untyped-def]
    """Only done and cancelled shards: the worker ends without starting its builder and runner
    (seconds of processes for nothing); a pending shard starts them."""
    _, db, _ = engine
    hw = db.hardware_class("x86")
    wl, _ = db.add_workload(structural_hash="00ac", name="dense", op_kind="dense", flops=1.0, tir_json="{}")
    (shard,) = db.add_shards(hw.id, [(wl.id, 8, 1.0)])
    shard_queue.cancel(db, [shard.id])
    starts: list[int] = []

    def counted_builder(threads: int) -> Any:
        starts.append(threads)
        raise OSError(14, "Bad address")

    summary = drain(db, "x86", tuner=Tuner(db, "x86", make_builder=counted_builder), backoff=NO_WAIT)
    assert (summary.shards_done, summary.measured, starts) == (0, 0, [])
    db.add_shards(hw.id, [(wl.id, 8, 1.0)])
    with pytest.raises(WorkerStartError):
        drain(db, "x86", tuner=Tuner(db, "x86", make_builder=counted_builder), backoff=NO_WAIT)
    assert len(starts) == START_FAILURES


def test_the_cost_model_is_read_before_a_shard_is_leased(engine, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """Nothing slow runs between the lease and the shard's heartbeat (which starts in
    ``ShardRun.run``): a first read of the class's cost model (xgboost's import, the file from the
    store) there outlasted a short lease, and the shard was lost before its first build (the
    fault-injection loop, seed 502255)."""
    import tunefleet.engine.worker as worker

    _, db, _ = engine
    hw = db.hardware_class("x86")
    wl, _ = db.add_workload(structural_hash="00ad", name="dense", op_kind="dense", flops=1.0, tir_json="{}")
    (shard,) = db.add_shards(hw.id, [(wl.id, 8, 1.0)])
    states_when_read: list[str] = []
    model = object()  # what the read returns

    def read(self: Tuner, db_: Database, options: TuneOptions | None = None) -> object:
        states_when_read.append(db_.shard(shard.id).state)
        return model

    def tuned(db_: Database, leased: Any, owner: str, options: TuneOptions, kit: Any) -> Any:
        assert kit.trained_model is model  # what the read returned goes to the shard
        return worker.ShardResult(leased.id, DONE, 0, 0, 0, None, 0.0)

    monkeypatch.setattr(Tuner, "start", lambda self: None)  # no builder or runner processes: nothing is tuned
    for part in ("builder", "runner", "online_model"):
        monkeypatch.setattr(Tuner, part, None)
    monkeypatch.setattr(Tuner, "cost_model", read)
    monkeypatch.setattr(worker, "run_shard", tuned)
    result = Tuner(db, "x86").tune_next(db, "me")
    assert result is not None and result.shard_id == shard.id
    assert states_when_read == [PENDING]


@pytest.mark.slow
def test_drain_survives_a_database_drop_in_a_callback_and_a_lost_lease(engine, db_url: str) -> None:  # type: ignore[no-untyped-def]
    """Two shards: the first loses its database connection inside ``get_top_k`` (MetaSchedule
    calls it from C++) and resumes with no attempt spent; the second is cancelled after its first
    batch, and the worker moves on instead of stopping."""
    settings, db, store = engine
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    planned, _ = shard_queue.plan(db, "x86", target_trials=4, shard_trials=4, model=model.id)
    shard_queue.cancel(db, [planned[-1].id])  # two shards are enough

    with contextlib.ExitStack() as stack:
        url = make_url(db_url)
        proxy = None  # SQLite: no connection to drop, a lock timeout instead
        if url.get_backend_name() == "postgresql":
            proxy = stack.enter_context(TcpProxy(url.host or "127.0.0.1", url.port or 5432))
        worker_db = db if proxy is None else Database(
            url.set(port=proxy.port).render_as_string(hide_password=False), connect_timeout_s=2)
        faulted: dict[str, Any] = {}

        @event.listens_for(worker_db.engine, "before_cursor_execute")
        def _drop_in_get_top_k(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
            if faulted.get("armed") and "ORDER BY measurements.mean_run_s" in statement:
                faulted["armed"] = False
                faulted["in"] = [frame.name for frame in traceback.extract_stack()]
                if proxy is None:
                    raise sqlite3.OperationalError("database is locked")  # what a lock timeout raises
                proxy.drop_connections()

        def on_batch(shard_id: int | None, rows: list[Any]) -> None:
            if "shard" not in faulted:  # the first shard: the database goes away in its next round
                faulted.update(shard=shard_id, armed=True)
            elif shard_id != faulted["shard"] and "cancelled" not in faulted:
                faulted["cancelled"] = shard_id
                shard_queue.cancel(db, [shard_id])

        summary = drain(worker_db, "x86", TuneOptions(seed=0, trials_per_iter=2, warm_start_shapes=False),
                        on_batch=on_batch, backoff=NO_WAIT)
        if proxy is not None:
            worker_db.close()

    assert "get_top_k" in faulted["in"], "the fault did not hit the C++-called get_top_k"
    first, second = db.shard(faulted["shard"]), db.shard(faulted["cancelled"])
    assert (first.state, first.leases) == (DONE, 1), first.history
    assert not any("attempt-failed" in h["event"] for h in first.history)
    assert second.state == CANCELLED
    assert summary.shards_done == 1 and summary.shards_failed == 0


@pytest.mark.slow
@on_backend("sqlite")  # the fault is injected above the database (the commit, then an error): one backend shows it
def test_a_shard_marked_done_before_its_acknowledgement_was_lost_is_counted_not_tuned_again(
        engine, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    """The connection drops just after the commit that marks a shard done: the worker sees an
    error, yet the shard is done. The retry counts it (it would have leased the next shard and
    left this one out of the summary), and every shard is tuned once."""
    from tunefleet.engine import shard as shard_module
    from tunefleet.errors import DatabaseUnavailableError

    _, db, store = engine
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    planned, _ = shard_queue.plan(db, "x86", target_trials=2, shard_trials=2, model=model.id)
    shard_queue.cancel(db, [planned[-1].id])  # two shards are enough
    real_complete = shard_queue.complete
    lost: list[int] = []

    def complete_then_lose_the_acknowledgement(db_: Database, shard_id: int, owner: str, **kw: Any) -> None:
        real_complete(db_, shard_id, owner, **kw)
        if not lost:
            lost.append(shard_id)
            raise DatabaseUnavailableError("database test failed: server closed the connection unexpectedly")

    monkeypatch.setattr(shard_module.shard_queue, "complete", complete_then_lose_the_acknowledgement)
    summary = drain(db, "x86", TuneOptions(seed=0, trials_per_iter=2, warm_start_shapes=False, transfer=False),
                    backoff=NO_WAIT)

    assert lost, "the fault never fired"
    shards = [db.shard(s.id) for s in planned[:-1]]
    assert [(s.state, s.leases) for s in shards] == [(DONE, 1), (DONE, 1)], [s.history for s in shards]
    assert (summary.shards_done, summary.shards_failed) == (2, 0)
    assert summary.measured == 4  # the lost acknowledgement's shard's 2 trials counted once
