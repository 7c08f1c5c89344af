"""Search cost per round vs the evolutionary search's population, on one real conv2d workload.

Usage::

    python bench/search_population_bench.py                       # resnet18's heaviest conv2d, 32 trials
    python bench/search_population_bench.py --trials 64 --batch 16 --populations 512:4 128:4 64:2

For each population (``SIZE:GENERATIONS``) one fresh search tunes the same workload (the
resnet18 conv2d with the largest weight x FLOPs, extracted under the CPU recipe: NHWC, weights
prepacked) with the same seed, trials, batch size, persistent builder and runner, and the bench
prints the wall time, seconds per measured candidate and the best mean run time found. MetaSchedule's
default is 512 schedules and 4 generations per round whatever the round's size; tunefleet's
``search_population`` default scales it with the round (``TuneOptions.population``). Prints what
it measured; asserts nothing. Run it on a quiet machine: every arm competes for the same cores.
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--populations", nargs="+", default=["512:4", "128:4", "64:2"],
                        help="arms SIZE:GENERATIONS[:INIT_MEASURED_RATIO] (the share of the initial population "
                        "taken from the best measured schedules; MetaSchedule's default 0.2)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    from tvm.s_tir import meta_schedule as ms

    from tunefleet.models.zoo import build_zoo_model
    from tunefleet.tvm.builder import PersistentBuilder, import_tensor_intrinsics
    from tunefleet.tvm.extract import extract_workloads
    from tunefleet.tvm.runner import make_runner
    from tunefleet.tvm.targets import host_cpu_target, make_target

    import_tensor_intrinsics()
    spec = host_cpu_target()
    target = make_target(spec)
    zm = build_zoo_model(args.model)
    convs = [w for w in extract_workloads(zm.mod, target, params=zm.loaded.params) if w.op_kind == "conv2d"]
    wl = max(convs, key=lambda w: w.weight * w.flops)
    print(f"workload {wl.name} ({wl.flops:.3g} FLOPs, called {wl.weight}x) on {spec}; {args.trials} trials, "
          f"batches of {args.batch}, seed {args.seed}")
    print(f"{'population':>10} {'generations':>11} {'measured':>8} {'wall s':>8} {'s/candidate':>12} {'best ms':>9}")
    with PersistentBuilder(max_workers=int(spec.get("num-cores", 2))) as builder:
        runner = make_runner(target)
        for arm in args.populations:
            size_s, generations_s, *ratio_s = arm.split(":")
            size, generations = int(size_s), int(generations_s)
            ratio = float(ratio_s[0]) if ratio_s else 0.2  # MetaSchedule's init_measured_ratio
            database = ms.database.MemoryDatabase()
            search = ms.search_strategy.EvolutionarySearch(population_size=size, genetic_num_iters=generations,
                                                           init_measured_ratio=ratio,
                                                           init_min_unmeasured=min(50, size))
            ctx = ms.TuneContext(mod=wl.mod, target=target, space_generator="post-order-apply", search_strategy=search,
                                 task_name=wl.name, num_threads=int(spec.get("num-cores", 2)), rand_state=args.seed)
            t0 = time.perf_counter()
            ms.tune_tasks(tasks=[ctx], task_weights=[1.0], work_dir="/tmp/tunefleet-population-bench",
                          max_trials_global=args.trials, num_trials_per_iter=args.batch, builder=builder,
                          runner=runner, database=database, task_scheduler="round-robin")
            wall = time.perf_counter() - t0
            runs = [sum(float(x) for x in r.run_secs) / len(r.run_secs)
                    for r in database.get_all_tuning_records() if r.run_secs]
            print(f"{size:>10} {generations:>11} {ratio:>8.2f} {wall:>8.1f} {wall / args.trials:>12.2f} "
                  f"{min(runs) * 1e3 if runs else float('nan'):>9.3f}", flush=True)


if __name__ == "__main__":
    main()
