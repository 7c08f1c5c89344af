"""Shared fixtures: real PostgreSQL (started here, never skipped) and database URLs per backend."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
#: The shipped hub bundle is imported only where a test asks for it (tests/hub, the README command):
#: every other test starts from an empty database, as its assertions expect, and pays no import.
NO_HUB = {"TUNEFLEET_HUB": "off"}
os.environ.update(NO_HUB)

from tunefleet.testing.postgres import PostgresServer  # noqa: E402
from tunefleet.testing.seaweedfs import SeaweedFSServer  # noqa: E402

DB_BACKENDS = ["sqlite", "postgresql"]


def on_backend(name: str) -> pytest.MarkDecorator:
    """Run a test that takes ``db_url`` on one backend only: for long end-to-end tests (real
    tuning) whose database behaviour the contract suite (``tunefleet.testing.db_contract``)
    already checks on both, so that the whole suite fits CI's time. Split them between backends."""
    assert name in DB_BACKENDS, name
    return pytest.mark.parametrize("db_url", [name], indirect=True)


#: The files that take longest (minutes each), longest first: the parallel phase hands them to its
#: workers first, so the short files fill the gaps at the end instead of one long file running
#: alone after everything else (pytest-xdist's loadfile hands out files in collection order).
HEAVY_FIRST = ("tests/cli/test_cli_run.py", "tests/integration/test_prefect_server.py",
               "tests/hub/test_hub_replay.py", "tests/engine/test_tune_e2e.py", "tests/flows/test_flows.py",
               "tests/costmodel/test_zeroshot.py", "tests/engine/test_efficiency.py", "tests/test_packaging.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``TUNEFLEET_TEST_PHASE`` (set by scripts/test.sh) keeps the ``serial`` tests (``serial``)
    or all the others (``parallel``, the :data:`HEAVY_FIRST` files first); unset, every test runs."""
    phase = os.environ.get("TUNEFLEET_TEST_PHASE", "")
    if not phase:
        return
    if phase not in ("parallel", "serial"):
        raise pytest.UsageError(f"TUNEFLEET_TEST_PHASE={phase!r}: one of parallel, serial (or unset)")
    serial = phase == "serial"
    keep, drop = [], []
    for item in items:
        (keep if (item.get_closest_marker("serial") is not None) == serial else drop).append(item)
    config.hook.pytest_deselected(items=drop)
    if not serial:
        rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
        keep.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: the rest in order
    items[:] = keep


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL cluster for the session; each test gets its own database."""
    with PostgresServer() as server:
        yield server


@pytest.fixture(scope="session")
def seaweedfs() -> Iterator[SeaweedFSServer]:
    """One real S3 service (SeaweedFS) on loopback for the session, shared by every module
    that uses S3 (each test makes its own bucket); never skipped."""
    with SeaweedFSServer() as server:
        yield server


def make_db_url(backend: str, request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'tunefleet.db'}"
        return
    server: PostgresServer = request.getfixturevalue("pg_server")
    name = server.create_database()
    try:
        yield server.url(name)
    finally:
        server.drop_database(name)


@pytest.fixture(params=DB_BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """An empty database on every real backend: SQLite file and PostgreSQL."""
    yield from make_db_url(request.param, request, tmp_path)


@pytest.fixture
def tunefleet_home(tmp_path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """An isolated TUNEFLEET_HOME with no TUNEFLEET_* variables leaking in (and the hub off)."""
    for key in list(os.environ):
        if key.startswith("TUNEFLEET_"):
            monkeypatch.delenv(key)
    home = tmp_path / "home"
    monkeypatch.setenv("TUNEFLEET_HOME", str(home))
    for key, value in NO_HUB.items():  # no shipped bundle either, unless the test asks
        monkeypatch.setenv(key, value)
    return home
