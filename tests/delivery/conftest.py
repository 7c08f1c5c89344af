"""Fixtures for the delivery tests: a seeded SQLite database and a local artifact store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tunefleet.config import load_settings
from tunefleet.db import Database
from tunefleet.hardware import seed_hardware_classes
from tunefleet.store import LocalStore


@pytest.fixture
def fleet(tmp_path) -> Iterator[tuple[Database, LocalStore]]:  # type: ignore[no-untyped-def]
    """A fresh SQLite database with the built-in hardware classes, and its artifact store."""
    settings = load_settings(home=tmp_path / "home", database_url=f"sqlite:///{tmp_path / 'tunefleet.db'}")
    db = Database.from_settings(settings)
    seed_hardware_classes(db, settings)
    yield db, LocalStore(settings.effective_store_path)
    db.close()
