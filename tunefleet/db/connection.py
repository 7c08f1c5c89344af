"""Engines, sessions and schema revisions: the one session factory of tunefleet.

An empty database is migrated to the newest revision on first use (``db_auto_migrate``); a
database at an older revision is refused with "run `tunefleet db upgrade`"; one at a revision
this tunefleet does not know (written by a newer release) is refused outright.

Nothing waits forever. Every PostgreSQL session starts with a statement timeout, a lock timeout
and an idle-in-transaction timeout (``TUNEFLEET_DB_*_TIMEOUT_S``: a stuck query fails, a blocked
one gives up, a stuck holder's transaction is ended by the server and its locks released) and
TCP keepalives on both ends (libpq's ``keepalives*`` find a server that went silent, the server's
``tcp_keepalives_*`` a worker node that vanished holding a lock). SQLite waits for a lock at most
its busy timeout. The connections this process has checked out are known by thread, so Ctrl-C
can roll back the transaction it interrupted before it gives the leases back
(:func:`roll_back_this_thread`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Dialect, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError, SQLAlchemyError

from tunefleet.config import (
    DEFAULT_DB_IDLE_IN_TRANSACTION_TIMEOUT_S,
    DEFAULT_DB_LOCK_TIMEOUT_S,
    DEFAULT_DB_STATEMENT_TIMEOUT_S,
    mask_secrets,
    mask_url,
)
from tunefleet.errors import (
    DatabaseError,
    DatabaseUnavailableError,
    SchemaOutdatedError,
    SchemaTooNewError,
)

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


def masked_url(url: str) -> str:
    """The URL with its passwords masked (user-info and ``?password=``), never failing to parse."""
    return mask_url(url)


# What a bound on waiting says when it ends a statement (PostgreSQL SQLSTATEs), and the setting
# that sets the bound.
_BOUNDS = {
    "55P03": "TUNEFLEET_DB_LOCK_TIMEOUT_S: another session held the lock longer",  # lock_not_available
    "57014": "TUNEFLEET_DB_STATEMENT_TIMEOUT_S",  # query_canceled: the statement timeout
    "25P03": "TUNEFLEET_DB_IDLE_IN_TRANSACTION_TIMEOUT_S",  # idle_in_transaction_session_timeout
}


def describe_db_error(exc: BaseException) -> str:
    """First line of the driver's message, without SQLAlchemy's boilerplate (passwords masked);
    a timeout names the setting that bounds it."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    line = mask_secrets(text[0].strip()) if text else type(orig).__name__
    bound = _BOUNDS.get(getattr(orig, "pgcode", None) or "")
    return f"{line} ({bound})" if bound and "timeout" in line else line


_PERMANENT = ("authentication failed", "does not exist", "permission denied", "no password supplied",
              "role \"", "unable to open database file", "not a database", "disk i/o error", "readonly database")


def is_connection_problem(exc: BaseException) -> bool:
    """Whether a driver error looks transient (server unreachable, connection dropped, lock timeout).

    Wrong credentials, a missing database or an unusable file are permanent: retrying cannot help.
    """
    if getattr(exc, "connection_invalidated", False):
        return True
    text = describe_db_error(exc).lower()
    return not any(p in text for p in _PERMANENT)


def is_dropped_connection(exc: BaseException, dialect: Dialect) -> bool:
    """Whether a driver error, SQLAlchemy's or the raw driver's, says the connection is gone.

    Raw driver errors reach us from the COPY path (:mod:`tunefleet.db._pg_copy`), which works on
    the DB-API connection; a dropped connection there surfaces as ``psycopg2.OperationalError``
    or, once the session's rollback finds it closed, as ``InterfaceError: connection already
    closed`` — neither of them SQLAlchemy's ``OperationalError``.
    """
    if getattr(exc, "connection_invalidated", False):
        return True
    orig = getattr(exc, "orig", None) or exc
    dbapi = dialect.loaded_dbapi
    return isinstance(orig, dbapi.Error) and bool(dialect.is_disconnect(orig, None, None))


def db_error_class(exc: BaseException, dialect: Dialect) -> type[DatabaseError] | None:
    """The :class:`DatabaseError` a driver error becomes, or None for one that is a bug (a bad
    statement keeps its traceback). A lost connection or a lock timeout is
    :class:`DatabaseUnavailableError` (transient), whichever layer raised it."""
    if is_dropped_connection(exc, dialect):
        return DatabaseUnavailableError
    orig = getattr(exc, "orig", None) or exc
    if isinstance(exc, OperationalError) or isinstance(orig, dialect.loaded_dbapi.OperationalError):
        return DatabaseUnavailableError if is_connection_problem(exc) else DatabaseError
    return None


def is_unique_violation(exc: BaseException) -> bool:
    """Whether an integrity error is a unique key (or primary key) already taken: what a concurrent
    write of the same key causes, unlike a foreign key, NOT NULL or CHECK violation."""
    orig = getattr(exc, "orig", None) or exc
    if "23505" in (getattr(orig, "pgcode", None), getattr(orig, "sqlstate", None)):  # PostgreSQL unique_violation
        return True
    return "UNIQUE constraint failed" in str(orig)  # SQLite, primary keys included


KEEPALIVE_IDLE_S = 30
"""Seconds of silence on a PostgreSQL connection before TCP keepalive probes start (both ends)."""
KEEPALIVE_INTERVAL_S = 10
"""Seconds between two keepalive probes."""
KEEPALIVE_COUNT = 3
"""Unanswered probes that end the connection: a peer gone silent is found in about a minute
(30 + 3 x 10 s), not after the kernel's default two hours."""


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def postgres_connect_args(*, connect_timeout_s: float = 5.0,
                          statement_timeout_s: float = DEFAULT_DB_STATEMENT_TIMEOUT_S,
                          lock_timeout_s: float = DEFAULT_DB_LOCK_TIMEOUT_S,
                          idle_in_transaction_timeout_s: float = DEFAULT_DB_IDLE_IN_TRANSACTION_TIMEOUT_S
                          ) -> dict[str, object]:
    """libpq connection parameters: the connect timeout, client keepalives, and the session's
    timeouts and server-side keepalives as startup ``options`` (no round trip; a timeout of 0 is
    left out: no limit).

    A pooler that refuses startup options (PgBouncer without ``ignore_startup_parameters =
    options``) needs every timeout at 0, or the options allowed."""
    session = {
        "statement_timeout": _ms(statement_timeout_s),
        "lock_timeout": _ms(lock_timeout_s),
        "idle_in_transaction_session_timeout": _ms(idle_in_transaction_timeout_s),
    }
    options = [f"-c {name}={value}" for name, value in session.items() if value > 0]
    if options:  # the server's probes of a silent client ride along with the timeouts
        options += [f"-c tcp_keepalives_idle={KEEPALIVE_IDLE_S}", f"-c tcp_keepalives_interval={KEEPALIVE_INTERVAL_S}",
                    f"-c tcp_keepalives_count={KEEPALIVE_COUNT}"]
    args: dict[str, object] = {
        "connect_timeout": max(2, math.ceil(connect_timeout_s)),
        "keepalives": 1, "keepalives_idle": KEEPALIVE_IDLE_S, "keepalives_interval": KEEPALIVE_INTERVAL_S,
        "keepalives_count": KEEPALIVE_COUNT,
    }
    if options:
        args["options"] = " ".join(options)
    return args


# The DB-API connections checked out of every engine of this process, with the thread that checked
# each out: what Ctrl-C's handler, running on the thread it interrupted, rolls back first.
_CHECKED_OUT: dict[int, tuple[int, Any]] = {}
_CHECKED_OUT_LOCK = threading.Lock()


def _track_checkouts(engine: Engine) -> None:
    @event.listens_for(engine, "checkout")
    def _checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
        with _CHECKED_OUT_LOCK:
            _CHECKED_OUT[id(record)] = (threading.get_ident(), dbapi_conn)

    @event.listens_for(engine, "checkin")
    def _checkin(_dbapi_conn: Any, record: Any) -> None:
        with _CHECKED_OUT_LOCK:
            _CHECKED_OUT.pop(id(record), None)


def roll_back_this_thread() -> int:
    """Roll back every transaction the calling thread has open on a connection of this process
    (any engine), releasing its locks; how many connections were rolled back.

    For a signal handler: Python runs it on the main thread between two bytecodes, so a
    transaction that thread had open is idle, and a new connection waiting for its locks would
    wait on a thread that never resumes. Other threads' connections are left alone (they finish
    their short transactions by themselves). What the interrupted code does next with its
    connection is not this function's concern: the caller exits."""
    me = threading.get_ident()
    with _CHECKED_OUT_LOCK:
        mine = [conn for thread, conn in _CHECKED_OUT.values() if thread == me]
    done = 0
    for conn in mine:
        with contextlib.suppress(Exception):  # a connection already broken holds no lock
            conn.rollback()
            done += 1
    return done


def make_engine(url: str, *, connect_timeout_s: float = 5.0,
                statement_timeout_s: float = DEFAULT_DB_STATEMENT_TIMEOUT_S,
                lock_timeout_s: float = DEFAULT_DB_LOCK_TIMEOUT_S,
                idle_in_transaction_timeout_s: float = DEFAULT_DB_IDLE_IN_TRANSACTION_TIMEOUT_S) -> Engine:
    """Create an engine whose waits are all bounded: connecting, and on PostgreSQL statements,
    lock waits, idle transactions and silent peers (:func:`postgres_connect_args`); on SQLite lock
    waits (its busy timeout is ``connect_timeout_s``)."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:  # e.g. a port that is not a number
        raise DatabaseError(f"invalid database URL {masked_url(url)}: {mask_secrets(str(exc))}") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database
        if database and database != ":memory:":
            try:
                Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise DatabaseError(f"cannot create the SQLite database {database}: {exc.strerror or exc}") from None
        engine = create_engine(url, connect_args={"timeout": connect_timeout_s})
        busy_ms = int(connect_timeout_s * 1000)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # type: ignore[no-untyped-def]
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")  # concurrent readers + one writer across processes
            cur.execute(f"PRAGMA busy_timeout={busy_ms}")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        _track_checkouts(engine)
        return engine
    if backend == "postgresql":
        connect_args = postgres_connect_args(connect_timeout_s=connect_timeout_s,
                                             statement_timeout_s=statement_timeout_s, lock_timeout_s=lock_timeout_s,
                                             idle_in_transaction_timeout_s=idle_in_transaction_timeout_s)
        # No pool_pre_ping: it costs a round trip per checkout, a large share of a short query
        # (docs/performance.md, "Figures that used to live in docstrings").
        # A dropped connection fails one operation, SQLAlchemy then invalidates the pool and the
        # next operation reconnects; callers retry transient DatabaseErrors.
        engine = create_engine(url, connect_args=connect_args, pool_size=5, max_overflow=5, pool_recycle=1800)
        _track_checkouts(engine)
        return engine
    raise DatabaseError(f"unsupported database {backend!r} in {masked_url(url)}; use sqlite or postgresql")


class _Unbounded:
    """The engine as Alembic's ``env.py`` uses it (``begin()``), with no statement timeout inside
    the migration's transaction: a migration may rewrite a large table (its lock waits stay
    bounded)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @contextlib.contextmanager
    def begin(self) -> Iterator[Any]:
        with self.engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
            yield conn


def alembic_config(engine: Engine) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["engine"] = engine if engine is None else _Unbounded(engine)
    return cfg


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    cfg = alembic_config(None)  # type: ignore[arg-type]
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None
    return head


def known_revisions() -> set[str]:
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config(None))  # type: ignore[arg-type]
    return {rev.revision for rev in script.walk_revisions()}


def current_revision(engine: Engine) -> str | None:
    """The schema revision stored in the database, or None for a database without one."""
    from alembic.runtime.migration import MigrationContext

    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except (OperationalError, DBAPIError) as exc:
        cls = DatabaseUnavailableError if is_connection_problem(exc) else DatabaseError
        raise cls(
            f"cannot connect to database {masked_url(str(engine.url))}: {describe_db_error(exc)}"
        ) from None


def upgrade(engine: Engine, revision: str = "head") -> None:
    from alembic import command

    log.info("upgrading database schema of %s to %s", masked_url(str(engine.url)), revision)
    try:
        command.upgrade(alembic_config(engine), revision)
    except SQLAlchemyError as exc:
        raise DatabaseError(f"schema upgrade failed: {describe_db_error(exc)}") from None


def downgrade(engine: Engine, revision: str) -> None:
    from alembic import command

    log.info("downgrading database schema of %s to %s", masked_url(str(engine.url)), revision)
    try:
        command.downgrade(alembic_config(engine), revision)
    except SQLAlchemyError as exc:
        raise DatabaseError(f"schema downgrade failed: {describe_db_error(exc)}") from None


def ensure_schema(engine: Engine, *, auto_migrate: bool = True) -> str:
    """Check (and for an empty database, create) the schema; return the current revision."""
    current = current_revision(engine)
    head = head_revision()
    if current == head:
        return current
    if current is None:
        tables = set(inspect(engine).get_table_names()) - {"alembic_version"}
        if tables:
            raise DatabaseError(
                f"database {masked_url(str(engine.url))} holds tables ({', '.join(sorted(tables)[:3])}...) "
                "but no tunefleet schema revision; point TUNEFLEET_DATABASE_URL at an empty database"
            )
        if not auto_migrate:
            raise SchemaOutdatedError(
                f"database {masked_url(str(engine.url))} is empty; run `tunefleet db upgrade`"
            )
        upgrade(engine, "head")
        return head
    if current not in known_revisions():
        raise SchemaTooNewError(
            f"database schema revision {current} is unknown to this tunefleet (newest known: {head}); "
            "it was written by a newer tunefleet — upgrade tunefleet"
        )
    raise SchemaOutdatedError(
        f"database schema is at revision {current}, this tunefleet needs {head}; run `tunefleet db upgrade`"
    )
