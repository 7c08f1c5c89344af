"""Candidate inputs: an embedding lookup (``take`` on integer indices) is measured, not crashed.

MetaSchedule's ``random_fill`` puts values near 2**30 into int32 tensors; used as indices they
read far outside the table. Both runners fill candidates' inputs with
:func:`tunefleet.tvm.runner.alloc_arguments`, which zero-fills integer tensors (masks: ones).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tvm.s_tir import meta_schedule as ms

from tunefleet.tvm.builder import PersistentBuilder
from tunefleet.tvm.parallel_runner import AdaptiveParallelRunner
from tunefleet.tvm.runner import alloc_arguments, make_runner

ROWS, DIM, TOKENS = 4096, 64, 32


def _embedding_lookup() -> Any:
    """``table[ids]`` as Relax legalises ``take``: no bounds check (mode ``fast``)."""
    import tvm
    from tvm import te, topi

    table = te.placeholder((ROWS, DIM), "float32", name="table")
    ids = te.placeholder((TOKENS,), "int32", name="ids")
    out = topi.take(table, ids, axis=0, mode="fast")
    return tvm.IRModule({"main": te.create_prim_func([table, ids, out])})


@pytest.fixture(scope="module")
def lookup(cpu_target: Any) -> Iterator[tuple[str, Any]]:
    """The built lookup: (artifact path, module)."""
    mod = _embedding_lookup()
    with PersistentBuilder(max_workers=1, timeout_s=120) as builder:
        (result,) = builder.build([ms.builder.BuilderInput(mod, cpu_target)])
    assert result.error_msg is None, result.error_msg
    yield str(result.artifact_path), mod
    shutil.rmtree(Path(str(result.artifact_path)).parent, ignore_errors=True)


def _runner_input(lookup: tuple[str, Any]) -> Any:
    path, mod = lookup
    return ms.runner.RunnerInput(path, "cpu", ms.arg_info.ArgInfo.from_entry_func(mod))


def test_alloc_arguments_zero_fills_integers_and_randomises_floats() -> None:
    import tvm

    args_info = [["TENSOR", "float32", [ROWS, DIM]], ["TENSOR", "int32", [TOKENS]],
                 ["TENSOR", "int64", [TOKENS]]]
    (args,) = alloc_arguments(tvm.cpu(), args_info, 1)
    table, ids32, ids64 = (arg.numpy() for arg in args)
    assert not ids32.any() and not ids64.any()
    assert table.std() > 0  # random_fill's floats, not a constant


def test_alloc_arguments_fills_masks_with_ones() -> None:
    """Zeros masked every position of BERT's attention, so its softmax was never timed (the runner
    module's docstring): a mask is all ones, nothing masked."""
    import tvm

    args_info = [["TENSOR", "int8", [1, 12, 128, 1]], ["TENSOR", "uint8", [TOKENS]], ["TENSOR", "bool", [TOKENS]],
                 ["TENSOR", "int32", [TOKENS]]]
    (args,) = alloc_arguments(tvm.cpu(), args_info, 1)
    mask8, masku8, mask_bool, ids = (arg.numpy() for arg in args)
    assert (mask8 == 1).all() and (masku8 == 1).all() and mask_bool.all()
    assert not ids.any()  # indices stay zeros: valid on any non-empty axis


def test_local_runner_measures_an_embedding_lookup(lookup: tuple[str, Any], cpu_target: Any) -> None:
    (future,) = make_runner(cpu_target, timeout_s=30).run([_runner_input(lookup)])
    result = future.result()
    assert result.error_msg is None, result.error_msg
    assert len(result.run_secs) == 5 and all(float(s) > 0 for s in result.run_secs)


def test_parallel_runner_measures_an_embedding_lookup(
    lookup: tuple[str, Any], cpu_target: Any
) -> None:
    with AdaptiveParallelRunner(cpu_target, max_degree=1) as runner:
        (future,) = runner.run([_runner_input(lookup)])
        result = future.result()
    assert result.error_msg is None, result.error_msg
    assert np.isfinite([float(s) for s in result.run_secs]).all()
