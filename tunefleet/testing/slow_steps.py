"""A build and a run that take their time, for tests of what a long batch does to a lease.

MetaSchedule's builders and runners call these in their worker processes, by reference (they
import this module), so they are plain functions of an importable module.
"""

from __future__ import annotations

import time
from typing import Any

STEP_S = 0.8
"""Seconds each build or run waits before doing its work."""


def slow_build(mod: Any, target: Any, params: Any) -> Any:
    """MetaSchedule's default build, :data:`STEP_S` later."""
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build

    time.sleep(STEP_S)
    return default_build(mod, target, params)


def slow_run(rt_mod: Any, device: Any, evaluator_config: Any, repeated_args: Any) -> Any:
    """MetaSchedule's default run evaluator, :data:`STEP_S` later."""
    from tvm.s_tir.meta_schedule.runner.local_runner import default_run_evaluator

    time.sleep(STEP_S)
    return default_run_evaluator(rt_mod, device, evaluator_config, repeated_args)
