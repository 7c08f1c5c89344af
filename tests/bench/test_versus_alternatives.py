"""bench/versus_alternatives.py: the sgemm peak's OpenBLAS core type per hardware class; the benches' --compare."""

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
