"""The session factory every part of :class:`tunefleet.db.Database` shares.

Every method opens its own short transaction, so a caller never holds locks across TVM work.
Storage errors are never swallowed: connection problems surface as :class:`DatabaseError`
with one line naming the database (password masked) and the driver's reason, and so do
integrity errors: a unique key a concurrent write took first is a retryable
:class:`~tunefleet.errors.ConflictError`, any other refused change a plain :class:`DatabaseError`.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Self

from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from tunefleet.config import (
    DEFAULT_DB_IDLE_IN_TRANSACTION_TIMEOUT_S,
    DEFAULT_DB_LOCK_TIMEOUT_S,
    DEFAULT_DB_STATEMENT_TIMEOUT_S,
)
from tunefleet.db.connection import (
    db_error_class,
    describe_db_error,
    ensure_schema,
    is_unique_violation,
    make_engine,
    masked_url,
)
from tunefleet.errors import ConflictError, DatabaseError, ParameterError

if TYPE_CHECKING:
    from tunefleet.config import Settings


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


_HEX = re.compile(r"[0-9a-fA-F]+")


def is_hex(text: str) -> bool:
    """Whether ``text`` is hex digits only: what a sha256 or a structural hash (or a prefix of one)
    is made of. Anything else is never a prefix: ``%`` and ``_`` would be SQL ``LIKE`` wildcards."""
    return _HEX.fullmatch(text) is not None


def check_fits(column: Any, value: str | None, what: str) -> str | None:
    """``value``, or one :class:`~tunefleet.errors.ParameterError` line when it is longer than
    ``column`` (a ``String(N)`` attribute of a table) holds.

    Checked here, before the database, because the backends disagree: PostgreSQL refuses an
    over-long value with a ``DataError`` at the write, SQLite stores it whole.
    """
    limit = getattr(column.type, "length", None)
    if value is not None and limit is not None and len(value) > limit:
        shown = value if len(value) <= 40 else f"{value[:40]}..."
        raise ParameterError(f"invalid {what}: {len(value)} characters (at most {limit}): {shown!r}")
    return value


class DatabaseBase:
    """One engine and one session factory over SQLite or PostgreSQL.

    Parameters
    ----------
    url:
        SQLAlchemy URL (``sqlite:///path`` or ``postgresql+psycopg2://...``).
    connect_timeout_s:
        Bound on connecting (and on SQLite's wait for a lock).
    statement_timeout_s, lock_timeout_s, idle_in_transaction_timeout_s:
        PostgreSQL's bounds on a statement, a lock wait and a transaction left idle (0: none);
        see :func:`~tunefleet.db.connection.make_engine`.
    auto_migrate:
        Create the schema in an empty database. An outdated or unknown schema is always refused.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout_s: float = 5.0,
        statement_timeout_s: float = DEFAULT_DB_STATEMENT_TIMEOUT_S,
        lock_timeout_s: float = DEFAULT_DB_LOCK_TIMEOUT_S,
        idle_in_transaction_timeout_s: float = DEFAULT_DB_IDLE_IN_TRANSACTION_TIMEOUT_S,
        auto_migrate: bool = True,
        check_schema: bool = True,
    ) -> None:
        self.url = url
        self.engine = make_engine(url, connect_timeout_s=connect_timeout_s, statement_timeout_s=statement_timeout_s,
                                  lock_timeout_s=lock_timeout_s,
                                  idle_in_transaction_timeout_s=idle_in_transaction_timeout_s)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._hw_ids: dict[str, int] = {}
        self._tx = threading.local()  # this thread's open :meth:`transaction`, if any
        if check_schema:
            ensure_schema(self.engine, auto_migrate=auto_migrate)

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: Any) -> Self:
        return cls(
            settings.effective_database_url,
            connect_timeout_s=settings.db_connect_timeout_s,
            statement_timeout_s=settings.db_statement_timeout_s,
            lock_timeout_s=settings.db_lock_timeout_s,
            idle_in_transaction_timeout_s=settings.db_idle_in_transaction_timeout_s,
            auto_migrate=settings.db_auto_migrate,
            **kwargs,
        )

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"Database({masked_url(self.url)!r})"

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A transaction: committed on success, rolled back on error (inside :meth:`transaction`,
        the enclosing one)."""
        outer = getattr(self._tx, "session", None)
        if outer is not None:
            yield outer
            return
        try:
            with self._sessions.begin() as sess:
                yield sess
        except IntegrityError as exc:
            if is_unique_violation(exc):
                raise ConflictError(f"database {masked_url(self.url)}: this write conflicted with a concurrent one "
                                    f"({describe_db_error(exc)}); run it again") from exc
            raise DatabaseError(f"database {masked_url(self.url)} refused the change: {describe_db_error(exc)}") from exc
        except Exception as exc:
            # SQLAlchemy's errors and the raw driver's alike (the COPY path uses the DB-API
            # connection): a lost connection is transient on every path.
            cls = db_error_class(exc, self.engine.dialect)
            if cls is None:
                raise
            raise cls(f"database {masked_url(self.url)} failed: {describe_db_error(exc)}") from exc

    @contextmanager
    def transaction(self) -> Iterator[Session]:
        """One transaction for every call this thread makes on this database inside the block:
        committed at its end, rolled back if the block raises (e.g. read, decide and write under
        a lock, :meth:`~tunefleet.db.shards.ShardsMixin.planning`)."""
        if getattr(self._tx, "session", None) is not None:
            raise RuntimeError("transactions do not nest")
        with self.session() as sess:
            self._tx.session = sess
            try:
                yield sess
            finally:
                self._tx.session = None

    def _insert(self, table: Any) -> Any:
        return (pg_dialect.insert if self.dialect == "postgresql" else sqlite_dialect.insert)(table)
