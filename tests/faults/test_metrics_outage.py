"""A Pushgateway outage fails no flow and no tuning step (issue 34, item 5).

The Pushgateway is real (``tunefleet.testing.prometheus``); "down" is one that stopped, its port
closed. A failed push is retried briefly (a hook stands in for the wait, and starts the gateway
in one test), then said once as a warning with the reason; the account step, the ``account``
flow the pipeline runs before its build, and a shard's accountant all go on.
"""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from tunefleet.energy import metrics as metrics_module
from tunefleet.energy.metrics import FleetMetrics
from tunefleet.testing.prometheus import PushgatewayServer

LOGGER = metrics_module.__name__


@pytest.fixture
def down_gateway() -> Iterator[str]:
    """The address of a real Pushgateway that stopped: nothing listens on its port any more."""
    server = PushgatewayServer()
    server.start()
    server.stop()
    yield server.address


def pushgateway_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Each warning record once, even where two handlers caught it (see the account step's test)."""
    records = {id(r): r for r in caplog.records if r.levelno >= logging.WARNING and "Pushgateway" in r.getMessage()}
    return [r.getMessage() for r in records.values()]


def test_a_failed_push_is_tried_again_briefly(caplog: pytest.LogCaptureFixture) -> None:
    server = PushgatewayServer()  # its port chosen, the gateway not started yet: down
    waits: list[float] = []

    def restarted(seconds: float) -> None:  # the gateway comes back while the push waits to retry
        waits.append(seconds)
        if server.proc is None:
            server.start()

    metrics = FleetMetrics()
    metrics.init_series("x86", "estimate")
    try:
        with caplog.at_level(logging.DEBUG, logger=LOGGER):
            assert metrics.publish(server.address, grouping_key={"shard": "1"}, sleep=restarted) is True
        assert waits == [metrics_module.PUSH_RETRY_S]
        text = urllib.request.urlopen(server.url + "/metrics", timeout=5).read().decode()
        assert 'tunefleet_trials_total{' in text and 'shard="1"' in text
        assert pushgateway_warnings(caplog) == []  # a blip that passed is no outage
    finally:
        server.stop()


def test_an_outage_is_said_once_with_its_reason_and_costs_no_time_per_batch(
        down_gateway: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = FleetMetrics()
    waits: list[float] = []
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert metrics.publish(down_gateway, grouping_key={"shard": "1"}, sleep=waits.append) is False
        for shard in range(2, 7):  # every batch of every shard of this process pushes
            assert FleetMetrics().publish(down_gateway, grouping_key={"shard": str(shard)}, sleep=waits.append) is False
    assert waits == [metrics_module.PUSH_RETRY_S, 2 * metrics_module.PUSH_RETRY_S]  # retried once, then skipped
    (warning,) = pushgateway_warnings(caplog)
    assert down_gateway in warning and "refused" in warning.lower() and "\n" not in warning

    # the gateway back (past the cool-down): pushed again, and said
    monkeypatch.setattr(metrics_module, "PUSH_COOLDOWN_S", 0.0)
    server = PushgatewayServer()
    server.port = int(down_gateway.rsplit(":", 1)[1])
    server.start()
    try:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=LOGGER):
            assert metrics.publish(down_gateway, grouping_key={"shard": "1"}, sleep=waits.append) is True
        assert any("again" in r.getMessage() and r.levelno == logging.INFO for r in caplog.records)
    finally:
        server.stop()


def test_a_refused_push_is_not_retried(caplog: pytest.LogCaptureFixture) -> None:
    server = PushgatewayServer()
    server.start()
    waits: list[float] = []
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            # a path the gateway does not serve: 404, a wrong address, not a passing outage
            assert FleetMetrics().publish(f"{server.url}/nowhere", grouping_key={"shard": "1"},
                                          sleep=waits.append) is False
    finally:
        server.stop()
    assert waits == []
    assert len(pushgateway_warnings(caplog)) == 1


def test_a_shards_accountant_goes_on_and_warns_once(down_gateway: str, caplog: pytest.LogCaptureFixture) -> None:
    from tunefleet.energy.accounting import ShardAccountant
    from tunefleet.energy.meters import EstimateMeter

    db = SimpleNamespace(best_measurements=lambda *_args: [])
    hardware = SimpleNamespace(id=1, name="x86", price_per_hour=1.0)
    workload = SimpleNamespace(id=1, structural_hash="ab" * 32)
    with caplog.at_level(logging.WARNING):
        accountant = ShardAccountant(db, hardware, workload, meter=EstimateMeter(10.0, 5.0),  # type: ignore[arg-type]
                                     pushgateway=down_gateway, shard_id=7, lease=1)  # pushes once at its start
        for _ in range(3):  # and after every round
            accountant.push()
        energy = accountant.finish()  # and at its end
    assert energy.source == "estimate"
    warnings = pushgateway_warnings(caplog)
    assert len(warnings) == 1 and down_gateway in warnings[0], warnings


def test_the_account_step_goes_on_when_the_pushgateway_is_down(
        tunefleet_home, down_gateway: str, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
        caplog: pytest.LogCaptureFixture) -> None:
    from tunefleet.tasks import steps

    from tunefleet.context import close_shared_contexts

    monkeypatch.setenv("TUNEFLEET_METRICS_PUSHGATEWAY", down_gateway)
    logger = logging.getLogger(LOGGER)
    # the context's logging setup may stop tunefleet's records at its own logger, so catch them there
    # too; where they also reach the root, pushgateway_warnings counts each record once
    handler = logging.Handler()
    handler.emit = caplog.handler.emit  # type: ignore[method-assign]
    logger.addHandler(handler)
    try:
        with caplog.at_level(logging.WARNING):
            assert steps.account.fn() == []  # nothing tuned yet: no rows, and no error
    finally:
        logger.removeHandler(handler)
        close_shared_contexts()
    warnings = pushgateway_warnings(caplog)
    assert len(warnings) == 1 and down_gateway in warnings[0], warnings


@pytest.fixture(scope="module")
def prefect_harness() -> Iterator[None]:
    from tunefleet.testing.prefect_server import flow_harness

    with flow_harness():
        yield


def test_the_account_flow_the_pipeline_runs_before_its_build_completes_when_the_pushgateway_is_down(
        prefect_harness: None, tunefleet_home, down_gateway: str,  # type: ignore[no-untyped-def]
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tunefleet.flows import step_flows

    from tunefleet.context import close_shared_contexts

    monkeypatch.setenv("TUNEFLEET_METRICS_PUSHGATEWAY", down_gateway)
    try:
        state = step_flows.account(None, ["x86"], return_state=True)
    finally:
        close_shared_contexts()
    assert state.is_completed(), state.message
    assert state.result() == []
