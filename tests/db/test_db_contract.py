"""The database contract suite, run against every real backend (SQLite and PostgreSQL)."""

from __future__ import annotations

from tunefleet.testing.db_contract import DatabaseContract


class TestDatabaseContract(DatabaseContract):
    """``db_url`` (tests/conftest.py) is parametrised over sqlite and a real PostgreSQL."""
