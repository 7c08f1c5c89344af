"""Where the timing threads' CPUs sit: the core-to-core probe built and run for real, the split of
an alternating timing's rounds by placement, and the line the build report prints."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tunefleet.delivery import placement
from tunefleet.delivery.placement import CoreProbe, ProbeError, by_placement, placement_line, probe_for


def test_the_probe_compiles_and_reads_a_round_trip() -> None:
    """CPUs 0 and 1: the suite runs on two (CI's machine has two cores), as tunefleet's timings do."""
    probe = CoreProbe((0, 1), round_trips=2000)
    ns = probe()
    assert ns is not None and 1.0 < ns < 1e6  # a cache line between two CPUs: tens to hundreds of ns, never nothing
    assert probe.error is None and probe() is not None  # compiled once, read again


def test_without_a_c_compiler_the_probe_is_not_supported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement.shutil, "which", lambda name: None)
    with pytest.raises(ProbeError, match="not supported: no C compiler"):
        placement.build_probe(tmp_path)


def test_a_probe_that_cannot_run_reads_none_and_says_why_once(monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(placement.shutil, "which", lambda name: None)
    probe = CoreProbe((0, 1))
    with caplog.at_level(logging.WARNING, logger="tunefleet.delivery.placement"):
        assert probe() is None and probe() is None
    assert probe.error is not None and probe.error.startswith("not supported: no C compiler")
    assert len(caplog.records) == 1  # the timing goes on; the reason is logged once


def test_a_cpu_it_may_not_pin_to_is_the_probe_s_error() -> None:
    probe = CoreProbe((0, 1000), round_trips=10)  # no such CPU here
    assert probe() is None
    assert probe.error == "the core-to-core probe failed: cannot pin a thread to CPU 1000"


def test_one_thread_or_one_cpu_has_no_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    assert probe_for(1) is None
    monkeypatch.setattr(placement.os, "sched_getaffinity", lambda pid: {3})
    assert probe_for(2) is None
    monkeypatch.setattr(placement.os, "sched_getaffinity", lambda pid: {7, 2, 5})
    probe = probe_for(2)
    assert probe is not None and probe.cpus == (2, 5)  # the first two this process may use


def _timed(tuned: list[float], ort: list[float], ns: list[float | None]) -> dict[str, dict[str, object]]:
    return {"tuned": {"ms": 0.0, "rounds_ms": tuned, "round_trip_ns": ns},
            "onnxruntime": {"ms": 0.0, "rounds_ms": ort, "round_trip_ns": ns}}


def test_blocks_are_split_by_the_round_trip_after_each() -> None:
    timed = _timed([14.5, 14.7, 18.0, 14.6], [17.0, 17.2, 17.6, 16.9], [60.0, 70.0, 350.0, None])
    timed["onnxruntime"]["round_trip_ns"] = [60.0, 70.0, 80.0, 90.0]  # the host moved the CPUs back meanwhile
    sides = by_placement(timed)
    assert sides["near"] == {"blocks": 6, "round_trip_ns": 70.0,
                             "ms": {"tuned": pytest.approx(14.6), "onnxruntime": pytest.approx(17.1)}}
    assert sides["far"] == {"blocks": 1, "round_trip_ns": 350.0, "ms": {"tuned": 18.0}}
    assert list(by_placement(_timed([14.5], [17.0], [60.0]))) == ["near"]  # one placement: one side
    assert by_placement(_timed([14.5], [17.0], [None])) == {}  # nothing read
    assert by_placement({"tuned": {"ms": 1.0, "rounds_ms": [1.0]}}) == {}  # timed without a probe


def test_the_line_says_the_placement_and_splits_the_figures_when_it_moved() -> None:
    labels = [("tuned", "tuned"), ("onnxruntime", "onnxruntime")]
    one = by_placement(_timed([14.5, 14.7], [17.0, 17.2], [60.0, 70.0]))
    assert placement_line(one, labels) == ("timed with the two CPUs near (a cache line's round trip 65 ns) "
                                           "after all 4 timed blocks")
    both = by_placement(_timed([14.5, 18.0, 14.7], [17.0, 17.6, 17.2], [60.0, 350.0, 70.0]))
    assert placement_line(both, labels) == (
        "timed with the two CPUs near after 4 of 6 timed blocks (65 ns): tuned 14.600 ms, onnxruntime 17.100 ms; "
        "far after 2 (350 ns): tuned 18.000 ms, onnxruntime 17.600 ms (the two speeds: docs/performance.md)")
    assert placement_line({}, labels, "not supported: no C compiler") == (
        "the placement of the timing threads' CPUs was not measured: not supported: no C compiler")


def test_the_build_report_prints_its_placement_under_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    from tunefleet.cli.render import report_table
    from tunefleet.delivery.build import BuildReport

    report = BuildReport("resnet18", "x86", 20, 20, 0, untuned_ms=900.0, tuned_ms=14.4, onnxruntime_ms=17.0, threads=2)
    report_table(report)
    assert "timed with the two CPUs" not in capsys.readouterr().out  # not measured: nothing said
    report.placement = by_placement(_timed([14.5, 14.7], [17.0, 17.2], [60.0, 70.0]))
    report.placement_line = placement_line(report.placement, [("tuned", "tuned"), ("onnxruntime", "onnxruntime")])
    report_table(report)
    assert "timed with the two CPUs near (a cache line's round trip 65 ns) after all 4 timed blocks" in capsys.readouterr().out
