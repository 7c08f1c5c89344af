"""A shard's Pushgateway group is deleted when the shard ends (issue 34, round two, item 7).

A Pushgateway never forgets a group: without deletion every shard attempt leaves its series there
for ever. The Pushgateway and Prometheus are real (``tunefleet.testing.prometheus``); the shard's
accountant is the real :class:`~tunefleet.energy.accounting.ShardAccountant` on stand-ins for the
database rows it reads.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from tunefleet.energy import metrics as metrics_module
from tunefleet.energy.accounting import ShardAccountant
from tunefleet.energy.meters import EstimateMeter
from tunefleet.energy.metrics import (
    FleetMetrics,
    PushgatewayError,
    delete_group,
    retract_group,
    retract_group_later,
)
from tunefleet.testing.prometheus import PrometheusServer, PushgatewayServer, wait_until

pytestmark = pytest.mark.serial  # times how long a push waits

HARDWARE = SimpleNamespace(id=1, name="x86", price_per_hour=3600.0)  # 1 price unit per second
WORKLOAD = SimpleNamespace(id=1, structural_hash="ab" * 32)
DB = SimpleNamespace(best_measurements=lambda *_args: [])


@pytest.fixture
def gateway() -> Iterator[PushgatewayServer]:
    with PushgatewayServer() as server:
        yield server  # type: ignore[misc]


def exposition(server: PushgatewayServer) -> str:
    with urllib.request.urlopen(server.url + "/metrics", timeout=5) as resp:
        return resp.read().decode()


def has_group(server: PushgatewayServer, shard: int, attempt: int) -> bool:
    return any(f'shard="{shard}"' in line and f'attempt="{attempt}"' in line and line.startswith("tunefleet_")
               for line in exposition(server).splitlines())


def accountant(address: str, *, shard: int = 7, lease: int = 1, linger_s: float | None = 0.0) -> ShardAccountant:
    return ShardAccountant(DB, HARDWARE, WORKLOAD, meter=EstimateMeter(10.0, 5.0),  # type: ignore[arg-type]
                           pushgateway=address, shard_id=shard, lease=lease, linger_s=linger_s)


def pushgateway_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    records = {id(r): r for r in caplog.records if r.levelno >= logging.WARNING and "Pushgateway" in r.getMessage()}
    return [r.getMessage() for r in records.values()]


def test_a_finished_shards_group_is_gone_from_the_pushgateway(gateway: PushgatewayServer) -> None:
    acc = accountant(gateway.address)
    assert has_group(gateway, 7, 1), "the attempt pushes its group when it starts"
    other = accountant(gateway.address, shard=8)
    acc.finish()
    assert not has_group(gateway, 7, 1), exposition(gateway)
    assert has_group(gateway, 8, 1), "only the finished shard's group goes"
    acc.push()  # a stray push after the end does not bring it back
    assert not has_group(gateway, 7, 1)
    other.finish()
    assert "tunefleet_" not in exposition(gateway)


def test_the_group_lingers_until_prometheus_has_scraped_the_final_values(gateway: PushgatewayServer) -> None:
    """The cost is counted only when the shard ends: deleted at once, Prometheus would never see it."""
    with PrometheusServer([gateway.address], scrape_interval="1s") as prometheus:
        wait_until(lambda: bool(prometheus.query("up == 1")), 30, "Prometheus to scrape the gateway")  # type: ignore[attr-defined]
        acc = accountant(gateway.address, linger_s=4.0)
        energy = acc.finish()
        assert energy.cost > 0 and has_group(gateway, 7, 1), "the group stays a while after the end"

        def scraped_cost() -> bool:  # still answers once the series went stale with the group's deletion
            found = prometheus.query('max_over_time(tunefleet_cost_total{shard="7",attempt="1"}[5m])')  # type: ignore[attr-defined]
            return bool(found) and float(found[0]["value"][1]) == pytest.approx(energy.cost)

        wait_until(scraped_cost, 10, "Prometheus to scrape the shard's final cost")
        wait_until(lambda: not has_group(gateway, 7, 1), 15, "the group's deletion after its linger")


def test_an_attempt_deletes_the_groups_its_shards_earlier_attempts_left(gateway: PushgatewayServer) -> None:
    accountant(gateway.address, lease=1)  # a worker killed mid-shard: never finishes
    accountant(gateway.address, lease=2)  # so is its successor
    accountant(gateway.address, shard=9, lease=1)  # another shard, running
    assert has_group(gateway, 7, 2) and has_group(gateway, 9, 1)
    third = accountant(gateway.address, lease=3)
    assert not has_group(gateway, 7, 1) and not has_group(gateway, 7, 2)
    assert has_group(gateway, 7, 3) and has_group(gateway, 9, 1)
    third.finish()
    assert not has_group(gateway, 7, 3)


def test_a_deletion_waits_in_the_background(gateway: PushgatewayServer) -> None:
    metrics = FleetMetrics()
    metrics.init_series("x86", "estimate")
    metrics.push(gateway.address, grouping_key={"shard": "3", "attempt": "1"})
    started = time.monotonic()
    retract_group_later(gateway.address, grouping_key={"shard": "3", "attempt": "1"}, after_s=1.0)
    assert time.monotonic() - started < 0.5, "returns at once"
    assert has_group(gateway, 3, 1)
    wait_until(lambda: not has_group(gateway, 3, 1), 10, "the deletion in the background")
    assert time.monotonic() - started >= 1.0


def test_a_process_that_exits_first_deletes_its_groups_as_it_ends_without_waiting(gateway: PushgatewayServer) -> None:
    code = textwrap.dedent(f"""
        from tunefleet.energy.metrics import FleetMetrics, retract_group_later
        m = FleetMetrics()
        m.init_series("x86", "estimate")
        m.push({gateway.address!r}, grouping_key={{"shard": "4", "attempt": "1"}})
        retract_group_later({gateway.address!r}, grouping_key={{"shard": "4", "attempt": "1"}}, after_s=60)
    """)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert time.monotonic() - started < 30, "a command never waits for the linger"
    assert not has_group(gateway, 4, 1), exposition(gateway)


def test_a_failed_deletion_never_raises_and_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    server = PushgatewayServer()
    server.start()
    address = server.address
    acc = accountant(address, shard=11)  # pushed while the gateway was up
    server.stop()
    waits: list[float] = []
    with caplog.at_level(logging.DEBUG, logger=metrics_module.__name__):
        acc.finish()  # the last push and the deletion both fail: no exception
        for _ in range(3):
            assert retract_group(address, grouping_key={"shard": "12", "attempt": "1"}, sleep=waits.append) is False
    warnings = pushgateway_warnings(caplog)
    assert len(warnings) == 1 and address in warnings[0] and "\n" not in warnings[0], warnings
    with pytest.raises(PushgatewayError, match=r"cannot delete the metrics group .* from the Pushgateway at"):
        delete_group(address, grouping_key={"shard": "12", "attempt": "1"})


def test_a_group_needs_a_key() -> None:
    with pytest.raises(ValueError, match="non-empty grouping_key"):
        delete_group("127.0.0.1:1", grouping_key={})
    with pytest.raises(ValueError, match="must not contain 'job'"):
        retract_group_later("127.0.0.1:1", grouping_key={"job": "x"})
