"""A Winograd kernel's best schedule, against the same schedule split between threads by tile.

Usage::

    python bench/winograd_partition.py --home H --hardware x86-avx2 [--workload HASH ...] --seconds 240

A Winograd convolution runs in stages: the data transform (``data_pack``, ``[alpha, alpha, P,
C]``), the batched products (``bgemm``, ``[alpha, alpha, P, CO]``) and the inverse transform. Each
stage's outer loops run in parallel, and TVM hands each thread a contiguous share of them. The
transforms' outer loop is the tile axis P; the products' is whatever their tiling put first, often
the transform positions (``eps``, ``nu``): each thread then reads, in the products, the transformed
tiles the other thread wrote, and writes products the other thread transforms back. On a VM whose
two vCPUs do not share a cache, that is data crossing between dies twice per convolution, which
tuning does not see while the vCPUs happen to share one.

This bench takes the best measured schedule of each Winograd workload of the class (or of those
named), and a variant of it whose products' outer tiles split only P
(:func:`tunefleet.tvm.partition.thread_local`: the
transform positions and output channels move to the next level, P's outer factor becomes the
smallest divisor at least the thread count; every inner tile stays as it was), builds both as the
runner measures them (weights in their packed layout, no layout rewrite in the call), and times
them in alternating blocks with the core-to-core round trip after each (``bench/two_speeds.py``'s
probe): each variant's median near and far. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # two_speeds.py, beside this file

from two_speeds import block_ms, first_reading, parse_sampling, split  # noqa: E402
from versus_alternatives import _cpu_model, pin_threads  # noqa: E402

from tunefleet.tvm.partition import thread_local  # noqa: E402 - pure JSON, no TVM


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--home", type=Path, required=True, help="the tunefleet home whose measurements to read")
    ap.add_argument("--hardware", default="x86", help="the hardware class (default x86)")
    ap.add_argument("--workload", action="append", default=[],
                    help="a Winograd workload's hash or prefix (default: every Winograd workload measured)")
    args = parse_sampling(ap, argv, seconds=240.0, calls=30, what="kernel")
    if not (args.home / "tunefleet.db").is_file():
        ap.error(f"--home {args.home}: no tunefleet.db there")
    return args


def _kernels(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each Winograd workload's two kernels, built, with random arguments."""
    import numpy as np
    import tvm

    from tunefleet.config import load_settings
    from tunefleet.db import Database
    from tunefleet.tvm.targets import make_target
    from tunefleet.tvm.traces import candidate

    db = Database.from_settings(load_settings(home=args.home))
    try:
        hw = db.hardware_class(args.hardware)
        wanted = [db.workload(ref) for ref in args.workload] or \
            [wl for wl, _ in db.workloads(hardware_class_id=hw.id) if "winograd" in wl.name]
        target = make_target(hw.target)
        out = []
        for wl in wanted:
            rows = db.best_measurements(wl.id, hw.id, n=1)
            variant = thread_local(rows[0].trace_json, args.threads) if rows else None
            if variant is None:
                print(f"  {wl.name}: {'no measurement' if not rows else 'no bgemm to split by tile, or split so already'}")
                continue
            mod = tvm.ir.load_json(wl.tir_json)
            built = {}
            for label, trace in (("best", rows[0].trace_json), ("by tile", variant)):
                sch = candidate(mod, trace).sch
                # as the runner measures a candidate: the weights come packed, no rewrite in the call
                lowered = tvm.s_tir.transform.RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(sch.mod)
                built[label] = tvm.compile(lowered, target=target)
            rng = np.random.default_rng(0)
            tensors = [tvm.runtime.tensor(rng.standard_normal(shape).astype(dtype), tvm.cpu())
                       for _, dtype, shape in rows[0].args_info]
            out.append({"workload": wl.name, "hash": wl.structural_hash, "built": built, "args": tensors,
                        "measured_ms": rows[0].mean_run_s * 1e3 if rows[0].mean_run_s else None})
        return out
    finally:
        db.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)
    probe = first_reading("winograd_partition")
    if probe is None:
        return 2
    print(f"Winograd kernels of {args.hardware} in {args.home}, {args.threads} threads, {_cpu_model()}")
    kernels = _kernels(args)
    if not kernels:
        print("winograd_partition: no Winograd workload to compare", file=sys.stderr)
        return 2
    for k in kernels:
        for func in k["built"].values():
            block_ms(lambda f=func, a=k["args"]: f(*a), 5)
    samples: list[dict[str, Any]] = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        sample: dict[str, Any] = {f"{k['workload']}|{label}": block_ms(lambda f=func, a=k["args"]: f(*a), args.calls)
                                  for k in kernels for label, func in k["built"].items()}
        sample["round_trip_ns"] = probe.read()
        samples.append(sample)
    sides = split(samples, args.far_ns)
    print(f"\n{'workload':<48}{'schedule':>10}" + "".join(f"{side + ' ms':>12}" for side in sides)
          + (f"{'far / near':>12}" if len(sides) == 2 else ""))
    for k in kernels:
        for label in k["built"]:
            key = f"{k['workload']}|{label}"
            cells = "".join(f"{sides[side][key]:>12.3f}" for side in sides)
            ratio = f"{sides['far'][key] / sides['near'][key]:>11.2f}x" if len(sides) == 2 else ""
            print(f"{k['workload'][:47]:<48}{label:>10}{cells}{ratio}")
    print("blocks: " + ", ".join(f"{side} {row['blocks']} (round trip {row['round_trip_ns']:.0f} ns)"
                                 for side, row in sides.items()))
    if args.json is not None:
        args.json.write_text(json.dumps({"home": str(args.home), "hardware": args.hardware, "processor": _cpu_model(),
                                         "threads": args.threads, "far_ns": args.far_ns, "sides": sides,
                                         "workloads": [{key: k[key] for key in ("workload", "hash", "measured_ms")}
                                                       for k in kernels]}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
