"""Where the timing threads' cores sit: the core-to-core round trip, read between timed blocks.

On the small VMs these timings run on, the host puts the two vCPUs on one core complex, where a
cache line goes from one to the other in well under 100 ns, or on two dies, several hundred ns
apart, and moves between the two within minutes. A tuned model whose kernels hand data between
their threads runs up to a quarter slower far apart while onnxruntime hardly moves
(docs/performance.md, "The two speeds are the two placements of the vCPUs"), so a latency table
means little without the placement it was timed in. :func:`~tunefleet.delivery.timing.time_alternating`
takes a :class:`CoreProbe` as its ``between`` and reads the round trip after each runtime's block;
:func:`by_placement` then splits each runtime's rounds by it, and :func:`placement_line` says it
in one line (``tunefleet run``'s table and ``bench/versus_alternatives.py`` print it).

The probe is a small C program, compiled here once per process with the system's C compiler (the
one TVM links its libraries with): two threads pinned to two CPUs bounce one cache line.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FAR_NS = 200.0
"""A round trip above this is the two CPUs far apart (no shared cache); at or below it, near."""

ROUND_TRIPS = 100_000
"""Round trips per reading (a reading takes about 10 ms near, 40 ms far)."""

SETTLE_S = 0.05
"""Seconds a reading waits first: the runtimes' worker threads spin a while after a call (onnxruntime's,
TVM's), and the probe needs both CPUs to itself."""

PROBE_C = r"""
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static _Atomic int flag __attribute__((aligned(64)));
static int n, cpu_a, cpu_b;
static int pin(int cpu) {
  cpu_set_t set; CPU_ZERO(&set); CPU_SET(cpu, &set);
  return pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}
static void *other(void *arg) {
  (void)arg; pin(cpu_b);
  for (int i = 0; i < n; i++) {
    while (atomic_load_explicit(&flag, memory_order_acquire) != 1) {}
    atomic_store_explicit(&flag, 0, memory_order_release);
  }
  return 0;
}
int main(int argc, char **argv) {
  n = argc > 1 ? atoi(argv[1]) : 100000;
  cpu_a = argc > 2 ? atoi(argv[2]) : 0;
  cpu_b = argc > 3 ? atoi(argv[3]) : 1;
  pthread_t t;
  if (pin(cpu_b) != 0) { fprintf(stderr, "cannot pin a thread to CPU %d\n", cpu_b); return 1; }
  if (pin(cpu_a) != 0) { fprintf(stderr, "cannot pin a thread to CPU %d\n", cpu_a); return 1; }
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
"""A round trip of one cache line between a thread on CPU ``argv[2]`` and one on ``argv[3]``, in ns."""


class ProbeError(RuntimeError):
    """The core-to-core probe cannot be built or run here."""


def build_probe(work: Path) -> Path:
    """Compile :data:`PROBE_C` into ``work``.

    Raises
    ------
    ProbeError
        No C compiler (``cc``, ``gcc`` or ``clang``), or the program does not compile.
    """
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise ProbeError("not supported: no C compiler (cc, gcc or clang) to build the core-to-core probe")
    src, exe = work / "core_probe.c", work / "core_probe"
    src.write_text(PROBE_C)
    done = subprocess.run([cc, "-O2", "-pthread", str(src), "-o", str(exe)], capture_output=True, text=True)
    if done.returncode != 0:
        raise ProbeError(f"the core-to-core probe did not compile: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    return exe


class CoreProbe:
    """Reads the round trip between two CPUs, in ns: a zero-argument call, for
    :func:`~tunefleet.delivery.timing.time_alternating`'s ``between``.

    The program is compiled on the first reading, into a directory removed when the process ends.
    A probe that fails (no compiler, a CPU it may not pin to) logs why once and reads None from
    then on: the timing goes on and its figures carry no placement.

    Parameters
    ----------
    cpus : tuple of int
        The two CPUs (:func:`probe_for` picks them).
    round_trips : int
        Round trips per reading.
    """

    def __init__(self, cpus: tuple[int, int], round_trips: int = ROUND_TRIPS) -> None:
        self.cpus = cpus
        self.round_trips = round_trips
        self.error: str | None = None
        self._exe: Path | None = None

    def _program(self) -> Path:
        if self._exe is None:
            work = Path(tempfile.mkdtemp(prefix="tunefleet-core-probe-"))
            atexit.register(shutil.rmtree, work, True)
            self._exe = build_probe(work)
        return self._exe

    def read(self) -> float:
        """One reading (the mean of :attr:`round_trips` round trips, after :data:`SETTLE_S`), in ns;
        :class:`ProbeError` when it fails."""
        exe = self._program()
        time.sleep(SETTLE_S)
        done = subprocess.run([str(exe), str(self.round_trips), *map(str, self.cpus)], capture_output=True,
                              text=True, timeout=60)
        if done.returncode != 0:
            raise ProbeError(f"the core-to-core probe failed: {done.stderr.strip() or done.returncode}")
        return float(done.stdout)

    def __call__(self) -> float | None:
        if self.error is not None:
            return None
        try:
            return self.read()
        except (ProbeError, OSError, ValueError, subprocess.SubprocessError) as e:
            self.error = str(e).splitlines()[0] if str(e) else type(e).__name__
            log.warning("the placement of the timing threads is not measured: %s", self.error)
            return None


def probe_for(threads: int) -> CoreProbe | None:
    """A probe between the first two CPUs this process may run on (``os.sched_getaffinity``),
    or None: one thread, or one CPU (nothing goes between cores)."""
    cpus = sorted(os.sched_getaffinity(0))
    if threads < 2 or len(cpus) < 2:
        return None
    return CoreProbe((cpus[0], cpus[1]))


def side_of(ns: float, far_ns: float = FAR_NS) -> str:
    """``"near"`` (at most ``far_ns``) or ``"far"``."""
    return "near" if ns <= far_ns else "far"


def by_placement(latency: Mapping[str, Mapping[str, Any]], far_ns: float = FAR_NS) -> dict[str, dict[str, Any]]:
    """Each runtime's median over its blocks in each placement.

    Parameters
    ----------
    latency : mapping
        :func:`~tunefleet.delivery.timing.time_alternating`'s result, timed with a probe
        (``rounds_ms`` and ``round_trip_ns`` per runtime, block by block; a reading of None is left out).
    far_ns : float
        Where near ends (:data:`FAR_NS`).

    Returns
    -------
    dict
        ``{"near": {"blocks": n, "round_trip_ns": median, "ms": {runtime: median}}, "far": {...}}``:
        ``blocks`` counts every runtime's blocks read in that placement; a placement with none is
        left out, and everything is empty when nothing was read.
    """
    blocks: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for name, figures in latency.items():
        for ms, ns in zip(figures.get("rounds_ms", []), figures.get("round_trip_ns") or [], strict=False):
            if ns is not None:
                blocks.setdefault(side_of(ns, far_ns), {}).setdefault(name, []).append((ms, ns))
    return {side: {"blocks": sum(len(pairs) for pairs in blocks[side].values()),
                   "round_trip_ns": statistics.median(ns for pairs in blocks[side].values() for _, ns in pairs),
                   "ms": {name: statistics.median(ms for ms, _ in pairs) for name, pairs in blocks[side].items()}}
            for side in ("near", "far") if side in blocks}


def split_timing(latency: Mapping[str, Mapping[str, Any]], probe: CoreProbe | None,
                 labels: Sequence[tuple[str, str]]) -> tuple[dict[str, dict[str, Any]], str]:
    """A timing read with ``probe`` (or without: None), split by placement: :func:`by_placement`'s
    result and :func:`placement_line`'s line, or ``({}, "")`` without a probe."""
    if probe is None:
        return {}, ""
    sides = by_placement(latency)
    return sides, placement_line(sides, labels, probe.error)


def placement_of(sides: Mapping[str, Any]) -> str:
    """One word for :func:`by_placement`'s result: ``near``, ``far``, ``mixed`` (blocks in both) or
    ``unknown`` (nothing read)."""
    return "mixed" if len(sides) > 1 else next(iter(sides), "unknown")


def placement_line(sides: Mapping[str, Mapping[str, Any]], labels: Sequence[tuple[str, str]] = (),
                   error: str | None = None) -> str:
    """The placement a timing ran in, in one line, e.g. ``timed with the two CPUs near (a cache
    line's round trip 78 ns) after all 15 timed blocks`` or, split, ``timed with the two CPUs near
    after 9 of 15 timed blocks (78 ns): tuned 14.383 ms, onnxruntime 16.881 ms; far after 6 (351
    ns): tuned 17.962 ms, onnxruntime 17.634 ms``.

    Parameters
    ----------
    sides : mapping
        :func:`by_placement`'s result.
    labels : sequence of (runtime, label)
        The runtimes to give per placement when the blocks split, and how to call them.
    error : str, optional
        Why nothing was read (the probe's :attr:`CoreProbe.error`).
    """
    if not sides:
        return f"the placement of the timing threads' CPUs was not measured{': ' + error if error else ''}"
    total = sum(s["blocks"] for s in sides.values())
    if len(sides) == 1:
        side, s = next(iter(sides.items()))
        return (f"timed with the two CPUs {side} (a cache line's round trip {s['round_trip_ns']:.0f} ns) after all "
                f"{total} timed blocks")
    parts = []
    for k, (side, s) in enumerate(sides.items()):
        figures = ", ".join(f"{label} {s['ms'][name]:.3f} ms" for name, label in labels if name in s["ms"])
        count = f"{s['blocks']} of {total} timed blocks" if k == 0 else f"{s['blocks']}"
        parts.append(f"{side} after {count} ({s['round_trip_ns']:.0f} ns)" + (f": {figures}" if figures else ""))
    return "timed with the two CPUs " + "; ".join(parts) + " (the two speeds: docs/performance.md)"


__all__ = ["FAR_NS", "ROUND_TRIPS", "SETTLE_S", "CoreProbe", "ProbeError", "build_probe", "by_placement", "placement_line", "placement_of",
           "probe_for", "side_of", "split_timing"]
