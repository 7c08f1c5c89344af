"""Engines, sessions and schema revisions: the one session factory of tunefleet.

An empty database is migrated to the newest revision on first use (``db_auto_migrate``); a
database at an older revision is refused with "run `tunefleet db upgrade`"; one at a revision
this tunefleet does not know (written by a newer release) is refused outright.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import create_engine, event, inspect
from sqlalchemy.engine import Dialect, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError, SQLAlchemyError

from tunefleet.config import mask_secrets, mask_url
from tunefleet.errors import DatabaseError, DatabaseUnavailableError, SchemaOutdatedError, SchemaTooNewError

if TYPE_CHECKING:
    from alembic.config import Config

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).with_name("migrations")


def masked_url(url: str) -> str:
    """The URL with its passwords masked (user-info and ``?password=``), never failing to parse."""
    return mask_url(url)


def describe_db_error(exc: BaseException) -> str:
    """First line of the driver's message, without SQLAlchemy's boilerplate (passwords masked)."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return mask_secrets(text[0].strip()) if text else type(orig).__name__


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


def make_engine(url: str, *, connect_timeout_s: float = 5.0, statement_timeout_s: float = 0.0) -> Engine:
    """Create an engine with bounded connection time on every backend."""
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

        return engine
    if backend == "postgresql":
        connect_args: dict[str, object] = {"connect_timeout": max(2, math.ceil(connect_timeout_s))}
        if statement_timeout_s > 0:
            connect_args["options"] = f"-c statement_timeout={int(statement_timeout_s * 1000)}"
        # No pool_pre_ping: it costs a round trip per checkout, a large share of a short query
        # (docs/performance.md, "Figures that used to live in docstrings").
        # A dropped connection fails one operation, SQLAlchemy then invalidates the pool and the
        # next operation reconnects; callers retry transient DatabaseErrors.
        return create_engine(url, connect_args=connect_args, pool_size=5, max_overflow=5, pool_recycle=1800)
    raise DatabaseError(f"unsupported database {backend!r} in {masked_url(url)}; use sqlite or postgresql")


def alembic_config(engine: Engine) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["engine"] = engine
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
