"""The library's two speeds on a VM: its latency against how far apart the two vCPUs are.

Usage::

    python bench/two_speeds.py resnet18 --library out/resnet18-x86.so --seconds 120
    python bench/two_speeds.py resnet18 --library LIB --json speeds.json
    python bench/two_speeds.py resnet18 --library LIB --kernels   # and kernel by kernel
    python bench/two_speeds.py resnet18 --library best=LIB --library variant=LIB2   # several

On the 2-core VMs these sessions get, the same tuned library runs at two speeds (a quarter apart
on resnet18) for stretches of seconds to minutes, while onnxruntime does not move: the rows of
``docs/performance.md`` that read 15-20 % apart between two timings of one library. This bench
times, over and over for ``--seconds``, a block of ``--calls`` calls of the library, a block of
onnxruntime (the same PyTorch module exported as ``bench/versus_alternatives.py`` exports it, the
session ``run``'s table uses) and, between the blocks, the **core-to-core round trip**: two threads
pinned to CPUs 0 and 1 bounce one cache line, a small C probe compiled here with the system's C
compiler (about 60 ns when the two vCPUs share a core complex's L3, several hundred when the host
has put them on different dies). It prints each runtime's median block by the round trip that came
right after it (``--far-ns``, default 200 ns, splits the two), and each ratio.

With ``--kernels`` each block is followed by one call of the library timed **kernel by kernel**
(the Relax VM's instrument) and by each kernel **called alone**, again, with the arguments it got in
that model call (its input then sits in the caches its last call left it in): a kernel slower far
apart only in the model loses time to data that the other thread wrote in the kernel before it; one
slower alone too, to what its own stages hand between the threads (a Winograd convolution's
transforms and batched products split across the threads differently). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # versus_alternatives.py, beside this file

from op_by_op import parse_libraries  # noqa: E402
from tunefleet.delivery.placement import FAR_NS, CoreProbe, ProbeError  # noqa: E402
from versus_alternatives import DEFAULT_THREADS, _cpu_model, pin_threads, torch_module, tuned_runner  # noqa: E402

def first_reading(prog: str) -> CoreProbe | None:
    """The probe between CPUs 0 and 1, read once; None (the reason printed, ``prog: ...``) where it cannot run."""
    probe = CoreProbe((0, 1))
    try:
        probe.read()
    except ProbeError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return None
    return probe


def split(samples: list[dict[str, Any]], far_ns: float) -> dict[str, dict[str, Any]]:
    """Each runtime's median block, over the blocks whose next round trip was at most ``far_ns``
    (``"near"``) and above it (``"far"``): ``{"near": {"blocks", "round_trip_ns", runtime: ms}, ...}``;
    a side without blocks is left out."""
    out: dict[str, dict[str, Any]] = {}
    for side, keep in (("near", lambda ns: ns <= far_ns), ("far", lambda ns: ns > far_ns)):
        rows = [s for s in samples if keep(s["round_trip_ns"])]
        if rows:
            runtimes = [k for k, v in rows[0].items() if k != "round_trip_ns" and not isinstance(v, list)]
            out[side] = {"blocks": len(rows), "round_trip_ns": statistics.median(r["round_trip_ns"] for r in rows),
                         **{k: statistics.median(r[k] for r in rows) for k in runtimes}}
    return out


class Kernels:
    """The library's kernels one by one, in a VM of its own (the instrument would slow the blocks).

    :meth:`in_model` calls the model once and returns each kernel call's milliseconds, in the
    order the model calls them (the VM's own builtins left out); :meth:`alone` then calls each
    kernel by itself with the arguments it got in the first call."""

    def __init__(self, library: str, inputs_np: list[Any]) -> None:
        from op_by_op import instrumented_tvm

        self.calls: list[tuple[str, Any, list[Any]]] = []
        self._call, self._runs = instrumented_tvm(library, inputs_np, keep=self.calls)
        self._call()
        self.names = [name for name, _, _ in self.calls]

    def in_model(self) -> list[float]:
        self._runs.clear()
        self._call()
        return [k["ms"] for k in self._runs[-1]]

    def alone(self, repeat: int = 3) -> list[float]:
        out = []
        for _, func, args in self.calls:
            best = float("inf")
            for _ in range(repeat):
                t = time.perf_counter()
                func(*args)
                best = min(best, (time.perf_counter() - t) * 1e3)
            out.append(best)
        return out


def split_kernels(samples: list[dict[str, Any]], far_ns: float, names: list[str]) -> list[dict[str, Any]]:
    """Each kernel call's median in the model and alone, near and far (the samples' round trip
    split as :func:`split` splits the blocks); empty unless both placements were sampled."""
    near = [s for s in samples if s["round_trip_ns"] <= far_ns and "kernels_in_model" in s]
    far = [s for s in samples if s["round_trip_ns"] > far_ns and "kernels_in_model" in s]
    if not near or not far:
        return []
    rows = []
    for k, name in enumerate(names):
        row: dict[str, Any] = {"call": k, "kernel": name}
        for side, group in (("near", near), ("far", far)):
            for where in ("in_model", "alone"):
                row[f"{where}_{side}_ms"] = statistics.median(s[f"kernels_{where}"][k] for s in group)
        rows.append(row)
    return rows


def print_kernels(rows: list[dict[str, Any]], top: int = 12) -> None:
    """The sums, and the kernel calls that lose the most far apart in the model."""
    if not rows:
        print("kernel by kernel: one placement of the vCPUs the whole time, nothing to compare")
        return
    total = {key: sum(r[key] for r in rows) for key in ("in_model_near_ms", "in_model_far_ms", "alone_near_ms",
                                                        "alone_far_ms")}
    print(f"\nkernel by kernel ({len(rows)} calls): in the model near {total['in_model_near_ms']:.2f} ms, far "
          f"{total['in_model_far_ms']:.2f}; alone near {total['alone_near_ms']:.2f}, far {total['alone_far_ms']:.2f}")
    print(f"{'call':>5}  {'kernel':<52}{'in model near':>14}{'far':>8}{'far/near':>10}{'alone near':>12}"
          f"{'far':>8}{'far/near':>10}")
    worst = sorted(rows, key=lambda r: r["in_model_far_ms"] - r["in_model_near_ms"], reverse=True)[:top]
    for r in worst:
        print(f"{r['call']:>5}  {r['kernel'][:51]:<52}{r['in_model_near_ms']:>14.3f}{r['in_model_far_ms']:>8.3f}"
              f"{r['in_model_far_ms'] / r['in_model_near_ms']:>9.2f}x{r['alone_near_ms']:>12.3f}"
              f"{r['alone_far_ms']:>8.3f}{r['alone_far_ms'] / r['alone_near_ms']:>9.2f}x")


def print_sides(sides: dict[str, dict[str, Any]], labels: list[str], far_ns: float) -> None:
    """Each runtime's median block by placement, each library's ratio to onnxruntime, and far over near."""
    print(f"\n{'vCPUs':<8}{'blocks':>8}{'round trip ns':>15}" + "".join(f"{label + ' ms':>16}" for label in labels)
          + f"{'onnxruntime ms':>16}" + "".join(f"{label + ' / ORT':>16}" for label in labels))
    for side, row in sides.items():
        print(f"{side:<8}{row['blocks']:>8}{row['round_trip_ns']:>15.0f}"
              + "".join(f"{row[label]:>16.3f}" for label in labels) + f"{row['onnxruntime']:>16.3f}"
              + "".join(f"{row[label] / row['onnxruntime']:>15.2f}x" for label in labels))
    if len(sides) == 2:
        print("far / near: " + ", ".join(f"{name} {sides['far'][name] / sides['near'][name]:.2f}x"
                                         for name in [*labels, "onnxruntime"]))
    else:
        print(f"every block's round trip was {'at most' if 'near' in sides else 'above'} {far_ns:.0f} ns: "
              "one placement of the vCPUs the whole time")


def block_ms(call: Any, calls: int) -> float:
    """The median of ``calls`` calls, each timed alone, in ms."""
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def parse_sampling(ap: argparse.ArgumentParser, argv: list[str] | None, *, seconds: float, calls: int,
                   what: str) -> argparse.Namespace:
    """Add the sampling options (how long, calls per block, the placements' split, threads, JSON)
    and parse ``argv``: ``--calls`` below 1 and ``--seconds`` not above 0 are the parser's errors."""
    ap.add_argument("--seconds", type=float, default=seconds, help=f"how long to sample (default {seconds:g})")
    ap.add_argument("--calls", type=int, default=calls, help=f"calls of each {what} per block (default {calls})")
    ap.add_argument("--far-ns", type=float, default=FAR_NS,
                    help=f"a round trip above this many ns counts as the vCPUs far apart (default {FAR_NS:g})")
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.calls < 1 or args.seconds <= 0:
        ap.error("--calls must be at least 1 and --seconds above 0")
    return args


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a zoo model: resnet18, mobilenet_v2, bert-base, ...")
    ap.add_argument("--library", action="append", required=True, metavar="[LABEL=]PATH",
                    help="the library tunefleet built for it; repeat with LABEL=PATH to time several in one run")
    ap.add_argument("--kernels", action="store_true",
                    help="after each block, one call timed kernel by kernel and each kernel alone")
    args = parse_sampling(ap, argv, seconds=120.0, calls=10, what="runtime")
    args.libraries = parse_libraries(ap, args.library)
    if args.kernels and len(args.libraries) > 1:
        ap.error("--kernels times one library kernel by kernel: give one --library")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="tunefleet-two-speeds-") as tmp:
        work = Path(tmp)
        probe = first_reading("two_speeds")
        if probe is None:
            return 2
        from tunefleet.delivery import alternatives as alt
        from tunefleet.models.zoo import build_zoo_model

        zoo = build_zoo_model(args.model)
        inputs_np = zoo.loaded.random_inputs(seed=0)
        module, why_not = torch_module(zoo)
        if module is None:
            print(f"two_speeds: {args.model} has no PyTorch module to export for onnxruntime ({why_not})",
                  file=sys.stderr)
            return 2
        import torch

        torch.set_num_threads(args.threads)
        onnx_path = alt.export_onnx(module, inputs_np, work / f"{args.model}.onnx")
        calls = {**{label: tuned_runner(path, inputs_np) for label, path in args.libraries.items()},
                 "onnxruntime": alt.onnxruntime_call(onnx_path, inputs_np, args.threads)}
        for call in calls.values():
            block_ms(call, 3)
        kernels = Kernels(next(iter(args.libraries.values())), inputs_np) if args.kernels else None
        print(f"{args.model}: {', '.join(f'{k} ({v})' for k, v in args.libraries.items())} and onnxruntime on {args.threads} threads, {_cpu_model()}; "
              f"blocks of {args.calls} calls for {args.seconds:.0f} s, the core-to-core round trip after each",
              flush=True)
        samples = []
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            sample: dict[str, Any] = {name: block_ms(call, args.calls) for name, call in calls.items()}
            if kernels is not None:
                time.sleep(0.05)  # onnxruntime's threads spin a while after its block
                sample["kernels_in_model"] = kernels.in_model()
                sample["kernels_alone"] = kernels.alone()
            sample["round_trip_ns"] = probe.read()
            samples.append(sample)
    sides = split(samples, args.far_ns)
    print_sides(sides, list(args.libraries), args.far_ns)
    by_kernel = split_kernels(samples, args.far_ns, kernels.names) if kernels is not None else None
    if by_kernel is not None:
        print_kernels(by_kernel)
    if args.json is not None:
        args.json.write_text(json.dumps({"model": args.model, "libraries": args.libraries, "processor": _cpu_model(),
                                         "threads": args.threads, "far_ns": args.far_ns, "sides": sides,
                                         "kernels": by_kernel, "samples": samples}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
