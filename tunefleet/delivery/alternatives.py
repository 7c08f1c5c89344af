"""What a user would run instead of a tuned build, on the same threads: PyTorch eager and onnxruntime.

A tuned model is worth deploying only if it beats these, so ``tunefleet build``/``run`` time them
next to the tuned build, in the same alternating rounds (:func:`tunefleet.delivery.timing.time_alternating`,
called by :func:`tunefleet.delivery.build.time_builds`; fields of
:class:`tunefleet.delivery.build.BuildReport`), and ``bench/versus_alternatives.py`` uses the same
calls and the same timing. :func:`calls` makes the zero-argument calls; it times nothing.

onnxruntime and onnx are core dependencies: onnxruntime runs every model ingested as ONNX, and every
model with a PyTorch module that exports to ONNX. A model with neither (one built in Relax, like the
zoo's ``mlp``), or whose export fails, gets a note in the report saying why instead of a figure.
PyTorch is optional (the ``torch`` extra) and only a model that has a PyTorch module gets an eager
figure. torch and onnxruntime are imported only here, only when used.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tunefleet.delivery.timing import ROUNDS, time_alternating

log = logging.getLogger(__name__)


def median_ms(call: Callable[[], Any], *, rounds: int = ROUNDS) -> float:
    """Latency of one call timed alone, in ms: :func:`~tunefleet.delivery.timing.time_alternating`
    with nothing to alternate with (``bench/tune_bench.py`` times PyTorch eager so)."""
    return float(time_alternating({"call": call}, rounds)["call"]["ms"])


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
    it needs no onnxscript).

    The module is exported in eval mode; one that cannot switch modes (the module of a
    ``torch.export`` program, ingested from a ``.pt2`` file: its graph was fixed at export) is
    exported as it is. The exporter's warnings (e.g. on a ``Slice`` it cannot constant-fold) go to
    the log, once each, not to the terminal: they concern the reference runtime's copy of the
    model, not the user's build.
    """
    import torch

    args = tuple(torch.from_numpy(x) for x in inputs)
    names = [f"input{i}" for i in range(len(args))]
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every one recorded, whatever the caller's filters (deduplicated below)
        # dynamo=False is chosen (see above); torch warns that it is legacy.
        warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*legacy TorchScript-based ONNX")
        # The trace freezes shape checks in transformers' code into constants: fine for fixed-shape inputs.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        try:
            torch.onnx.export(module, args, str(path), dynamo=False, input_names=names)
        except NotImplementedError:  # "Calling train() is not supported yet": an exported program's module
            # Its mode is nominal (the graph is fixed): constant folding, which torch warns about
            # outside eval mode, is what an inference model wants.
            warnings.filterwarnings("ignore", category=UserWarning, message=".*constant folding be turned off")
            torch.onnx.export(module, args, str(path), dynamo=False, input_names=names,
                              training=torch.onnx.TrainingMode.PRESERVE)
    for text in dict.fromkeys(f"{w.category.__name__}: {str(w.message).strip()}" for w in caught):
        log.info("exporting the PyTorch module to ONNX for onnxruntime: %s", text)
    return path


def onnxruntime_session(onnx_model: Path | bytes, threads: int, *, profile_prefix: str | None = None) -> Any:
    """An onnxruntime session of an ONNX model (a file or its bytes) with every graph optimisation
    on ``threads`` intra-op threads (one inter-op thread, as a latency-bound deployment runs it);
    with onnxruntime's own profiler on when ``profile_prefix`` names its output file's prefix
    (``bench/op_by_op.py``)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = max(1, threads)
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    source = str(onnx_model) if isinstance(onnx_model, Path) else onnx_model
    return ort.InferenceSession(source, opts, providers=["CPUExecutionProvider"])


def onnxruntime_call(onnx_model: Path | bytes, inputs: Sequence[Any], threads: int) -> Callable[[], Any]:
    """A zero-argument call of an ONNX model (a file or its bytes) in onnxruntime on ``inputs``,
    in a session of :func:`onnxruntime_session`."""
    sess = onnxruntime_session(onnx_model, threads)
    feeds = onnxruntime_feeds(sess, inputs)
    return lambda: sess.run(None, feeds)


def onnxruntime_feeds(sess: Any, inputs: Sequence[Any]) -> dict[str, Any]:
    """A session's inputs by name, in the order of ``inputs``."""
    return {i.name: x for i, x in zip(sess.get_inputs(), inputs, strict=True)}


_LABELS = {"torch": "PyTorch eager", "onnxruntime": "onnxruntime"}


def _why(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__


def _onnxruntime(inputs: Sequence[Any], threads: int, torch_module: Any,
                 onnx_bytes: bytes | None) -> tuple[Callable[[], Any] | None, str]:
    """(the onnxruntime call, ""), or (None, the note saying why there is none)."""
    if onnx_bytes is not None:
        try:
            return onnxruntime_call(onnx_bytes, inputs, threads), ""
        except Exception as exc:  # noqa: BLE001 - a session failure is a note, not a failed build
            return None, f"onnxruntime latency not measured: {_why(exc)}"
    if torch_module is None:
        return None, "no ONNX model and no PyTorch module to export: onnxruntime latency not measured"
    with tempfile.TemporaryDirectory(prefix="tunefleet-onnx-") as tmp:
        try:
            path = export_onnx(torch_module, inputs, Path(tmp) / "model.onnx")
        except Exception as exc:  # noqa: BLE001 - a model torch cannot export is a note, not a failed build
            return None, f"the PyTorch module cannot be exported to ONNX ({_why(exc)}): onnxruntime latency not measured"
        try:
            return onnxruntime_call(path, inputs, threads), ""  # the session has read the file
        except Exception as exc:  # noqa: BLE001 - as above
            return None, f"onnxruntime latency not measured: {_why(exc)}"


def calls(inputs: Sequence[Any], threads: int, *, torch_module: Any = None, onnx_bytes: bytes | None = None,
          no_module: str | None = None) -> tuple[dict[str, Callable[[], Any]], list[str]]:
    """Zero-argument calls of PyTorch eager (``"torch"``) and onnxruntime (``"onnxruntime"``) on
    ``inputs``, on ``threads`` threads, each called once already; and notes on what has no call.

    PyTorch eager needs ``torch_module``. onnxruntime runs ``onnx_bytes`` (a model ingested as
    ONNX) or, failing that, ``torch_module`` exported to ONNX. A call that raises on its first call
    is left out with a note.

    Parameters
    ----------
    inputs : sequence of numpy.ndarray
        The model's inputs.
    threads : int
        Threads of each runtime.
    torch_module : torch.nn.Module, optional
        The model's PyTorch module.
    onnx_bytes : bytes, optional
        The model as ingested, if it came as ONNX.
    no_module : str, optional
        Why there is no ``torch_module`` though the model has one (a ``.pt2`` file parsed only in
        a sandboxed child): the notes say so instead of "no PyTorch module".

    Returns
    -------
    tuple of (dict of str to callable, list of str)
        The calls by name, and one note per alternative without a call.
    """
    out: dict[str, Callable[[], Any]] = {}
    notes: list[str] = []
    if torch_module is not None:
        out["torch"] = torch_eager_call(torch_module, inputs, threads)
    else:
        notes.append(f"PyTorch eager latency not measured: {no_module}" if no_module else
                     "no PyTorch module for this model: eager latency not measured")
    ort_call, why_not = _onnxruntime(inputs, threads, torch_module, onnx_bytes)
    if ort_call is None and no_module and torch_module is None and onnx_bytes is None:
        why_not = f"onnxruntime latency not measured: {no_module}"
    if ort_call is not None:
        out["onnxruntime"] = ort_call
    else:
        notes.append(why_not)
    for name, call in list(out.items()):
        try:
            call()  # the first call: a runtime that cannot run the model fails here, before any timing
        except Exception as exc:  # noqa: BLE001 - a note, not a failed build
            del out[name]
            notes.append(f"{_LABELS[name]} latency not measured: {_why(exc)}")
    return out, notes
