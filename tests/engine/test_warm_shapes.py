"""Search that starts warm across shapes, on real TVM tuning of the tiny ``mlp`` (SQLite and
PostgreSQL): its two ``matmul_add_relu`` layers are one operator at two shapes, so the one tuned
second first measures the best schedules of the one tuned first, fitted to its shape."""

from __future__ import annotations

import pytest

from tests.conftest import on_backend
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.policies import ShapeWarmStart
from tunefleet.engine.shard import ShardRun, run_shard
from tunefleet.models.ingest import ingest
from tunefleet.models.workloads import extract
from tunefleet.planning import shard_queue
from tunefleet.planning.warm_shapes import shape_seeds
from tunefleet.vocab import task_name_key

pytestmark = pytest.mark.slow


def _shard(db, workload_id: int, trials: int):  # type: ignore[no-untyped-def]
    """A pending x86 shard of one workload, leased by worker "w"."""
    (created,) = db.add_shards(db.hardware_class("x86").id, [(workload_id, trials, 1.0)])
    return shard_queue.lease(db, "x86", "w", shard_id=created.id)


def fc1_tuned_on_avx2_only(db, store):  # type: ignore[no-untyped-def]
    """mlp extracted for x86 and x86-avx2, its fc1 tuned a little (4 trials) on x86-avx2 only: the
    classes, and mlp's workloads by FLOPs (fc3: matmul_add; fc1 and fc2: matmul_add_relu)."""
    model = ingest(db, store, "mlp").model
    for cls in ("x86", "x86-avx2"):
        extract(db, store, model, cls)
    x86, avx2 = db.hardware_class("x86"), db.hardware_class("x86-avx2")
    other, first, second = sorted((wl for wl, _ in db.workloads(model.id)), key=lambda wl: wl.flops)
    (created,) = db.add_shards(avx2.id, [(first.id, 4, 1.0)])
    shard = shard_queue.lease(db, "x86-avx2", "w", shard_id=created.id)
    assert run_shard(db, shard, "w", TuneOptions(seed=0, trials_per_iter=4)).state == "done"
    return x86, avx2, (other, first, second)


@on_backend("postgresql")
def test_a_new_workload_first_measures_the_schedules_of_its_other_shapes(engine) -> None:  # type: ignore[no-untyped-def]
    import tvm

    from tunefleet.tvm.traces import candidate, trace_sha256_of

    _, db, store = engine
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    hw = db.hardware_class("x86")
    by_flops = sorted((wl for wl, _ in db.workloads(model.id)), key=lambda wl: wl.flops)
    other, first, second = by_flops  # fc3 (matmul_add), fc1 (64 -> 128), fc2 (128 -> 128)
    assert [task_name_key(wl.name) for wl in by_flops] == ["matmul_add", "matmul_add_relu", "matmul_add_relu"]
    options = TuneOptions(seed=0, trials_per_iter=4)

    cold = run_shard(db, _shard(db, first.id, 4), "w", options)
    assert cold.state == "done" and cold.shape_seeds == 0  # nothing of its kind was measured yet

    expected = shape_seeds(db, second, hw)
    assert expected.traces and expected.tried >= len(expected.traces)
    assert expected.adapted + expected.as_is == len(expected.traces) and expected.adapted >= 1  # 64 -> 128 inputs
    assert expected.donors == [f"{first.name} {first.structural_hash[:8]}"]
    assert shape_seeds(db, second, hw).traces == expected.traces, "deterministic"
    assert shape_seeds(db, other, hw).tried == 0  # matmul_add: other fused ops

    shard = _shard(db, second.id, 4)
    warm = run_shard(db, shard, "w", options)
    assert warm.state == "done" and warm.shape_seeds == len(expected.traces)
    mod = tvm.ir.load_json(second.tir_json)
    seeded = {trace_sha256_of(candidate(mod, t).sch) for t in expected.traces}
    rows = sorted((m for m in db.measurements() if m.shard_id == shard.id), key=lambda m: m.id)
    first_round = rows[:1 + len(seeded)]  # the default and the seeds come first
    assert seeded <= {m.trace_sha256 for m in first_round}
    assert all(m.error_kind is None for m in rows if m.trace_sha256 in seeded), "the seeds build and run"

    # measured now: a later shard of it is not seeded again; the knob turns the policy off
    assert ShapeWarmStart().seeds(ShardRun(db, _shard(db, second.id, 2), "w", options)) == []
    off = ShardRun(db, _shard(db, other.id, 2), "w", options.replace(warm_start_shapes=False))
    assert not any(isinstance(p, ShapeWarmStart) for p in off.policies())


@on_backend("sqlite")
def test_a_new_workload_borrows_other_shapes_of_a_compatible_class(engine) -> None:  # type: ignore[no-untyped-def]
    """fc1 tuned on x86-avx2 only: a shard of fc2 on x86 is seeded with fc1's avx2 schedules, fitted
    to its shape (a hub bundle's classes lend the same way), unless transfer is off."""
    from tunefleet.planning.warm_shapes import shape_seeds_near

    _, db, store = engine
    x86, avx2, (other, first, second) = fc1_tuned_on_avx2_only(db, store)
    options = TuneOptions(seed=0, trials_per_iter=4)

    assert shape_seeds(db, second, x86).traces == []  # nothing of its kind measured on x86 itself
    near = shape_seeds_near(db, second, x86)
    assert near.traces and near.traces == shape_seeds(db, second, x86, source=avx2).traces
    assert near.donors == [f"{first.name} {first.structural_hash[:8]} on x86-avx2"]
    assert shape_seeds_near(db, second, x86, other_classes=False).traces == []
    assert shape_seeds_near(db, other, x86).tried == 0  # matmul_add: other fused ops, measured nowhere

    run = ShardRun(db, _shard(db, second.id, 8), "w", options)
    assert ShapeWarmStart().seeds(run) == near.traces  # at most 4 (half of the shard's 8 trials)
    assert ShapeWarmStart(other_classes=False).seeds(run) == []
    no_transfer = ShardRun(db, _shard(db, other.id, 2), "w", options.replace(transfer=False)).policies()
    assert [p.other_classes for p in no_transfer if isinstance(p, ShapeWarmStart)] == [False]
