"""A write that loses a race (a unique key taken meanwhile) is one clear, retryable line, never a
driver traceback; on SQLite and PostgreSQL. The race is forced, without sleeps: the conflicting
row is inserted on the same connection just before the statement that collides with it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event

from tunefleet.db import Database
from tunefleet.errors import ConflictError, DatabaseError, TransientError

# Another export reserved dataset version 1 between this export's read of the highest version
# and its insert (tunefleet.db.learning.add_dataset: max + 1).
RACED_DATASET = ("INSERT INTO datasets (version, uri, manifest, row_count, created_at) "
                 "VALUES (1, 'raced', '{}', 0, CURRENT_TIMESTAMP)")


@contextmanager
def inserted_just_before(target: Any, table: str, sql: str) -> Iterator[list[str]]:
    """Run ``sql`` on the same connection just before the first ``INSERT INTO table`` on
    ``target`` (an Engine, or the Engine class for every engine); yields the statements it preceded."""
    fired: list[str] = []

    def before(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if not fired and statement.lstrip().upper().startswith(f"INSERT INTO {table.upper()} "):
            fired.append(statement)
            raw = cursor.connection.cursor()
            raw.execute(sql)
            raw.close()

    event.listen(target, "before_cursor_execute", before)
    try:
        yield fired
    finally:
        event.remove(target, "before_cursor_execute", before)


def test_unique_key_taken_meanwhile_is_one_retryable_line(db_url: str) -> None:
    db = Database(db_url)
    with inserted_just_before(db.engine, "datasets", RACED_DATASET) as fired, pytest.raises(ConflictError) as exc:
        db.add_dataset(uri="", manifest={}, row_count=0)
    assert fired
    msg = str(exc.value)
    assert "\n" not in msg and "Traceback" not in msg
    assert "conflicted with a concurrent one" in msg and "run it again" in msg
    assert "pw" not in msg.replace("postgres:***", "")  # the test server's password stays masked
    assert isinstance(exc.value, DatabaseError) and isinstance(exc.value, TransientError)
    assert db.add_dataset(uri="", manifest={}, row_count=0).version == 1  # the losing write rolled back
    assert db.add_dataset(uri="", manifest={}, row_count=0).version == 2  # running it again works


def test_other_integrity_errors_are_one_permanent_line(db_url: str) -> None:
    db = Database(db_url)
    with pytest.raises(DatabaseError) as exc:  # no such workload or class: a foreign key refuses it
        db.add_shards(987654, [(987654, 8, 1.0)])
    msg = str(exc.value)
    assert "\n" not in msg and "refused the change" in msg
    assert not isinstance(exc.value, TransientError)
