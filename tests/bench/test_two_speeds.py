"""bench/two_speeds.py: the split by placement, the parser, the kernels timed for real (the core-to-core
probe itself: tests/delivery/test_placement.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # bench/ is scripts, not a package

import two_speeds


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


def _tiny_library(path: Path) -> list:
    """A two-kernel Relax model (a matrix product, then a ReLU), compiled and exported for real."""
    import numpy as np
    import tvm
    from tvm import relax
    from tvm.script import relax as R

    bb = relax.BlockBuilder()
    x = relax.Var("x", R.Tensor((64, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, x))
            out = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    tvm.compile(mod, target="llvm").export_library(str(path))
    return [np.random.default_rng(0).standard_normal((64, 64)).astype("float32")]


def test_a_real_library_s_kernels_are_timed_in_the_model_and_alone(tmp_path: Path) -> None:
    inputs = _tiny_library(tmp_path / "tiny.so")
    kernels = two_speeds.Kernels(str(tmp_path / "tiny.so"), inputs)
    assert kernels.names == ["matmul", "relu"]
    for times in (kernels.in_model(), kernels.in_model(), kernels.alone()):
        assert len(times) == 2 and all(t > 0 for t in times)
    assert len(kernels.calls) == 2  # captured in the first call only


def test_kernels_are_split_by_placement_and_need_both() -> None:
    def sample(ns: float, model: list[float], alone: list[float]) -> dict:
        return {"tunefleet": 1.0, "round_trip_ns": ns, "kernels_in_model": model, "kernels_alone": alone}

    samples = [sample(60, [1.0, 2.0], [0.9, 2.0]), sample(80, [1.2, 2.0], [0.9, 2.0]),
               sample(350, [1.6, 2.1], [1.0, 3.0])]
    rows = two_speeds.split_kernels(samples, 200.0, ["conv", "winograd"])
    assert rows[0] == {"call": 0, "kernel": "conv", "in_model_near_ms": pytest.approx(1.1), "alone_near_ms": 0.9,
                       "in_model_far_ms": 1.6, "alone_far_ms": 1.0}
    assert (rows[1]["alone_near_ms"], rows[1]["alone_far_ms"]) == (2.0, 3.0)
    assert two_speeds.split(samples, 200.0)["far"] == {"blocks": 1, "round_trip_ns": 350, "tunefleet": 1.0}
    assert two_speeds.split_kernels(samples[:2], 200.0, ["conv", "winograd"]) == []


def test_several_libraries_are_timed_under_their_labels(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    a, b = tmp_path / "a.so", tmp_path / "b.so"
    a.write_bytes(b"")
    b.write_bytes(b"")
    assert two_speeds.parse_args(["m", "--library", str(a)]).libraries == {"tunefleet": str(a)}
    assert two_speeds.parse_args(["m", "--library", f"best={a}", "--library", f"variant={b}"]).libraries == {
        "best": str(a), "variant": str(b)}
    with pytest.raises(SystemExit):
        two_speeds.parse_args(["m", "--library", f"best={a}", "--library", f"variant={b}", "--kernels"])
    assert "--kernels times one library" in capsys.readouterr().err
    sides = two_speeds.split([{"best": 10.0, "variant": 9.0, "onnxruntime": 12.0, "round_trip_ns": 60.0},
                              {"best": 14.0, "variant": 10.0, "onnxruntime": 12.5, "round_trip_ns": 350.0}], 200.0)
    two_speeds.print_sides(sides, ["best", "variant"], 200.0)
    out = capsys.readouterr().out
    assert "far / near: best 1.40x, variant 1.11x, onnxruntime 1.04x" in out
    assert "0.83x" in out and "0.80x" in out  # near: 10 / 12 and far: 10 / 12.5
