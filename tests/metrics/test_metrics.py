"""FleetMetrics: names, types and labels in the exposition; counter, gauge and push behaviour."""

from __future__ import annotations

import socket
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from tunefleet.energy.metrics import METRIC_NAMES, SHARD_DURATION_BUCKETS, SHARD_STATES, FleetMetrics, PushgatewayError
from tunefleet.errors import TransientError, TunefleetError
from tunefleet.testing.ports import free_port

WORKLOAD = "0123456789abcdef" + "0" * 48

#: family name in the parsed exposition -> (type, label names)
EXPECTED = {
    "tunefleet_energy_joules": ("counter", {"hardware", "source", "kind"}),
    "tunefleet_cost": ("counter", {"hardware"}),
    "tunefleet_trials": ("counter", {"hardware", "kind"}),
    "tunefleet_measure_errors": ("counter", {"hardware", "stage"}),
    "tunefleet_shard_duration_seconds": ("histogram", {"hardware"}),
    "tunefleet_best_latency_seconds": ("gauge", {"workload", "hardware"}),
    "tunefleet_shards": ("gauge", {"hardware", "state"}),
    "tunefleet_model_energy_joules": ("gauge", {"model", "hardware", "kind"}),
    "tunefleet_model_cost": ("gauge", {"model", "hardware"}),
    "tunefleet_measure_parallelism": ("gauge", {"hardware"}),
    "tunefleet_node_quarantined": ("gauge", {"hardware", "node"}),
    "tunefleet_last_push_timestamp_seconds": ("gauge", set()),
}


def observe_everything(m: FleetMetrics) -> None:
    m.observe_batch("x86", "rapl", useful_joules=12.5, wasted_joules=40.0, useful_trials=2, wasted_trials=6,
                    build_errors=1, run_errors=2)
    m.observe_batch("gpu", "nvml+estimate", 100.0, 300.0, 1, 9, 0, 3)
    m.observe_shard("x86", duration_s=95.0, cost=0.0045)
    m.set_best_latency(WORKLOAD, "x86", 1.2e-4)
    m.set_shard_states("x86", {"pending": 3, "leased": 1})
    m.set_model_totals("resnet18", "x86", useful_joules=10.0, wasted_joules=30.0, cost=0.002)
    m.set_measure_parallelism("x86", 2)
    m.node_quarantined.labels(hardware="x86", node="node-1").set(1)


def families(m: FleetMetrics) -> dict[str, object]:
    return {f.name: f for f in text_string_to_metric_families(m.exposition().decode())}


def sample(m: FleetMetrics, name: str, **labels: str) -> float:
    value = m.registry.get_sample_value(name, labels)
    assert value is not None, f"no sample {name}{labels}"
    return value


def test_exposition_has_every_metric_with_type_and_labels() -> None:
    m = FleetMetrics()
    observe_everything(m)
    fams = families(m)
    for name, (mtype, labels) in EXPECTED.items():
        fam = fams.get(name)
        assert fam is not None, f"{name} missing from the exposition"
        assert fam.type == mtype, (name, fam.type)
        own = [s for s in fam.samples if not s.name.endswith("_created")]
        assert own, f"{name} has no samples"
        for s in own:
            assert set(s.labels) - {"le"} == labels, (s.name, s.labels)
    # the names dashboards query (counters with _total)
    exposed = {s.name for fam in fams.values() for s in fam.samples}
    assert set(METRIC_NAMES) - {"tunefleet_shard_duration_seconds"} <= exposed
    assert "tunefleet_shard_duration_seconds_bucket" in exposed
    assert sample(m, "tunefleet_energy_joules_total", hardware="gpu", source="nvml+estimate", kind="wasted") == 300.0
    assert sample(m, "tunefleet_trials_total", hardware="x86", kind="wasted") == 6
    assert sample(m, "tunefleet_measure_errors_total", hardware="gpu", stage="run") == 3
    assert sample(m, "tunefleet_cost_total", hardware="x86") == pytest.approx(0.0045)
    assert sample(m, "tunefleet_best_latency_seconds", workload="0123456789abcdef", hardware="x86") == 1.2e-4
    assert sample(m, "tunefleet_model_energy_joules", model="resnet18", hardware="x86", kind="wasted") == 30.0
    assert sample(m, "tunefleet_model_cost", model="resnet18", hardware="x86") == 0.002


def test_histogram_buckets_span_one_second_to_two_hours() -> None:
    m = FleetMetrics()
    m.observe_shard("arm", 0.5, 0.0)
    m.observe_shard("arm", 7000.0, 0.1)
    assert SHARD_DURATION_BUCKETS[0] == 1.0 and SHARD_DURATION_BUCKETS[-1] == 7200.0
    assert sample(m, "tunefleet_shard_duration_seconds_bucket", hardware="arm", le="1.0") == 1
    assert sample(m, "tunefleet_shard_duration_seconds_bucket", hardware="arm", le="5400.0") == 1
    assert sample(m, "tunefleet_shard_duration_seconds_bucket", hardware="arm", le="7200.0") == 2
    assert sample(m, "tunefleet_shard_duration_seconds_count", hardware="arm") == 2


def test_counters_only_go_up() -> None:
    m = FleetMetrics()
    m.observe_batch("x86", "estimate", 5.0, 1.0, 1, 1, 0, 1)
    before = sample(m, "tunefleet_energy_joules_total", hardware="x86", source="estimate", kind="useful")
    m.observe_batch("x86", "estimate", 0.0, 0.0, 0, 0, 0, 0)  # zero adds nothing, is allowed
    for bad in ({"useful_joules": -1.0}, {"wasted_trials": -1}, {"run_errors": -1}):
        args = {"useful_joules": 1.0, "wasted_joules": 1.0, "useful_trials": 1, "wasted_trials": 1,
                "build_errors": 0, "run_errors": 0, **bad}
        with pytest.raises(ValueError):
            m.observe_batch("x86", "estimate", **args)
    with pytest.raises(ValueError):
        m.observe_shard("x86", 10.0, -0.5)
    assert sample(m, "tunefleet_energy_joules_total", hardware="x86", source="estimate", kind="useful") == before
    m.observe_batch("x86", "estimate", 2.0, 0.0, 1, 0, 0, 0)
    assert sample(m, "tunefleet_energy_joules_total", hardware="x86", source="estimate", kind="useful") == before + 2.0


def test_rejects_labels_outside_the_vocabulary() -> None:
    m = FleetMetrics()
    for source in ("", "solar", "rapl+", "RAPL", "rapl,nvml"):
        with pytest.raises(ValueError):
            m.observe_batch("x86", source, 1, 1, 1, 1)
    with pytest.raises(ValueError, match="wasted"):
        m.observe_batch("x86", "rapl", 1, 1, 1, 1, build_errors=1, run_errors=1)  # errors are wasted trials
    with pytest.raises(ValueError):
        m.set_shard_states("x86", {"running": 1})
    with pytest.raises(ValueError):
        m.set_best_latency("not-a-hash", "x86", 1.0)
    with pytest.raises(ValueError):
        m.set_best_latency(WORKLOAD, "x86", 0.0)
    with pytest.raises(ValueError):
        m.observe_shard("", 1.0, 1.0)


def test_set_shard_states_zero_fills_and_overwrites() -> None:
    m = FleetMetrics()
    m.set_shard_states("gpu", {"pending": 4, "done": 2})
    assert {s: sample(m, "tunefleet_shards", hardware="gpu", state=s) for s in SHARD_STATES} == {
        "pending": 4, "leased": 0, "done": 2, "failed": 0, "cancelled": 0}
    m.set_shard_states("gpu", {"done": 6})
    assert sample(m, "tunefleet_shards", hardware="gpu", state="pending") == 0
    assert sample(m, "tunefleet_shards", hardware="gpu", state="done") == 6


def test_init_series_creates_zero_series() -> None:
    m = FleetMetrics()
    m.init_series("arm", "estimate")
    assert sample(m, "tunefleet_energy_joules_total", hardware="arm", source="estimate", kind="wasted") == 0
    assert sample(m, "tunefleet_trials_total", hardware="arm", kind="useful") == 0
    assert sample(m, "tunefleet_measure_errors_total", hardware="arm", stage="build") == 0
    assert sample(m, "tunefleet_cost_total", hardware="arm") == 0
    assert sample(m, "tunefleet_shard_duration_seconds_count", hardware="arm") == 0


def test_instances_have_separate_registries() -> None:
    a, b = FleetMetrics(), FleetMetrics()
    assert a.registry is not b.registry
    a.observe_batch("x86", "rapl", 1.0, 2.0, 1, 1)
    assert b.registry.get_sample_value("tunefleet_trials_total", {"hardware": "x86", "kind": "useful"}) is None
    registry = CollectorRegistry()
    c = FleetMetrics(registry)
    assert c.registry is registry
    with pytest.raises(ValueError):  # the same metrics twice in one registry
        FleetMetrics(registry)


def test_nothing_registered_at_import() -> None:
    from prometheus_client import REGISTRY

    FleetMetrics()
    assert not [n for n in REGISTRY._names_to_collectors if n.startswith("tunefleet_")]


def test_push_to_unreachable_gateway_fails_fast_with_one_line() -> None:
    m = FleetMetrics()
    m.observe_batch("x86", "rapl", 1.0, 2.0, 1, 1)
    gateway = f"127.0.0.1:{free_port()}"  # nothing listens there
    start = time.monotonic()
    with pytest.raises(PushgatewayError) as info:
        m.push(gateway, grouping_key={"shard": "1"})
    assert time.monotonic() - start < 10
    message = str(info.value)
    assert "\n" not in message and gateway in message, message
    assert isinstance(info.value, TunefleetError) and isinstance(info.value, TransientError)
    assert m.registry.get_sample_value("tunefleet_last_push_timestamp_seconds") == 0  # a failed push is no push


def test_push_to_silent_gateway_times_out() -> None:
    """A gateway that accepts connections but never answers: the default timeout (5 s) applies."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        gateway = f"127.0.0.1:{listener.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(PushgatewayError) as info:
            FleetMetrics().push(f"http://{gateway}", grouping_key={"shard": "2"})
        elapsed = time.monotonic() - start
    assert elapsed < 10, elapsed
    assert gateway in str(info.value) and "\n" not in str(info.value)


def test_push_refuses_grouping_keys_that_would_relabel_series() -> None:
    m = FleetMetrics()
    m.observe_batch("arm", "estimate", 1.0, 2.0, 1, 1)
    with pytest.raises(ValueError, match="hardware"):
        m.push("127.0.0.1:1", grouping_key={"shard": "1", "hardware": "x86"})
    with pytest.raises(ValueError):
        m.push("127.0.0.1:1", grouping_key={})
    with pytest.raises(ValueError):
        m.push("127.0.0.1:1", grouping_key={"job": "x"})


@pytest.mark.slow
def test_push_replaces_only_its_group(pushgateway) -> None:  # type: ignore[no-untyped-def]
    a, b = FleetMetrics(), FleetMetrics()
    a.observe_batch("x86", "rapl", 1.0, 2.0, 1, 1)
    b.observe_batch("x86", "rapl", 5.0, 5.0, 3, 3)
    a.push(pushgateway.address, grouping_key={"shard": "a", "hardware": "x86"})
    b.push(pushgateway.address, grouping_key={"shard": "b", "hardware": "x86"})
    a.observe_batch("x86", "rapl", 1.0, 0.0, 1, 0)
    a.push(pushgateway.address, grouping_key={"shard": "a", "hardware": "x86"})
    text = urllib.request.urlopen(pushgateway.url + "/metrics", timeout=5).read().decode()
    values = {(s.labels.get("shard"), s.labels.get("kind")): s.value
              for f in text_string_to_metric_families(text) if f.name == "tunefleet_trials"
              for s in f.samples if s.name == "tunefleet_trials_total"}
    assert values[("a", "useful")] == 2 and values[("b", "useful")] == 3
    assert a.registry.get_sample_value("tunefleet_last_push_timestamp_seconds") > time.time() - 60


def test_serve_exposes_the_registry() -> None:
    m = FleetMetrics()
    m.observe_batch("x86", "rapl", 1.0, 2.0, 1, 1)
    server = m.serve(0)
    try:
        assert server.server_address[0] == "127.0.0.1"
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5).read().decode()
        assert 'tunefleet_trials_total{hardware="x86",kind="useful"} 1.0' in body
        assert "python_gc_objects_collected_total" not in body  # our registry, not the global one
    finally:
        server.shutdown()
        server.server_close()
