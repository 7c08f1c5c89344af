"""A database blip where a CLI worker is idle is waited out, not fatal (issue 34, item 4).

``drain`` used to retry transient errors only around a lease and its shard: its queue poll (the
pending shards it cannot lease yet), the planning of a budget's next round and the closing of the
rounds sat outside, so one dropped connection while the worker waited or planned killed it. Here
each of those calls meets one blip — on PostgreSQL a real one (every connection reset by a TCP
proxy, :class:`~tunefleet.testing.tcp_proxy.TcpProxy`), on SQLite a lock timeout — injected
through a hook on the database call the loop makes, and the worker carries on. Stand-in tuner
(no TVM), both backends.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import make_url

from tests.budget.test_rounds import Clock, FakeTuner, add_stand_in_model
from tunefleet.budget import Budget
from tunefleet.db import Database
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.worker import Backoff, drain
from tunefleet.errors import DatabaseUnavailableError
from tunefleet.planning import shard_queue
from tunefleet.planning.rounds import Rounds
from tunefleet.testing.tcp_proxy import TcpProxy
from tunefleet.vocab import DONE

NO_WAIT = Backoff(factor=0)


class Blips:
    """Blips of one database, on demand: :meth:`arm` makes the next statement run on this thread
    fail as a lost connection does — on PostgreSQL the proxy resets every connection just before
    it, on SQLite it raises what a lock timeout raises."""

    def __init__(self, proxy: TcpProxy | None) -> None:
        self.proxy = proxy
        self.fired: list[str] = []
        self._armed: set[int] = set()

    def arm(self) -> None:
        self._armed.add(threading.get_ident())

    def before_cursor_execute(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if threading.get_ident() not in self._armed:
            return
        self._armed.discard(threading.get_ident())
        self.fired.append(" ".join(statement.split())[:60])
        if self.proxy is None:
            raise sqlite3.OperationalError("database is locked")
        self.proxy.drop_connections()

    def listen(self, db: Database) -> None:
        event.listen(db.engine, "before_cursor_execute", self.before_cursor_execute)

    def once_in(self, fn: Callable[..., Any], *, then: Callable[[], None] | None = None) -> Callable[..., Any]:
        """``fn`` whose first call meets a blip at its first statement; ``then`` runs before its
        second call (the retry)."""
        calls = 0

        def blipped(*args: Any, **kwargs: Any) -> Any:
            nonlocal calls
            calls += 1
            if calls == 1:
                self.arm()
            elif calls == 2 and then is not None:
                then()
            return fn(*args, **kwargs)

        return blipped


@contextlib.contextmanager
def proxied_url(db_url: str) -> Iterator[tuple[str, TcpProxy | None]]:
    """``db_url`` as a worker reaches it: PostgreSQL through a TCP proxy the test can cut, SQLite as is."""
    url = make_url(db_url)
    if url.get_backend_name() != "postgresql":
        yield db_url, None
        return
    with TcpProxy(url.host or "127.0.0.1", url.port or 5432) as proxy:
        yield url.set(port=proxy.port).render_as_string(hide_password=False), proxy


@pytest.fixture
def worker_db(db_url: str) -> Iterator[tuple[Database, Database, Blips]]:
    """(the test's own database, the worker's — through the proxy on PostgreSQL —, its blips), with
    the stand-in tuner's workloads under one model."""
    direct = Database(db_url)
    direct.upsert_hardware_class("x86", {"kind": "llvm", "num-cores": 2}, "x86")
    add_stand_in_model(direct)
    with proxied_url(db_url) as (url, proxy):
        worker = Database(url, connect_timeout_s=2)
        blips = Blips(proxy)
        blips.listen(worker)
        try:
            yield direct, worker, blips
        finally:
            worker.close()
            direct.close()


def test_a_blip_in_the_pending_shards_poll_is_waited_out(worker_db: tuple[Database, Database, Blips],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue's last shard waits for its workload, which another worker searches; the worker's
    poll of the pending shards meets a blip, and the worker polls again instead of dying."""
    direct, worker, blips = worker_db
    big = direct.workload("big")
    hw = direct.hardware_class("x86")
    theirs, ours = direct.add_shards(hw.id, [(big.id, 4, 2.0), (big.id, 4, 1.0)])
    leased = shard_queue.lease(direct, "x86", "other-worker")
    assert leased is not None and leased.id == theirs.id

    def other_worker_finishes() -> None:
        shard_queue.complete(direct, theirs.id, "other-worker", generation=leased.lease_generation)

    # the poll blips; before polling again, the other worker is done with the workload
    monkeypatch.setattr(worker, "pending_shards", blips.once_in(worker.pending_shards, then=other_worker_finishes))
    monkeypatch.setattr("tunefleet.engine.worker._wait", lambda seconds: None)
    summary = drain(worker, "x86", TuneOptions(), tuner=FakeTuner(Clock()), backoff=NO_WAIT)  # type: ignore[arg-type]

    assert len(blips.fired) == 1 and blips.fired[0].startswith("SELECT shards.id, shards.workload_id")
    assert summary.shards_done == 1
    assert direct.shard(ours.id).state == DONE and not direct.pending_shards(hw.id)


@pytest.mark.parametrize("place", ["refill", "end"])
def test_a_blip_while_planning_or_closing_a_budget_s_rounds_is_waited_out(
        worker_db: tuple[Database, Database, Blips], monkeypatch: pytest.MonkeyPatch, place: str) -> None:
    """A budget's next round is planned when the queue is empty (``refill``), and the rounds are
    closed at the end (``end``); a blip in either is retried, and the budget is spent exactly."""
    direct, worker, blips = worker_db
    clock = Clock()
    rounds = Rounds("x86", [direct.model("m").id], Budget(trials=40), started_at=clock(), min_trials=8, batch=8,
                    clock=clock)
    monkeypatch.setattr(rounds, place, blips.once_in(getattr(rounds, place)))
    summary = drain(worker, "x86", TuneOptions(), tuner=FakeTuner(clock), refill=rounds,  # type: ignore[arg-type]
                    backoff=NO_WAIT)

    assert len(blips.fired) == 1
    assert summary.measured == 40 and summary.stopped == "trial budget spent"
    assert summary.budget is not None and (summary.budget["trials"], summary.budget["stopped"]) == (
        40, "trial budget spent")
    assert {s.state for s in shard_queue.list_shards(direct)} == {DONE}


def test_a_worker_still_gives_up_after_too_many_blips_in_a_row(worker_db: tuple[Database, Database, Blips],
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Retried is not forever: a database gone for good stops the worker with the error, once the
    retries (:data:`~tunefleet.vocab.TRANSIENT_RETRIES` in a row) are spent."""
    from tunefleet.vocab import TRANSIENT_RETRIES

    direct, worker, blips = worker_db
    big = direct.workload("big")
    hw = direct.hardware_class("x86")
    direct.add_shards(hw.id, [(big.id, 4, 2.0), (big.id, 4, 1.0)])
    assert shard_queue.lease(direct, "x86", "other-worker") is not None
    polls = 0
    real = worker.pending_shards

    def always_blipped(*args: Any) -> Any:
        nonlocal polls
        polls += 1
        blips.arm()
        return real(*args)

    monkeypatch.setattr(worker, "pending_shards", always_blipped)
    with pytest.raises(DatabaseUnavailableError):
        drain(worker, "x86", TuneOptions(), tuner=FakeTuner(Clock()), backoff=NO_WAIT)  # type: ignore[arg-type]
    assert polls == TRANSIENT_RETRIES + 1
