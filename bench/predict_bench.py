"""Warm-start scoring cost: FleetCostModel.predict with one feature extraction vs two.

Usage::

    python bench/predict_bench.py                      # small-cnn's heaviest workload, 512 candidates
    python bench/predict_bench.py --model mlp --candidates 256 --repeats 5

The evolutionary search scores thousands of candidates a round; a warm-started shard scores them
with the fleet's trained model blended with the online XGBModel once that is past its warm-up.
Both read MetaSchedule's ``PerStoreFeature`` features. This times, on the same candidates in the
same process, alternately:

* ``two`` — the fleet model's score plus ``XGBModel.predict`` (which extracts the features again),
  as FleetCostModel did before;
* ``one`` — ``FleetCostModel.predict`` now (the online model scores the matrices already extracted);

and checks the two give the same scores. The fleet and online models are trained on random labels
(the cost of scoring does not depend on what the model learned). Prints what it measured.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small-cnn")
    ap.add_argument("--candidates", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    import numpy as np
    from tvm.s_tir import meta_schedule as ms

    from tunefleet.config import load_settings
    from tunefleet.hardware import builtin_classes
    from tunefleet.models.zoo import build_zoo_model
    from tunefleet.testing.models import arbitrary_trained_model
    from tunefleet.tvm.builder import import_tensor_intrinsics
    from tunefleet.tvm.extract import extract_workloads
    from tunefleet.engine.learned import FleetCostModel, _normalised
    from tunefleet.tvm.targets import make_target
    from tunefleet.engine.shard import new_online_model

    with tempfile.TemporaryDirectory() as home:
        spec = builtin_classes(load_settings(home=Path(home)))["x86"]["target"]
    target = make_target(spec)
    import_tensor_intrinsics()
    loaded = build_zoo_model(args.model).loaded
    found = extract_workloads(loaded.mod, target, params=loaded.params)
    task = max(found, key=lambda w: w.flops).task
    ctx = ms.TuneContext(task.mod, target=target, space_generator="post-order-apply", search_strategy="replay-trace",
                         task_name=task.task_name, rand_state=0, num_threads=2)
    ctx.pre_tuning(max_trials=args.candidates, num_trials_per_iter=args.candidates,
                   design_spaces=ctx.generate_design_space(), database=ms.database.MemoryDatabase(), cost_model=None)
    cands = list(ctx.generate_measure_candidates())
    ctx.post_tuning()

    fleet_model = arbitrary_trained_model(0, rows=256, rounds=50)
    online = new_online_model(2)
    if len(cands) < online.num_warmup_samples:
        raise SystemExit(f"predict_bench: not supported: {len(cands)} candidates, fewer than the online model's "
                         f"warm-up ({online.num_warmup_samples}); it would never blend (raise --candidates)")
    rng = np.random.default_rng(0)
    warm = cands[: online.num_warmup_samples]
    online.update(ctx, warm, [ms.runner.RunnerResult([float(s)], None) for s in rng.uniform(1e-5, 1e-3, len(warm))])
    fleet = FleetCostModel(fleet_model, online=online)

    def two() -> np.ndarray:
        return 0.5 * _normalised(fleet.prior(ctx, cands)) + 0.5 * _normalised(online.predict(ctx, cands))

    times: dict[str, list[float]] = {"two": [], "one": []}
    scores = {}
    for _ in range(args.repeats):
        for name, fn in (("two", two), ("one", lambda: fleet.predict(ctx, cands))):
            t0 = time.perf_counter()
            scores[name] = fn()
            times[name].append(time.perf_counter() - t0)
    same = bool(np.allclose(scores["one"], scores["two"]))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"{args.model}: {task.task_name}, {len(cands)} candidates, median of {args.repeats}, same scores: {same}")
    for name in ("two", "one"):
        print(f"  {name} extraction(s): {med[name] * 1e3:8.1f} ms  ({med[name] / len(cands) * 1e3:.3f} ms/candidate)")
    print(f"  one/two: {med['one'] / med['two']:.2f}x")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
