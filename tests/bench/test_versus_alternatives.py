"""bench/versus_alternatives.py: the sgemm peak (its OpenBLAS core type per hardware class, the median beside it); the benches' --compare."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # bench/ is scripts, not a package

import versus_alternatives


@pytest.mark.parametrize(("hardware", "isa", "expected"), [
    ("x86-avx2", ["avx2", "avx512f", "fma"], "Haswell"),  # the class's AVX2 kernels wherever it runs
    ("x86", ["avx", "avx2", "avx512bw", "avx512f", "fma"], "SkylakeX"),  # Zen 5: OpenBLAS would pick Haswell
    ("x86", ["avx", "avx2", "fma"], None),  # an AVX2 CPU: OpenBLAS picks its own
    ("arm", [], None),
])
def test_the_peak_uses_the_class_s_widest_kernels(hardware: str, isa: list[str], expected: str | None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import tunefleet.hardware

    monkeypatch.setattr(tunefleet.hardware, "host_cpu", lambda: {"model": "x", "id": "y", "isa": isa})
    assert versus_alternatives.default_coretype(hardware) == expected


def test_compare_libraries_are_labelled_files_or_one_line_errors(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``--compare LABEL=LIBRARY`` of both benches (pretrained_bench parses it with the same function)."""
    import pretrained_bench

    lib = tmp_path / "earlier.so"
    lib.write_bytes(b"")
    assert pretrained_bench.parse_args(["electra.onnx", "--compare", f"earlier={lib}"]).compare == {"earlier": str(lib)}
    for bad, said in ((str(lib), "--compare takes LABEL=LIBRARY"), (f"x={tmp_path / 'none.so'}", "no such library")):
        with pytest.raises(SystemExit):
            pretrained_bench.parse_args(["electra.onnx", "--compare", bad])
        assert said in capsys.readouterr().err


def test_nominal_work_counts_the_model_s_products_and_each_runtime_s_share_of_the_peak(
        capsys: pytest.CaptureFixture[str]) -> None:
    """The model's nominal FLOPs are its matrix products counted directly (mlp: three dense
    layers), and each timed runtime's GFLOP/s on them is set against the sgemm peak."""
    from tunefleet.models.zoo import build_zoo_model

    zoo = build_zoo_model("mlp")
    inputs = zoo.loaded.random_inputs(seed=0)
    flops, why_not = versus_alternatives.nominal_flops(zoo, inputs)
    batch = inputs[0].shape[0]
    assert why_not is None and flops == 2 * batch * (64 * 128 + 128 * 128 + 128 * 10)

    phase = {"measure": {"latency": {"tunefleet tuned": {"ms": 0.5}, "onnxruntime": {"ms": 1.0}}}}
    versus_alternatives.print_nominal_work(phase, 2e9, None, 8000.0)
    runtimes = phase["nominal"]["runtimes"]
    assert runtimes["tunefleet tuned"] == {"gflops": 4000.0, "peak_fraction": 0.5}
    assert runtimes["onnxruntime"] == {"gflops": 2000.0, "peak_fraction": 0.25}
    assert "2.000 GFLOP per call" in capsys.readouterr().out
    versus_alternatives.print_nominal_work(phase := {}, None, "no PyTorch module", 8000.0)
    assert "nominal" not in phase and "not counted: no PyTorch module" in capsys.readouterr().out


def test_a_second_bench_run_on_a_home_in_use_stops_with_one_line(tmp_path: Path) -> None:
    """Another process holds the home: the bench does not start; once it let go, the home is free."""
    import subprocess
    import textwrap

    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(versus_alternatives.__file__).parent)!r})
        import versus_alternatives
        versus_alternatives.claim_home(__import__("pathlib").Path({str(tmp_path)!r}))
        print("claimed")
    """)
    held = versus_alternatives.claim_home(tmp_path)
    second = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert second.returncode == 1, second
    assert "not started: another bench run is using the home" in second.stderr
    assert "claimed" not in second.stdout
    held.release()
    again = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert (again.returncode, again.stdout.strip()) == (0, "claimed"), again


def test_the_peak_is_the_fastest_repeat_and_the_median_is_printed_beside_it() -> None:
    """The shares are read against the fastest repeat; the median repeat's GFLOP/s is reported
    beside it, so that a lone fast repeat shows (docs/performance.md)."""
    peak = versus_alternatives.sgemm_peak(96, repeat=7)
    assert peak["seconds"] <= peak["median_seconds"]
    assert versus_alternatives.median_gflops(peak) == pytest.approx(2.0 * 96 ** 3 / peak["median_seconds"] / 1e9)
    assert versus_alternatives.median_gflops(peak) <= peak["gflops"]
