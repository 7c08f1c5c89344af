"""bench/random_programs.py: distinct random programs of a workload, measured, and the spread it prints."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # bench/ is scripts, not a package

import random_programs  # noqa: E402

from tests.tvm.conftest import matmul_mod  # noqa: E402


def test_random_programs_are_distinct_and_measured() -> None:
    import tvm_ffi

    from tunefleet.tvm.builder import PersistentBuilder, import_tensor_intrinsics
    from tunefleet.tvm.runner import make_runner, stop_runner
    from tunefleet.tvm.targets import host_cpu_target, make_target

    cpu_target = make_target(host_cpu_target(2))
    import_tensor_intrinsics()
    _, cands = random_programs.sample_programs(matmul_mod(32), cpu_target, 6, seed=0, threads=2)
    assert len(cands) == 6
    assert len({tvm_ffi.structural_hash(c.sch.mod) for c in cands}) == 6
    runner = make_runner(cpu_target, timeout_s=10)
    try:
        with PersistentBuilder(max_workers=2) as builder:
            times = random_programs.measure(cands, cpu_target, builder, runner)
    finally:
        stop_runner(runner)
    assert len(times) == 6 and all(t is not None and 0 < t < 1 for t in times)


def test_spread_is_the_median_of_each_workloads_slowest_over_its_fastest() -> None:
    assert random_programs.spread({"a": [1.0, 4.0], "b": [2.0, 4.0, 3.0], "c": [5.0]}) == pytest.approx(3.0)
    assert random_programs.spread({"c": [5.0]}) is None


def test_draw_is_a_seeded_sorted_subset() -> None:
    workloads = [f"w{i}" for i in range(10)]
    drawn = random_programs.draw(workloads, 4, seed=0)
    assert drawn == sorted(drawn) and len(set(drawn)) == 4 and set(drawn) <= set(workloads)
    assert random_programs.draw(workloads, 4, seed=0) == drawn
    assert random_programs.draw(workloads, 40, seed=0) == workloads


def test_a_model_trains_on_and_scores_the_sampled_table() -> None:
    import argparse
    import types

    import tvm

    from tunefleet.learning import costmodel as cm
    from tunefleet.tvm.builder import import_tensor_intrinsics
    from tunefleet.tvm.targets import host_cpu_target, target_fingerprint

    import_tensor_intrinsics()
    mods = {"a": matmul_mod(32), "b": matmul_mod(48)}
    db = types.SimpleNamespace(workload=lambda h: types.SimpleNamespace(name=f"mm-{h}",
                                                                       tir_json=tvm.ir.save_json(mods[h])))
    args = argparse.Namespace(programs=5, seed=0, timeout_s=10.0)
    target = target_fingerprint(host_cpu_target(2))
    sampler = random_programs.Sampler(db, {"a": target, "b": target}, args, threads=2)
    try:
        table, times = sampler.table(["a", "b"])
    finally:
        sampler.close()
    assert table.num_rows == 10 and sampler.measured == 10 and sorted(times) == ["a", "b"]
    assert max(table["label"].to_pylist()) == 1.0  # each workload's best over itself
    model = cm.train(table, objective="rank:pairwise", num_boost_round=5)
    assert cm.evaluate(model, table)["n_pairs"] > 0
