"""The library's two speeds on a VM: its latency against how far apart the two vCPUs are.

Usage::

    python bench/two_speeds.py resnet18 --library out/resnet18-x86.so --seconds 120
    python bench/two_speeds.py resnet18 --library LIB --json speeds.json

On the 2-core VMs these sessions get, the same tuned library runs at two speeds (a quarter apart
on resnet18) for stretches of seconds to minutes, while onnxruntime does not move: the rows of
``docs/performance.md`` that read 15-20 % apart between two timings of one library. This bench
times, over and over for ``--seconds``, a block of ``--calls`` calls of the library, a block of
onnxruntime (the same PyTorch module exported as ``bench/versus_alternatives.py`` exports it, the
session ``run``'s table uses) and, between the blocks, the **core-to-core round trip**: two threads
pinned to CPUs 0 and 1 bounce one cache line, a small C probe compiled here with the system's C
compiler (about 60 ns when the two vCPUs share a core complex's L3, several hundred when the host
has put them on different dies). It prints each runtime's median block by the round trip that came
right after it (``--far-ns``, default 200 ns, splits the two), and each ratio. Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # versus_alternatives.py, beside this file

from versus_alternatives import DEFAULT_THREADS, _cpu_model, pin_threads, torch_module, tuned_runner  # noqa: E402

PROBE_C = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static _Atomic int flag __attribute__((aligned(64)));
static int n;
static int pin(int cpu) {
  cpu_set_t set; CPU_ZERO(&set); CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}
static void *other(void *arg) {
  (void)arg; pin(1);
  for (int i = 0; i < n; i++) {
    while (atomic_load_explicit(&flag, memory_order_acquire) != 1) {}
    atomic_store_explicit(&flag, 0, memory_order_release);
  }
  return 0;
}
int main(int argc, char **argv) {
  n = argc > 1 ? atoi(argv[1]) : 100000;
  pthread_t t;
  if (pin(0) != 0) { fprintf(stderr, "cannot pin a thread to CPU 0\n"); return 1; }
  pthread_create(&t, 0, other, 0);
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  for (int i = 0; i < n; i++) {
    atomic_store_explicit(&flag, 1, memory_order_release);
    while (atomic_load_explicit(&flag, memory_order_acquire) != 0) {}
  }
  clock_gettime(CLOCK_MONOTONIC, &b);
  pthread_join(t, 0);
  printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
  return 0;
}
"""
"""A round trip of one cache line between a thread on CPU 0 and one on CPU 1, in ns."""

ROUND_TRIPS = 100_000


class ProbeError(RuntimeError):
    """The core-to-core probe cannot be built or run here."""


def build_probe(work: Path) -> Path:
    """Compile :data:`PROBE_C` into ``work``; :class:`ProbeError` without a C compiler."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise ProbeError("not supported: no C compiler (cc, gcc or clang) to build the core-to-core probe")
    src, exe = work / "probe.c", work / "probe"
    src.write_text(PROBE_C)
    done = subprocess.run([cc, "-O2", "-pthread", str(src), "-o", str(exe)], capture_output=True, text=True)
    if done.returncode != 0:
        raise ProbeError(f"the core-to-core probe did not compile: {done.stderr.strip().splitlines()[-1:]}")
    return exe


def round_trip_ns(probe: Path) -> float:
    """One reading of the probe (:data:`ROUND_TRIPS` round trips, their mean), in ns."""
    done = subprocess.run([str(probe), str(ROUND_TRIPS)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise ProbeError(f"the core-to-core probe failed: {done.stderr.strip() or done.returncode}")
    return float(done.stdout)


def split(samples: list[dict[str, Any]], far_ns: float) -> dict[str, dict[str, Any]]:
    """Each runtime's median block, over the blocks whose next round trip was at most ``far_ns``
    (``"near"``) and above it (``"far"``): ``{"near": {"blocks", "round_trip_ns", runtime: ms}, ...}``;
    a side without blocks is left out."""
    out: dict[str, dict[str, Any]] = {}
    for side, keep in (("near", lambda ns: ns <= far_ns), ("far", lambda ns: ns > far_ns)):
        rows = [s for s in samples if keep(s["round_trip_ns"])]
        if rows:
            runtimes = [k for k in rows[0] if k != "round_trip_ns"]
            out[side] = {"blocks": len(rows), "round_trip_ns": statistics.median(r["round_trip_ns"] for r in rows),
                         **{k: statistics.median(r[k] for r in rows) for k in runtimes}}
    return out


def block_ms(call: Any, calls: int) -> float:
    """The median of ``calls`` calls, each timed alone, in ms."""
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        call()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a zoo model: resnet18, mobilenet_v2, bert-base, ...")
    ap.add_argument("--library", required=True, help="the library tunefleet built for it")
    ap.add_argument("--seconds", type=float, default=120.0, help="how long to sample (default 120)")
    ap.add_argument("--calls", type=int, default=10, help="calls of each runtime per block (default 10)")
    ap.add_argument("--far-ns", type=float, default=200.0,
                    help="a round trip above this many ns counts as the vCPUs far apart (default 200)")
    ap.add_argument("--threads", type=int, default=DEFAULT_THREADS)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.calls < 1 or args.seconds <= 0:
        ap.error("--calls must be at least 1 and --seconds above 0")
    if not Path(args.library).is_file():
        ap.error(f"--library {args.library}: no such library")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    pin_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="tunefleet-two-speeds-") as tmp:
        work = Path(tmp)
        try:
            probe = build_probe(work)
            round_trip_ns(probe)
        except ProbeError as exc:
            print(f"two_speeds: {exc}", file=sys.stderr)
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
        calls = {"tunefleet": tuned_runner(args.library, inputs_np),
                 "onnxruntime": alt.onnxruntime_call(onnx_path, inputs_np, args.threads)}
        for call in calls.values():
            block_ms(call, 3)
        print(f"{args.model}: {args.library} and onnxruntime on {args.threads} threads, {_cpu_model()}; "
              f"blocks of {args.calls} calls for {args.seconds:.0f} s, the core-to-core round trip after each",
              flush=True)
        samples = []
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            sample = {name: block_ms(call, args.calls) for name, call in calls.items()}
            time.sleep(0.05)  # the runtimes' threads stop spinning before the probe takes both CPUs
            sample["round_trip_ns"] = round_trip_ns(probe)
            samples.append(sample)
    sides = split(samples, args.far_ns)
    print(f"\n{'vCPUs':<8}{'blocks':>8}{'round trip ns':>15}{'tunefleet ms':>14}{'onnxruntime ms':>16}"
          f"{'tunefleet / onnxruntime':>25}")
    for side, row in sides.items():
        print(f"{side:<8}{row['blocks']:>8}{row['round_trip_ns']:>15.0f}{row['tunefleet']:>14.3f}"
              f"{row['onnxruntime']:>16.3f}{row['tunefleet'] / row['onnxruntime']:>24.2f}x")
    if len(sides) == 2:
        print(f"far / near: tunefleet {sides['far']['tunefleet'] / sides['near']['tunefleet']:.2f}x, "
              f"onnxruntime {sides['far']['onnxruntime'] / sides['near']['onnxruntime']:.2f}x")
    else:
        print(f"every block's round trip was {'at most' if 'near' in sides else 'above'} {args.far_ns:.0f} ns: "
              "one placement of the vCPUs the whole time")
    if args.json is not None:
        args.json.write_text(json.dumps({"model": args.model, "library": args.library, "processor": _cpu_model(),
                                         "threads": args.threads, "far_ns": args.far_ns, "sides": sides,
                                         "samples": samples}, indent=1) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
