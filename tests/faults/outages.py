"""Database outages and lost commit acknowledgements, on demand, for the fault tests of issue 34.

:class:`DatabaseOutage` cuts one :class:`~tunefleet.db.Database` off the way a network does — on
PostgreSQL a real cut (a :class:`~tunefleet.testing.tcp_proxy.TcpProxy` resets the connections and
refuses new ones), on SQLite every statement failing as a lock timeout does — and can make one
commit succeed and then fail as if its acknowledgement were lost (a hook after the session's
commit). No sleeps: each fault fires at a named call.
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import make_url

from tunefleet.db import Database
from tunefleet.errors import DatabaseUnavailableError
from tunefleet.testing.tcp_proxy import TcpProxy


class DatabaseOutage:
    """The database ``db`` reaches, cut off and brought back on demand.

    Use :func:`cut_off_database` to get one with its database.
    """

    def __init__(self, db: Database, proxy: TcpProxy | None) -> None:
        self.db = db
        self.proxy = proxy
        self.is_down = False
        self.lost_acks = 0
        self._armed: set[int] = set()
        event.listen(db.engine, "before_cursor_execute", self._before_statement)
        event.listen(db._sessions, "after_commit", self._after_commit)

    # -- outage -------------------------------------------------------------------------------
    def down(self) -> None:
        """From now on, every statement fails as on a lost connection."""
        self.is_down = True
        if self.proxy is not None:
            self.proxy.pause()

    def up(self) -> None:
        self.is_down = False
        if self.proxy is not None:
            self.proxy.resume()

    def _before_statement(self, *_: Any) -> None:
        if self.is_down and self.proxy is None:
            raise sqlite3.OperationalError("database is locked")

    # -- lost acknowledgement -----------------------------------------------------------------
    def lose_ack(self, fn: Callable[..., Any], *, then_down: bool = True) -> Callable[..., Any]:
        """``fn`` whose first commit succeeds, after which the caller gets a lost-connection error;
        with ``then_down`` the database stays unreachable (until :meth:`up`), as it does when a
        network cut is what lost the acknowledgement."""

        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self._armed.add(threading.get_ident())
            self._then_down = then_down
            try:
                return fn(*args, **kwargs)
            finally:
                self._armed.discard(threading.get_ident())

        return wrapped

    def _after_commit(self, session: Any) -> None:
        if threading.get_ident() not in self._armed:
            return
        self._armed.discard(threading.get_ident())
        self.lost_acks += 1
        if self._then_down:
            self.down()
        raise DatabaseUnavailableError(
            "database failed: server closed the connection unexpectedly (the commit's acknowledgement was lost)")


@contextlib.contextmanager
def cut_off_database(db_url: str) -> Iterator[tuple[Database, DatabaseOutage]]:
    """A :class:`Database` on ``db_url`` (through a TCP proxy on PostgreSQL) and its outage switch."""
    url = make_url(db_url)
    if url.get_backend_name() != "postgresql":
        db = Database(db_url, connect_timeout_s=2)
        try:
            yield db, DatabaseOutage(db, None)
        finally:
            db.close()
        return
    with TcpProxy(url.host or "127.0.0.1", url.port or 5432) as proxy:
        db = Database(url.set(port=proxy.port).render_as_string(hide_password=False), connect_timeout_s=2)
        try:
            yield db, DatabaseOutage(db, proxy)
        finally:
            db.close()
