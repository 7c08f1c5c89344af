"""Nothing hangs forever, on SQLite and PostgreSQL (issue 34, item 3).

* A PostgreSQL session carries TCP keepalives and a lock, idle-in-transaction and statement
  timeout (``SHOW``); a write blocked on a row lock another session holds fails after the lock
  timeout with one line naming it, on SQLite after its busy timeout, instead of waiting forever.
* The heartbeat renews a lease only while the tuning thread makes progress (a round starts, a
  batch is proposed, a batch committed); a tuning thread stuck in a build lets its lease lapse and
  another worker takes the shard over. One build's timeout stays under half a lease.
* Ctrl-C gives the leases back even while the interrupted thread holds their row lock in an open
  transaction on another connection of the same process.

Interleavings come through hooks (a connection holding a lock, a stand-in build that blocks until
the test lets go, a fake clock); a call that would wait forever runs on a thread and fails the
test after a bound instead.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from sqlalchemy import text, update

from tests.conftest import make_db_url, on_backend
from tunefleet.config import Settings, load_settings
from tunefleet.db import Database
from tunefleet.db.tables import Shard
from tunefleet.engine import heartbeat as heartbeat_module
from tunefleet.engine.heartbeat import Heartbeat, ProgressClock, bound_build_timeout
from tunefleet.errors import DatabaseUnavailableError, LeaseLostError
from tunefleet.planning import shard_queue
from tunefleet.vocab import LEASED, PENDING

pytestmark = pytest.mark.serial  # leases of seconds against the clock

T = TypeVar("T")


def bounded(fn: Callable[[], T], seconds: float, what: str) -> T:
    """``fn()`` on a daemon thread: its result or its exception, or the test fails once it still
    runs after ``seconds`` (it would wait forever)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="bounded", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"{what} still waits after {seconds:g} s: it would wait forever")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def add_shard(db: Database) -> Shard:
    """One pending shard of an ``x86`` class (no TVM needed)."""
    db.upsert_hardware_class("x86", {"kind": "llvm", "num-cores": 2}, "x86")
    wl, _ = db.add_workload(structural_hash="ab", name="dense", op_kind="dense", flops=1.0, tir_json="{}")
    (shard,) = db.add_shards(db.hardware_class("x86").id, [(wl.id, 8, 1.0)])
    return shard


@contextlib.contextmanager
def row_locked(db: Database, shard_id: int) -> Iterator[Any]:
    """Another connection of this process holds the shard's row lock (PostgreSQL) or the write
    lock (SQLite) in an open transaction, as a thread interrupted mid-commit does."""
    with db.engine.connect() as conn:
        conn.execute(update(Shard).where(Shard.id == shard_id).values(priority=Shard.priority))
        try:
            yield conn
        finally:
            conn.rollback()


@pytest.fixture
def engine(db_url: str, tmp_path) -> Iterator[tuple[Settings, Database, Any]]:  # type: ignore[no-untyped-def]
    """Settings, database and artifact store per backend, as tests/engine's fixture of the name."""
    from tunefleet.hardware import seed_hardware_classes
    from tunefleet.store import LocalStore

    settings = settings_for(db_url, tmp_path)
    db = Database.from_settings(settings)
    seed_hardware_classes(db, settings)
    yield settings, db, LocalStore(settings.effective_store_path)
    db.close()


@pytest.fixture
def pg_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    yield from make_db_url("postgresql", request, tmp_path)


def settings_for(url: str, tmp_path, **overrides: Any) -> Settings:  # type: ignore[no-untyped-def]
    return load_settings(home=tmp_path / "home", database_url=url, **overrides)


# -- the sessions' bounds ----------------------------------------------------------------------

def _shown(db: Database, names: tuple[str, ...]) -> dict[str, str]:
    with db.engine.connect() as conn:
        return {name: conn.exec_driver_sql(f"SHOW {name}").scalar() for name in names}


def test_postgres_sessions_carry_keepalives_and_lock_idle_and_statement_timeouts(pg_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    db = Database.from_settings(settings_for(pg_url, tmp_path))
    try:
        timeouts = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout")
        server_keepalives = ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count")
        assert _shown(db, timeouts) == {"statement_timeout": "10min", "lock_timeout": "30s",
                                        "idle_in_transaction_session_timeout": "2min"}
        # the server probes a silent client (a worker node that vanished holding a lock) ...
        assert _shown(db, server_keepalives) == {"tcp_keepalives_idle": "30", "tcp_keepalives_interval": "10",
                                                 "tcp_keepalives_count": "3"}
        # ... and libpq a silent server
        with db.engine.connect() as conn:
            dsn = conn.connection.dbapi_connection.get_dsn_parameters()  # type: ignore[union-attr]
        assert {k: dsn.get(k) for k in ("keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count")} \
            == {"keepalives": "1", "keepalives_idle": "30", "keepalives_interval": "10", "keepalives_count": "3"}
    finally:
        db.close()
    # one setting per knob; 0 turns one off
    tuned = Database.from_settings(settings_for(pg_url, tmp_path, db_statement_timeout_s=0, db_lock_timeout_s=1.5,
                                                db_idle_in_transaction_timeout_s=0))
    try:
        assert _shown(tuned, timeouts) == {"statement_timeout": "0", "lock_timeout": "1500ms",
                                           "idle_in_transaction_session_timeout": "0"}
    finally:
        tuned.close()


def test_a_write_blocked_on_a_row_lock_fails_after_the_lock_timeout_instead_of_waiting_forever(
        db_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # PostgreSQL waits TUNEFLEET_DB_LOCK_TIMEOUT_S, SQLite its busy timeout (TUNEFLEET_DB_CONNECT_TIMEOUT_S)
    db = Database.from_settings(settings_for(db_url, tmp_path, db_lock_timeout_s=1, db_connect_timeout_s=1))
    try:
        shard = add_shard(db)
        with row_locked(db, shard.id):
            t0 = time.monotonic()
            with pytest.raises(DatabaseUnavailableError) as info:
                bounded(lambda: db.set_shard_priorities({shard.id: 2.0}), 20, "a write blocked on a row lock")
            waited = time.monotonic() - t0
        message = str(info.value)
        assert "\n" not in message and ("lock timeout" in message or "database is locked" in message), message
        assert 0.5 <= waited < 10
        assert db.set_shard_priorities({shard.id: 2.0}) == 1  # the lock gone, the write goes through
    finally:
        db.close()


def test_a_hung_statement_fails_after_the_statement_timeout(pg_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    db = Database.from_settings(settings_for(pg_url, tmp_path, db_statement_timeout_s=1))
    try:
        with pytest.raises(DatabaseUnavailableError, match="statement timeout"), db.session() as s:
            bounded(lambda: s.execute(text("SELECT pg_sleep(30)")), 20, "a statement")
    finally:
        db.close()


def test_a_session_idle_in_a_transaction_is_ended_and_frees_its_row_lock(pg_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    db = Database.from_settings(settings_for(pg_url, tmp_path, db_lock_timeout_s=15,
                                             db_idle_in_transaction_timeout_s=1))
    try:
        shard = add_shard(db)
        with contextlib.suppress(Exception), row_locked(db, shard.id):  # its rollback finds the session ended
            # the holder never comes back (a stuck thread): the server ends it, the waiter goes on
            assert bounded(lambda: db.set_shard_priorities({shard.id: 2.0}), 12, "a write behind an idle holder") == 1
    finally:
        db.close()


# -- the heartbeat follows the tuning thread's progress -------------------------------------------

def test_the_heartbeat_renews_a_lease_only_while_the_tuning_thread_makes_progress(
        db_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    db = Database(db_url)
    try:
        shard = add_shard(db)
        leased = db.lease_shard(shard.hardware_class_id, "w", lease_s=3, shard_id=shard.id)
        assert leased is not None
        now = [100.0]
        progress = ProgressClock(clock=lambda: now[0])
        renewed: list[float] = []
        real = heartbeat_module.shard_queue.heartbeat

        def spy(*args: Any, **kwargs: Any) -> None:
            renewed.append(now[0])
            real(*args, **kwargs)

        monkeypatch.setattr(heartbeat_module.shard_queue, "heartbeat", spy)
        hb = Heartbeat(db, shard.id, "w", 3, generation=leased.lease_generation, progress=progress)
        now[0] = 102.9
        hb.beat()  # a batch returned 2.9 s ago: renewed
        with caplog.at_level(logging.ERROR, logger=heartbeat_module.__name__):
            now[0] = 103.0
            hb.beat()  # nothing returned for a whole lease: not renewed
            now[0] = 104.0
            hb.beat()
        assert renewed == [102.9]
        stalled = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(stalled) == 1 and f"shard {shard.id}" in stalled[0] and "stops renewing" in stalled[0]
        progress.touch("a batch committed")  # the thread moves again while it still holds the lease
        hb.beat()
        assert renewed == [102.9, 104.0] and hb.reason() is None
        # ... once another worker took the lapsed lease over, the next beat finds it lost
        later = dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(hours=1)
        assert shard_queue.requeue_expired(db, now=later) == [shard.id]
        with pytest.raises(LeaseLostError):
            hb.beat()
    finally:
        db.close()


def test_one_build_times_out_within_half_a_lease(caplog: pytest.LogCaptureFixture) -> None:
    from tunefleet.tvm.builder import PersistentBuilder

    builder = PersistentBuilder(max_workers=1, timeout_s=30, eager=False)
    bound_build_timeout(builder, 120)  # 30 s < 60 s: left alone
    assert builder.timeout_s == 30
    with caplog.at_level(logging.WARNING, logger=heartbeat_module.__name__):
        bound_build_timeout(builder, 8)
        bound_build_timeout(builder, 8)
    assert builder.timeout_s < 4
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 1 and "half" in warned[0] and "TUNEFLEET_LEASE_S" in warned[0]


def _mlp_shard(db: Database, store: Any, *, trials: int) -> tuple[Any, Any]:
    """The x86 class and a new shard of ``trials`` on the first workload of ``mlp``."""
    from tunefleet.models.ingest import ingest
    from tunefleet.models.workloads import extract

    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    hw = db.hardware_class("x86")
    (shard,) = db.add_shards(hw.id, [(db.workloads(model.id)[0][0].id, trials, 1.0)])
    return hw, shard


@pytest.mark.slow
@on_backend("postgresql")  # the lease's expiry and fencing: the contract suite checks both backends
def test_a_tuning_thread_stuck_in_a_build_lets_its_lease_lapse_and_another_worker_takes_the_shard(
        engine) -> None:  # type: ignore[no-untyped-def]
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import BuilderResult, PyBuilder

    from tunefleet.engine.options import TuneOptions
    from tunefleet.engine.shard import ShardKit, run_shard
    from tunefleet.testing.prometheus import wait_until

    entered, release = threading.Event(), threading.Event()

    @derived_object
    class StuckBuilder(PyBuilder):
        """A stand-in build that blocks until the test lets go (a build that never returns)."""

        timeout_s = 30.0

        def build(self, build_inputs: list[Any]) -> list[Any]:
            entered.set()
            release.wait()
            return [BuilderResult(None, "stand-in build let go by the test") for _ in build_inputs]

    _, db, store = engine
    hw, shard = _mlp_shard(db, store, trials=4)
    # leased for longer than it takes to start tuning; the heartbeat then renews it 3 s at a time
    leased = shard_queue.lease(db, "x86", "stuck", lease_s=60, shard_id=shard.id)
    assert leased is not None
    builder = StuckBuilder()
    options = TuneOptions(seed=0, trials_per_iter=2, lease_s=3, warm_start_shapes=False, transfer=False)
    outcome: dict[str, Any] = {}

    def tune() -> None:
        try:
            outcome["result"] = run_shard(db, leased, "stuck", options, ShardKit(builder=builder))
        except BaseException as exc:  # noqa: BLE001 - checked below
            outcome["error"] = exc

    thread = threading.Thread(target=tune, name="stuck-tuning", daemon=True)
    thread.start()
    try:
        assert entered.wait(180), "the search never reached the stand-in build"
        # nothing returns: the heartbeat stops renewing after a lease, and the lease expires
        wait_until(lambda: [s.id for s in db.expired_leases()] == [shard.id], 20, "the stuck worker's lease to expire")
        assert db.shard(shard.id).state == LEASED
        assert shard_queue.requeue_expired(db) == [shard.id]
        assert db.shard(shard.id).state == PENDING
        later = dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(hours=1)  # past its backoff
        taken = db.lease_shard(hw.id, "rescuer", lease_s=60, shard_id=shard.id, now=later)
        assert taken is not None and taken.lease_generation > leased.lease_generation
    finally:
        release.set()
        thread.join(120)
    assert not thread.is_alive()
    assert builder.timeout_s < 1.5  # one build times out within half a lease
    # the stuck worker, let go, finds its lease gone: it stores nothing and spends no attempt
    assert isinstance(outcome.get("error"), LeaseLostError), outcome
    assert db.count_measurements(shard_id=shard.id) == 0
    assert db.shard(shard.id).lease_owner == "rescuer"


@pytest.mark.slow
@pytest.mark.parametrize(("slow", "db_url"), [("build", "sqlite"), ("run", "postgresql")], indirect=["db_url"])
def test_a_batch_longer_than_a_lease_keeps_its_lease_while_its_builds_and_runs_return(
        engine, slow: str) -> None:  # type: ignore[no-untyped-def]
    """Each build and each run that returns is progress: a batch of eight candidates whose builds
    (or runs) take 0.8 s each lasts about two 3-second leases, and the lease holds throughout."""
    from tvm.s_tir import meta_schedule as ms

    from tunefleet.engine.options import TuneOptions
    from tunefleet.engine.shard import ShardKit, run_shard
    from tunefleet.testing import slow_steps
    from tunefleet.tvm.builder import PersistentBuilder
    from tunefleet.tvm.runner import default_evaluator_config
    from tunefleet.tvm.targets import make_target
    from tunefleet.vocab import DONE

    _, db, store = engine
    hw, shard = _mlp_shard(db, store, trials=8)
    leased = shard_queue.lease(db, "x86", "slow", lease_s=60, shard_id=shard.id)  # the heartbeat: 3 s leases
    assert leased is not None
    builder = PersistentBuilder(max_workers=1, f_build=slow_steps.slow_build if slow == "build" else None)
    runner = ms.runner.LocalRunner(
        evaluator_config=default_evaluator_config(make_target(hw.target)),
        f_run_evaluator=slow_steps.slow_run if slow == "run" else None)
    options = TuneOptions(seed=0, trials_per_iter=8, lease_s=3, warm_start_shapes=False, transfer=False)
    stop, requeued = threading.Event(), []

    def fleet() -> None:  # what the rest of the fleet does: take back every lease that lapsed
        while not stop.wait(0.5):
            requeued.extend(shard_queue.requeue_expired(db))

    rescuer = threading.Thread(target=fleet, name="requeue-expired", daemon=True)
    rescuer.start()
    try:
        result = run_shard(db, leased, "slow", options, ShardKit(builder=builder, runner=runner))
    finally:
        stop.set()
        rescuer.join(10)
        builder.shutdown()
        runner.pool.shutdown()
    assert requeued == []
    assert result.state == DONE and result.measured == 8, result
    assert result.seconds > 2 * 3  # the batch did last longer than a lease
    after = db.shard(shard.id)
    assert (after.state, after.leases, after.lost_leases) == (DONE, 1, 0)


# -- Ctrl-C --------------------------------------------------------------------------------------

def test_ctrl_c_gives_leases_back_while_the_interrupted_thread_holds_their_row_lock(
        db_url: str, tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    import psutil

    from tunefleet.cli import interrupt
    from tunefleet.engine.worker import worker_owner

    settings = settings_for(db_url, tmp_path)  # the default timeouts: no waiting them out within the bound
    db = Database.from_settings(settings)
    try:
        shard = add_shard(db)
        assert db.lease_shard(shard.hardware_class_id, worker_owner(), lease_s=60, shard_id=shard.id) is not None
        # this test's own children (the PostgreSQL server) are no tuning worker's
        monkeypatch.setattr(psutil.Process, "children", lambda self, recursive=False: [])

        def interrupted_mid_commit() -> None:
            with row_locked(db, shard.id):
                # Ctrl-C's handler runs on the thread it interrupted, which holds the row lock
                interrupt.stop_children_and_give_back(settings, "tunefleet run mlp")

        bounded(interrupted_mid_commit, 20, "Ctrl-C giving the leases back")
        err = capsys.readouterr().err
        assert "1 shard lease(s) given back" in err, err
        after = db.shard(shard.id)
        assert (after.state, after.lease_owner, after.leases) == (PENDING, None, 0)
    finally:
        db.close()
