"""Every panel query of every dashboard, run against a real Prometheus that scraped a real
Pushgateway fed by FleetMetrics: no query may error or come back empty (or NaN).

Synthetic observations for now (two shards on two hardware classes, plus the accounting step);
the data producer is the only part to swap for a real tiny tuning run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tunefleet.energy.metrics import SHARD_STATES, FleetMetrics

from .conftest import PrometheusServer, PushgatewayServer, assert_all_panels_return_data, wait_until

pytestmark = pytest.mark.slow

WORKLOADS = ["3f2a9c0d1e4b5a6f" + "0" * 48, "a1b2c3d4e5f60718" + "0" * 48, "ffeeddccbbaa9988" + "1" * 48]


class SyntheticFleet:
    """Two shard jobs (x86 with RAPL, gpu with NVML + estimated host) and the accounting step."""

    def __init__(self, gateway: str) -> None:
        self.gateway = gateway
        self.shards = {
            "101": ("x86", "rapl", FleetMetrics()),
            "202": ("gpu", "nvml+estimate", FleetMetrics()),
        }
        self.account = FleetMetrics()

    def push_all(self) -> None:
        for shard, (hardware, _source, m) in self.shards.items():
            m.push(self.gateway, grouping_key={"shard": shard, "hardware": hardware})
        self.account.push(self.gateway, job="tunefleet-account", grouping_key={"step": "account"})

    def start(self) -> None:
        """Shards leased: every series at zero so increase() sees the later growth."""
        for hardware, source, m in self.shards.values():
            m.init_series(hardware, source)
        self.account.set_shard_states("x86", {"pending": 5, "leased": 1})
        self.account.set_shard_states("gpu", {"pending": 2, "leased": 1, "failed": 1})
        self.push_all()

    def tune(self, round_: int) -> None:
        """One measured batch per shard, a finished shard, better latencies and updated totals."""
        scale = round_ + 1
        x86, gpu = self.shards["101"][2], self.shards["202"][2]
        x86.observe_batch("x86", "rapl", 30.0 * scale, 90.0 * scale, 2, 14, build_errors=1, run_errors=2)
        gpu.observe_batch("gpu", "nvml+estimate", 400.0 * scale, 900.0 * scale, 3, 29, build_errors=0, run_errors=4)
        x86.observe_shard("x86", duration_s=240.0 * scale, cost=0.17 * 240 * scale / 3600)
        gpu.observe_shard("gpu", duration_s=1300.0 * scale, cost=2.5 * 1300 * scale / 3600)
        for i, w in enumerate(WORKLOADS):
            x86.set_best_latency(w, "x86", (3 - i) * 1e-4 / scale)
            gpu.set_best_latency(w, "gpu", (3 - i) * 2e-5 / scale)
        self.account.set_shard_states("x86", {"pending": 4 - round_, "leased": 1, "done": 1 + round_})
        self.account.set_shard_states("gpu", {"pending": 1, "leased": 1, "done": round_ + 1, "failed": 1})
        for model, share in (("resnet18", 0.6), ("bert-tiny", 0.4)):
            self.account.set_model_totals(model, "x86", 30.0 * share * scale, 90.0 * share * scale, 0.011 * share * scale)
            self.account.set_model_totals(model, "gpu", 400.0 * share * scale, 900.0 * share * scale, 0.9 * share * scale)
        self.push_all()


def oldest_scraped_push(prometheus: PrometheusServer) -> float:
    result = prometheus.query("min(push_time_seconds)")  # every group pushes each time
    return float(result[0]["value"][1]) if result else 0.0


def push_and_wait(prometheus: PrometheusServer, action: Callable[[], None], settle: float = 2.5) -> None:
    before = time.time()
    action()
    # wait until Prometheus has scraped this push, then let a few more scrapes land (1 s interval)
    wait_until(lambda: oldest_scraped_push(prometheus) >= before, 30, "Prometheus to scrape the Pushgateway")
    time.sleep(settle)


def test_every_panel_query_returns_data(pushgateway: PushgatewayServer, prometheus: PrometheusServer) -> None:
    fleet = SyntheticFleet(pushgateway.address)
    push_and_wait(prometheus, fleet.start)
    push_and_wait(prometheus, lambda: fleet.tune(0))
    push_and_wait(prometheus, lambda: fleet.tune(1))

    # the data really made it, with the shard label kept (honor_labels) and both classes present
    shards = prometheus.query("count by (shard, hardware) (tunefleet_trials_total)")
    assert {(s["metric"]["shard"], s["metric"]["hardware"]) for s in shards} == {("101", "x86"), ("202", "gpu")}
    states = prometheus.query('sum by (state) (tunefleet_shards{hardware=~".*"})')
    assert {s["metric"]["state"] for s in states} == set(SHARD_STATES)

    ran = assert_all_panels_return_data(prometheus.url, hardware=".*", rate_interval="30s", range="5m")
    assert ran >= 25
    # a single class selected still gives data (the gpu shard is the only gpu series)
    assert_all_panels_return_data(prometheus.url, hardware="gpu", rate_interval="30s", range="5m")
