"""Flows under Prefect's test harness (a temporary Prefect server on SQLite, once per session; results persisted)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "tunefleet")


@pytest.fixture(scope="session")
def prefect_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    from tunefleet.testing.prefect_server import flow_harness

    with flow_harness():
        yield


@pytest.fixture
def flow_env(prefect_harness: None, tunefleet_home, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """A fresh tunefleet home (SQLite + local artifacts); shared contexts closed afterwards."""
    from tunefleet.context import close_shared_contexts

    yield
    close_shared_contexts()
