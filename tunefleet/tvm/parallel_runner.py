"""A MetaSchedule runner that measures candidates in parallel and picks the degree itself.

The idea follows DOPpler (IEEE TPDS 2023): measuring candidates one at a time leaves most of a
node idle while the tuner waits, but measuring several at once perturbs the figures. So measure
in parallel, check the parallel figures against serial ones on every batch, raise the degree of
parallelism while they agree and back off when they drift, and decide anything that matters
(could this candidate be the new best?) on serial figures. This module is our own
implementation of that loop for TVM MetaSchedule; it is not DOPpler's code.

Design
------
* :class:`AdaptiveParallelRunner` is a ``ms.runner.PyRunner``. A candidate is loaded and timed
  exactly as ``ms.runner.LocalRunner`` does it: the worker calls LocalRunner's own worker
  function (``load_module``, then ``default_alloc_argument`` and ``default_run_evaluator``, or
  the ``f_alloc_argument`` / ``f_run_evaluator`` / ``f_cleanup`` given), with the same
  :class:`~tvm.s_tir.meta_schedule.runner.EvaluatorConfig`. Like LocalRunner, :meth:`run`
  measures the whole batch before it returns, and returns futures that are already done.
* Worker processes persist across batches. Each one is a dedicated process (one pipe, one
  measurement at a time) forked from the process-wide fork server that
  :mod:`tunefleet.tvm.builder` starts with TVM preloaded, so a worker starts in milliseconds
  instead of paying ``import tvm`` again. A worker belongs to a *slot*: on a CPU target, a set
  of cores and a thread count. Workers are kept while their slot is in use (the serial slot and
  the slots of the current degree) and replaced when the degree changes.
* CPU targets (device ``llvm``/``cpu``): at degree ``d`` the cores this process may use
  (``os.sched_getaffinity(0)`` at construction) are cut into ``d`` disjoint contiguous slices;
  worker ``i`` pins itself to slice ``i`` with ``os.sched_setaffinity`` and runs
  ``len(slice)`` TVM threads (``TVM_NUM_THREADS``, read when TVM's thread pool starts, which is
  after the pinning). In a slice worker ``TVM_BIND_THREADS=0`` as well: TVM otherwise binds its
  threads to cores counted from core 0 of the *machine*, not of the worker's slice, which can
  pull a pinned worker onto another worker's cores. The serial slot has all the cores and, for
  ``TVM_NUM_THREADS`` / ``OMP_NUM_THREADS`` / ``TVM_BIND_THREADS``, exactly the values this
  process has when the worker starts (unset stays unset), i.e. what LocalRunner's worker and a
  model run in this process get. It forces no thread count of its own: the tuner sets
  ``TVM_NUM_THREADS`` to the class's ``num-cores`` before it makes the runner
  (:func:`tunefleet.tvm.threads.use_threads`), and the build times the model on as many, so
  serial figures, LocalRunner's and the final model's share one thread count (TVM's own default,
  half the hardware threads on x86, was half the cores on a VM without SMT: docs/performance.md).
  ``max_degree`` is capped at the number of usable cores.
* GPU targets (any other device type): ``d`` unpinned worker processes share GPU 0.
  **Unverified**: no GPU was available when this was written; the path is kept minimal (the
  same control loop, no pinning, no MPS/stream isolation).

Control loop (one iteration per :meth:`run` call)
-------------------------------------------------
1. At degree ``d > 1`` (and a batch larger than the serial sample), measure the batch on the
   ``d`` slot workers at once (*parallel phase*).
2. Re-measure serially (*serial phase*, the serial slot): the ``top_k`` *suspects* (the fastest
   candidates by parallel figure: whether a candidate improves the best must be decided on
   serial figures) plus ``calibration`` other candidates drawn with a seeded RNG.
3. Agreement (:func:`decide_degree`): a candidate measured on ``1/d`` of the cores is
   systematically slower, so raw equality is not expected. What must hold is that the ratio
   parallel/serial is the *same* for every re-measured candidate: the drift is the largest
   deviation of ``log(parallel/serial)`` from its median, as a relative figure. A rank inversion
   between two candidates by relative margins ``a`` (parallel) and ``b`` (serial) moves their
   log ratios apart by at least ``log(1+a) + log(1+b)``, so inversions beyond noise show up as
   drift too (:func:`rank_inversions` counts them for the history). Drift within ``tolerance``:
   grow the degree by one (up to ``max_degree``); beyond it: halve it (down to 1).
4. Commit: a candidate measured serially gets its serial figures (mode ``"serial"``); the others
   get their parallel figures times the batch's median serial/parallel ratio (mode
   ``"parallel"``; the last known ratio when this batch gave none). :meth:`pop_measure_info`
   tells which, per artifact.
5. At degree 1 every candidate is measured serially (as LocalRunner). After ``probe_every``
   consecutive batches at degree 1 the next batch probes degree 2; if that batch drifts the
   degree halves back to 1.

A candidate that fails in the parallel phase is measured again serially (a failure there may
be the parallelism's doing: a slice's fewer cores past the timeout, concurrent processes out of
GPU memory), and the serial outcome is what is committed (``retried`` in the batch's history).
A candidate that fails serially (load error, exception, crashed worker, timeout) gets an error
``RunnerResult`` (workers' stderr goes to ``/dev/null`` unless this module logs at DEBUG, as
LocalRunner does it; at DEBUG, to the run's log file: :mod:`tunefleet.tvm.native_log`); a worker
that died or timed out is killed and replaced. :meth:`run` never hangs and never raises for a bad
candidate (only :class:`RunnerStartupError` when a worker cannot start at all).

Limits
------
* With 2 cores the only parallel degree is 2, one core and one thread per worker, while the
  serial figure uses TVM's default thread count (``n`` threads wherever that default gives
  ``n > 1``). Where the serial figure is multi-threaded, the parallel/serial ratio is ~``n`` for
  a schedule that parallelises well and ~1 for a single-threaded one, so on a batch that mixes
  both the ratio is *not* consistent and the loop (correctly) backs off to serial. The scaled
  parallel figure of a candidate that was not re-measured can be off by up to that factor; that
  is why the suspects are always re-measured serially. Parallel measurement pays on many-core
  nodes (each slice still several cores, with its own cache) and on GPUs, neither of which has
  been measured yet.
* Every batch at degree > 1 re-measures ``top_k + calibration`` candidates serially (default 4),
  so the wall-time gain is at most ``n / (n/d + top_k + calibration)`` for a batch of ``n`` with
  uniform candidates; batches of ``top_k + calibration`` or fewer are measured serially only.
* Measurements on a shared, loaded machine are noisy in any mode; a tight ``tolerance`` there
  keeps the runner at degree 1 most of the time (by design).
"""

from __future__ import annotations

import glob
import logging
import math
import multiprocessing
import os
import random
import statistics
import threading
import time
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait as connection_wait
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import EvaluatorConfig, PyRunner, RunnerFuture, RunnerInput
from tvm.s_tir.meta_schedule.runner.local_runner import LocalRunnerFuture
from tvm.target import Target

from tunefleet.errors import TunefleetError
from tunefleet.tvm.builder import ensure_forkserver
from tunefleet.tvm.ffi_errors import keeps_failure
from tunefleet.tvm.native_log import redirect_native_stderr
from tunefleet.tvm.runner import alloc_arguments, default_evaluator_config

logger = logging.getLogger(__name__)

__all__ = [
    "AdaptiveParallelRunner",
    "RunnerStartupError",
    "core_slices",
    "decide_degree",
    "rank_inversions",
]

_CPU_DEVICES = frozenset({"llvm", "cpu", "c"})
_IPC_SLACK_S = 1.0
_ERROR_PREFIX = "AdaptiveParallelRunner"
# Read by TVM's thread pool when it starts; a serial/GPU worker gets the parent's values.
_THREAD_ENV = ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "TVM_BIND_THREADS")

FuncSpec = Callable[..., Any] | str | None
# A slot: ("cpu", cores) or ("gpu", index).
SlotKey = tuple[str, Any]


class RunnerStartupError(TunefleetError):
    """A measurement worker could not start (it failed to import TVM or timed out)."""


# --------------------------------------------------------------------------------------------
# Pure functions (the control loop's decision).


def _log_ratios(parallel_secs: Sequence[float], serial_secs: Sequence[float]) -> list[float]:
    if len(parallel_secs) != len(serial_secs):
        raise ValueError(
            f"parallel_secs and serial_secs differ in length ({len(parallel_secs)} vs "
            f"{len(serial_secs)})"
        )
    out = []
    for par, ser in zip(parallel_secs, serial_secs):
        if par is None or ser is None:
            continue
        par, ser = float(par), float(ser)
        if par > 0 and ser > 0 and math.isfinite(par) and math.isfinite(ser):
            out.append(math.log(par / ser))
    return out


def rank_inversions(
    parallel_secs: Sequence[float], serial_secs: Sequence[float], margin: float = 0.0
) -> int:
    """Count candidate pairs that parallel and serial figures order differently.

    Parameters
    ----------
    parallel_secs, serial_secs : sequence of float
        Figures of the same candidates (same order); non-positive or non-finite pairs are
        skipped.
    margin : float
        A pair counts only when both orders are decided by more than this relative margin.

    Returns
    -------
    int
        The number of inverted pairs.
    """
    pairs = [
        (float(p), float(s))
        for p, s in zip(parallel_secs, serial_secs)
        if p is not None and s is not None and p > 0 and s > 0
        and math.isfinite(p) and math.isfinite(s)
    ]
    count = 0
    for i in range(len(pairs)):
        for j in range(i + 1, len(pairs)):
            (p1, s1), (p2, s2) = pairs[i], pairs[j]
            dp = math.log(p1 / p2)
            ds = math.log(s1 / s2)
            if dp * ds < 0 and abs(dp) > math.log1p(margin) and abs(ds) > math.log1p(margin):
                count += 1
    return count


def decide_degree(
    current: int,
    max_degree: int,
    parallel_secs: Sequence[float],
    serial_secs: Sequence[float],
    tolerance: float,
    *,
    min_pairs: int = 2,
) -> tuple[int, float]:
    """The next degree of parallelism, from the candidates measured both ways.

    Parameters
    ----------
    current : int
        The degree the parallel figures were measured at (clamped to ``[1, max_degree]``).
    max_degree : int
        Upper bound (>= 1).
    parallel_secs, serial_secs : sequence of float
        Parallel and serial figures (e.g. medians of ``run_secs``) of the re-measured
        candidates, in the same order. Pairs with a missing, non-positive or non-finite value
        are ignored.
    tolerance : float
        The largest drift (relative, >= 0) still counted as agreement.
    min_pairs : int
        With fewer usable pairs there is no evidence either way: the degree is kept.

    Returns
    -------
    new_degree : int
        ``current + 1`` (capped at ``max_degree``) when the drift is within ``tolerance``,
        ``current // 2`` (at least 1) when it is not, ``current`` without evidence.
    drift : float
        ``exp(max_i |r_i - median(r)|) - 1`` with ``r_i = log(parallel_i / serial_i)``: how far
        the least consistent candidate's ratio is from the batch's typical ratio (0.0: all
        ratios equal). NaN without evidence.
    """
    if max_degree < 1:
        raise ValueError(f"max_degree must be >= 1, got {max_degree}")
    if not tolerance >= 0:  # also rejects NaN
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")
    current = min(max(int(current), 1), int(max_degree))
    logs = _log_ratios(parallel_secs, serial_secs)
    if len(logs) < max(min_pairs, 2):
        return current, math.nan
    middle = statistics.median(logs)
    drift = math.expm1(max(abs(r - middle) for r in logs))
    if drift <= tolerance:
        return min(current + 1, int(max_degree)), drift
    return max(1, current // 2), drift


def core_slices(cores: Sequence[int], degree: int) -> list[tuple[int, ...]]:
    """Cut ``cores`` (sorted) into ``degree`` disjoint contiguous slices of near-equal size.

    Parameters
    ----------
    cores : sequence of int
        Usable core ids.
    degree : int
        Number of slices, ``1 <= degree <= len(cores)``.

    Returns
    -------
    list of tuple of int
        The slices; the first ``len(cores) % degree`` are one core larger.
    """
    ordered = sorted(int(c) for c in cores)
    if not 1 <= degree <= len(ordered):
        raise ValueError(f"degree must be in [1, {len(ordered)}], got {degree}")
    base, extra = divmod(len(ordered), degree)
    out, start = [], 0
    for i in range(degree):
        size = base + (1 if i < extra else 0)
        out.append(tuple(ordered[start:start + size]))
        start += size
    return out


# --------------------------------------------------------------------------------------------
# Worker side.


def _thread_affinities() -> dict[int, str]:  # pragma: no cover - runs in the worker
    out = {}
    for status in glob.glob("/proc/self/task/*/status"):
        try:
            with open(status) as fh:
                for line in fh:
                    if line.startswith("Cpus_allowed_list:"):
                        out[int(status.split("/")[4])] = line.split(":", 1)[1].strip()
        except OSError:
            pass
    return out


def _worker_main(
    conn: Any,
    cores: tuple[int, ...] | None,
    nthreads: int | None,
    unbind: bool,
    quiet: bool,
    thread_env: dict[str, str | None] | None = None,
) -> None:  # pragma: no cover - runs in the worker
    """A measurement worker: configure cores/threads, then measure what the pipe sends.

    ``thread_env`` (serial slot): the parent's threading variables, applied as they are (None:
    unset), because a worker forked from the fork server has the fork server's environment,
    not the parent's current one.
    """
    try:
        if quiet:  # as LocalRunner: errors travel back through the pipe, not on stderr
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.close(devnull)
        else:  # DEBUG: TVM's C++ warnings go to the run's log file, if it has one
            redirect_native_stderr()
        if cores is not None:
            os.sched_setaffinity(0, cores)
        for name, value in (thread_env or {}).items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if nthreads is not None:
            os.environ["TVM_NUM_THREADS"] = str(nthreads)
            os.environ["OMP_NUM_THREADS"] = str(nthreads)
        if unbind:
            os.environ["TVM_BIND_THREADS"] = "0"
        import tvm  # noqa: F401
        from tvm.s_tir.meta_schedule.runner.local_runner import _worker_func

        conn.send(("ready", os.getpid(), sorted(os.sched_getaffinity(0))))
    except BaseException:  # noqa: BLE001
        try:
            conn.send(("failed", traceback.format_exc()))
        finally:
            return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        if msg == "info":
            import tvm_ffi

            info = {
                "pid": os.getpid(),
                "affinity": sorted(os.sched_getaffinity(0)),
                "num_threads": int(tvm_ffi.get_global_func("runtime.NumThreads")()),
                "thread_affinity": _thread_affinities(),
            }
            conn.send(("info", info))
            continue
        start = time.perf_counter()
        try:
            costs = _worker_func(*msg)
            reply = ("ok", [float(c) for c in costs], time.perf_counter() - start)
        except BaseException:  # noqa: BLE001 - the message becomes the candidate's error
            reply = ("error", traceback.format_exc(), time.perf_counter() - start)
        conn.send(reply)


# --------------------------------------------------------------------------------------------
# Parent side.


@dataclass
class _Worker:
    key: SlotKey
    process: Any
    conn: Any
    pid: int
    affinity: list[int]

    def kill(self) -> None:
        try:
            self.process.kill()
        except Exception:  # noqa: BLE001 - already gone
            pass
        try:
            self.process.join(timeout=5)
        except Exception:  # noqa: BLE001
            pass
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001
            pass

    def close(self) -> None:
        try:
            self.conn.send(None)
        except Exception:  # noqa: BLE001
            pass
        try:
            self.process.join(timeout=2)
        except Exception:  # noqa: BLE001
            pass
        if self.process.is_alive():
            self.kill()
        else:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001
                pass


@dataclass
class _Outcome:
    costs: list[float] | None
    error: str | None
    seconds: float


def _close_workers(holder: dict[SlotKey, _Worker]) -> None:
    workers = list(holder.values())
    holder.clear()
    for worker in workers:
        worker.close()


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


@derived_object
class AdaptiveParallelRunner(PyRunner):
    """A MetaSchedule runner with an adaptive degree of parallelism (see the module docstring).

    Usable wherever MetaSchedule takes a runner (``ms.tune_tasks(runner=...)``) and as a context
    manager that stops the workers.

    Parameters
    ----------
    target : tvm.target.Target or dict or str, optional
        Only used for the default evaluator configuration
        (:func:`tunefleet.tvm.runner.default_evaluator_config`); without it and without
        ``evaluator_config``, MetaSchedule's defaults.
    evaluator_config : EvaluatorConfig, optional
        How each candidate is timed (as for LocalRunner).
    max_degree : int, optional
        Largest degree of parallelism; default and cap on CPU: the usable cores.
    initial_degree : int
        Degree of the first batch (clamped to ``[1, max_degree]``).
    tolerance : float
        Largest drift (relative) counted as agreement (:func:`decide_degree`).
    top_k : int
        Suspects re-measured serially per parallel batch (the fastest by parallel figure).
    calibration : int
        Other candidates re-measured serially per parallel batch (seeded RNG).
    probe_every : int
        After this many consecutive batches at degree 1, probe degree 2 (0: never).
    timeout_s : float
        Seconds one measurement may take before its worker is killed and it gets an error.
    alloc_repeat : int
        As for LocalRunner.
    f_alloc_argument, f_run_evaluator, f_cleanup : str or callable, optional
        As for LocalRunner (a registered global function name or a picklable callable);
        ``f_alloc_argument`` defaults to :func:`tunefleet.tvm.runner.alloc_arguments`.
    seed : int
        Seed of the calibration sample.
    on_degree : callable, optional
        Called after each batch with the degree the next batch will use.
    startup_timeout_s : float
        Seconds a worker may take to start.
    """

    def __init__(
        self,
        target: Target | dict[str, Any] | str | None = None,
        evaluator_config: EvaluatorConfig | None = None,
        *,
        max_degree: int | None = None,
        initial_degree: int = 1,
        tolerance: float = 0.15,
        top_k: int = 2,
        calibration: int = 2,
        probe_every: int = 4,
        timeout_s: float = 30.0,
        alloc_repeat: int = 1,
        f_alloc_argument: FuncSpec = None,
        f_run_evaluator: FuncSpec = None,
        f_cleanup: FuncSpec = None,
        seed: int = 0,
        on_degree: Callable[[int], None] | None = None,
        startup_timeout_s: float = 300.0,
    ) -> None:
        super().__init__()
        if evaluator_config is None and target is not None:
            evaluator_config = default_evaluator_config(target)
        self.evaluator_config = EvaluatorConfig._normalized(evaluator_config)
        try:
            self.cores: tuple[int, ...] = tuple(sorted(os.sched_getaffinity(0)))
        except (AttributeError, OSError):  # pragma: no cover - non-Linux
            self.cores = tuple(range(os.cpu_count() or 1))
        if max_degree is None:
            max_degree = len(self.cores)
        if max_degree < 1:
            raise ValueError(f"max_degree must be >= 1, got {max_degree}")
        if tolerance < 0:
            raise ValueError(f"tolerance must be >= 0, got {tolerance}")
        if top_k < 0 or calibration < 0 or top_k + calibration < 2:
            raise ValueError("top_k and calibration must be >= 0 with top_k + calibration >= 2")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.max_degree = int(max_degree)
        self.degree = min(max(int(initial_degree), 1), self.max_degree)
        self.tolerance = float(tolerance)
        self.top_k = int(top_k)
        self.calibration = int(calibration)
        self.probe_every = int(probe_every)
        self.timeout_s = float(timeout_s)
        self.alloc_repeat = int(alloc_repeat)
        self.f_alloc_argument = f_alloc_argument or alloc_arguments
        self.f_run_evaluator = f_run_evaluator
        self.f_cleanup = f_cleanup
        self.seed = int(seed)
        self.on_degree = on_degree
        #: Called as each measurement returns (a shard's heartbeat counts it as progress).
        self.on_returned: Callable[[], None] | None = None
        self.startup_timeout_s = float(startup_timeout_s)
        #: One dict per batch (see :meth:`run`).
        self.history: list[dict[str, Any]] = []
        #: Per artifact path: how its committed figure was obtained (see :meth:`pop_measure_info`).
        self.measure_info: dict[str, dict[str, Any]] = {}
        self.worker_starts = 0
        self.worker_crashes = 0
        self.worker_timeouts = 0
        self._last_scale: float | None = None
        self._serial_streak = 0
        self._lock = threading.Lock()
        self._workers: dict[SlotKey, _Worker] = {}
        self._finalizer = weakref.finalize(self, _close_workers, self._workers)
        self._ctx = multiprocessing.get_context("forkserver")
        logger.info(
            "AdaptiveParallelRunner: cores=%s max_degree=%d degree=%d tolerance=%.2f top_k=%d "
            "calibration=%d timeout_s=%.0f",
            list(self.cores), self.max_degree, self.degree, self.tolerance, self.top_k,
            self.calibration, self.timeout_s,
        )

    # -- slots and workers -----------------------------------------------------------------------

    def _max_degree_for(self, is_cpu: bool) -> int:
        return min(self.max_degree, len(self.cores)) if is_cpu else self.max_degree

    def _serial_slot(self, is_cpu: bool) -> SlotKey:
        return ("cpu", self.cores) if is_cpu else ("gpu", 0)

    def _parallel_slots(self, is_cpu: bool, degree: int) -> list[SlotKey]:
        if is_cpu:
            return [("cpu", s) for s in core_slices(self.cores, degree)]
        return [("gpu", i) for i in range(degree)]

    def _spawn(self, key: SlotKey) -> tuple[Any, Any]:
        kind, value = key
        thread_env: dict[str, str | None] | None = None
        if kind == "cpu" and tuple(value) != self.cores:  # a slice: pinned, one thread per core
            cores: tuple[int, ...] | None = tuple(value)
            nthreads: int | None = len(value)
            unbind = True
        elif kind == "cpu":  # the serial slot: measure as LocalRunner's worker does
            cores, nthreads, unbind = tuple(value), None, False
            thread_env = {name: os.environ.get(name) for name in _THREAD_ENV}
        else:
            cores, nthreads, unbind = None, None, False
            thread_env = {name: os.environ.get(name) for name in _THREAD_ENV}
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=_worker_main,
            args=(child, cores, nthreads, unbind, not logger.isEnabledFor(logging.DEBUG),
                  thread_env),
            daemon=True,
            name=f"AdaptiveParallelRunner-{kind}-{value}",
        )
        process.start()
        child.close()
        self.worker_starts += 1
        return process, parent

    def _ensure_workers(self, keys: Sequence[SlotKey]) -> list[_Worker]:
        """Start the workers of ``keys`` that are missing (in parallel); return them in order."""
        ensure_forkserver(self._ctx)
        pending = {}
        for key in dict.fromkeys(keys):
            worker = self._workers.get(key)
            if worker is not None and worker.process.is_alive():
                continue
            if worker is not None:
                worker.kill()
                del self._workers[key]
            pending[key] = self._spawn(key)
        deadline = time.monotonic() + self.startup_timeout_s
        try:
            for key, (process, conn) in pending.items():
                if not conn.poll(max(0.0, deadline - time.monotonic())):
                    raise RunnerStartupError(
                        f"measurement worker {key} did not start within "
                        f"{self.startup_timeout_s:.0f} s"
                    )
                try:
                    msg = conn.recv()
                except (EOFError, OSError) as exc:
                    raise RunnerStartupError(
                        f"measurement worker {key} died while starting (exit code "
                        f"{process.exitcode})"
                    ) from exc
                if msg[0] != "ready":
                    raise RunnerStartupError(f"measurement worker {key} failed to start:\n{msg[1]}")
                self._workers[key] = _Worker(key, process, conn, int(msg[1]), list(msg[2]))
        except BaseException:
            for key, (process, conn) in pending.items():
                if key not in self._workers:
                    _Worker(key, process, conn, -1, []).kill()
            raise
        return [self._workers[key] for key in keys]

    def _retire_unused(self, keep: Sequence[SlotKey]) -> None:
        wanted = set(keep)
        for key in [k for k in self._workers if k not in wanted]:
            self._workers.pop(key).close()

    def _replace(self, worker: _Worker) -> _Worker:
        worker.kill()
        self._workers.pop(worker.key, None)
        return self._ensure_workers([worker.key])[0]

    def warmup(self, is_cpu: bool = True) -> None:
        """Start the serial worker and those of the current degree now (else the first batch does)."""
        with self._lock:
            keys = [self._serial_slot(is_cpu)]
            if self.degree > 1:
                keys += self._parallel_slots(is_cpu, min(self.degree, self._max_degree_for(is_cpu)))
            self._ensure_workers(keys)

    def worker_info(self) -> list[dict[str, Any]]:
        """Ask every live worker for its pid, core affinity (process and per thread) and TVM threads.

        Returns
        -------
        list of dict
            ``{"slot", "pid", "affinity", "num_threads", "thread_affinity"}`` per worker. Asking
            starts TVM's thread pool in the worker (as a first measurement would).
        """
        with self._lock:
            out = []
            for key, worker in list(self._workers.items()):
                try:
                    worker.conn.send("info")
                    if worker.conn.poll(30):
                        kind, info = worker.conn.recv()
                        out.append({"slot": key, **info})
                except (EOFError, OSError):
                    continue
            return out

    def shutdown(self) -> None:
        """Stop every worker (idempotent); a later :meth:`run` starts them again."""
        with self._lock:
            _close_workers(self._workers)

    # -- measuring -------------------------------------------------------------------------------

    def _payload(self, runner_input: RunnerInput) -> tuple[Any, ...]:
        return (
            self.f_alloc_argument,
            self.f_run_evaluator,
            self.f_cleanup,
            self.evaluator_config,
            self.alloc_repeat,
            str(runner_input.artifact_path),
            str(runner_input.device_type),
            tuple(arg_info.as_json() for arg_info in runner_input.args_info),
        )

    def _measure(
        self, indices: Sequence[int], payloads: Sequence[tuple[Any, ...]], keys: Sequence[SlotKey]
    ) -> dict[int, _Outcome]:
        """Measure ``indices`` on the workers of ``keys``, one candidate per worker at a time."""
        outcome: dict[int, _Outcome] = {}
        queue: deque[int] = deque(indices)
        idle: deque[_Worker] = deque(self._ensure_workers(keys))
        # conn -> (worker, index, started, deadline)
        busy: dict[Any, tuple[_Worker, int, float, float]] = {}
        while queue or busy:
            while queue and idle:
                worker = idle.popleft()
                index = queue.popleft()
                try:
                    worker.conn.send(payloads[index])
                except (OSError, ValueError):  # died while idle: replace, retry the candidate
                    logger.warning("AdaptiveParallelRunner: worker %s died while idle", worker.key)
                    queue.appendleft(index)
                    idle.append(self._replace(worker))
                    continue
                now = time.monotonic()
                busy[worker.conn] = (worker, index, now, now + self.timeout_s + _IPC_SLACK_S)
            if not busy:
                continue
            next_deadline = min(entry[3] for entry in busy.values())
            ready = connection_wait(list(busy), timeout=max(0.0, next_deadline - time.monotonic()))
            for conn in ready:
                worker, index, started, _ = busy.pop(conn)
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    worker.process.join(timeout=5)
                    code = worker.process.exitcode
                    self.worker_crashes += 1
                    outcome[index] = _Outcome(
                        None,
                        f"{_ERROR_PREFIX}: the measurement worker died (exit code {code}) while "
                        "running this candidate\n",
                        time.monotonic() - started,
                    )
                    logger.warning(
                        "AdaptiveParallelRunner: a candidate killed worker %s (exit code %s); "
                        "replacing it", worker.key, code,
                    )
                    idle.append(self._replace(worker))
                    self._returned()
                    continue
                if msg[0] == "ok":
                    outcome[index] = _Outcome(list(msg[1]), None, float(msg[2]))
                else:
                    outcome[index] = _Outcome(
                        None, f"{_ERROR_PREFIX}: An exception occurred\n{msg[1]}", float(msg[2])
                    )
                idle.append(worker)
                self._returned()
            now = time.monotonic()
            for conn in [c for c, entry in busy.items() if entry[3] <= now]:
                worker, index, started, _ = busy.pop(conn)
                self.worker_timeouts += 1
                outcome[index] = _Outcome(
                    None,
                    f"{_ERROR_PREFIX}: Timeout, killed after {self.timeout_s} seconds\n",
                    now - started,
                )
                logger.warning(
                    "AdaptiveParallelRunner: a measurement timed out after %.1f s on worker %s; "
                    "replacing it", self.timeout_s, worker.key,
                )
                idle.append(self._replace(worker))
                self._returned()
        return outcome

    def _returned(self) -> None:
        """A measurement returned (a result, an error, a timeout): tell ``on_returned``."""
        if self.on_returned is not None:
            self.on_returned()

    def pop_measure_info(self, artifact_path: str) -> dict[str, Any] | None:
        """Remove and return how an artifact's committed figure was obtained (None if unknown).

        Returns
        -------
        dict or None
            ``mode`` (``"serial"`` or ``"parallel"``), ``degree`` (of the parallel phase; 1 when
            the batch was serial only), ``raw_parallel_secs`` (the parallel ``run_secs``, or
            None), ``serial_secs`` (the serial ``run_secs``, or None), ``scale`` (the factor
            applied to parallel figures; 1.0 in mode serial), ``batch`` (index in
            :attr:`history`). Failed candidates have no entry.
        """
        return self.measure_info.pop(str(artifact_path), None)

    @keeps_failure
    def run(self, runner_inputs: list[RunnerInput]) -> list[RunnerFuture]:
        """Measure a batch (one control-loop iteration, see the module docstring).

        Parameters
        ----------
        runner_inputs : list of RunnerInput
            The built candidates.

        Returns
        -------
        list of RunnerFuture
            One per input, in order, already done: ``RunnerResult(run_secs, None)`` or
            ``RunnerResult(None, error_msg)``.

        Raises
        ------
        RunnerStartupError
            Only when a worker cannot start at all.
        """
        inputs = list(runner_inputs)
        with self._lock:
            results, record = self._run_locked(inputs)
            self.history.append(record)
        logger.info(
            "AdaptiveParallelRunner batch %d: n=%d degree=%d drift=%s decision=%s -> %d "
            "(serial %d, parallel %.2f s, serial %.2f s)",
            record["batch"], record["n"], record["degree"],
            "n/a" if math.isnan(record["drift"]) else f"{record['drift']:.3f}",
            record["decision"], record["new_degree"], record["remeasured"],
            record["parallel_wall_s"], record["serial_wall_s"],
        )
        if self.on_degree is not None:
            try:
                self.on_degree(self.degree)
            except Exception:  # noqa: BLE001 - a callback must not break tuning
                logger.exception("AdaptiveParallelRunner on_degree callback failed")
        return [LocalRunnerFuture(res=res, error_message=err) for res, err in results]

    def _run_locked(
        self, inputs: list[RunnerInput]
    ) -> tuple[list[tuple[list[float] | None, str | None]], dict[str, Any]]:
        n = len(inputs)
        batch = len(self.history)
        is_cpu = not inputs or str(inputs[0].device_type) in _CPU_DEVICES
        max_degree = self._max_degree_for(is_cpu)
        self.degree = min(self.degree, max_degree)
        degree = self.degree
        record: dict[str, Any] = {
            "batch": batch, "n": n, "degree": degree, "drift": math.nan, "rank_inversions": 0,
            "decision": "keep", "new_degree": degree, "remeasured": 0, "scale": None,
            "parallel_wall_s": 0.0, "serial_wall_s": 0.0, "errors": 0,
        }
        if n == 0:
            return [], record
        payloads = [self._payload(ri) for ri in inputs]
        paths = [str(ri.artifact_path) for ri in inputs]
        serial_key = self._serial_slot(is_cpu)
        parallel = degree > 1 and n > self.top_k + self.calibration

        if not parallel:
            if degree > 1:
                record["decision"] = "keep (batch too small for a parallel phase)"
            self._retire_unused([serial_key] + (
                self._parallel_slots(is_cpu, degree) if degree > 1 else []))
            start = time.monotonic()
            serial = self._measure(range(n), payloads, [serial_key])
            record["serial_wall_s"] = time.monotonic() - start
            record["remeasured"] = n
            results = []
            for i in range(n):
                out = serial[i]
                results.append((out.costs, out.error))
                if out.costs is not None:
                    self.measure_info[paths[i]] = {
                        "mode": "serial", "degree": 1, "raw_parallel_secs": None,
                        "serial_secs": list(out.costs), "scale": 1.0, "batch": batch,
                    }
            record["errors"] = sum(1 for r in results if r[0] is None)
            if degree == 1:
                self._serial_streak += 1
                if self.probe_every > 0 and max_degree > 1 and self._serial_streak >= self.probe_every:
                    self._serial_streak = 0
                    self.degree = 2
                    record["decision"] = "probe"
            record["new_degree"] = self.degree
            return results, record

        # Parallel phase.
        slots = self._parallel_slots(is_cpu, degree)
        self._retire_unused([serial_key] + slots)
        start = time.monotonic()
        par = self._measure(range(n), payloads, slots)
        record["parallel_wall_s"] = time.monotonic() - start

        # Serial phase: suspects (fastest by parallel figure), then a seeded calibration sample.
        ok = [i for i in range(n) if par[i].costs]
        ranked = sorted(ok, key=lambda i: (_median(par[i].costs or [math.inf]), i))
        suspects = ranked[: self.top_k]
        rest = [i for i in ok if i not in suspects]
        rng = random.Random(self.seed * 1_000_003 + batch)
        sample = sorted(rng.sample(rest, min(self.calibration, len(rest))))
        chosen = suspects + sample
        # A failure in the parallel phase is not the candidate's verdict (a slice's fewer cores
        # can push it past the timeout; concurrent processes can run a GPU out of memory): every
        # candidate that failed there is measured again serially, and that result is committed.
        failed = [i for i in range(n) if par[i].costs is None]
        start = time.monotonic()
        ser = self._measure(chosen + failed, payloads, [serial_key])
        record["serial_wall_s"] = time.monotonic() - start
        record["remeasured"] = len(chosen) + len(failed)
        record["suspects"] = list(suspects)
        record["calibration_sample"] = list(sample)
        record["retried"] = list(failed)

        both = [i for i in chosen if ser[i].costs]
        par_fig = [_median(par[i].costs or []) for i in both]
        ser_fig = [_median(ser[i].costs or []) for i in both]
        ratios = [s / p for p, s in zip(par_fig, ser_fig) if p > 0 and s > 0]
        if ratios:
            scale = _median(ratios)
            self._last_scale = scale
        else:
            scale = self._last_scale if self._last_scale is not None else 1.0
        record["scale"] = scale
        new_degree, drift = decide_degree(degree, max_degree, par_fig, ser_fig, self.tolerance)
        record["drift"] = drift
        record["rank_inversions"] = rank_inversions(par_fig, ser_fig)
        if math.isnan(drift):
            record["decision"] = "keep (no evidence)"
        elif new_degree > degree:
            record["decision"] = "grow"
        elif new_degree < degree:
            record["decision"] = "shrink"
        else:
            record["decision"] = "keep (at max_degree)"
        self.degree = new_degree
        record["new_degree"] = new_degree
        self._serial_streak = 0

        results = []
        for i in range(n):
            if i in ser and ser[i].costs is not None:
                costs = list(ser[i].costs or [])
                results.append((costs, None))
                self.measure_info[paths[i]] = {
                    "mode": "serial", "degree": degree,
                    "raw_parallel_secs": None if par[i].costs is None else list(par[i].costs),
                    "serial_secs": costs, "scale": 1.0, "batch": batch,
                }
            elif par[i].costs is not None:
                raw = list(par[i].costs or [])
                results.append(([c * scale for c in raw], None))
                self.measure_info[paths[i]] = {
                    "mode": "parallel", "degree": degree, "raw_parallel_secs": raw,
                    "serial_secs": None, "scale": scale, "batch": batch,
                }
            else:  # failed serially (a suspect or calibration pick, or a retried failure)
                results.append((None, ser[i].error))
        record["errors"] = sum(1 for r in results if r[0] is None)
        return results, record


def _enter(self: Any) -> Any:
    return self


def _exit(self: Any, *exc_info: object) -> None:
    self.shutdown()


# ``derived_object`` returns a TVM object class wrapping our class; special methods are looked
# up on that class, so the context-manager protocol is attached there (as for PersistentBuilder).
AdaptiveParallelRunner.__enter__ = _enter  # type: ignore[attr-defined]
AdaptiveParallelRunner.__exit__ = _exit  # type: ignore[attr-defined]
