"""A schedule of one shape made to fit another shape of the same operator (tunefleet.tvm.similar),
on real TIR: the conv2d and matmul workloads of ``small-cnn`` at two image sizes."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import tvm
from tvm.s_tir import meta_schedule as ms

from tunefleet.tvm.similar import ADAPTED, AS_IS, SKIPPED, adapt_trace, fit_tile
from tunefleet.tvm.traces import candidate, trace_json_of
from tunefleet.vocab import DEFAULT_TRACE_JSON, task_name_key


def test_task_name_key_is_the_fused_op_sequence() -> None:
    assert task_name_key("fused_conv2d1_add1_relu1") == task_name_key("fused_conv2d_add_relu") == "conv2d_add_relu"
    assert task_name_key("fused_matmul_add2") == "matmul_add"
    assert task_name_key("max_pool2d1") == "max_pool2d"


@pytest.mark.parametrize(("extent", "donor", "innermost", "fitted"), [
    (32, [2, 8, 2, 1], 64, [2, 8, 2, 1]),  # fits: kept
    (16, [2, 8, 2, 1], 64, [1, 8, 2, 1]),  # smaller: the inner tiles kept, the outermost shrinks
    (64, [2, 8, 2, 1], 64, [4, 8, 2, 1]),  # larger: the outermost takes the rest
    (30, [1, 1, 16, 1], 64, [2, 1, 15, 1]),  # the largest divisor at most the donor's tile
    (7, [1, 2, 2, 2], 64, [7, 1, 1, 1]),  # a prime extent
    (128, [1, 128], 64, [2, 64]),  # the innermost stays within max_innermost_factor
])
def test_fit_tile_keeps_inner_tiles_as_close_as_divisors_allow(extent: int, donor: list[int], innermost: int,
                                                               fitted: list[int]) -> None:
    got = fit_tile(extent, donor, innermost)
    assert got == fitted and int(np.prod(got)) == extent


@pytest.fixture(scope="module")
def target() -> Any:
    from tunefleet.tvm.builder import import_tensor_intrinsics
    from tunefleet.tvm.targets import host_cpu_target, make_target

    import_tensor_intrinsics()
    return make_target(host_cpu_target(1))


@pytest.fixture(scope="module")
def cnn(target: Any) -> dict[int, dict[str, list[Any]]]:
    """small-cnn's workloads at image sizes 16 and 8, by size and fused-op sequence, fewest FLOPs first
    (``conv2d_add_relu``: the model's first conv2d, then its second)."""
    from tunefleet.models.zoo import build_zoo_model
    from tunefleet.tvm.extract import extract_workloads

    out: dict[int, dict[str, list[Any]]] = {}
    for size in (16, 8):
        for w in sorted(extract_workloads(build_zoo_model("small-cnn", image_size=size).mod, target),
                        key=lambda w: w.flops):
            out.setdefault(size, {}).setdefault(task_name_key(w.name), []).append(w)
    return out


def _sampled(mod: Any, target: Any, seed: int = 7) -> str:
    """A schedule of ``mod`` as MetaSchedule's search makes one: a design space with its sampled
    decisions, postprocessed; its trace JSON."""
    ctx = ms.TuneContext(mod, target=target, space_generator="post-order-apply", task_name="t", rand_state=seed,
                         num_threads=1)
    space = ctx.generate_design_space()[0]
    sch = tvm.s_tir.Schedule(mod, seed=seed)
    space.trace.apply_to_schedule(sch, remove_postproc=True)
    sch.enter_postproc()
    assert all(p.apply(sch) for p in ctx.space_generator.postprocs)
    return trace_json_of(sch)


def _run(mod: Any, trace_json: str | None, target: Any) -> np.ndarray:
    """Build ``mod`` scheduled by the trace and run it on fixed inputs; its output. (Its own
    arguments: a weight-packing schedule packs them inside, so the outputs compare.)"""
    sch = candidate(mod, trace_json).sch
    lib = tvm.compile(sch.mod, target=target)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(rng.standard_normal([int(d) for d in a.shape]).astype(str(a.dtype)))
            for a in ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=False)]
    lib["main"](*args)
    return args[-1].numpy()


def _tiles(trace_json: str) -> list[list[int]]:
    insts, decisions = json.loads(trace_json)
    tiled = {i for i, inst in enumerate(insts) if inst[0] == "SamplePerfectTile"}
    return [list(d) for i, d in decisions if i in tiled]


@pytest.mark.parametrize(("donor", "new"), [
    ((16, "conv2d_add_relu", 0), (8, "conv2d_add_relu", 0)),  # the same conv, a smaller image
    ((8, "conv2d_add_relu", 0), (16, "conv2d_add_relu", 0)),  # ... a larger one
    ((16, "conv2d_add_relu", 0), (16, "conv2d_add_relu", 1)),  # the model's other conv (more channels)
    ((16, "matmul_add", 0), (8, "matmul_add", 0)),
])
def test_a_schedule_is_fitted_to_another_shape_and_computes_the_same(
        cnn: dict[int, dict[str, list[Any]]], target: Any, donor: tuple[int, str, int], new: tuple[int, str, int]) -> None:
    a, b = cnn[donor[0]][donor[1]][donor[2]], cnn[new[0]][new[1]][new[2]]
    donor_json = _sampled(a.mod, target)
    got = adapt_trace(b.mod, donor_json, target, donor_mod=a.mod)
    assert got.outcome == ADAPTED and got.refitted > 0 and got.trace_json is not None, got.reason
    assert got == adapt_trace(b.mod, donor_json, target, donor_mod=a.mod), "deterministic"
    # every tile now multiplies to a loop extent of the new module; the donor's did not all
    assert _tiles(got.trace_json) != _tiles(donor_json)
    np.testing.assert_allclose(_run(b.mod, got.trace_json, target), _run(b.mod, None, target), rtol=1e-4, atol=1e-4)


def test_a_schedule_that_fits_is_kept_as_is(cnn: dict[int, dict[str, list[Any]]], target: Any) -> None:
    wl = cnn[16]["conv2d_add_relu"][0]
    donor_json = _sampled(wl.mod, target)
    assert adapt_trace(wl.mod, donor_json, target) == adapt_trace(wl.mod, donor_json, target, donor_mod=wl.mod)
    got = adapt_trace(wl.mod, donor_json, target)
    assert (got.outcome, got.trace_json, got.refitted) == (AS_IS, donor_json, 0)


def test_what_cannot_be_made_valid_is_skipped_with_a_reason(cnn: dict[int, dict[str, list[Any]]],
                                                            target: Any) -> None:
    conv, dense = cnn[16]["conv2d_add_relu"][0], cnn[16]["matmul_add"][0]
    other_op = adapt_trace(dense.mod, _sampled(conv.mod, target), target, donor_mod=conv.mod)
    assert other_op.outcome == SKIPPED and other_op.trace_json is None and other_op.reason
    default = adapt_trace(conv.mod, DEFAULT_TRACE_JSON, target)
    assert default.outcome == SKIPPED and "default" in default.reason
