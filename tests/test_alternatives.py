"""What the user would run instead, called for the build report: PyTorch eager and onnxruntime."""

from __future__ import annotations

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


def _want(module: object, inputs: list[np.ndarray]) -> np.ndarray:
    import torch

    return module(*[torch.from_numpy(x) for x in inputs]).detach().numpy()  # type: ignore[operator]


def test_a_torch_module_gets_an_eager_call_and_an_onnxruntime_call_of_its_export(tiny) -> None:  # type: ignore[no-untyped-def]
    module, inputs = tiny
    calls, notes = alternatives.calls(inputs, 1, torch_module=module)
    assert notes == [] and set(calls) == {"torch", "onnxruntime"}
    np.testing.assert_allclose(calls["torch"]().numpy(), _want(module, inputs), rtol=1e-6)
    np.testing.assert_allclose(calls["onnxruntime"]()[0], _want(module, inputs), rtol=1e-5, atol=1e-5)


def test_the_module_of_an_exported_program_is_exported_to_onnx_too(tiny) -> None:  # type: ignore[no-untyped-def]
    """A model ingested from a ``.pt2`` file: its module cannot switch to eval mode."""
    import torch

    module, inputs = tiny
    program = torch.export.export(module, tuple(torch.from_numpy(x) for x in inputs)).module()
    calls, notes = alternatives.calls(inputs, 1, torch_module=program)
    assert notes == [] and set(calls) == {"torch", "onnxruntime"}
    np.testing.assert_allclose(calls["onnxruntime"]()[0], _want(module, inputs), rtol=1e-5, atol=1e-5)


def test_an_onnx_model_runs_as_ingested(tiny, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    module, inputs = tiny
    onnx = alternatives.export_onnx(module, inputs, tmp_path / "m.onnx").read_bytes()
    np.testing.assert_allclose(alternatives.onnxruntime_call(onnx, inputs, 1)()[0], _want(module, inputs),
                               rtol=1e-5, atol=1e-5)
    calls, notes = alternatives.calls(inputs, 1, onnx_bytes=onnx)
    assert set(calls) == {"onnxruntime"}
    assert notes == ["no PyTorch module for this model: eager latency not measured"]


def test_a_model_onnxruntime_cannot_load_is_a_note_not_a_failed_build(tiny) -> None:  # type: ignore[no-untyped-def]
    _, inputs = tiny
    calls, notes = alternatives.calls(inputs, 1, onnx_bytes=b"not an onnx model")
    assert calls == {}
    assert notes[-1].startswith("onnxruntime latency not measured: ")


def test_a_module_that_cannot_be_exported_is_a_note(tiny) -> None:  # type: ignore[no-untyped-def]
    import torch

    _, inputs = tiny

    class NoExport(torch.nn.Module):
        """Runs eagerly; the exporter's trace fails, as on an operator ONNX has no counterpart for."""

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if torch.jit.is_tracing():
                raise RuntimeError("Exporting the operator 'aten::something' to ONNX is not supported")
            return x * 2

    calls, notes = alternatives.calls(inputs, 1, torch_module=NoExport())
    assert set(calls) == {"torch"}
    assert len(notes) == 1 and notes[0].startswith("the PyTorch module cannot be exported to ONNX (")
    assert notes[0].endswith("): onnxruntime latency not measured")


def test_a_runtime_that_fails_on_its_first_call_is_a_note(tiny) -> None:  # type: ignore[no-untyped-def]
    _, inputs = tiny

    class Broken:
        def __call__(self, *args: object) -> None:
            raise RuntimeError("shape mismatch\nmore detail")

    calls, notes = alternatives.calls(inputs, 1, torch_module=Broken())
    assert "torch" not in calls
    assert "PyTorch eager latency not measured: RuntimeError: shape mismatch" in notes


def test_median_ms_is_the_alternating_timing_of_one_call() -> None:
    n = []
    ms = alternatives.median_ms(lambda: n.append(1), rounds=2)
    assert ms >= 0 and len(n) > 2 * 5  # a warm-up and two rounds of at least 5 calls


def test_a_sandboxed_model_file_says_why_neither_alternative_was_timed(tiny) -> None:  # type: ignore[no-untyped-def]
    _, inputs = tiny
    why = "a .pt2 file is untrusted input, parsed only in a child process"
    calls, notes = alternatives.calls(inputs, 1, no_module=why)
    assert calls == {}
    assert notes == [f"PyTorch eager latency not measured: {why}", f"onnxruntime latency not measured: {why}"]


def test_the_exporters_warnings_go_to_the_log_once_each_not_to_the_terminal(tiny, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """torch warns while exporting some models (mobilenet_v2: a ``Slice`` it cannot
    constant-fold); ``run`` printed those lines amid its live line."""
    import warnings

    import torch

    _, inputs = tiny

    class Warns(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(3):
                warnings.warn("the exporter says something", UserWarning, stacklevel=1)
            return x * 2

    with warnings.catch_warnings():
        # the module's warning, escaping export_onnx, fails the test (only it: a logging handler
        # that another test left may warn on its own)
        warnings.filterwarnings("error", message="the exporter says something")
        with caplog.at_level("INFO", logger="tunefleet.delivery.alternatives"):
            path = alternatives.export_onnx(Warns(), inputs, tmp_path / "w.onnx")
    np.testing.assert_allclose(alternatives.onnxruntime_call(path, inputs, 1)()[0], inputs[0] * 2, rtol=1e-6)
    said = [r.getMessage() for r in caplog.records if "the exporter says something" in r.getMessage()]
    assert said == ["exporting the PyTorch module to ONNX for onnxruntime: UserWarning: the exporter says something"]
