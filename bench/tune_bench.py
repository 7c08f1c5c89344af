"""Tuning benchmark: stock MetaSchedule vs tunefleet's engine, same model, budget, seeds, machine.

Usage::

    python bench/tune_bench.py --model resnet18 --trials 8
    python bench/tune_bench.py --model mlp --trials 16        # a quick smoke run

Arm (a) is ``ms.tune_tasks`` with the stock LocalBuilder, LocalRunner and JSONDatabase over all
tasks of the model (round-robin scheduler); arm (b) is tunefleet: ingest, extract, plan, drain
(PersistentBuilder, FleetDatabase, one shard per workload). Both use the evolutionary search
with the same trials per workload and trials per batch. Wall time is split into search
(MetaSchedule's profiler scopes ``EvoSearch/*``), build (time inside the builder) and the rest
(measuring + overhead). The final latency is the median of 3 builds x runs; PyTorch eager runs
with the same thread count. Prints what it measured; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _timed_builder(inner: Any) -> Any:
    from tvm.ir.utils import derived_object
    from tvm.s_tir.meta_schedule.builder import PyBuilder

    @derived_object
    class TimedBuilder(PyBuilder):
        def __init__(self) -> None:
            super().__init__()
            self.seconds = 0.0
            self.inner = inner
            self.pop_build_time = getattr(inner, "pop_build_time", None)

        def build(self, build_inputs: list[Any]) -> list[Any]:
            t = time.perf_counter()
            out = inner.build(build_inputs)
            self.seconds += time.perf_counter() - t
            return out

    return TimedBuilder()


def _search_seconds(profiler: Any) -> float:
    return float(sum(float(v) for k, v in profiler.get().items()
                     if k.startswith("EvoSearch/") and "/" not in k[len("EvoSearch/"):]))


def _latency_ms(db_factory: Any, loaded: Any, target: Any, threads: int) -> float:
    """Median of 3 (build with the database, then time the VM)."""
    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    from tunefleet.tvm.extract import prepare_for_build

    results = []
    inputs = [tvm.runtime.tensor(x, tvm.cpu()) for x in loaded.random_inputs(seed=0)]
    for _ in range(3):
        with target:
            ex = ms.relax_integration.compile_relax(db_factory(), prepare_for_build(loaded.mod, target, loaded.params),
                                                    target, params=None)
        vm = relax.VirtualMachine(ex, tvm.cpu())
        timer = vm.time_evaluator("main", tvm.cpu(), number=3, repeat=5, min_repeat_ms=200)
        results.append(float(statistics.median(timer(*inputs).results)) * 1e3)
    return statistics.median(results)


def stock_arm(loaded: Any, target: Any, trials: int, per_iter: int, seed: int, threads: int) -> dict[str, float]:
    from tvm.s_tir import meta_schedule as ms

    from tunefleet.tvm.extract import extract_workloads

    found = extract_workloads(loaded.mod, target, params=loaded.params)
    with tempfile.TemporaryDirectory() as work:
        start = time.perf_counter()
        # The stock default timeout (30 s) fails every build here: each fresh worker spends 40-80 s
        # importing tensor intrinsics (see tunefleet/tvm/builder.py). 600 s lets the stock arm finish.
        builder = _timed_builder(ms.builder.LocalBuilder(timeout_sec=600))
        ctxs, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
            [w.task for w in found], work, space="post-order-apply", strategy="evolutionary",
            num_threads=threads, seed=seed)
        database = ms.database.JSONDatabase(work_dir=work)
        with ms.Profiler() as prof:
            ms.tune_tasks(tasks=ctxs, task_weights=weights, work_dir=work,
                          max_trials_global=trials * len(found), max_trials_per_task=trials,
                          num_trials_per_iter=per_iter, builder=builder, runner=ms.runner.LocalRunner(),
                          database=database, cost_model="xgb", task_scheduler="round-robin")
        wall = time.perf_counter() - start
        n = sum(1 for _ in database.get_all_tuning_records())
        latency = _latency_ms(lambda: ms.database.JSONDatabase(work_dir=work), loaded, target, threads)
    search = _search_seconds(prof)
    return {"wall_s": wall, "search_s": search, "build_s": builder.seconds, "other_s": wall - search - builder.seconds,
            "trials": n, "latency_ms": latency, "tasks": len(found)}


def tunefleet_arm(model: str, loaded: Any, target: Any, trials: int, per_iter: int, seed: int,
                  threads: int) -> dict[str, float]:
    from tvm.s_tir import meta_schedule as ms

    from tunefleet.planning import shard_queue
    from tunefleet.config import load_settings
    from tunefleet.db import Database
    from tunefleet.hardware import seed_hardware_classes
    from tunefleet.models.ingest import ingest
    from tunefleet.engine.options import TuneOptions
    from tunefleet.engine.worker import Tuner, drain
    from tunefleet.models.workloads import extract
    from tunefleet.store import open_store
    from tunefleet.tvm.bridge import FleetDatabase
    from tunefleet.tvm.builder import PersistentBuilder

    with tempfile.TemporaryDirectory() as home:
        settings = load_settings(home=Path(home))
        db = Database.from_settings(settings)
        seed_hardware_classes(db, settings)
        store = open_store(settings)
        start = time.perf_counter()
        m = ingest(db, store, model).model
        extract(db, store, m, "x86")
        shard_queue.plan(db, "x86", target_trials=trials, model=m.id)
        builder = _timed_builder(PersistentBuilder(max_workers=threads))
        with ms.Profiler() as prof:
            summary = drain(db, "x86", tuner=Tuner(db, "x86", TuneOptions(seed=seed, trials_per_iter=per_iter), builder=builder))
        builder.inner.shutdown()
        wall = time.perf_counter() - start
        build_s = builder.seconds
        latency = _latency_ms(lambda: FleetDatabase(db, "x86"), loaded, target, threads)
        search = _search_seconds(prof)
        return {"wall_s": wall, "search_s": search, "build_s": build_s, "other_s": wall - search - build_s,
                "trials": summary.measured, "latency_ms": latency, "tasks": summary.shards_done}


def torch_eager_ms(loaded: Any, threads: int) -> float | None:
    from tunefleet.delivery import alternatives

    if loaded.torch_module is None:
        return None
    return alternatives.median_ms(alternatives.torch_eager_call(loaded.torch_module, loaded.random_inputs(seed=0),
                                                                threads))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--trials", type=int, default=8, help="trials per workload, both arms")
    ap.add_argument("--per-iter", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--arms", default="stock,tunefleet")
    args = ap.parse_args()

    from tunefleet.hardware import builtin_classes
    from tunefleet.config import load_settings
    from tunefleet.models.zoo import build_zoo_model
    from tunefleet.tvm.targets import make_target

    spec = builtin_classes(load_settings())["x86"]["target"]
    target = make_target(spec)
    from tunefleet.tvm.threads import class_threads
    threads = class_threads(spec)
    loaded = build_zoo_model(args.model).loaded
    results: dict[str, dict[str, float]] = {}
    for arm in args.arms.split(","):
        print(f"== {arm}: {args.model}, {args.trials} trials per workload, {args.per_iter} per batch", flush=True)
        if arm == "stock":
            results[arm] = stock_arm(loaded, target, args.trials, args.per_iter, args.seed, threads)
        else:
            results[arm] = tunefleet_arm(args.model, loaded, target, args.trials, args.per_iter, args.seed, threads)
        print(results[arm], flush=True)
    eager = torch_eager_ms(loaded, threads)
    print()
    print(f"{'arm':<10} {'tasks':>5} {'trials':>6} {'wall s':>8} {'search s':>9} {'build s':>8} {'other s':>8} "
          f"{'s/trial':>8} {'latency ms':>11} {'vs eager':>9}")
    for arm, r in results.items():
        ratio = f"{r['latency_ms'] / eager:.2f}x" if eager else "-"
        print(f"{arm:<10} {r['tasks']:>5.0f} {r['trials']:>6.0f} {r['wall_s']:>8.1f} {r['search_s']:>9.1f} "
              f"{r['build_s']:>8.1f} {r['other_s']:>8.1f} {r['wall_s'] / max(1, r['trials']):>8.2f} "
              f"{r['latency_ms']:>11.3f} {ratio:>9}")
    if eager:
        print(f"PyTorch eager ({threads} threads): {eager:.3f} ms")
    if "stock" in results and "tunefleet" in results:
        s, t = results["stock"], results["tunefleet"]
        print(f"tunefleet/stock wall time: {t['wall_s'] / s['wall_s']:.2f}; latency: {t['latency_ms'] / s['latency_ms']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
