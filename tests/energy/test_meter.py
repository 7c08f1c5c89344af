"""Energy meters: RAPL on a fake powercap tree, NVML with a fake reader, the estimate (with a
fake CPU source and with a real child process), probing, money and apportioning. No TVM."""

from __future__ import annotations

import logging
import math
import multiprocessing
import random
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tunefleet.energy import meters
from tunefleet.energy.meters import (
    Availability,
    CompositeMeter,
    EnergyReading,
    EnergySourceUnavailable,
    EstimateMeter,
    NvmlMeter,
    RaplMeter,
    apportion,
    clear_probe_cache,
    detect_sources,
    money,
    probe,
    rapl_domains,
)


class Dial:
    """A fake cumulative counter (CPU seconds, clock): returns whatever the test set last."""

    def __init__(self, value: float = 0.0) -> None:
        self.value = value

    def __call__(self) -> float:
        return self.value


def make_zone(root: Path, directory: str, name: str, energy_uj: int, max_range_uj: int | None = None) -> Path:
    zone = root / directory
    zone.mkdir(parents=True)
    (zone / "name").write_text(f"{name}\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    if max_range_uj is not None:
        (zone / "max_energy_range_uj").write_text(f"{max_range_uj}\n")
    return zone


def set_energy(root: Path, directory: str, energy_uj: int) -> None:
    (root / directory / "energy_uj").write_text(f"{energy_uj}\n")


@pytest.fixture
def powercap(tmp_path: Path) -> Path:
    """Two packages, plus zones that must not be summed: sub-zones, psys, an MMIO duplicate."""
    root = tmp_path / "powercap"
    (root / "intel-rapl").mkdir(parents=True)  # the control type, not a zone
    make_zone(root, "intel-rapl:0", "package-0", 1_000_000, max_range_uj=20_000_000)
    make_zone(root, "intel-rapl:1", "package-1", 5_000_000, max_range_uj=20_000_000)
    make_zone(root, "intel-rapl:0:0", "core", 7_000_000, max_range_uj=20_000_000)
    make_zone(root, "intel-rapl:0:2", "dram", 3_000_000, max_range_uj=20_000_000)
    make_zone(root, "intel-rapl:2", "psys", 9_000_000, max_range_uj=20_000_000)
    make_zone(root, "intel-rapl-mmio:0", "package-0", 1_000_000, max_range_uj=20_000_000)
    return root


@pytest.fixture
def fresh_probe() -> Iterator[None]:
    clear_probe_cache()
    yield
    clear_probe_cache()


# ---------------------------------------------------------------------------------------- RAPL


def test_rapl_domains_are_top_level_packages_only(powercap: Path) -> None:
    domains = rapl_domains(powercap)
    assert [d.name for d in domains] == ["package-0", "package-1"]
    assert [d.path.name for d in domains] == ["intel-rapl:0", "intel-rapl:1"]
    assert all(d.max_range_uj == 20_000_000 for d in domains)
    assert RaplMeter.available(powercap)
    assert "2 package domain(s)" in RaplMeter.available(powercap).reason


def test_rapl_splits_package_energy_by_cpu_share_of_each_interval(powercap: Path) -> None:
    job, machine, clock = Dial(10.0), Dial(100.0), Dial(50.0)
    meter = RaplMeter(powercap, cpu_seconds=job, machine_cpu_seconds=machine, clock=clock)
    meter.start()

    # Interval 1: packages +10 J and +10 J; the job used 5 of the machine's 20 busy CPU-s.
    set_energy(powercap, "intel-rapl:0", 11_000_000)
    set_energy(powercap, "intel-rapl:1", 15_000_000)
    set_energy(powercap, "intel-rapl:0:0", 19_000_000)  # sub-zones and psys never count
    set_energy(powercap, "intel-rapl:2", 19_000_000)
    job.value, machine.value, clock.value = 15.0, 120.0, 52.0
    first = meter.read()
    assert first.source == "rapl"
    assert first.joules == pytest.approx(20.0 * 5 / 20)
    assert first.cpu_s == pytest.approx(5.0)
    assert first.wall_s == pytest.approx(2.0)
    assert first.detail["package_joules"] == pytest.approx({"package-0": 10.0, "package-1": 10.0})

    # Interval 2: +4 J and +2 J at a share of 5/10: the split follows the interval's share,
    # not the whole run's (which would give 26 J x 10/30).
    set_energy(powercap, "intel-rapl:0", 15_000_000)
    set_energy(powercap, "intel-rapl:1", 17_000_000)
    job.value, machine.value, clock.value = 20.0, 130.0, 55.0
    second = meter.read()
    assert second.joules == pytest.approx(5.0 + 6.0 * 0.5)
    assert second.cpu_s == pytest.approx(10.0)
    assert second.detail["package_joules"] == pytest.approx({"package-0": 14.0, "package-1": 12.0})
    assert second.detail["cpu_share"] == pytest.approx(8.0 / 26.0)
    assert second.detail["machine_cpu_s"] == pytest.approx(30.0)
    assert second.since(first).joules == pytest.approx(3.0)


def test_rapl_counter_wraparound(powercap: Path) -> None:
    set_energy(powercap, "intel-rapl:0", 19_000_000)
    job, machine = Dial(0.0), Dial(0.0)
    meter = RaplMeter(powercap, cpu_seconds=job, machine_cpu_seconds=machine)
    meter.start()

    # package-0 wraps at 20 J: 19 J -> 1 J is +2 J, not -18 J.
    set_energy(powercap, "intel-rapl:0", 1_000_000)
    job.value = machine.value = 4.0  # the job is the whole machine
    reading = meter.read()
    assert reading.detail["package_joules"]["package-0"] == pytest.approx(2.0)
    assert reading.detail["wraps"] == 1
    assert reading.joules == pytest.approx(2.0)

    # It keeps counting across a second wrap.
    set_energy(powercap, "intel-rapl:0", 18_000_000)
    job.value = machine.value = 8.0
    meter.read()
    set_energy(powercap, "intel-rapl:0", 500_000)
    set_energy(powercap, "intel-rapl:1", 6_000_000)
    job.value = machine.value = 12.0
    reading = meter.read()
    assert reading.detail["package_joules"] == pytest.approx({"package-0": 2.0 + 17.0 + 2.5, "package-1": 1.0})
    assert reading.detail["wraps"] == 2
    assert reading.joules == pytest.approx(22.5)


def test_rapl_share_is_clipped_to_one_and_zero_without_machine_time(powercap: Path) -> None:
    job, machine = Dial(0.0), Dial(0.0)
    meter = RaplMeter(powercap, cpu_seconds=job, machine_cpu_seconds=machine)
    meter.start()
    set_energy(powercap, "intel-rapl:0", 3_000_000)  # +2 J
    job.value, machine.value = 6.0, 4.0  # sources disagree: the job cannot exceed the machine
    assert meter.read().joules == pytest.approx(2.0)
    set_energy(powercap, "intel-rapl:0", 4_000_000)  # +1 J while nothing ran
    assert meter.read().joules == pytest.approx(2.0)


def test_rapl_permission_denied_is_not_available(powercap: Path, monkeypatch: pytest.MonkeyPatch,
                                                 fresh_probe: None) -> None:
    real_read = meters._read_int

    def root_only(path: Path) -> int:  # what kernels >= 5.10 do for non-root readers
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path)

    monkeypatch.setattr(meters, "_read_int", root_only)
    status = RaplMeter.available(powercap)
    assert not status
    assert "permission denied" in status.reason
    with pytest.raises(EnergySourceUnavailable, match="permission denied"):
        RaplMeter(powercap, cpu_seconds=Dial(), machine_cpu_seconds=Dial()).start()
    meter = probe(watts_per_core=12.0, idle_watts=30.0, powercap_root=powercap)
    assert isinstance(meter, EstimateMeter)


def test_rapl_absent_or_empty_root_is_not_available(tmp_path: Path) -> None:
    assert not RaplMeter.available(tmp_path / "nope")
    assert RaplMeter.available(tmp_path / "nope").reason == f"no RAPL: {tmp_path / 'nope'} absent"
    (tmp_path / "empty").mkdir()
    assert "no intel-rapl:N package zone" in RaplMeter.available(tmp_path / "empty").reason


# ------------------------------------------------------------------------------------ estimate


def test_estimate_arithmetic_with_fake_cpu_and_clock() -> None:
    cpu, clock = Dial(7.0), Dial(100.0)
    meter = EstimateMeter(watts_per_core=10.0, idle_watts=30.0, cpu_seconds=cpu, clock=clock)
    meter.start()
    cpu.value, clock.value = 9.5, 104.0
    first = meter.read()
    assert first.source == "estimate"
    assert first.cpu_s == pytest.approx(2.5)
    assert first.wall_s == pytest.approx(4.0)
    assert first.joules == pytest.approx(2.5 * 10.0 + 30.0 * 4.0)  # 145 J
    assert first.detail["cpu_joules"] == pytest.approx(25.0)
    assert first.detail["idle_joules"] == pytest.approx(120.0)
    assert first.watts == pytest.approx(145.0 / 4.0)

    cpu.value, clock.value = 11.0, 110.0  # cumulative since start
    second = meter.read()
    assert second.joules == pytest.approx(4.0 * 10.0 + 30.0 * 10.0)
    assert second.since(first).joules == pytest.approx(340.0 - 145.0)
    assert second.since(first).wall_s == pytest.approx(6.0)


def test_estimate_adds_gpu_watts_for_wall_time() -> None:
    cpu, clock = Dial(0.0), Dial(0.0)
    meter = EstimateMeter(12.0, 60.0, cpu_seconds=cpu, clock=clock, gpu_watts=600.0)
    meter.start()
    cpu.value, clock.value = 1.0, 2.0
    reading = meter.read()
    assert reading.joules == pytest.approx(12.0 + 120.0 + 1200.0)
    assert reading.detail["gpu_joules"] == pytest.approx(1200.0)


def _burn_cpu(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_estimate_counts_cpu_of_a_child_that_exited() -> None:
    meter = EstimateMeter(watts_per_core=10.0, idle_watts=0.0)  # this process and its children
    meter.start()
    child = multiprocessing.get_context("fork").Process(target=_burn_cpu, args=(0.5,))
    child.start()
    child.join(timeout=120)
    assert child.exitcode == 0
    reading = meter.read()  # the child was never seen alive: its time is in our children_* figures
    assert reading.cpu_s >= 0.45
    assert reading.joules > 0.3 * 10.0
    assert reading.joules == pytest.approx(reading.cpu_s * 10.0)


def test_meters_must_be_started_and_reject_bad_figures() -> None:
    with pytest.raises(RuntimeError, match="before start"):
        EstimateMeter(1.0, 1.0, cpu_seconds=Dial()).read()
    with pytest.raises(ValueError, match="idle_watts"):
        EstimateMeter(1.0, -5.0, cpu_seconds=Dial())
    with pytest.raises(ValueError, match="not both"):
        EstimateMeter(1.0, 1.0, processes=lambda: [], cpu_seconds=Dial())


# ---------------------------------------------------------------------------------------- NVML


def test_fake_nvml_reader_sums_devices_in_joules() -> None:
    counters_mj = {0: 1_000_000.0, 1: 2_000_000.0, 2: 9e9}
    clock = Dial(0.0)
    meter = NvmlMeter(device_indices=[0, 1], reader=counters_mj.__getitem__, clock=clock)
    meter.start()
    counters_mj.update({0: 1_500_000.0, 1: 2_250_000.0, 2: 1e12})  # device 2 is not ours
    clock.value = 3.0
    reading = meter.read()
    assert reading.source == "nvml"
    assert reading.joules == pytest.approx(500.0 + 250.0)
    assert reading.detail["device_joules"] == pytest.approx({0: 500.0, 1: 250.0})
    assert reading.cpu_s == 0.0
    assert reading.wall_s == pytest.approx(3.0)

    counters_mj.update({0: 400.0, 1: 2_260_000.0})  # device 0's driver reloaded: counter restarted
    reading = meter.read()
    assert reading.detail["device_joules"] == pytest.approx({0: 500.4, 1: 260.0})


def test_fake_nvml_composite_with_estimate_sums_and_labels() -> None:
    counters_mj = {0: 0.0}
    cpu, clock = Dial(0.0), Dial(0.0)
    gpu = NvmlMeter([0], reader=counters_mj.__getitem__, clock=clock)
    host = EstimateMeter(10.0, 50.0, cpu_seconds=cpu, clock=clock)
    meter = CompositeMeter([gpu, host])
    assert meter.source == "nvml+estimate"
    with meter:
        counters_mj[0] = 300_000.0
        cpu.value, clock.value = 2.0, 1.0
        reading = meter.read()
    assert reading.source == "nvml+estimate"
    assert reading.joules == pytest.approx(300.0 + 20.0 + 50.0)
    assert reading.cpu_s == pytest.approx(2.0)
    assert [part["joules"] for part in reading.detail["parts"]] == pytest.approx([300.0, 70.0])


def test_fake_nvml_reader_needs_device_indices() -> None:
    with pytest.raises(ValueError, match="device_indices"):
        NvmlMeter(reader=lambda index: 0.0)


# ------------------------------------------------------------------------------------- probing


def _energy_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "tunefleet.energy.meters" and "energy source" in r.getMessage()]


def test_probe_without_rapl_is_estimate_and_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                        fresh_probe: None) -> None:
    caplog.set_level(logging.INFO, logger="tunefleet.energy.meters")
    absent = tmp_path / "powercap"
    meters = [probe("llvm", watts_per_core=12.0, idle_watts=30.0, powercap_root=absent) for _ in range(3)]
    assert all(isinstance(m, EstimateMeter) and m.source == "estimate" for m in meters)
    assert len({id(m) for m in meters}) == 3  # a fresh meter each time, the probe only once
    records = _energy_records(caplog)
    assert len(records) == 1
    assert records[0].levelno == logging.INFO
    assert records[0].getMessage() == f"energy source: estimate (no RAPL: {absent} absent)"


def test_probe_on_this_machine(caplog: pytest.LogCaptureFixture, fresh_probe: None) -> None:
    caplog.set_level(logging.INFO, logger="tunefleet.energy.meters")
    meter = probe(watts_per_core=12.0, idle_watts=30.0)
    probe(watts_per_core=12.0, idle_watts=30.0)
    expected = "rapl" if RaplMeter.available() else "estimate"
    if not Path(meters.DEFAULT_POWERCAP_ROOT).exists():
        assert expected == "estimate"  # this VM: no /sys/class/powercap
    assert meter.source == expected
    assert len(_energy_records(caplog)) == 1
    with meter:
        reading = meter.read()
    assert reading.source == expected
    assert reading.joules >= 0.0


def test_probe_cuda_without_nvml_estimates_the_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture, fresh_probe: None) -> None:
    caplog.set_level(logging.INFO, logger="tunefleet.energy.meters")
    monkeypatch.setattr(NvmlMeter, "available", classmethod(lambda cls: Availability(False, "no NVML: faked")))
    meter = probe({"kind": "cuda", "arch": "sm_90"}, watts_per_core=12.0, idle_watts=60.0,
                  watts_per_gpu=300.0, gpu_count=2, powercap_root=tmp_path / "none")
    assert isinstance(meter, EstimateMeter)
    assert meter.source == "estimate"
    assert meter.gpu_watts == 600.0
    assert _energy_records(caplog)[0].getMessage() == (
        f"energy source: estimate (no RAPL: {tmp_path / 'none'} absent; no NVML: faked)")
    # A CPU target with the same figures charges no GPU.
    assert probe("llvm", watts_per_core=12.0, idle_watts=60.0, watts_per_gpu=300.0,
                 powercap_root=tmp_path / "none").gpu_watts == 0.0  # type: ignore[attr-defined]


def test_probe_cuda_combines_sources(powercap: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     fresh_probe: None) -> None:
    monkeypatch.setattr(NvmlMeter, "available", classmethod(lambda cls: Availability(True, "NVML: faked")))
    assert probe("cuda", watts_per_core=1.0, idle_watts=1.0, powercap_root=powercap).source == "nvml+rapl"
    assert probe("cuda", watts_per_core=1.0, idle_watts=1.0, powercap_root=tmp_path / "x").source == "nvml+estimate"
    assert detect_sources(str(powercap), True).source == "nvml+rapl"

    clear_probe_cache()
    monkeypatch.setattr(NvmlMeter, "available", classmethod(lambda cls: Availability(False, "no NVML: faked")))
    meter = probe("cuda", watts_per_core=1.0, idle_watts=1.0, watts_per_gpu=250.0, powercap_root=powercap)
    assert meter.source == "rapl+estimate"  # host measured, GPU estimated
    assert isinstance(meter, CompositeMeter)
    assert [m.source for m in meter.meters] == ["rapl", "estimate"]
    assert meter.meters[1].gpu_watts == 250.0  # type: ignore[attr-defined]


def test_nvml_on_this_machine_is_reported_not_raised() -> None:
    status = NvmlMeter.available()
    assert isinstance(status, Availability)
    if not status:
        assert status.reason.startswith("no NVML")


# ------------------------------------------------------------------------- money, apportioning


def test_money_is_node_time_times_price() -> None:
    assert money(2.50, 1800.0) == pytest.approx(1.25)
    assert money(0.17, 3600.0 * 24) == pytest.approx(4.08)
    assert money(0.17, 0.0) == 0.0
    with pytest.raises(ValueError):
        money(-1.0, 10.0)
    with pytest.raises(ValueError):
        money(1.0, float("nan"))


def test_apportion_by_weights() -> None:
    assert apportion(10.0, [1.0, 3.0]) == pytest.approx([2.5, 7.5])
    assert apportion(6.0, [0.0, 1.0, 2.0]) == pytest.approx([0.0, 2.0, 4.0])
    assert apportion(9.0, [0.0, 0.0, 0.0]) == [3.0, 3.0, 3.0]  # no weights: equal parts
    assert apportion(9.0, 3) == [3.0, 3.0, 3.0]
    assert apportion(0.0, []) == []
    with pytest.raises(ValueError):
        apportion(1.0, [])
    with pytest.raises(ValueError):
        apportion(1.0, [1.0, -0.5])
    with pytest.raises(ValueError):
        apportion(1.0, [1.0, float("inf")])


def test_apportion_sums_exactly_to_the_total() -> None:
    parts = apportion(1.0, [0.1] * 10)  # naive 0.1 x 10 sums to 0.9999999999999999
    assert sum(parts) == 1.0
    assert parts == pytest.approx([0.1] * 10)

    rng = random.Random(20240611)
    for _ in range(2000):
        weights = [rng.choice([0.0, rng.random() * 10 ** rng.randint(-6, 6)]) for _ in range(rng.randint(1, 30))]
        total = rng.random() * 10 ** rng.randint(-3, 9)
        parts = apportion(total, weights)
        assert sum(parts) == total or math.fsum(parts) == total
        assert all(p >= 0 for p in parts)
        weight_sum = math.fsum(weights)
        expected = [total * w / weight_sum for w in weights] if weight_sum else [total / len(weights)] * len(weights)
        assert parts == pytest.approx(expected, rel=1e-9, abs=1e-12 * total)


def test_reading_since_rejects_other_sources() -> None:
    a = EnergyReading(1.0, "rapl", 1.0, 1.0)
    b = EnergyReading(2.0, "estimate", 2.0, 2.0)
    with pytest.raises(ValueError, match="different sources"):
        b.since(a)
