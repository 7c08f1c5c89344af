"""What the user would run instead, timed for the build report: PyTorch eager and onnxruntime."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tunefleet.delivery import alternatives


@pytest.fixture(scope="module")
def tiny() -> tuple[object, list[np.ndarray]]:
    import torch

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    return module, [np.random.default_rng(0).standard_normal((2, 16)).astype("float32")]


def test_eager_and_onnxruntime_of_a_torch_module_are_both_timed(tiny) -> None:  # type: ignore[no-untyped-def]
    module, inputs = tiny
    latencies, notes = alternatives.measure(inputs, 1, torch_module=module)
    assert notes == []
    assert set(latencies) == {"torch", "onnxruntime"} and all(v > 0 for v in latencies.values())


def test_an_onnx_model_runs_as_ingested(tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    module, inputs = tiny
    onnx = alternatives.export_onnx(module, inputs, tmp_path / "m.onnx").read_bytes()
    want = module(*[__import__("torch").from_numpy(x) for x in inputs]).detach().numpy()
    got = alternatives.onnxruntime_call(onnx, inputs, 1)()[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    latencies, notes = alternatives.measure(inputs, 1, onnx_bytes=onnx)
    assert set(latencies) == {"onnxruntime"}
    assert notes == ["no PyTorch module for this model: eager latency not measured"]


def test_without_onnxruntime_the_report_says_how_to_get_it(tiny, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    module, inputs = tiny
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import raises ImportError
    latencies, notes = alternatives.measure(inputs, 1, torch_module=module)
    assert set(latencies) == {"torch"}
    assert notes == [f"onnxruntime is not installed: its latency not measured ({alternatives.INSTALL_HINT})"]


def test_a_model_onnxruntime_cannot_load_is_a_note_not_a_failed_build(tiny) -> None:  # type: ignore[no-untyped-def]
    _, inputs = tiny
    latencies, notes = alternatives.measure(inputs, 1, onnx_bytes=b"not an onnx model")
    assert latencies == {}
    assert notes[-1].startswith("onnxruntime latency not measured: ")
