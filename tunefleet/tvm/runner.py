"""Factory for the MetaSchedule runner tunefleet measures candidates with.

One serial ``ms.runner.LocalRunner`` (a single persistent Popen worker that loads each built
artifact and times it with ``time_evaluator``); the parallel one is
:mod:`tunefleet.tvm.parallel_runner`. Both fill a candidate's inputs with
:func:`alloc_arguments`.

Evaluator defaults
------------------
TVM's ``time_evaluator`` runs the kernel once to warm up, then ``repeat`` times a batch of
``number`` runs (``number`` grows until a batch lasts ``min_repeat_ms``), and returns
``repeat`` averages. MetaSchedule records those ``repeat`` figures as ``run_secs``.

* CPU (``llvm``): ``number=1, repeat=5, min_repeat_ms=0, enable_cpu_cache_flush=True``. The cache
  flush (``cache_flush_cpu_non_first_arg``) runs before each *repeat*, so only the first run of
  a batch is cold: with ``number > 1`` or ``min_repeat_ms > 0`` the later runs hit a warm cache
  and the flush is pointless. One cold run per repeat measures what a layer sees inside a whole
  model (its weights are not in cache) and keeps a trial to milliseconds; five repeats give a
  spread to judge noise with.
* CUDA and other GPUs: ``number=3, repeat=3, min_repeat_ms=10, enable_cpu_cache_flush=False``.
  Flushing host caches says nothing about a GPU kernel; GPU kernels are short, so runs are
  batched (``min_repeat_ms``) to rise above timer resolution and launch jitter. The runner is
  the same ``LocalRunner``: the device comes from each candidate's ``RunnerInput.device_type``,
  so it measures on GPU 0 of the node it runs on.

Inputs
------
MetaSchedule's ``random_fill`` writes the bits of floats in [1, 10) into int32/int64 tensors,
so an integer input holds values near 2**30 (int32) or 2**62 (int64). Read as indices, they
are out of range: an embedding lookup (``take``, which TVM lowers without a bounds check)
crashed the runner's worker on every candidate, and such a workload stayed on its default
schedule. :func:`alloc_arguments` fills integer tensors with zeros instead, a valid index on
any non-empty axis; floats keep ``random_fill``, whose values time as real data does.

Masks (``bool``, ``int8``, ``uint8``) are filled with ones: nothing masked, as in a batch
without padding. Zeros masked every position of BERT's attention: its fused softmax workload
(``where(not mask, softmax(x), fill)``) then skipped the softmax, and the search kept a schedule
that recomputes it per element: fast on zeros, hundreds of times slower on a real mask (figures:
docs/learning.md, "Candidate inputs").

The ``LocalRunner`` constructor starts its worker and checks it (that worker imports TVM:
seconds); create the runner once per tuning session.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.runner import PyRunner
from tvm.s_tir.meta_schedule.runner.utils import alloc_argument_common
from tvm.target import Target

from tunefleet.tvm.targets import make_target

logger = logging.getLogger(__name__)

__all__ = ["ProgressRunner", "alloc_arguments", "default_evaluator_config", "make_runner", "stop_runner"]

_CPU_DEFAULTS: dict[str, Any] = {
    "number": 1,
    "repeat": 5,
    "min_repeat_ms": 0,
    "enable_cpu_cache_flush": True,
}
_GPU_DEFAULTS: dict[str, Any] = {
    "number": 3,
    "repeat": 3,
    "min_repeat_ms": 10,
    "enable_cpu_cache_flush": False,
}


#: Element types read as masks: a candidate's inputs of these types are all ones ("Inputs" above).
_MASK_DTYPES = ("bool", "int8", "uint8")


def alloc_arguments(device: Any, args_info: Any, alloc_repeat: int) -> list[list[Any]]:
    """MetaSchedule's ``default_alloc_argument``, with masks filled with ones and other integer
    tensors with zeros.

    Runs in the runner's worker (LocalRunner's or the parallel runner's), which imports this
    module by name. Why: see "Inputs" in the module docstring.
    """
    random_fill = tvm.get_global_func("tvm.contrib.random.random_fill")

    def fill(tensor: Any) -> None:
        dtype = str(tensor.dtype)
        if dtype in _MASK_DTYPES:
            tensor.copyfrom(np.ones(tuple(tensor.shape), dtype=dtype))
        elif dtype.startswith(("int", "uint")):
            tensor.copyfrom(np.zeros(tuple(tensor.shape), dtype=dtype))
        else:
            random_fill(tensor)

    return alloc_argument_common(fill, device, args_info, alloc_repeat)


def _is_cpu(target: Target) -> bool:
    return "cpu" in [str(key) for key in target.keys] and "gpu" not in [
        str(key) for key in target.keys
    ]


def default_evaluator_config(
    target: Target | Mapping[str, Any] | str,
    *,
    number: int | None = None,
    repeat: int | None = None,
    min_repeat_ms: int | None = None,
    enable_cpu_cache_flush: bool | None = None,
) -> ms.runner.EvaluatorConfig:
    """The evaluator configuration for a target (see the module docstring for the defaults).

    Parameters
    ----------
    target : tvm.target.Target or dict or str
        The target candidates are built for.
    number, repeat, min_repeat_ms, enable_cpu_cache_flush : optional
        Overrides of the per-target defaults.

    Returns
    -------
    ms.runner.EvaluatorConfig
        The configuration.
    """
    target = target if isinstance(target, Target) else make_target(target)
    values = dict(_CPU_DEFAULTS if _is_cpu(target) else _GPU_DEFAULTS)
    overrides = {
        "number": number,
        "repeat": repeat,
        "min_repeat_ms": min_repeat_ms,
        "enable_cpu_cache_flush": enable_cpu_cache_flush,
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    if values["number"] < 1 or values["repeat"] < 1 or values["min_repeat_ms"] < 0:
        raise ValueError(f"invalid evaluator configuration {values}")
    return ms.runner.EvaluatorConfig(
        number=int(values["number"]),
        repeat=int(values["repeat"]),
        min_repeat_ms=int(values["min_repeat_ms"]),
        enable_cpu_cache_flush=bool(values["enable_cpu_cache_flush"]),
    )


def make_runner(
    target: Target | Mapping[str, Any] | str,
    *,
    timeout_s: float = 30.0,
    number: int | None = None,
    repeat: int | None = None,
    min_repeat_ms: int | None = None,
    enable_cpu_cache_flush: bool | None = None,
    cooldown_s: float = 0.0,
    alloc_repeat: int = 1,
) -> ms.runner.LocalRunner:
    """A ``ms.runner.LocalRunner`` configured for the target.

    Parameters
    ----------
    target : tvm.target.Target or dict or str
        The target candidates are built for (CPU or GPU defaults follow from its keys).
    timeout_s : float
        Seconds one measurement may take before it is reported as an error.
    number, repeat, min_repeat_ms, enable_cpu_cache_flush : optional
        Overrides of :func:`default_evaluator_config`.
    cooldown_s : float
        Pause between measurements.
    alloc_repeat : int
        How many sets of random inputs to measure with (each gives ``repeat`` figures).

    Returns
    -------
    ms.runner.LocalRunner
        The runner (its worker process is already started).
    """
    config = default_evaluator_config(
        target,
        number=number,
        repeat=repeat,
        min_repeat_ms=min_repeat_ms,
        enable_cpu_cache_flush=enable_cpu_cache_flush,
    )
    logger.info("LocalRunner for %s: %s, timeout %.0f s", target, config, timeout_s)
    return ms.runner.LocalRunner(
        timeout_sec=timeout_s,
        evaluator_config=config,
        cooldown_sec=cooldown_s,
        alloc_repeat=alloc_repeat,
        f_alloc_argument=alloc_arguments,
    )


def stop_runner(runner: Any) -> None:
    """Stop a runner's worker processes: its own ``shutdown`` (the parallel runner's), else its
    pool's (MetaSchedule's ``LocalRunner`` has none of its own, and its worker would live on until
    the runner is garbage-collected); a runner with neither is left as it is."""
    stop = getattr(runner, "shutdown", None) or getattr(getattr(runner, "pool", None), "shutdown", None)
    if stop is not None:
        stop()


@derived_object
class ProgressRunner(PyRunner):
    """Measures with another runner and calls ``touch`` once per candidate whose run returned: a
    shard's heartbeat renews its lease only while builds, runs and commits return
    (:class:`tunefleet.engine.heartbeat.ProgressClock`), and one batch's runs may take longer
    than a lease."""

    def __init__(self, inner: Any, touch: Callable[[], None]) -> None:
        super().__init__()
        self.inner, self.touch = inner, touch

    def run(self, runner_inputs: list[Any]) -> list[Any]:
        if hasattr(self.inner, "on_returned"):  # the parallel runner: it says as each run returns
            self.inner.on_returned = self.touch
            return list(self.inner.run(runner_inputs))
        # MetaSchedule's LocalRunner measures one candidate after another and returns only when all
        # are done: hand it one at a time, which changes nothing else
        futures: list[Any] = []
        for one in runner_inputs:
            futures += self.inner.run([one])
            self.touch()
        return futures
