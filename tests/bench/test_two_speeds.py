"""bench/two_speeds.py: the core-to-core probe, built and run for real, and the split by placement."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # bench/ is scripts, not a package

import two_speeds


def test_the_probe_compiles_and_reads_a_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe = two_speeds.build_probe(tmp_path)
    monkeypatch.setattr(two_speeds, "ROUND_TRIPS", 2000)
    ns = two_speeds.round_trip_ns(probe)
    assert 1.0 < ns < 1e6  # a cache line between two CPUs: tens to hundreds of ns, never nothing


def test_without_a_c_compiler_the_probe_is_not_supported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(two_speeds.shutil, "which", lambda name: None)
    with pytest.raises(two_speeds.ProbeError, match="not supported: no C compiler"):
        two_speeds.build_probe(tmp_path)


def test_blocks_are_split_by_the_round_trip_after_them() -> None:
    samples = [{"tunefleet": 14.5, "onnxruntime": 17.0, "round_trip_ns": 60.0},
               {"tunefleet": 14.7, "onnxruntime": 17.2, "round_trip_ns": 70.0},
               {"tunefleet": 18.0, "onnxruntime": 17.6, "round_trip_ns": 350.0}]
    sides = two_speeds.split(samples, far_ns=200.0)
    assert sides["near"] == {"blocks": 2, "round_trip_ns": 65.0, "tunefleet": pytest.approx(14.6),
                             "onnxruntime": pytest.approx(17.1)}
    assert sides["far"] == {"blocks": 1, "round_trip_ns": 350.0, "tunefleet": 18.0, "onnxruntime": 17.6}
    assert set(two_speeds.split(samples[:2], far_ns=200.0)) == {"near"}  # one placement: one side


def test_a_missing_library_and_no_calls_are_the_parser_s_errors(capsys: pytest.CaptureFixture[str],
                                                                   tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        two_speeds.parse_args(["resnet18", "--library", str(tmp_path / "none.so")])
    assert "no such library" in capsys.readouterr().err
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"")
    with pytest.raises(SystemExit):
        two_speeds.parse_args(["resnet18", "--library", str(lib), "--calls", "0"])
    assert "--calls must be at least 1" in capsys.readouterr().err
