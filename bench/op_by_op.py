"""Where does onnxruntime win? The tuned library against onnxruntime, kernel by kernel.

Usage::

    python bench/op_by_op.py mobilenet_v2 --library out/mobilenet-v2-x86-avx2.so
    python bench/op_by_op.py resnet18 --library LIB --threads 2 --calls 60 --json ops.json

For a zoo model and a library tunefleet built for it (the file ``tunefleet run``/``build`` writes,
or a bench phase's ``library``), on the same inputs and threads:

1. **tunefleet**: the library in Relax's virtual machine with an instrument that reads the clock
   before and after every kernel call (TVM 0.27's VM has no profiler of its own; the instrument
   costs a few microseconds per call, which the kernels' sum against the plain call shows);
2. **onnxruntime**: the same PyTorch module exported as ``bench/versus_alternatives.py`` exports
   it, in a session of :func:`tunefleet.delivery.alternatives.onnxruntime_session` (the options
   ``run``'s table uses) with onnxruntime's own profiler on: every node's kernel time.

The two run ``--calls`` calls each after warm-up, in alternating blocks of ten, and each kernel
keeps its median. Convolutions are matched across the two runtimes by what they compute (input and output
channels, input and output size, kernel: depthwise, 1x1 or kxk), whatever layout each runtime
chose (NCHW, NHWC or blocked NCHWc); every other kernel is summed by kind on its own side. Then
both whole calls, without instrument or profiler, in alternating rounds
(:func:`tunefleet.delivery.timing.time_alternating`). Prints one row per convolution (summed over
its calls: ms each side and the ratio) and the kinds; ``--json`` writes it all. Asserts nothing
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

from versus_alternatives import (  # noqa: E402 - beside this file; light at import
    DEFAULT_THREADS,
    _cpu_model,
    load_vm,
    pin_threads,
    torch_module,
    tuned_runner,
)

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
    (``[N, C/b, H, W, b]``); 4-D is NCHW for onnxruntime and, for tunefleet, NHWC unless the last
    two dimensions are the square ones (NCHW). None for any other shape."""
    if len(shape) == 5:
        return shape[1] * shape[4], shape[2], shape[3]
    if len(shape) != 4:
        return None
    if runtime == "onnxruntime":
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


def conv_key(shapes: list[list[int]], out_shape: list[int], runtime: str) -> str | None:
    """What a convolution computes, as the same string on both runtimes:
    ``"dw3x3 96->96 112x112->56x56"``; None where the shapes say too little."""
    data = activation(shapes[0], runtime) if shapes else None
    out = activation(out_shape, runtime)
    if data is None or out is None or len(shapes) < 2:
        return None
    weights = math.prod(shapes[1])
    return f"{conv_kind(weights, data[0], out[0])} {data[0]}->{out[0]} {data[1]}x{data[2]}->{out[1]}x{out[2]}"


def tvm_kind(symbol: str) -> str:
    """A kernel's kind from its PrimFunc name: ``fused_conv2d3_add2_clip1`` -> ``conv2d_add_clip``."""
    parts = [p.rstrip("0123456789") for p in symbol.split("_")]
    return "_".join(p for p in parts if p and p != "fused") or symbol


def is_conv(kind: str) -> bool:
    return "conv" in kind.lower()


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


# -- side by side ----------------------------------------------------------------------------------

def per_kernel(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One entry per kernel position of the call sequence, its median over the runs (every run of
    a model calls the same kernels in the same order; runs of another length are dropped)."""
    if not runs:
        return []
    length = statistics.mode(len(r) for r in runs)
    kept = [r for r in runs if len(r) == length]
    return [{**kept[0][i], "ms": statistics.median(r[i]["ms"] for r in kept)} for i in range(length)]


def summarise(kernels: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Convolutions matched by what they compute, the rest by kind, per runtime: ``{"convs":
    [{"key", runtime: {"calls", "ms"}, ..., "ratio"}], "kinds": {runtime: {kind: {"calls", "ms"}}},
    "total_ms": {runtime: ms}}``; ``ratio`` is tunefleet over onnxruntime where both have the key."""
    convs: dict[str, dict[str, dict[str, float]]] = defaultdict(dict)
    kinds: dict[str, dict[str, dict[str, float]]] = {}
    totals = {}
    for runtime, rows in kernels.items():
        kinds[runtime] = {}
        totals[runtime] = sum(r["ms"] for r in rows)
        for r in rows:
            key = conv_key(r["shapes"], r["out"], runtime) if is_conv(r["kind"]) else None
            bucket = convs[key] if key is not None else kinds[runtime]
            name = runtime if key is not None else r["kind"]
            entry = bucket.setdefault(name, {"calls": 0, "ms": 0.0})
            entry["calls"] += 1
            entry["ms"] += r["ms"]
    rows = []
    for key, sides in convs.items():
        row: dict[str, Any] = {"key": key, **sides}
        if "tunefleet" in sides and "onnxruntime" in sides and sides["onnxruntime"]["ms"] > 0:
            row["ratio"] = sides["tunefleet"]["ms"] / sides["onnxruntime"]["ms"]
        rows.append(row)
    rows.sort(key=lambda r: -max(r.get(s, {}).get("ms", 0.0) for s in kernels))
    return {"convs": rows, "kinds": kinds, "total_ms": totals}


# -- measuring ---------------------------------------------------------------------------------------

def _tensor_shape(value: Any) -> list[int]:
    shape = getattr(value, "shape", None)
    try:
        return [int(d) for d in shape] if shape is not None else []
    except TypeError:
        return []


def instrumented_tvm(library: str, inputs_np: list[Any]) -> tuple[Any, list[list[dict[str, Any]]]]:
    """(a zero-argument call of the library that records its kernels, the list each call appends
    its kernels to): ``{"name", "kind", "shapes", "out", "ms"}`` per kernel call, the VM's own
    built-ins left out."""
    import tvm

    dev = tvm.cpu()
    vm = load_vm(library)
    runs: list[list[dict[str, Any]]] = []
    started: list[float] = []

    def instrument(func: Any, symbol: str, before: bool, ret: Any, *args: Any) -> int:
        if before:
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
        runs.append([])
        main(*inputs)

    return call, runs


def profile_side_by_side(library: str, onnx_path: Path, inputs_np: list[Any], threads: int, calls: int,
                         work: Path) -> dict[str, list[dict[str, Any]]]:
    """Both runtimes' kernels, ``calls`` calls each after :data:`WARMUP_CALLS`, in alternating
    blocks of :data:`BLOCK` calls.

    Blocks, not one call of each in turn: onnxruntime's threads spin for a while after a run, and
    a TVM kernel whose parallel loop shares a core with them waits for the scheduler (the first
    layers of the next call ran up to 40x slower so). A block's first calls may still be slowed,
    which each kernel's median over the calls leaves out.
    """
    from tunefleet.delivery.alternatives import onnxruntime_session

    tvm_call, tvm_runs = instrumented_tvm(library, inputs_np)
    sess = onnxruntime_session(onnx_path, threads, profile_prefix=str(work / "onnxruntime-profile"))
    feeds = {i.name: x for i, x in zip(sess.get_inputs(), inputs_np, strict=True)}
    for _ in range(WARMUP_CALLS):
        tvm_call()
        sess.run(None, feeds)
    del tvm_runs[:]
    done = 0
    while done < calls:
        block = min(BLOCK, calls - done)
        for _ in range(block):
            tvm_call()
        for _ in range(block):
            sess.run(None, feeds)
        done += block
    events = json.loads(Path(sess.end_profiling()).read_text())
    return {"tunefleet": per_kernel(tvm_runs), "onnxruntime": per_kernel(ort_kernels(events, WARMUP_CALLS))}


# -- printing ---------------------------------------------------------------------------------------

def print_report(summary: dict[str, Any], whole: dict[str, dict[str, Any]]) -> None:
    sides = ("tunefleet", "onnxruntime")
    print("\nconvolutions, matched by what they compute (ms summed over their calls; the median call of each):")
    print(f"{'convolution':<40} {'calls':>7} {'tunefleet':>10} {'onnxruntime':>12} {'ratio':>7}")
    for row in summary["convs"]:
        calls = "/".join(str(int(row[s]["calls"])) if s in row else "-" for s in sides)
        ms = [f"{row[s]['ms']:.3f}" if s in row else "-" for s in sides]
        ratio = f"{row['ratio']:.2f}" if "ratio" in row else "-"
        print(f"{row['key']:<40} {calls:>7} {ms[0]:>10} {ms[1]:>12} {ratio:>7}")
    matched = [r for r in summary["convs"] if "ratio" in r]
    conv_ms = {s: sum(r[s]["ms"] for r in summary["convs"] if s in r) for s in sides}
    matched_ms = {s: sum(r[s]["ms"] for r in matched) for s in sides}
    print(f"{'all convolutions':<40} {'':>7} {conv_ms['tunefleet']:>10.3f} {conv_ms['onnxruntime']:>12.3f}"
          f" {conv_ms['tunefleet'] / conv_ms['onnxruntime'] if conv_ms['onnxruntime'] else float('nan'):>7.2f}")
    print(f"{'  of them matched on both sides':<40} {len(matched):>7} {matched_ms['tunefleet']:>10.3f}"
          f" {matched_ms['onnxruntime']:>12.3f}")
    for side in sides:
        print(f"\n{side}: every other kernel, by kind (ms summed over its calls)")
        for kind, entry in sorted(summary["kinds"][side].items(), key=lambda kv: -kv[1]["ms"]):
            print(f"  {kind:<38} {int(entry['calls']):>5} calls {entry['ms']:>9.3f}")
    print("\nwhole call (ms) | kernels summed, instrumented or profiled | plain call, alternating rounds")
    for side, label in zip(sides, ("tunefleet tuned", "onnxruntime"), strict=True):
        print(f"  {side:<12} {summary['total_ms'][side]:>10.3f} | {whole[label]['ms']:>10.3f}")
    print(f"  tunefleet / onnxruntime: kernels {summary['total_ms']['tunefleet'] / summary['total_ms']['onnxruntime']:.2f}x,"
          f" plain calls {whole['tunefleet tuned']['ms'] / whole['onnxruntime']['ms']:.2f}x")


# -- main --------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a zoo model: resnet18, mobilenet_v2, ...")
    ap.add_argument("--library", required=True, help="the library tunefleet built for it")
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    ap.add_argument("--calls", type=int, default=50, help="profiled calls of each runtime (after warm-up)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of the plain calls")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.calls < 1:
        ap.error("--calls must be at least 1")
    if not Path(args.library).is_file():
        ap.error(f"--library {args.library}: no such file")
    return args


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
    print(f"{args.model}: {args.library} against onnxruntime on {args.threads} threads, {_cpu_model()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="tunefleet-op-by-op-") as tmp:
        work = Path(tmp)
        onnx_path = alt.export_onnx(module, inputs_np, work / f"{args.model}.onnx")
        kernels = profile_side_by_side(args.library, onnx_path, inputs_np, args.threads, args.calls, work)
        whole = time_alternating({"tunefleet tuned": tuned_runner(args.library, inputs_np),
                                  "onnxruntime": alt.onnxruntime_call(onnx_path, inputs_np, args.threads)}, args.rounds)
    summary = summarise(kernels)
    print_report(summary, whole)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model": args.model, "library": args.library, "threads": args.threads,
                                         "processor": _cpu_model(), "calls": args.calls, "kernels": kernels,
                                         "summary": summary, "whole_ms": {k: v["ms"] for k, v in whole.items()}},
                                        indent=2))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
