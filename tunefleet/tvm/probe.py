"""Whether this node can build and run code for a hardware class: one probe, two callers.

A candidate can fail for its own reasons (a schedule the compiler rejects, a kernel that
crashes) or for the node's (no compiler to link the built module with, a full temporary
directory, a broken device, a runner whose process died). In a batch's results the two look
alike, and a node's fault stored as candidate errors would never be tried again, would spend the
shard and would teach the datasets label 0. :func:`probe` tells them apart: it builds and runs a
workload's *default* schedule — the unscheduled PrimFunc on a CPU (which MetaSchedule measures as
a candidate too), dlight's fallback schedule on a GPU — with the same builder and runner. What
fails there is the node's fault.

Callers: a worker before it leases its first shard (:meth:`tunefleet.engine.worker.Tuner.start`,
on a small matmul) and a shard whose whole batch failed (the workload itself), see
:class:`tunefleet.tvm.commit.CommitCallback`.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

import tvm
from tvm.s_tir import meta_schedule as ms

__all__ = ["default_schedule", "probe", "probe_module"]


def probe_module() -> tvm.IRModule:
    """A 32x32 matmul: small enough to build and run in well under a second."""
    from tvm import te

    a = te.placeholder((32, 32), name="A", dtype="float32")
    b = te.placeholder((32, 32), name="B", dtype="float32")
    k = te.reduce_axis((0, 32), name="k")
    c = te.compute((32, 32), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return tvm.IRModule({"main": te.create_prim_func([a, b, c])})


def default_schedule(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """The schedule a workload runs with untuned: the PrimFunc as it is on a CPU; on a GPU,
    dlight's fallback (an unscheduled PrimFunc binds no threads and does not build there)."""
    if target.kind.name == "llvm":
        return mod
    from tvm.s_tir import dlight as dl

    with target:
        return dl.ApplyDefaultSchedule(dl.gpu.Fallback())(mod)  # type: ignore[no-any-return]


def _first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines()
             if line.strip() and not line.strip().startswith("Command line:")]
    # TVM's messages end with the cause after a traceback (a compiler's, before its command line)
    return (lines[-1] if lines else "no message")[:300]


def probe(target: tvm.target.Target, builder: Any, runner: Any, mod: tvm.IRModule | None = None) -> str | None:
    """Build and run ``mod``'s default schedule (a small matmul when None) with ``builder`` and
    ``runner`` (MetaSchedule's interfaces); None when both worked, else why not, in one line
    ("build failed: ..." or "run failed: ...", or :func:`missing_compiler`'s reason)."""
    from tunefleet.tvm.compiler import missing_compiler

    if (why := missing_compiler()) is not None:
        return why
    mod = default_schedule(mod if mod is not None else probe_module(), target)
    func = next(iter(mod.functions.values()))
    path = None
    try:
        try:
            (built,) = builder.build([ms.builder.BuilderInput(mod, target)])
        except Exception as exc:  # noqa: BLE001 - a builder that cannot build at all is the node's fault
            return f"build failed: {type(exc).__name__}: {_first_line(str(exc))}"
        if built.error_msg:
            return f"build failed: {_first_line(built.error_msg)}"
        path = built.artifact_path
        try:
            device = tvm.runtime.Device._DEVICE_TYPE_TO_NAME[target.get_target_device_type()]  # "llvm" -> "cpu"
            (future,) = runner.run([ms.runner.RunnerInput(path, device, ms.arg_info.ArgInfo.from_prim_func(func))])
            ran = future.result()
        except Exception as exc:  # noqa: BLE001 - likewise for the runner
            return f"run failed: {type(exc).__name__}: {_first_line(str(exc))}"
        if ran.error_msg:
            return f"run failed: {_first_line(ran.error_msg)}"
        return None
    finally:
        if path:
            shutil.rmtree(os.path.dirname(path), ignore_errors=True)
