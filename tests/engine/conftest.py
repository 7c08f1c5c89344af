"""Fixtures for end-to-end engine tests: a settings object per backend, tiny models only."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tunefleet.config import Settings, load_settings
from tunefleet.db import Database
from tunefleet.hardware import seed_hardware_classes
from tunefleet.store import LocalStore


@pytest.fixture
def engine_settings(db_url: str, tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return load_settings(home=tmp_path / "home", database_url=db_url)


@pytest.fixture
def engine(engine_settings: Settings) -> Iterator[tuple[Settings, Database, LocalStore]]:
    db = Database.from_settings(engine_settings)
    seed_hardware_classes(db, engine_settings)
    yield engine_settings, db, LocalStore(engine_settings.effective_store_path)
    db.close()
