"""Fixtures for the metrics and dashboard tests: the dashboard generator, and a real Prometheus +
Pushgateway (Debian packages ``prometheus`` and ``prometheus-pushgateway``, see
``tunefleet.testing.prometheus``) on loopback.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tunefleet.testing.prometheus import PrometheusServer, PushgatewayServer, wait_until  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
GENERATOR = REPO / "dashboards" / "generate.py"


def load_script(path: Path, name: str) -> ModuleType:
    """A script outside the package (``dashboards/`` is not a package) as a module, loaded once."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_generator() -> ModuleType:
    """``dashboards/generate.py`` as a module."""
    return load_script(GENERATOR, "tunefleet_dashboards_generate")


@pytest.fixture(scope="session")
def generator() -> ModuleType:
    return load_generator()


# Function scope: each test gets empty servers (both are ready in well under a second).
@pytest.fixture
def pushgateway() -> Iterator[PushgatewayServer]:
    with PushgatewayServer() as server:
        yield server  # type: ignore[misc]


@pytest.fixture
def prometheus(pushgateway: PushgatewayServer) -> Iterator[PrometheusServer]:
    server = PrometheusServer([pushgateway.address], scrape_interval="1s")
    with server:
        yield server


# --------------------------------------------------------------------------------------------
# Running every panel query
# --------------------------------------------------------------------------------------------


def assert_all_panels_return_data(prom_url: str, *, hardware: str = ".*", rate_interval: str = "30s",
                                  range: str = "5m", allow_nan: bool = False) -> int:  # noqa: A002
    """Run every panel query of every committed dashboard against Prometheus; fail on any error,
    any empty result, and (unless ``allow_nan``) any series whose value is NaN.

    Returns the number of queries run.
    """
    gen = load_generator()
    outcomes = gen.query_panels(prom_url, hardware=hardware, rate_interval=rate_interval, range=range)
    problems = []
    for o in outcomes:
        where = f"{o.query.dashboard} #{o.query.panel_id} {o.query.title!r}: {o.promql}"
        if o.error:
            problems.append(f"{where}\n    error: {o.error}")
        elif not o.result:
            problems.append(f"{where}\n    empty result")
        elif not allow_nan and any(str(s["value"][1]).lower() == "nan" for s in o.result):
            problems.append(f"{where}\n    NaN in {o.result}")
    assert outcomes, "no panel queries found"
    assert not problems, f"{len(problems)} of {len(outcomes)} panel queries failed:\n" + "\n".join(problems)
    return len(outcomes)
