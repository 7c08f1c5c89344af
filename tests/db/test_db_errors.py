"""Bad database input: unreachable servers, wrong credentials, bad URLs — one clear line, fast."""

from __future__ import annotations

import socket
import time

import pytest

from tunefleet.db import Database
from tunefleet.errors import DatabaseError
from tunefleet.testing.ports import free_port


def test_unreachable_postgres_port_fails_fast() -> None:
    url = f"postgresql+psycopg2://postgres:pw@127.0.0.1:{free_port()}/x"
    start = time.monotonic()
    with pytest.raises(DatabaseError, match=r"cannot connect to database postgresql\+psycopg2://postgres:\*\*\*@") as exc:
        Database(url, connect_timeout_s=2)
    assert time.monotonic() - start < 10
    assert "\n" not in str(exc.value)
    assert "pw" not in str(exc.value)


def test_silent_server_times_out_within_10s() -> None:
    """A peer that accepts TCP but never speaks (a hung server) must not hang us."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(DatabaseError, match="timeout|timed out"):
            Database(f"postgresql+psycopg2://postgres:pw@127.0.0.1:{port}/x", connect_timeout_s=3)
        assert time.monotonic() - start < 10


def test_wrong_password_is_named(pg_server) -> None:  # type: ignore[no-untyped-def]
    start = time.monotonic()
    with pytest.raises(DatabaseError, match="password authentication failed"):
        Database(pg_server.url("postgres", password="not-the-password"))
    assert time.monotonic() - start < 10


def test_sqlite_in_unwritable_place(tmp_path) -> None:  # type: ignore[no-untyped-def]
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(DatabaseError, match="cannot create the SQLite database"):
        Database(f"sqlite:///{blocker}/sub/tunefleet.db")


def test_sqlite_file_that_is_not_a_database(tmp_path) -> None:  # type: ignore[no-untyped-def]
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(DatabaseError, match="not a database"):
        Database(f"sqlite:///{junk}")
