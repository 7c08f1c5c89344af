"""Where does onnxruntime win? The tuned library against onnxruntime, kernel by kernel.

Usage::

    python bench/op_by_op.py mobilenet_v2 --library out/mobilenet-v2-x86-avx2.so
    python bench/op_by_op.py resnet18 --library LIB --threads 2 --calls 60 --json ops.json
    python bench/op_by_op.py mobilenet_v2 --library scratch=A.so --library hub=B.so

For a zoo model and a library tunefleet built for it (the file ``tunefleet run``/``build`` writes,
or a bench phase's ``library``; several, each ``LABEL=PATH``, are measured in the same run), on the
same inputs and threads:

1. **tunefleet**: the library in Relax's virtual machine with an instrument that reads the clock
   before and after every kernel call (TVM 0.27's VM has no profiler of its own; the instrument
   costs a few microseconds per call, which the kernels' sum against the plain call shows);
2. **onnxruntime**: the same PyTorch module exported as ``bench/versus_alternatives.py`` exports
   it, in a session of :func:`tunefleet.delivery.alternatives.onnxruntime_session` (the options
   ``run``'s table uses) with onnxruntime's own profiler on: every node's kernel time.

Each runtime makes ``--calls`` calls after warm-up, in alternating blocks of ten, and each kernel
keeps its median. Convolutions are matched across the runtimes by what they compute (input and
output channels, input and output size, kernel: depthwise, 1x1 or kxk), whatever layout each
runtime chose (NCHW, NHWC or blocked NCHWc; a tunefleet Winograd kernel as the 3x3 convolution it
computes); matrix products the same way (batch, M, K, N: a dense layer with prepacked weights
against a ``Gemm``, a batch of attention heads against a ``FusedMatMul``, epilogues fused or not);
every other kernel is summed by kind on its own side.
Then the whole calls, without instrument or profiler, in alternating rounds
(:func:`tunefleet.delivery.timing.time_alternating`). Prints one row per convolution and per
matrix product (summed over its calls: ms on each side, each library's ratio to onnxruntime's, and
a matrix product's GFLOP/s on each side and in numpy's BLAS on the same product alone,
``OPENBLAS_CORETYPE`` picking its kernels) and the kinds; ``--json`` writes it all. Asserts nothing
about speed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # versus_alternatives.py, beside this file

from tunefleet.recipes import WINOGRAD_TILE  # noqa: E402 - light (no TVM)
from versus_alternatives import (  # noqa: E402 - beside this file; light at import
    DEFAULT_THREADS,
    _cpu_model,
    blas_core,
    load_vm,
    matmul_times,
    parse_compare,
    pin_threads,
    torch_module,
    tuned_runner,
)

ORT = "onnxruntime"
WARMUP_CALLS = 10
BLOCK = 10
"""Calls of one runtime before the other's turn."""
KERNELS = (1, 3, 5, 7, 9, 11)
"""Kernel sizes a convolution's weight count is tried against."""
BLOCKS = (1, 4, 8, 16)
"""Channel blocks a packed weight may pad its channel counts to."""


# -- what a convolution computes, from its tensors' shapes -------------------------------------------

def activation(shape: list[int], runtime: str) -> tuple[int, int, int] | None:
    """(channels, height, width) of a batch-1 activation, whatever its layout: 5-D is blocked NCHWc
    (``[N, C/b, H, W, b]``); 4-D is NCHW for onnxruntime and, for a tunefleet library (any other
    ``runtime``), NHWC unless the last two dimensions are the square ones (NCHW). None for any
    other shape."""
    if len(shape) == 5:
        return shape[1] * shape[4], shape[2], shape[3]
    if len(shape) != 4:
        return None
    if runtime == ORT:
        return shape[1], shape[2], shape[3]
    if shape[2] == shape[3] and shape[1] != shape[2]:  # [N, C, H, W] with a square map
        return shape[1], shape[2], shape[3]
    return shape[3], shape[1], shape[2]  # NHWC


def _padded(n: int, block: int) -> int:
    return -(-n // block) * block


def conv_kind(weights: int, c_in: int, c_out: int) -> str:
    """``"1x1"``, ``"3x3"``, ..., or ``"dw3x3"`` (depthwise) from a weight tensor's element count,
    which a packed layout may have padded to a channel block; ``"?"`` when nothing fits."""
    for k in KERNELS:
        for block in BLOCKS:
            if weights == k * k * _padded(c_in, block) * _padded(c_out, block):
                return f"{k}x{k}"
            if c_in == c_out and weights == k * k * _padded(c_out, block):
                return f"dw{k}x{k}"
    return "?"


def conv_key(shapes: list[list[int]], out_shape: list[int], runtime: str, *, winograd: bool = False) -> str | None:
    """What a convolution computes, as the same string on both runtimes:
    ``"dw3x3 96->96 112x112->56x56"``; None where the shapes say too little. ``winograd``: a
    tunefleet Winograd kernel, whose transformed weights stand for a 3x3 convolution."""
    data = activation(shapes[0], runtime) if shapes else None
    out = activation(out_shape, runtime)
    if data is None or out is None or len(shapes) < 2:
        return None
    weights = math.prod(shapes[1])
    alpha = WINOGRAD_TILE + 2  # a 3x3 kernel's transformed weights: alpha x alpha per channel pair
    kind = "3x3" if winograd and weights == alpha * alpha * data[0] * out[0] else conv_kind(weights, data[0], out[0])
    return f"{kind} {data[0]}->{out[0]} {data[1]}x{data[2]}->{out[1]}x{out[2]}"


def matmul_key(shapes: list[list[int]], out_shape: list[int]) -> str | None:
    """What a matrix product computes, as the same string on both runtimes: ``"128x768 by
    768x3072"``, ``"12 x 128x64 by 64x128"`` for a batch of 12; None where the shapes say too
    little. The product's ``M`` and ``N`` are the output's last two dimensions (one row block when
    it has one), its batch the product of the others; ``K`` is what the first operand holds beyond
    ``batch x M``, whatever its layout (transposed, or the 3-D activation of a dense layer)."""
    if not shapes or not shapes[0] or not out_shape:
        return None
    dims = [1, *out_shape] if len(out_shape) == 1 else out_shape
    batch, m, n = math.prod(dims[:-2]), dims[-2], dims[-1]
    k, rest = divmod(math.prod(shapes[0]), batch * m) if batch * m else (0, 1)
    if rest or k < 1 or n < 1:
        return None
    return f"{f'{batch} x ' if batch > 1 else ''}{m}x{k} by {k}x{n}"


def matmul_dims(key: str) -> tuple[int, int, int, int]:
    """(batch, M, K, N) of a :func:`matmul_key`."""
    batch, _, rest = key.rpartition(" x ")
    (m, k), (_, n) = (map(int, half.split("x")) for half in rest.split(" by "))
    return (int(batch) if batch else 1), m, k, n


def matmul_flops(key: str) -> float:
    """Multiply-adds x 2 of one call of :func:`matmul_key`'s product."""
    batch, m, k, n = matmul_dims(key)
    return 2.0 * batch * m * k * n


def blas_gflops(key: str, repeat: int = 20) -> float:
    """GFLOP/s of numpy's BLAS on the same product, the median of ``repeat`` calls after a warm-up,
    on the threads the bench pinned: what the machine's BLAS does at that shape
    (``OPENBLAS_CORETYPE`` picks its kernels)."""
    import numpy as np

    batch, m, k, n = matmul_dims(key)
    rng = np.random.default_rng(0)
    times = matmul_times(rng.standard_normal((batch, m, k), dtype=np.float32),
                         rng.standard_normal((batch, k, n), dtype=np.float32), repeat)
    return matmul_flops(key) / statistics.median(times) / 1e9


def tvm_kind(symbol: str) -> str:
    """A kernel's kind from its PrimFunc name: ``fused_conv2d3_add2_clip1`` -> ``conv2d_add_clip``."""
    parts = [p.rstrip("0123456789") for p in symbol.split("_")]
    return "_".join(p for p in parts if p and p != "fused") or symbol


def is_conv(kind: str) -> bool:
    return "conv" in kind.lower()


def is_matmul(kind: str) -> bool:
    """A matrix product: tunefleet's ``matmul``/``dense`` kernels (their epilogues fused or not),
    onnxruntime's ``MatMul``, ``FusedMatMul``, ``Gemm``."""
    return any(name in kind.lower() for name in ("matmul", "dense", "gemm"))


# -- onnxruntime's profile ---------------------------------------------------------------------------

def _type_shapes(entries: Any) -> list[list[int]]:
    """onnxruntime's ``input_type_shape``/``output_type_shape``: ``[{"float": [1, 3, 224, 224]}, ...]``."""
    shapes = []
    for entry in entries or []:
        dims = next(iter(entry.values())) if isinstance(entry, dict) and entry else entry
        shapes.append([int(d) for d in dims] if isinstance(dims, list) else [])
    return shapes


def ort_kernels(events: list[dict[str, Any]], skip_runs: int) -> list[list[dict[str, Any]]]:
    """The node kernels of every profiled run after the first ``skip_runs`` (warm-up), in order:
    per run a list of ``{"name", "kind", "shapes", "out", "ms"}``. A node event belongs to the
    ``model_run`` event whose time span holds it."""
    runs = sorted((e for e in events if e.get("cat") == "Session" and e.get("name") == "model_run"),
                  key=lambda e: e["ts"])
    nodes = sorted((e for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")),
                   key=lambda e: e["ts"])
    out: list[list[dict[str, Any]]] = [[] for _ in runs]
    i = 0
    for node in nodes:
        while i < len(runs) and node["ts"] > runs[i]["ts"] + runs[i]["dur"]:
            i += 1
        if i == len(runs):
            break
        if node["ts"] < runs[i]["ts"]:
            continue
        args = node.get("args", {})
        out[i].append({"name": node["name"].removesuffix("_kernel_time"), "kind": args.get("op_name", "?"),
                       "shapes": _type_shapes(args.get("input_type_shape")),
                       "out": (_type_shapes(args.get("output_type_shape")) or [[]])[0],
                       "ms": node["dur"] / 1e3})
    return out[skip_runs:]


def profile_events(sess: Any) -> list[dict[str, Any]]:
    """End a profiling session's profile and read its events (onnxruntime writes them as a JSON list)."""
    return json.loads(Path(sess.end_profiling()).read_text())


# -- side by side ----------------------------------------------------------------------------------

def per_kernel(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One entry per kernel position of the call sequence, its median over the runs (every run of
    a model calls the same kernels in the same order; runs of another length are dropped)."""
    if not runs:
        return []
    length = statistics.mode(len(r) for r in runs)
    kept = [r for r in runs if len(r) == length]
    return [{**kept[0][i], "ms": statistics.median(r[i]["ms"] for r in kept)} for i in range(length)]


def _matched_key(row: dict[str, Any], runtime: str) -> tuple[str, str] | None:
    """(``"convs"`` or ``"matmuls"``, what the kernel computes) for a kernel matched across the
    runtimes; None for one summed by kind."""
    if is_conv(row["kind"]):
        key = conv_key(row["shapes"], row["out"], runtime, winograd="winograd" in row["kind"])
        return ("convs", key) if key is not None else None
    if is_matmul(row["kind"]):
        key = matmul_key(row["shapes"], row["out"])
        return ("matmuls", key) if key is not None else None
    return None


def summarise(kernels: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Convolutions and matrix products matched by what they compute, the rest by kind, per
    runtime: ``{"convs": [{"key", runtime: {"calls", "ms"}, ..., "ratio": {runtime: ms /
    onnxruntime's ms}}], "matmuls": [the same, with "gflop": one call's GFLOP], "kinds": {runtime:
    {kind: {"calls", "ms"}}}, "total_ms": {runtime: ms}}``; a ratio for every runtime but
    onnxruntime that has the key where onnxruntime has it too."""
    matched: dict[str, dict[str, dict[str, dict[str, float]]]] = {"convs": defaultdict(dict),
                                                                  "matmuls": defaultdict(dict)}
    kinds: dict[str, dict[str, dict[str, float]]] = {}
    totals = {}
    for runtime, rows in kernels.items():
        kinds[runtime] = {}
        totals[runtime] = sum(r["ms"] for r in rows)
        for r in rows:
            found = _matched_key(r, runtime)
            bucket = matched[found[0]][found[1]] if found is not None else kinds[runtime]
            name = runtime if found is not None else r["kind"]
            entry = bucket.setdefault(name, {"calls": 0, "ms": 0.0})
            entry["calls"] += 1
            entry["ms"] += r["ms"]
    out: dict[str, Any] = {}
    for table, keys in matched.items():
        rows = []
        for key, sides in keys.items():
            theirs = sides.get(ORT, {}).get("ms", 0.0)
            ratio = {name: side["ms"] / theirs for name, side in sides.items() if name != ORT and theirs > 0}
            rows.append({"key": key, **sides, "ratio": ratio,
                         **({"gflop": matmul_flops(key) / 1e9} if table == "matmuls" else {})})
        rows.sort(key=lambda r: -max(r.get(s, {}).get("ms", 0.0) for s in kernels))
        out[table] = rows
    return {**out, "kinds": kinds, "total_ms": totals}


# -- measuring ---------------------------------------------------------------------------------------

def _tensor_shape(value: Any) -> list[int]:
    shape = getattr(value, "shape", None)
    try:
        return [int(d) for d in shape] if shape is not None else []
    except TypeError:
        return []


def instrumented_tvm(library: str, inputs_np: list[Any],
                     keep: list[tuple[str, Any, list[Any]]] | None = None) -> tuple[Any, list[list[dict[str, Any]]]]:
    """(a zero-argument call of the library that records its kernels, the list each call appends
    its kernels to): ``{"name", "kind", "shapes", "out", "ms"}`` per kernel call, the VM's own
    built-ins left out. With ``keep``, the first call appends each kernel call's (name, function,
    arguments) to it: a kernel can then be called alone with what it got in the model."""
    import tvm

    dev = tvm.cpu()
    vm = load_vm(library)
    runs: list[list[dict[str, Any]]] = []
    started: list[float] = []
    capturing = keep is not None

    def instrument(func: Any, symbol: str, before: bool, ret: Any, *args: Any) -> int:
        if before:
            if capturing and not str(symbol).startswith("vm.builtin"):
                assert keep is not None
                keep.append((str(symbol), func, list(args)))
            started.append(time.perf_counter())
            return 0
        ms = (time.perf_counter() - started.pop()) * 1e3
        if not str(symbol).startswith("vm.builtin"):
            shapes = [_tensor_shape(a) for a in args]
            runs[-1].append({"name": str(symbol), "kind": tvm_kind(str(symbol)), "shapes": shapes[:-1],
                             "out": shapes[-1] if shapes else [], "ms": ms})
        return 0

    vm.set_instrument(instrument)
    main = vm["main"]
    inputs = [tvm.runtime.tensor(x, dev) for x in inputs_np]

    def call() -> None:
        nonlocal capturing
        runs.append([])
        main(*inputs)
        capturing = False

    return call, runs


def profile_side_by_side(libraries: dict[str, str], onnx_path: Path, inputs_np: list[Any], threads: int,
                         calls: int, work: Path) -> dict[str, list[dict[str, Any]]]:
    """Every library's kernels (label -> path) and onnxruntime's, ``calls`` calls each after
    :data:`WARMUP_CALLS`, in alternating blocks of :data:`BLOCK` calls.

    Blocks, not one call of each in turn: onnxruntime's threads spin for a while after a run, and
    a TVM kernel whose parallel loop shares a core with them waits for the scheduler (the first
    layers of the next call ran up to 40x slower so). A block's first calls may still be slowed,
    which each kernel's median over the calls leaves out.
    """
    from tunefleet.delivery.alternatives import onnxruntime_feeds, onnxruntime_session

    tvm = {label: instrumented_tvm(path, inputs_np) for label, path in libraries.items()}
    sess = onnxruntime_session(onnx_path, threads, profile_prefix=str(work / "onnxruntime-profile"))
    feeds = onnxruntime_feeds(sess, inputs_np)
    for _ in range(WARMUP_CALLS):
        for call, _ in tvm.values():
            call()
        sess.run(None, feeds)
    for _, runs in tvm.values():
        del runs[:]
    done = 0
    while done < calls:
        block = min(BLOCK, calls - done)
        for call, _ in tvm.values():
            for _ in range(block):
                call()
        for _ in range(block):
            sess.run(None, feeds)
        done += block
    return {**{label: per_kernel(runs) for label, (_, runs) in tvm.items()},
            ORT: per_kernel(ort_kernels(profile_events(sess), WARMUP_CALLS))}


# -- printing ---------------------------------------------------------------------------------------

def _print_matched(summary: dict[str, Any], table: str, sides: list[str], width: int) -> None:
    """One table of kernels matched across the runtimes (``"convs"`` or ``"matmuls"``), left out
    when the model has none; a matrix product's row also gives each runtime's GFLOP/s."""
    rows = summary[table]
    if not rows:
        return
    ours = [s for s in sides if s != ORT]
    what, plural = ("convolution", "convolutions") if table == "convs" else ("matrix product", "matrix products")
    rate = table == "matmuls"
    blas = rate and any("blas_gflops" in row for row in rows)
    print(f"\n{plural}, matched by what they compute (ms summed over their calls; the median call of each;"
          " ratio: over onnxruntime's" + ("; GFLOP/s: of the summed calls" if rate else "")
          + ("; BLAS: numpy's on the same product, alone" if blas else "") + "):")
    print(f"{what:<40} {'calls':>7}" + "".join(f"{s:>{width}}" for s in sides)
          + "".join(f"{'ratio ' + s:>{width + 6}}" for s in ours)
          + ("".join(f"{'GFLOP/s ' + s:>{width + 8}}" for s in sides) if rate else "")
          + (f"{'GFLOP/s BLAS':>14}" if blas else ""))
    for row in rows:
        calls = int(next(row[s]["calls"] for s in sides if s in row))
        ms = "".join(f"{row[s]['ms']:>{width}.3f}" if s in row else f"{'-':>{width}}" for s in sides)
        ratios = "".join(f"{row['ratio'][s]:>{width + 6}.2f}" if s in row["ratio"] else f"{'-':>{width + 6}}"
                         for s in ours)
        gflops = "".join(f"{row['gflop'] * row[s]['calls'] / row[s]['ms'] * 1e3:>{width + 8}.1f}"
                         if s in row and row[s]["ms"] > 0 else f"{'-':>{width + 8}}" for s in sides) if rate else ""
        alone = f"{row['blas_gflops']:>14.1f}" if blas and "blas_gflops" in row else (f"{'-':>14}" if blas else "")
        print(f"{row['key']:<40} {calls:>7}{ms}{ratios}{gflops}{alone}")
    summed = {s: sum(r[s]["ms"] for r in rows if s in r) for s in sides}
    unmatched = [r["key"] for r in rows if any(s not in r for s in sides)]
    print(f"{'all ' + plural:<40} {'':>7}" + "".join(f"{summed[s]:>{width}.3f}" for s in sides)
          + "".join(f"{summed[s] / summed[ORT] if summed.get(ORT) else float('nan'):>{width + 6}.2f}" for s in ours))
    print(f"  {len(rows) - len(unmatched)} of {len(rows)} {plural} found on every side"
          + (f"; not: {', '.join(unmatched)}" if unmatched else ""))


def print_report(summary: dict[str, Any], whole: dict[str, dict[str, Any]]) -> None:
    """The convolutions' and matrix products' tables, the other kernels by kind, and the whole
    calls (``whole``: each runtime's :func:`~tunefleet.delivery.timing.time_alternating` figure)."""
    sides = list(summary["total_ms"])
    width = max(12, *(len(s) + 2 for s in sides))
    for table in ("convs", "matmuls"):
        _print_matched(summary, table, sides, width)
    for side in sides:
        print(f"\n{side}: every other kernel, by kind (ms summed over its calls)")
        for kind, entry in sorted(summary["kinds"][side].items(), key=lambda kv: -kv[1]["ms"]):
            print(f"  {kind:<38} {int(entry['calls']):>5} calls {entry['ms']:>9.3f}")
    print("\nwhole call (ms) | kernels summed, instrumented or profiled | plain call, alternating rounds | "
          "over onnxruntime's: kernels, plain")
    for side in sides:
        kernels, plain = summary["total_ms"][side], whole[side]["ms"]
        over = (f"{kernels / summary['total_ms'][ORT]:.2f}x, {plain / whole[ORT]['ms']:.2f}x" if side != ORT else "")
        print(f"  {side:<{width}} {kernels:>10.3f} | {plain:>10.3f} | {over}")


# -- main --------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a zoo model: resnet18, mobilenet_v2, ...")
    ap.add_argument("--library", action="append", required=True, metavar="[LABEL=]PATH",
                    help="the library tunefleet built for it; repeat with LABEL=PATH to measure several in one run")
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    ap.add_argument("--calls", type=int, default=50, help="profiled calls of each runtime (after warm-up)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of the plain calls")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.calls < 1:
        ap.error("--calls must be at least 1")
    args.libraries = parse_libraries(ap, args.library)
    return args


def parse_libraries(ap: argparse.ArgumentParser, items: list[str]) -> dict[str, str]:
    """``--library`` values -> label -> path: one plain path is ``tunefleet``; several need labels."""
    if len(items) == 1 and "=" not in items[0]:
        items = [f"tunefleet={items[0]}"]
    return parse_compare(ap, items, "--library", taken=(ORT,))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)
    from tunefleet.delivery import alternatives as alt
    from tunefleet.delivery.timing import time_alternating
    from tunefleet.models.zoo import build_zoo_model

    zoo = build_zoo_model(args.model)
    inputs_np = zoo.loaded.random_inputs(seed=0)
    module, why_not = torch_module(zoo)
    if module is None:
        print(f"not measured: {args.model} has no PyTorch module to export for onnxruntime ({why_not})", file=sys.stderr)
        return 1
    import torch

    torch.set_num_threads(args.threads)
    print(f"{args.model}: {', '.join(f'{k} ({v})' for k, v in args.libraries.items())} against onnxruntime on "
          f"{args.threads} threads, {_cpu_model()}; numpy's BLAS: OpenBLAS core {blas_core() or '?'}", flush=True)
    with tempfile.TemporaryDirectory(prefix="tunefleet-op-by-op-") as tmp:
        work = Path(tmp)
        onnx_path = alt.export_onnx(module, inputs_np, work / f"{args.model}.onnx")
        kernels = profile_side_by_side(args.libraries, onnx_path, inputs_np, args.threads, args.calls, work)
        whole = time_alternating({**{label: tuned_runner(path, inputs_np) for label, path in args.libraries.items()},
                                  ORT: alt.onnxruntime_call(onnx_path, inputs_np, args.threads)}, args.rounds)
    summary = summarise(kernels)
    for row in summary["matmuls"]:
        row["blas_gflops"] = blas_gflops(row["key"])
    print_report(summary, whole)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model": args.model, "libraries": args.libraries, "threads": args.threads,
                                         "processor": _cpu_model(), "calls": args.calls, "kernels": kernels,
                                         "summary": summary, "whole_ms": {k: v["ms"] for k, v in whole.items()}},
                                        indent=2))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
