"""A MetaSchedule builder that keeps one worker pool alive across batches.

Why
---
The stock ``ms.builder.LocalBuilder`` creates a fresh ``PopenPoolExecutor`` for every batch
(and once more in its constructor for a sanity check), and every fresh worker pays for
``import tvm`` plus ``import tvm.s_tir.tensor_intrin`` - which ``default_build`` imports and
which parses hundreds of TVMScript intrinsics. That import alone costs tens of seconds of CPU per
process when torch is installed (``inspect.getmodule`` scanning every loaded module, because
``tvm_ffi`` imports torch; docs/performance.md has the figures). :class:`PersistentBuilder` pays
it once.

How
---
* One ``pebble.ProcessPool`` for the builder's lifetime, given the ``multiprocessing`` context
  to start its workers with. The default start method is ``forkserver`` with ``tvm``,
  ``tvm.s_tir.tensor_intrin`` and this module preloaded in the fork server: the heavy import
  happens once per parent process, and every worker (including those pebble starts in place of
  a killed one) forks ready in milliseconds. ``spawn`` is available too; each worker then
  imports TVM in the pool initializer. (The fork server is a process-wide singleton: if
  something else started it first, the preload does not apply and the initializer imports
  instead.)
* Each :class:`~tvm.s_tir.meta_schedule.builder.BuilderInput` is shipped as JSON
  (``tvm.ir.save_json`` of the module, the target's ``export()``, params via
  ``save_param_dict``) and built with the same functions as ``LocalBuilder``:
  ``ms.builder.local_builder.default_build`` then ``default_export`` (a ``.tar`` in a fresh
  temporary directory), or the ``f_build`` / ``f_export`` given (a registered global function
  name or a picklable top-level callable).
* A batch is scheduled on the pool at once, each build with ``timeout=timeout_s``; pebble
  times a build from when a worker takes it. Past that, pebble kills that worker (SIGTERM, then
  SIGKILL) and starts another; a build that kills its worker (segfault, ``os._exit``) gets
  ``pebble.ProcessExpired`` and its worker is replaced too. Only that build gets an error
  result; the others keep running. Should pebble give up on the whole pool
  (``BrokenProcessPool``), the builds it dropped get an error and the pool is replaced.
  ``build`` never raises for a bad candidate.
* Start-up waits until every worker has run the initializer (:meth:`warmup`): pebble starts
  all its workers at once but reports nothing about them, so a shared counter does.
* Build seconds (measured in the worker around build + export) are kept per artifact path in
  :attr:`build_times` (``pop_build_time`` for a measure callback) and passed to ``on_build``.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future, wait
from concurrent.futures import TimeoutError as FutureTimeoutError
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Literal

import pebble
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder
from tvm.target import Target

from tunefleet.errors import TunefleetError
from tunefleet.tvm.ffi_errors import keeps_failure
from tunefleet.tvm.native_log import redirect_native_stderr
from tunefleet.tvm.targets import target_fingerprint

logger = logging.getLogger(__name__)

__all__ = [
    "BuildStat",
    "BuilderStartupError",
    "BuilderStats",
    "PersistentBuilder",
    "import_tensor_intrinsics",
]

# The fork server imports these once, TVM without PyTorch (:mod:`tunefleet.tvm.without_torch`: no
# worker uses torch); importing this module there (``_PRELOAD_ENV`` set) also imports the tensor
# intrinsics the fast way (see the end of this module).
_PRELOAD_MODULES = ["tunefleet.tvm.without_torch", "tvm", "tvm.s_tir.meta_schedule", __name__]
_PRELOAD_ENV = "TUNEFLEET_BUILDER_FORKSERVER"
_POLL_S = 0.05
_BACKSTOP_SLACK_S = 30.0

StartMethod = Literal["forkserver", "spawn"]
BuildFunc = Callable[..., Any]


class BuilderStartupError(TunefleetError):
    """The build worker pool could not start (workers failed to import TVM or timed out)."""


@dataclass(frozen=True)
class BuildStat:
    """What one build cost.

    Attributes
    ----------
    index : int
        Position of the input in its batch.
    artifact_path : str or None
        The exported module, or None when the build failed.
    build_seconds : float
        Worker-side seconds for deserialisation + build + export (0.0 when not measured, e.g.
        a timeout or a crashed worker: see ``wall_seconds``).
    wall_seconds : float
        Parent-side seconds from the batch's scheduling to this result (includes waiting for a
        free worker, IPC and, for a timeout, the whole wait).
    error : str or None
        The error message given to MetaSchedule, when the build failed.
    worker_pid : int or None
        The worker that built it.
    """

    index: int
    artifact_path: str | None
    build_seconds: float
    wall_seconds: float
    error: str | None
    worker_pid: int | None


@dataclass
class BuilderStats:
    """Counters over the builder's lifetime.

    ``pool_starts`` counts pool starts plus the workers pebble started in place of one killed
    for a timeout or dead in a crash (each a restart of part of the pool).
    """

    batches: int = 0
    built: int = 0
    failed: int = 0
    timeouts: int = 0
    crashes: int = 0
    pool_starts: int = 0
    build_seconds: float = 0.0
    wall_seconds: float = 0.0
    """Wall time inside :meth:`PersistentBuilder.build` (batches build in parallel: less than
    ``build_seconds``, the sum over candidates)."""
    startup_seconds: list[float] = field(default_factory=list)


_INTRIN_LOCK = threading.Lock()


def import_tensor_intrinsics() -> float:
    """Import ``tvm.s_tir.tensor_intrin`` (once per process), several times faster than a plain import.

    MetaSchedule needs the tensor intrinsics registered: ``default_build`` and the first
    ``TuneContext`` import them. Each of the ~500 ``@T.prim_func`` definitions in that package
    calls ``inspect.stack()``, and for every ``<frozen importlib...>`` frame on the stack
    (an import is in progress) ``inspect.getmodule`` rescans all of ``sys.modules`` looking
    for a module whose file is ``<frozen ...>`` - which never matches. With torch loaded
    (``tvm_ffi`` imports it) that is thousands of modules times tens of thousands of calls, the
    whole "first TuneContext" cost (docs/performance.md). During this import only,
    ``inspect.getmodule`` returns None at once for a frame whose file name starts with ``<``
    (what the full scan returns for it anyway); it is restored afterwards.

    Returns
    -------
    float
        Seconds spent (0.0 when already imported).
    """
    if "tvm.s_tir.tensor_intrin" in sys.modules:
        return 0.0
    import inspect

    start = time.perf_counter()
    with _INTRIN_LOCK:
        original = inspect.getmodule

        def _getmodule(obj: Any, _filename: str | None = None) -> Any:
            if _filename is not None and _filename.startswith("<") and inspect.isframe(obj):
                return None
            return original(obj, _filename)

        inspect.getmodule = _getmodule  # type: ignore[assignment]
        try:
            import tvm.s_tir.tensor_intrin  # noqa: F401
        finally:
            inspect.getmodule = original  # type: ignore[assignment]
    seconds = time.perf_counter() - start
    logger.debug("imported tvm.s_tir.tensor_intrin in %.1f s", seconds)
    return seconds


# --------------------------------------------------------------------------------------------
# Worker side (runs in the pool processes).


def _worker_init(
    ready: Any, pids: Any, init_seconds: Any, initializer: Callable[[], None] | None
) -> None:  # pragma: no cover - runs in the worker
    """Pool initializer: import what ``default_build`` needs once, then report ready."""
    redirect_native_stderr()  # TVM's C++ warnings go to the run's log file, if it has one
    start = time.perf_counter()
    import_tensor_intrinsics()
    from tvm.s_tir.meta_schedule.builder import local_builder  # noqa: F401

    if initializer is not None:
        initializer()
    with ready.get_lock():
        if ready.value < len(pids):  # the first workers report; replacements are only counted
            pids[ready.value] = os.getpid()
            init_seconds[ready.value] = time.perf_counter() - start
        ready.value += 1


def _build_in_worker(
    f_build: str | BuildFunc | None,
    f_export: str | BuildFunc | None,
    mod_json: str,
    target_json: str,
    params_blob: bytes | None,
) -> tuple[str | None, float, str | None, int]:  # pragma: no cover - runs in the worker
    """Build and export one candidate; never raises for a bad candidate."""
    start = time.perf_counter()
    try:
        from tvm.runtime import load_param_dict
        from tvm.s_tir.meta_schedule.builder.local_builder import default_build, default_export
        from tvm.s_tir.meta_schedule.utils import get_global_func_with_default_on_worker

        build = get_global_func_with_default_on_worker(f_build, default_build)
        export = get_global_func_with_default_on_worker(f_export, default_export)
        mod = tvm.ir.load_json(mod_json)
        target = Target(json.loads(target_json))
        params = load_param_dict(bytearray(params_blob)) if params_blob is not None else None
        rt_mod = build(mod, target, params)
        artifact_path = str(export(rt_mod))
        return artifact_path, time.perf_counter() - start, None, os.getpid()
    except Exception:  # noqa: BLE001 - the message goes to MetaSchedule as the build error
        return (
            None,
            time.perf_counter() - start,
            "PersistentBuilder: An exception occurred\n" + traceback.format_exc(),
            os.getpid(),
        )


# --------------------------------------------------------------------------------------------
# Parent side.


_FORKSERVER_LOCK = threading.Lock()


def ensure_forkserver(ctx: Any) -> None:
    """Start the process-wide fork server with TVM preloaded, unless it already runs.

    Call it from the thread that builds the pool, never concurrently with other work: it sets
    environment variables for the server's start, and changing ``environ`` while another thread
    starts a subprocess (vfork, then exec with that ``environ``) can make the exec fail with EFAULT
    ("Bad address": seen when a builder's pool started in the background while MetaSchedule's
    LocalRunner started its workers). Once the server runs, nothing is changed.
    """
    from multiprocessing import forkserver

    with _FORKSERVER_LOCK:
        server = forkserver._forkserver  # the process-wide instance ensure_running() starts
        pid = getattr(server, "_forkserver_pid", None)
        if pid is not None and _alive(pid):
            return
        ctx.set_forkserver_preload(list(_PRELOAD_MODULES))
        # PYTHONSAFEPATH: the server (``python -c ...``) must not put the working directory first on
        # sys.path, else a folder named ``tunefleet`` there (the clone, seen from the folder above
        # it) shadows the installed package in every worker.
        env = {_PRELOAD_ENV: "1", "PYTHONSAFEPATH": "1"}
        previous = {key: os.environ.get(key) for key in env}
        os.environ.update(env)
        try:
            forkserver.ensure_running()
        finally:
            for key, value in previous.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


class _Pool:
    """One ``pebble.ProcessPool`` plus the start-up barrier pebble does not have."""

    def __init__(
        self,
        max_workers: int,
        start_method: StartMethod,
        initializer: Callable[[], None] | None,
        startup_timeout_s: float,
    ) -> None:
        ctx = multiprocessing.get_context(start_method)
        if start_method == "forkserver":
            # pebble starts its workers with this context, so they fork from the preloaded server.
            ensure_forkserver(ctx)
        self.max_workers = max_workers
        self.startup_timeout_s = startup_timeout_s
        self.started_at = time.monotonic()
        self.ready = ctx.Value("i", 0)
        self.init_pids = ctx.Array("i", max_workers)
        self.init_seconds = ctx.Array("d", max_workers)
        self.executor = pebble.ProcessPool(
            max_workers=max_workers,
            initializer=_worker_init,
            initargs=(self.ready, self.init_pids, self.init_seconds, initializer),
            context=ctx,
        )
        # pebble starts all its workers on its first status check or schedule: start them now.
        self.executor.active  # noqa: B018
        self.worker_init_seconds: dict[int, float] = {}
        self.is_ready = False

    @property
    def processes(self) -> list[Any]:
        """The live workers (pebble's own table of them)."""
        return list(self.executor._pool_manager.worker_manager.workers.values())

    def wait_ready(self) -> float:
        """Block until every worker has run the initializer; return the seconds it took."""
        timeout_s = self.startup_timeout_s
        deadline = self.started_at + timeout_s
        # Hand-written: pebble has no "all workers started" signal, so poll the shared counter.
        while self.ready.value < self.max_workers:
            if not self.executor.active:  # a worker exited in the initializer: pebble gave up
                raise BuilderStartupError(
                    "PersistentBuilder workers failed to start (a worker exited during "
                    "start-up; its error is in its log)."
                )
            if time.monotonic() > deadline:
                raise BuilderStartupError(
                    f"PersistentBuilder workers did not start within {timeout_s:.0f} s "
                    f"({self.ready.value}/{self.max_workers} ready)."
                )
            time.sleep(_POLL_S)
        self.worker_init_seconds = dict(zip(self.init_pids[:], self.init_seconds[:]))
        self.is_ready = True
        return time.monotonic() - self.started_at

    def close(self, kill: bool) -> None:
        """Shut the pool down: with ``kill`` at once (pebble SIGTERMs, then SIGKILLs, each
        worker), else after the builds already scheduled."""
        if kill:
            self.executor.stop()
        else:
            self.executor.close()
        try:
            self.executor.join()
        except Exception:  # noqa: BLE001
            logger.debug("pool shutdown failed", exc_info=True)


def _close_pool_holder(holder: dict[str, _Pool | None]) -> None:
    pool = holder.get("pool")
    holder["pool"] = None
    if pool is not None:
        pool.close(kill=True)


@derived_object
class PersistentBuilder(PyBuilder):
    """A MetaSchedule builder with a persistent process pool (see the module docstring).

    Usable wherever MetaSchedule takes a builder (``ms.tune_tasks(builder=...)``) and as a
    context manager (``with PersistentBuilder() as builder: ...``) that shuts the pool down.

    Parameters
    ----------
    max_workers : int, optional
        Worker processes; defaults to the cores this process may use.
    timeout_s : float
        Seconds one build may take before it is killed and reported as an error.
    start_method : {"forkserver", "spawn"}
        How workers start (see the module docstring).
    startup_timeout_s : float
        Seconds the pool may take to start (importing TVM); past that :meth:`build` raises
        :class:`BuilderStartupError`.
    f_build, f_export : str or callable, optional
        As in ``LocalBuilder``: a registered global function name or a picklable callable;
        None means ``default_build`` / ``default_export``.
    initializer : callable, optional
        Extra per-worker initialisation (after the TVM imports), e.g. registering functions.
    on_build : callable, optional
        Called in the parent with a :class:`BuildStat` for every input, in input order, at the
        end of each batch.
    eager : bool
        Start the pool in the constructor (in the background), so worker start-up overlaps
        with task extraction and the first TuneContext.
    """

    def __init__(
        self,
        max_workers: int | None = None,
        timeout_s: float = 30.0,
        *,
        start_method: StartMethod = "forkserver",
        startup_timeout_s: float = 600.0,
        f_build: str | BuildFunc | None = None,
        f_export: str | BuildFunc | None = None,
        initializer: Callable[[], None] | None = None,
        on_build: Callable[[BuildStat], None] | None = None,
        eager: bool = True,
    ) -> None:
        super().__init__()
        if max_workers is None:
            try:
                max_workers = len(os.sched_getaffinity(0))
            except (AttributeError, OSError):  # pragma: no cover - non-Linux
                max_workers = os.cpu_count() or 1
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        if start_method not in ("forkserver", "spawn"):
            raise ValueError(f"start_method must be 'forkserver' or 'spawn', got {start_method!r}")
        self.max_workers = int(max_workers)
        self.timeout_s = float(timeout_s)
        self.start_method: StartMethod = start_method
        self.startup_timeout_s = float(startup_timeout_s)
        self.f_build = f_build
        self.f_export = f_export
        self.initializer = initializer
        self.on_build = on_build
        self.on_returned: Callable[[], None] | None = None
        """Called (from a pool thread) as each build of a batch returns, before the batch ends."""
        self.stats = BuilderStats()
        self.build_times: dict[str, float] = {}
        self.last_batch: list[BuildStat] = []
        self._lock = threading.Lock()
        self._pool_lock = threading.Lock()
        self._closed = False
        self._holder: dict[str, _Pool | None] = {"pool": None}
        self._finalizer = weakref.finalize(self, _close_pool_holder, self._holder)
        logger.info(
            "PersistentBuilder: max_workers=%d timeout_s=%.1f start_method=%s",
            self.max_workers,
            self.timeout_s,
            self.start_method,
        )
        if eager:
            if start_method == "forkserver":  # here, not in the background thread: see ensure_forkserver
                ensure_forkserver(multiprocessing.get_context("forkserver"))
            # Starting workers blocks until the fork server has imported TVM: do it off-thread.
            self._start_pool_in_background()

    # -- pool management ---------------------------------------------------------------------

    def _start_pool(self, background: bool = False) -> _Pool | None:
        with self._pool_lock:
            pool = self._holder["pool"]
            if pool is None and background and self._closed:
                return None
            if pool is None:
                pool = _Pool(self.max_workers, self.start_method, self.initializer, self.startup_timeout_s)
                self._holder["pool"] = pool
                self.stats.pool_starts += 1
            return pool

    def _start_pool_in_background(self) -> None:
        def _run() -> None:
            try:
                self._start_pool(background=True)
            except Exception:  # noqa: BLE001 - build() retries and reports
                logger.warning("PersistentBuilder: background pool start failed", exc_info=True)

        threading.Thread(target=_run, name="PersistentBuilder-start", daemon=True).start()

    def _ready_pool(self) -> _Pool:
        self._closed = False
        pool = self._start_pool()
        assert pool is not None
        if pool.is_ready and not pool.executor.active:
            # pebble gives up on a pool whose workers all died with nothing running.
            logger.warning("PersistentBuilder: the pool broke while idle; replacing it")
            self._discard_pool()
            pool = self._start_pool()
            assert pool is not None
        if not pool.is_ready:
            try:
                seconds = pool.wait_ready()
            except BaseException:
                self._discard_pool()
                raise
            self.stats.startup_seconds.append(seconds)
            logger.info(
                "PersistentBuilder: %d workers ready in %.1f s (worker init seconds: %s)",
                self.max_workers,
                seconds,
                {pid: round(sec, 2) for pid, sec in pool.worker_init_seconds.items()},
            )
        return pool

    def _discard_pool(self) -> None:
        with self._pool_lock:
            _close_pool_holder(self._holder)

    def warmup(self) -> float:
        """Start the workers (if needed) and wait until they are ready.

        Returns
        -------
        float
            Seconds from pool creation to ready (0.0 if it was already ready).
        """
        self._closed = False
        pool = self._start_pool()
        assert pool is not None
        if pool.is_ready:
            return 0.0
        self._ready_pool()
        return self.stats.startup_seconds[-1]

    def shutdown(self) -> None:
        """Stop the worker processes (idempotent). A later :meth:`build` starts a new pool."""
        with self._pool_lock:
            self._closed = True
            pool = self._holder["pool"]
            self._holder["pool"] = None
        if pool is not None:
            pool.close(kill=False)

    # -- build ---------------------------------------------------------------------------------

    def pop_build_time(self, artifact_path: str) -> float | None:
        """Remove and return the build seconds recorded for an artifact (None if unknown)."""
        return self.build_times.pop(str(artifact_path), None)

    @staticmethod
    def _payload(build_input: BuilderInput) -> tuple[str, str, bytes | None]:
        from tvm.runtime import save_param_dict

        params = build_input.params
        blob = None
        if params is not None:
            blob = bytes(save_param_dict({str(k): v for k, v in params.items()}))
        return (
            tvm.ir.save_json(build_input.mod),
            target_fingerprint(build_input.target),
            blob,
        )

    @keeps_failure
    def build(self, build_inputs: Sequence[BuilderInput]) -> list[BuilderResult]:
        """Build a batch of candidates.

        Parameters
        ----------
        build_inputs : sequence of BuilderInput
            The candidates.

        Returns
        -------
        list of BuilderResult
            One per input, in order: ``(artifact_path, None)`` or ``(None, error_msg)``.

        Raises
        ------
        BuilderStartupError
            Only if the worker pool cannot start at all.
        """
        t0 = time.monotonic()
        with self._lock:
            stats = self._build_locked(list(build_inputs))
        self.stats.wall_seconds += time.monotonic() - t0
        self.last_batch = stats
        if self.on_build is not None:
            for stat in stats:
                try:
                    self.on_build(stat)
                except Exception:  # noqa: BLE001 - a callback must not break tuning
                    logger.exception("PersistentBuilder on_build callback failed")
        return [BuilderResult(s.artifact_path, s.error) for s in stats]

    def _returned(self, done_at: dict[int, float], index: int) -> None:
        done_at.setdefault(index, time.monotonic())
        if self.on_returned is not None:
            try:
                self.on_returned()
            except Exception:  # noqa: BLE001 - a callback must not break a build
                logger.exception("PersistentBuilder on_returned callback failed")

    def _build_locked(self, inputs: list[BuilderInput]) -> list[BuildStat]:
        n = len(inputs)
        self.stats.batches += 1
        if n == 0:
            return []
        payloads = [self._payload(bi) for bi in inputs]
        done_at: dict[int, float] = {}
        try:
            pool = self._ready_pool()
            scheduled = time.monotonic()
            futures: list[Future[Any]] = []
            for index, payload in enumerate(payloads):
                try:
                    fut = pool.executor.schedule(
                        _build_in_worker, args=(self.f_build, self.f_export, *payload),
                        timeout=self.timeout_s,
                    )
                except RuntimeError as exc:  # pebble gave up on the pool since it was checked
                    fut = Future()
                    fut.set_exception(BrokenProcessPool(str(exc)))
                fut.add_done_callback(lambda _, i=index: self._returned(done_at, i))
                futures.append(fut)
            # pebble resolves every future: a result, TimeoutError or ProcessExpired. The bound is
            # a backstop for a worker killed from outside between taking a build and pebble
            # noticing: every build's deadline, one round of workers after another, plus slack.
            rounds = -(-n // self.max_workers)
            _, lost = wait(futures, timeout=(rounds + 1) * self.timeout_s + _BACKSTOP_SLACK_S)
            for fut in lost:
                fut.cancel()
        except BaseException:
            # KeyboardInterrupt, startup failure: leave no busy worker behind.
            self._discard_pool()
            raise

        outcome: list[BuildStat] = []
        broken = False
        for index, fut in enumerate(futures):
            wall = done_at.get(index, time.monotonic()) - scheduled
            try:
                path, seconds, error, pid = fut.result()
            except FutureTimeoutError:
                error = f"PersistentBuilder: Timeout, killed after {self.timeout_s} seconds"
                self.stats.timeouts += 1
                self.stats.pool_starts += 1  # pebble replaced the worker it killed
                logger.warning("PersistentBuilder: a build timed out after %.1f s; worker replaced",
                               self.timeout_s)
            except pebble.ProcessExpired as exc:
                error = (f"PersistentBuilder: the build worker died (exit code {exc.exitcode}) "
                         "while building this candidate")
                self.stats.crashes += 1
                self.stats.pool_starts += 1  # pebble replaced the dead worker
                logger.warning("PersistentBuilder: a build killed its worker (exit code %s); "
                               "worker replaced", exc.exitcode)
            except BrokenProcessPool as exc:
                error = f"PersistentBuilder: the build worker pool broke ({exc}) during this build"
                broken = True
            except CancelledError:  # the backstop gave up on it
                error = "PersistentBuilder: the build was lost by the worker pool (no result in time)"
                broken = True
            except Exception as exc:  # noqa: BLE001 - e.g. an unpicklable f_build
                error = f"PersistentBuilder: An exception occurred\n{exc!r}"
            else:
                outcome.append(BuildStat(index, path, float(seconds), wall, error, pid))
                continue
            outcome.append(BuildStat(index, None, 0.0, wall, error, None))
        if broken:
            logger.warning("PersistentBuilder: pebble gave up on the pool; replacing it")
            self._discard_pool()

        for stat in outcome:
            if stat.artifact_path is not None:
                self.stats.built += 1
                self.stats.build_seconds += stat.build_seconds
                self.build_times[stat.artifact_path] = stat.build_seconds
            else:
                self.stats.failed += 1
        return outcome


def _enter(self: Any) -> Any:
    return self


def _exit(self: Any, *exc_info: object) -> None:
    self.shutdown()


# ``derived_object`` returns a TVM object class wrapping our class; special methods are looked
# up on that class, so the context-manager protocol is attached there.
PersistentBuilder.__enter__ = _enter  # type: ignore[attr-defined]
PersistentBuilder.__exit__ = _exit  # type: ignore[attr-defined]


if os.environ.get(_PRELOAD_ENV) == "1" and "tvm.s_tir.tensor_intrin" not in sys.modules:
    # We are being preloaded by the fork server that ensure_forkserver started: import the
    # intrinsics here once, so every worker forks with them.
    import_tensor_intrinsics()
