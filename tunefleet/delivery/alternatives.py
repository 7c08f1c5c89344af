"""What a user would run instead of a tuned build, on the same threads: PyTorch eager and onnxruntime.

A tuned model is worth deploying only if it beats these, so ``tunefleet build``/``run`` time them
next to the tuned build (fields of :class:`tunefleet.delivery.build.BuildReport`) when the packages are
installed, and ``bench/versus_alternatives.py`` uses the same sessions. onnxruntime is an optional
package (the ``bench`` extra); without it, or for a model that cannot be exported, the report says
why in a note instead of a figure. torch and onnxruntime are imported only here, only when used.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

INSTALL_HINT = "pip install -e '.[bench]'"


def median_ms(call: Callable[[], Any], *, warmup: int = 3, repeat: int = 10) -> float:
    """Median wall time of ``call()`` in milliseconds, after ``warmup`` calls."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def torch_eager_call(module: Any, inputs: Sequence[Any], threads: int) -> Callable[[], Any]:
    """A zero-argument call of ``module`` in eager mode on ``inputs`` (numpy arrays), on ``threads`` threads."""
    import torch

    torch.set_num_threads(max(1, threads))
    args = [torch.from_numpy(x) for x in inputs]

    def call() -> Any:
        with torch.inference_mode():
            return module(*args)

    return call


def export_onnx(module: Any, inputs: Sequence[Any], path: Path) -> Path:
    """Export a torch module traced on ``inputs`` to ONNX at ``path`` (the TorchScript exporter:
    it needs no onnxscript)."""
    import torch

    args = tuple(torch.from_numpy(x) for x in inputs)
    with torch.no_grad(), warnings.catch_warnings():
        # dynamo=False is chosen (see above); torch warns that it is legacy.
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*legacy TorchScript-based ONNX")
        # The trace freezes shape checks in transformers' code into constants: fine for fixed-shape inputs.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        torch.onnx.export(module, args, str(path), dynamo=False, input_names=[f"input{i}" for i in range(len(args))])
    return path


def onnxruntime_call(onnx_model: Path | bytes, inputs: Sequence[Any], threads: int) -> Callable[[], Any]:
    """A zero-argument call of an ONNX model (a file or its bytes) in onnxruntime on ``inputs``,
    with every graph optimisation on ``threads`` intra-op threads (one inter-op thread, as a
    latency-bound deployment runs it). Raises ImportError without onnxruntime."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, threads)
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    source = str(onnx_model) if isinstance(onnx_model, Path) else onnx_model
    sess = ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])
    feeds = {i.name: x for i, x in zip(sess.get_inputs(), inputs, strict=True)}
    return lambda: sess.run(None, feeds)


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def measure(inputs: Sequence[Any], threads: int, *, torch_module: Any = None,
            onnx_bytes: bytes | None = None) -> tuple[dict[str, float], list[str]]:
    """Latencies (ms) of PyTorch eager and onnxruntime on ``inputs``, and notes on what was not measured.

    PyTorch eager needs ``torch_module``. onnxruntime runs ``onnx_bytes`` (a model ingested as
    ONNX) or, failing that, ``torch_module`` exported to ONNX.
    """
    out: dict[str, float] = {}
    notes: list[str] = []
    if torch_module is not None:
        try:
            out["torch"] = median_ms(torch_eager_call(torch_module, inputs, threads))
        except ImportError:
            notes.append("PyTorch is not installed: eager latency not measured")
    else:
        notes.append("no PyTorch module for this model: eager latency not measured")
    try:
        import onnxruntime  # noqa: F401 - only whether it is installed
    except ImportError:
        notes.append(f"onnxruntime is not installed: its latency not measured ({INSTALL_HINT})")
        return out, notes
    if onnx_bytes is None and torch_module is None:
        notes.append("no ONNX model and no PyTorch module to export: onnxruntime latency not measured")
        return out, notes
    try:
        if onnx_bytes is not None:
            out["onnxruntime"] = median_ms(onnxruntime_call(onnx_bytes, inputs, threads))
        else:
            with tempfile.TemporaryDirectory(prefix="tunefleet-onnx-") as tmp:
                path = export_onnx(torch_module, inputs, Path(tmp) / "model.onnx")
                out["onnxruntime"] = median_ms(onnxruntime_call(path, inputs, threads))
    except Exception as exc:  # noqa: BLE001 - an export or session failure is a note, not a failed build
        notes.append(f"onnxruntime latency not measured: {_why(exc)}")
    return out, notes
