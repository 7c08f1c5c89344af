"""PersistentBuilder: builds batches, times them, survives timeouts and crashed workers."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tvm.s_tir import meta_schedule as ms

from tunefleet.tvm.builder import BuildStat, PersistentBuilder, import_tensor_intrinsics
from tunefleet.tvm.extract import ExtractedWorkload

# -- build functions shipped to the workers by reference (must be importable top-level) -------

_MODE_ATTR = "tunefleet_test_mode"


def selective_build(mod: Any, target: Any, params: Any) -> Any:
    """``default_build``, except for modules marked to sleep, crash or raise."""
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build

    mode = mod.attrs[_MODE_ATTR] if mod.attrs is not None and _MODE_ATTR in mod.attrs else ""
    if mode == "sleep":
        time.sleep(600)
    elif mode == "crash":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif mode == "raise":
        raise ValueError("deliberate build failure")
    return default_build(mod.without_attr(_MODE_ATTR) if mode else mod, target, params)


def _marked(mod: Any, mode: str) -> Any:
    return mod.with_attr(_MODE_ATTR, mode)


def _cleanup(paths: list[str | None]) -> None:
    for path in paths:
        if path:
            shutil.rmtree(Path(path).parent, ignore_errors=True)


@pytest.fixture(scope="module")
def candidates(mlp_workloads: list[ExtractedWorkload], cpu_target: Any) -> list[Any]:
    """BuilderInputs: every design space of the MLP's workloads plus the unscheduled ones."""
    import_tensor_intrinsics()
    inputs = []
    for workload in mlp_workloads:
        ctx = ms.TuneContext(
            mod=workload.mod,
            target=cpu_target,
            space_generator="post-order-apply",
            search_strategy="replay-trace",
            task_name=workload.name,
        )
        spaces = ctx.generate_design_space()
        inputs += [ms.builder.BuilderInput(sch.mod, cpu_target) for sch in spaces]
        inputs.append(ms.builder.BuilderInput(workload.mod, cpu_target))
    return inputs


@pytest.fixture(scope="module")
def builder() -> Iterator[Any]:
    """One warm PersistentBuilder for the module (the fork server stays up for the session)."""
    with PersistentBuilder(max_workers=2, timeout_s=60) as b:
        b.warmup()
        yield b


def test_builds_a_batch_and_records_build_times(builder: Any, candidates: list[Any]) -> None:
    seen: list[BuildStat] = []
    builder.on_build = seen.append
    try:
        results = builder.build(candidates)
    finally:
        builder.on_build = None
    paths = [r.artifact_path for r in results]
    try:
        assert len(results) == len(candidates) >= 4
        assert all(r.error_msg is None for r in results), [r.error_msg for r in results]
        assert all(p and Path(p).is_file() and p.endswith(".tar") for p in paths)
        assert len(set(paths)) == len(paths)
        assert [s.index for s in seen] == list(range(len(candidates)))
        assert [s.artifact_path for s in builder.last_batch] == paths
        for stat in seen:
            assert 0 < stat.build_seconds <= stat.wall_seconds + 0.5
            assert stat.worker_pid not in (None, os.getpid())
            assert builder.build_times[stat.artifact_path] == stat.build_seconds
        assert builder.pop_build_time(paths[0]) == seen[0].build_seconds
        assert builder.pop_build_time(paths[0]) is None
        # Both workers were used and the pool was not restarted.
        assert len({s.worker_pid for s in seen}) == 2
        assert builder.stats.pool_starts == 1
    finally:
        _cleanup(paths)


def test_pool_persists_across_batches(builder: Any, candidates: list[Any]) -> None:
    first = builder.build(candidates[:2])
    pids_first = {s.worker_pid for s in builder.last_batch}
    second = builder.build(candidates[:2])
    pids_second = {s.worker_pid for s in builder.last_batch}
    _cleanup([r.artifact_path for r in first + second])
    assert pids_first | pids_second <= {p.pid for p in builder._inst._holder["pool"].processes}
    assert builder.stats.pool_starts == 1


def test_build_error_is_reported_without_restarting(
    builder: Any, mlp_workloads: list[ExtractedWorkload], cpu_target: Any
) -> None:
    b = PersistentBuilder(max_workers=1, timeout_s=60, f_build=selective_build)
    try:
        good = ms.builder.BuilderInput(mlp_workloads[0].mod, cpu_target)
        bad = ms.builder.BuilderInput(_marked(mlp_workloads[0].mod, "raise"), cpu_target)
        results = b.build([bad, good])
        _cleanup([r.artifact_path for r in results])
        assert results[0].artifact_path is None
        assert "deliberate build failure" in results[0].error_msg
        assert results[1].error_msg is None
        assert b.stats.pool_starts == 1
        assert b.stats.failed == 1 and b.stats.built == 1
    finally:
        b.shutdown()


def test_survives_a_build_timeout(
    mlp_workloads: list[ExtractedWorkload], cpu_target: Any
) -> None:
    b = PersistentBuilder(max_workers=2, timeout_s=5, f_build=selective_build)
    try:
        b.warmup()
        mod = mlp_workloads[0].mod
        batch = [
            ms.builder.BuilderInput(mod, cpu_target),
            ms.builder.BuilderInput(_marked(mod, "sleep"), cpu_target),
            ms.builder.BuilderInput(mod, cpu_target),
            ms.builder.BuilderInput(mod, cpu_target),
        ]
        start = time.monotonic()
        results = b.build(batch)
        elapsed = time.monotonic() - start
        _cleanup([r.artifact_path for r in results])
        assert results[1].artifact_path is None
        assert "Timeout" in results[1].error_msg
        assert [r.error_msg for i, r in enumerate(results) if i != 1] == [None, None, None]
        assert elapsed < 60  # never waits for the 600 s sleep
        assert b.stats.timeouts == 1
        # The killed pool is replaced (at once if work remains, else on the next batch).
        again = b.build([ms.builder.BuilderInput(mod, cpu_target)])
        _cleanup([r.artifact_path for r in again])
        assert again[0].error_msg is None
        assert b.stats.pool_starts == 2
    finally:
        b.shutdown()


def test_survives_a_crashing_worker(
    mlp_workloads: list[ExtractedWorkload], cpu_target: Any
) -> None:
    b = PersistentBuilder(max_workers=2, timeout_s=60, f_build=selective_build)
    try:
        mod = mlp_workloads[1].mod
        batch = [
            ms.builder.BuilderInput(mod, cpu_target),
            ms.builder.BuilderInput(_marked(mod, "crash"), cpu_target),
            ms.builder.BuilderInput(mod, cpu_target),
        ]
        results = b.build(batch)
        _cleanup([r.artifact_path for r in results])
        assert results[1].artifact_path is None
        assert "worker died" in results[1].error_msg
        assert results[0].error_msg is None and results[2].error_msg is None
        assert b.stats.crashes >= 1
        assert b.stats.pool_starts >= 2
    finally:
        b.shutdown()


def test_context_manager_and_restart_after_shutdown(
    mlp_workloads: list[ExtractedWorkload], cpu_target: Any
) -> None:
    with PersistentBuilder(max_workers=1, timeout_s=60) as b:
        assert b.build([]) == []
    assert b._inst._holder["pool"] is None
    # A builder that was shut down starts a new pool when used again.
    results = b.build([ms.builder.BuilderInput(mlp_workloads[0].mod, cpu_target)])
    b.shutdown()
    _cleanup([r.artifact_path for r in results])
    assert results[0].error_msg is None


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        PersistentBuilder(max_workers=0, eager=False)
    with pytest.raises(ValueError):
        PersistentBuilder(timeout_s=0, eager=False)
    with pytest.raises(ValueError):
        PersistentBuilder(start_method="fork", eager=False)  # type: ignore[arg-type]


@pytest.mark.slow
def test_tune_tasks_with_persistent_builder_produces_records(
    mlp_mod: Any,
    mlp_params: dict[str, Any],
    mlp_workloads: list[ExtractedWorkload],
    cpu_target: Any,
    tmp_path: Path,
) -> None:
    import numpy as np
    import tvm
    from tvm import relax

    from tunefleet.tvm.compile import build_with_database
    from tunefleet.tvm.extract import workload_hash
    from tunefleet.tvm.runner import make_runner

    import_tensor_intrinsics()
    tasks, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
        [w.task for w in mlp_workloads], work_dir=str(tmp_path), seed=0
    )
    database = ms.database.MemoryDatabase()
    with PersistentBuilder(max_workers=2, timeout_s=60) as b:
        ms.tune_tasks(
            tasks=tasks,
            task_weights=weights,
            work_dir=str(tmp_path),
            max_trials_global=8,
            num_trials_per_iter=4,
            builder=b,
            runner=make_runner(cpu_target, timeout_s=30),
            database=database,
        )
        assert b.stats.built >= 8
        assert b.stats.build_seconds > 0
    records = database.get_all_tuning_records()
    assert len(records) >= 8
    measured = [r for r in records if r.run_secs and len(r.run_secs) == 5]
    assert measured, "no record carries the runner's 5 repeats"
    # Records are keyed by exactly the hash extract_workloads reports.
    assert {workload_hash(r.workload.mod) for r in records} <= {
        w.structural_hash for w in mlp_workloads
    }
    # And the build finds them: every tuned fused function gets its schedule.
    result = build_with_database(mlp_mod, cpu_target, database, params=mlp_params)
    tuned_workloads = {workload_hash(r.workload.mod) for r in records}
    assert len(result.hits) == len(tuned_workloads) >= 1
    # The tuned model computes what the untuned one does.
    executable = result.executable
    vm = relax.VirtualMachine(executable, tvm.cpu())
    x = np.random.default_rng(0).standard_normal((1, 64)).astype("float32")
    out = vm["forward"](tvm.runtime.tensor(x)).numpy()
    w1, b1 = mlp_params["fc1.weight"], mlp_params["fc1.bias"]
    w2, b2 = mlp_params["fc2.weight"], mlp_params["fc2.bias"]
    np.testing.assert_allclose(
        out, np.maximum(x @ w1.T + b1, 0) @ w2.T + b2, rtol=1e-4, atol=1e-4
    )


def test_spawn_start_method_builds(
    mlp_workloads: list[ExtractedWorkload], cpu_target: Any
) -> None:
    # Each spawned worker imports TVM itself (no fork server): slower to start, same results.
    with PersistentBuilder(max_workers=1, timeout_s=60, start_method="spawn") as b:
        results = b.build([ms.builder.BuilderInput(mlp_workloads[0].mod, cpu_target)])
        _cleanup([r.artifact_path for r in results])
        assert results[0].error_msg is None
        assert b.stats.startup_seconds and b.stats.startup_seconds[0] > 0


def test_every_worker_starts_before_the_first_build() -> None:
    """Warm-up returns only once every worker has run the initializer (the old executor started
    workers lazily, and a descheduled parent once left a pool one worker short until its start-up
    timeout: three tests hung 600 s each); each worker's start-up is recorded."""
    with PersistentBuilder(max_workers=2, startup_timeout_s=40) as builder:
        builder.warmup()
        pool = builder._holder["pool"]
        assert pool is not None and pool.ready.value == 2
        assert len(pool.worker_init_seconds) == 2  # two distinct workers reported


def test_a_build_the_pool_never_answers_gets_an_error(
    mlp_workloads: list[ExtractedWorkload], cpu_target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backstop: a build whose future pebble never resolves (a worker killed from outside at
    the wrong moment) gets an error after its deadline instead of hanging the shard."""
    from concurrent.futures import Future

    import tunefleet.tvm.builder as builder_module

    monkeypatch.setattr(builder_module, "_BACKSTOP_SLACK_S", 0.5)
    b = PersistentBuilder(max_workers=1, timeout_s=1)
    try:
        b.warmup()
        pool = b._holder["pool"]
        monkeypatch.setattr(pool.executor, "schedule", lambda *a, **k: Future())  # never resolved
        start = time.monotonic()
        (result,) = b.build([ms.builder.BuilderInput(mlp_workloads[0].mod, cpu_target)])
        assert time.monotonic() - start < 10
        assert result.artifact_path is None and "lost by the worker pool" in result.error_msg
        monkeypatch.undo()
        (again,) = b.build([ms.builder.BuilderInput(mlp_workloads[0].mod, cpu_target)])  # a fresh pool builds
        _cleanup([again.artifact_path])
        assert again.error_msg is None
    finally:
        b.shutdown()
