"""How well does the cost model rank random programs of workloads it never saw (TenSet's protocol)?

Usage::

    python bench/random_programs.py bench/data/campaign-amd-epyc-family-25-model-17*.parquet
    python bench/random_programs.py SOURCES --workloads 60 --programs 32 --json random.json
    python bench/random_programs.py SOURCES --workloads 40 --programs 16 --train-random 69   # TenSet's both sides

TenSet's pairwise accuracy of 0.846 (the anchor of "A cost model that knows before it measures")
scores programs sampled at random from each task's search space: its ``scripts/dump_programs.py``
draws Ansor's initial population and evolves it with Ansor's default, random cost model, 3,000
distinct programs per task, whose run times spread over orders of magnitude. ``bench/pretrain.py``
scores the campaign's own measurements instead: candidates that an evolutionary search guided by
a cost model chose, most of them near their workload's best. This bench scores one trained model
on both, for the same held-out workloads:

1. the sources (hub bundles holding a campaign's measurements, as for ``bench/pretrain.py``) go
   into a fresh home and a dataset; the workloads with a tensor dimension in ``--holdout-dims``
   are held out (``bench/pretrain.py``'s shape-family split) and the shipped configuration
   (``rank:pairwise``, 60 rounds) is trained on the rest;
2. ``--workloads`` of the held-out workloads are drawn (seeded; all of them if fewer); for each,
   ``--programs`` distinct random programs: MetaSchedule's ``ReplayTrace`` (the design space's
   traces with every decision drawn anew, the CPU post-processors applied), built by tunefleet's
   builder and measured by its runner with the tuner's evaluator, for the campaign class's target
   (the machine must run that code: a campaign of this CPU is the meaningful source);
3. prints the model's pairwise accuracy (every pair of one workload's programs with different run
   times; pooled, and averaged per workload with its rows as weights, as TenSet averages it),
   peak@1 and peak@5 next to a random ranking's, on the random programs and on the campaign's own
   held-out rows of the same workloads, and how far apart each set's run times lie (a workload's
   slowest over its fastest, the median over workloads).

``--train-random N`` also measures random programs of N training workloads (drawn the same way)
and trains a second model, the same configuration, on them alone: TenSet's protocol on both
sides, scored beside the campaign-trained model on both test sets.

A program that fails to build or run (a random program can exceed the runner's timeout) counts
as an error row: left out of the pairs, as the dataset leaves run errors out. Prints what it
measured; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pretrain import DEFAULT_HOLDOUT_DIMS, METRICS, bundles_exist, load_table, row  # noqa: E402

CONFIG = ("rank:pairwise", 60, {})
"""The shipped configuration (``bench/pretrain.py``'s choice): objective, rounds, parameters."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sources", nargs="+", type=Path, help="hub bundles holding a campaign's measurements")
    p.add_argument("--holdout-dims", default=",".join(map(str, DEFAULT_HOLDOUT_DIMS)),
                   help="held-out shape families (default %(default)s, as bench/pretrain.py)")
    p.add_argument("--workloads", type=int, default=60, help="held-out workloads to sample programs of "
                   "(default %(default)s)")
    p.add_argument("--programs", type=int, default=32, help="random programs per workload (default %(default)s)")
    p.add_argument("--train-random", type=int, default=0, metavar="N", help="also measure random programs of N "
                   "training workloads and train a second model on them, TenSet's protocol on both sides (default 0)")
    p.add_argument("--timeout-s", type=float, default=10.0, help="one measurement's limit (default %(default)s s)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", type=Path, help="the scratch tunefleet home (default a temporary folder)")
    p.add_argument("--json", type=Path, help="also write the report as JSON here")
    return p.parse_args(argv)


def sample_programs(mod: Any, target: Any, n: int, seed: int, threads: int) -> tuple[Any, list[Any]]:
    """(the TuneContext, up to ``n`` distinct random programs of ``mod``): ReplayTrace's draws,
    repeated until ``n`` distinct modules or five draws that add none."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    ctx = ms.TuneContext(mod, target=target, space_generator="post-order-apply", search_strategy="replay-trace",
                         task_name="random", rand_state=seed, num_threads=threads)
    spaces = ctx.generate_design_space()
    seen: set[int] = set()
    out: list[Any] = []
    stale = 0
    while len(out) < n and stale < 5:
        ctx.search_strategy.pre_tuning(max_trials=n, num_trials_per_iter=n, design_spaces=spaces,
                                       database=ms.database.MemoryDatabase(), cost_model=None)
        before = len(out)
        for cand in ctx.search_strategy.generate_measure_candidates() or []:
            key = tvm_ffi.structural_hash(cand.sch.mod)
            if key not in seen and len(out) < n:
                seen.add(key)
                out.append(cand)
        ctx.search_strategy.post_tuning()
        stale = stale + 1 if len(out) == before else 0
    return ctx, out


def measure(cands: list[Any], target: Any, builder: Any, runner: Any) -> list[float | None]:
    """Each program's mean run time (seconds), or None where it failed to build or run."""
    from tvm.s_tir import meta_schedule as ms

    built = builder.build([ms.builder.BuilderInput(c.sch.mod, target) for c in cands])
    ok = [i for i, b in enumerate(built) if not b.error_msg]
    out: list[float | None] = [None] * len(cands)
    futures = runner.run([ms.runner.RunnerInput(built[i].artifact_path, "cpu", cands[i].args_info) for i in ok])
    for i, f in zip(ok, futures):
        res = f.result()
        if res.error_msg is None and res.run_secs:
            out[i] = statistics.fmean(float(x) for x in res.run_secs)
    return out


def draw(workloads: list[str], n: int, seed: int) -> list[str]:
    """``n`` of ``workloads`` (all of them if fewer), drawn with ``seed``, sorted."""
    out = list(workloads)
    random.Random(seed).shuffle(out)
    return sorted(out[:n])


class Sampler:
    """Random programs of workloads, measured, as a table that :mod:`tunefleet.learning.costmodel`
    scores and trains on (features, label = the workload's best time / this time, error_kind)."""

    def __init__(self, db: Any, target_of: dict[str, str], args: argparse.Namespace, threads: int) -> None:
        from tvm.s_tir import meta_schedule as ms

        from tunefleet.tvm.builder import PersistentBuilder

        self.db, self.target_of, self.args, self.threads = db, target_of, args, threads
        self.extractor = ms.feature_extractor.PerStoreFeature()
        self.builder = PersistentBuilder(max_workers=threads)
        self.runners: dict[str, Any] = {}
        self.measured = self.errors = 0

    def table(self, workloads: list[str]) -> tuple[Any, dict[str, list[float]]]:
        """(the table of their programs, each workload's successful run times)."""
        import numpy as np
        import pyarrow as pa
        import tvm

        from tunefleet.learning.dataset import features_array
        from tunefleet.tvm.runner import make_runner
        from tunefleet.tvm.targets import make_target

        rows: dict[str, list[Any]] = {"workload_hash": [], "hardware": [], "label": [], "error_kind": [], "features": []}
        times_of: dict[str, list[float]] = {}
        for k, wl_hash in enumerate(workloads, 1):
            target = make_target(self.target_of[wl_hash])
            runner = self.runners.get(self.target_of[wl_hash])
            if runner is None:
                runner = self.runners[self.target_of[wl_hash]] = make_runner(target, timeout_s=self.args.timeout_s)
            wl = self.db.workload(wl_hash)
            t0 = time.perf_counter()
            tctx, cands = sample_programs(tvm.ir.load_json(wl.tir_json), target, self.args.programs,
                                          self.args.seed + k, self.threads)
            times = measure(cands, target, self.builder, runner)
            mats = [np.asarray(t.numpy(), dtype=np.float32) for t in self.extractor.extract_from(tctx, cands)]
            good = [t for t in times if t is not None]
            best = min(good) if good else None
            times_of[wl_hash] = good
            for t, m in zip(times, mats, strict=True):
                rows["workload_hash"].append(wl_hash)
                rows["hardware"].append("random")
                rows["label"].append(best / t if t is not None and best else 0.0)
                rows["error_kind"].append(None if t is not None else "run")
                rows["features"].append(m)
            self.measured += len(good)
            self.errors += len(times) - len(good)
            print(f"  [{k}/{len(workloads)}] {wl.name}: {len(cands)} programs, {len(good)} measured"
                  + (f", {min(good) * 1e3:.3f}-{max(good) * 1e3:.3f} ms" if good else "")
                  + f" ({time.perf_counter() - t0:.0f} s)", flush=True)
        table = pa.table({"workload_hash": pa.array(rows["workload_hash"], pa.string()),
                          "hardware": pa.array(rows["hardware"], pa.string()),
                          "label": pa.array(rows["label"], pa.float64()),
                          "error_kind": pa.array(rows["error_kind"], pa.string()),
                          "features": features_array(rows["features"])})
        return table, times_of

    def close(self) -> None:
        from tunefleet.tvm.runner import stop_runner

        self.builder.shutdown()
        for runner in self.runners.values():
            stop_runner(runner)


def spread(times: dict[str, list[float]]) -> float | None:
    """The median over workloads of the slowest successful time over the fastest."""
    ratios = [max(t) / min(t) for t in times.values() if len(t) >= 2 and min(t) > 0]
    return statistics.median(ratios) if ratios else None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not bundles_exist("random_programs", args.sources):
        return 2
    import pyarrow as pa

    from tunefleet import api
    from tunefleet.config import Settings
    from tunefleet.hardware import cpu_label, host_cpu
    from tunefleet.learning import costmodel as cm
    from tunefleet.tvm.builder import import_tensor_intrinsics
    from tunefleet.tvm.threads import class_threads, use_threads

    dims = {int(d) for d in args.holdout_dims.split(",") if d.strip()}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tunefleet-random-programs-") as tmp:
        work = args.work_dir or Path(tmp)
        table, sources = load_table(args.sources, work)
        ctx = api.connect(Settings(home=work, hub="off"))
        classes = ctx.db.hub_classes()
        heldout = cm.shape_holdout(table, dims)
        train_t, test_t = cm.split_by_workload(table, heldout=heldout)
        objective, rounds, params = CONFIG
        t0 = time.perf_counter()
        model = cm.train(train_t, objective=objective, num_boost_round=rounds, params=params)
        print(f"trained {objective}, {rounds} rounds on {train_t.num_rows} rows of "
              f"{len(set(train_t['workload_hash'].to_pylist()))} workloads ({time.perf_counter() - t0:.0f} s); "
              f"{len(heldout)} workloads held out (a dimension in {sorted(dims)})", flush=True)

        # each workload's target: its first row's (the campaign class's, as measured there)
        target_of: dict[str, str] = {}
        for wl, tgt in zip(table["workload_hash"].to_pylist(), table["target"].to_pylist()):
            if tgt:
                target_of.setdefault(wl, tgt)
        chosen = draw(sorted(w for w in target_of if w in heldout), args.workloads, args.seed)
        train_chosen = draw(sorted(w for w in target_of if w not in heldout), args.train_random, args.seed)
        print(f"this CPU: {cpu_label(host_cpu())}; the campaign's: "
              f"{', '.join(sorted({cpu_label(dict(hw.capabilities or {}).get('cpu') or {}) for hw in classes}))}; "
              f"targets: {', '.join(sorted({target_of[w] for w in chosen + train_chosen}))}", flush=True)

        import_tensor_intrinsics()
        threads = use_threads(max(class_threads(json.loads(target_of[w])) for w in chosen))
        sampler = Sampler(ctx.db, target_of, args, threads)
        try:
            print(f"random programs of {len(chosen)} held-out workloads:", flush=True)
            rand_t, random_times = sampler.table(chosen)
            if train_chosen:
                print(f"random programs of {len(train_chosen)} training workloads:", flush=True)
                rand_train_t, _ = sampler.table(train_chosen)
        finally:
            sampler.close()
        models = {"the model": model}
        if train_chosen:
            models["trained on random programs"] = cm.train(rand_train_t, objective=objective, num_boost_round=rounds,
                                                            params=params)
        campaign_t = test_t.filter(pa.array([w in set(chosen) for w in test_t["workload_hash"].to_pylist()]))
        campaign_times: dict[str, list[float]] = {}
        labels = campaign_t["label"].to_pylist()
        for w, lab, err in zip(campaign_t["workload_hash"].to_pylist(), labels, campaign_t["error_kind"].to_pylist()):
            if err is None and lab:
                campaign_times.setdefault(w, []).append(1.0 / lab)  # best / time: its inverse is time / best

        report: dict[str, Any] = {"workloads": len(chosen), "programs_per_workload": args.programs,
                                  "measured": sampler.measured, "errors": sampler.errors, "dims": sorted(dims),
                                  "train_rows": train_t.num_rows, "train_random_workloads": len(train_chosen),
                                  "sources": sources}
        print(f"\n{len(chosen)} held-out workloads ({len(train_chosen)} training workloads' random programs too); "
              f"{sampler.measured} random programs measured ({sampler.errors} failed to build or run); "
              f"{campaign_t.num_rows} campaign rows of the held-out workloads; {time.perf_counter() - started:.0f} s in all")
        print(f"{'ranking':44s} {'pairwise':>8s} {'by workload':>11s} {'peak@1':>7s} {'peak@5':>7s}")
        for name, t, times in (("random programs", rand_t, random_times),
                               ("the campaign's rows", campaign_t, campaign_times)):
            report[name] = {"spread": spread(times)}
            for label, m_ in models.items():
                m = cm.evaluate(m_, t, seed=args.seed)
                print(row(f"{name}: {label}", m, width=44))
                report[name][label] = {k: m.get(k) for k in (*METRICS, "n_pairs", "n_workloads")}
            base = cm.baselines(t, seed=args.seed)["random"]
            print(row(f"{name}: random ranking", base, width=44))
            s = report[name]["spread"]
            print(f"{'':44s} run times: slowest / fastest, median over workloads: "
                  f"{'n/a' if s is None else f'{s:.1f}x'}")
            report[name]["random"] = {k: base.get(k) for k in METRICS}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
