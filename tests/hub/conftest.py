"""Fixtures for the hub tests: a home per database backend, real mlp TIR and traces, real S3."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dataset.conftest import mlp_workloads  # noqa: F401  (a fixture shared with the dataset tests)


@pytest.fixture
def make_home(tunefleet_home: Path, db_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """Open a context on a database of the test's backend: the first call uses ``db_url``, later
    calls a new database of the same backend (another home: another machine's database)."""
    from tests.conftest import make_db_url
    from tunefleet import api
    from tunefleet.config import load_settings

    opened, urls = [], []

    def make(name: str = "a", **settings: Any) -> Any:
        (tmp_path / name).mkdir(exist_ok=True)
        url = db_url
        if opened:
            urls.append(make_db_url(request.node.callspec.params["db_url"], request, tmp_path / name))
            url = next(urls[-1])
        ctx = api.connect(load_settings(home=tmp_path / name, database_url=url, **{"hub": "off", **settings}))
        opened.append(ctx)
        return ctx

    yield make
    for ctx in opened:
        ctx.close()
    for gen in urls:
        next(gen, None)
