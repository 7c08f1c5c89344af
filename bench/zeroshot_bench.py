"""Zero-shot benchmark: train on some zoo models, evaluate on held-out models' unseen workloads.

Usage::

    python bench/zeroshot_bench.py --home /tmp/zs --train resnet18,mobilenet_v2 \
        --heldout resnet50,small-cnn --trials 16 --warm-workloads 6

Steps (re-running with the same ``--home`` resumes: tuning and export are idempotent):

1. *Tune* every model (train and held-out) to ``--trials`` per workload with tunefleet's engine.
2. *Export* the measurements as a dataset (incremental) and *train* both objectives on the
   workloads of the training models; the held-out set is the workloads only the held-out models
   have (``costmodel.model_holdout``), so no held-out structural hash is seen in training.
   Metrics are printed next to an untrained model (constant scores: what MetaSchedule's XGBModel
   predicts before its warm-up) and a random ranking on the same held-out rows.
3. *Register* the better objective with ``costmodel.retrain(holdout_models=...)``; make it current.
4. *Zero-shot*: in a copy of the database with the held-out workloads' measurements removed,
   propose schedules for them with the current model and build each held-out model; with
   ``--verify 1`` (default) the top proposal of each workload is measured too, which gives a
   per-workload ratio to the fully tuned best. Latency of the zero-shot build, the fully tuned
   build (same trial budget, original database) and the untuned build are measured side by side.
5. *Warm start*: for the ``--warm-workloads`` heaviest held-out workloads, tune them again to the
   same budget twice in fresh copies — cold (MetaSchedule's own XGBModel) and warm-started with
   the current model — with the same seed, and report the trials each needed to reach the cold
   arm's final latency.

Prints what it measured; asserts nothing.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HW = "x86"


def _fmt(v: Any, digits: int = 3) -> str:
    return "-" if v is None else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))


def open_home(home: Path, *, db_file: Path | None = None, store_path: Path | None = None) -> tuple[Any, Any, Any]:
    from tunefleet.config import load_settings
    from tunefleet.db import Database
    from tunefleet.hardware import ensure_hardware_classes
    from tunefleet.store import open_store

    overrides: dict[str, Any] = {"home": home}
    if db_file is not None:
        overrides["database_url"] = f"sqlite:///{db_file}"
    if store_path is not None:
        overrides["store_path"] = store_path
    settings = load_settings(**overrides)
    db = Database.from_settings(settings)
    ensure_hardware_classes(db, settings)
    return settings, db, open_store(settings)


def tune_all(db: Any, store: Any, models: list[str], trials: int, seed: int) -> dict[str, int]:
    from tunefleet.planning import shard_queue
    from tunefleet.models.ingest import ingest
    from tunefleet.engine.options import TuneOptions
    from tunefleet.engine.worker import drain
    from tunefleet.models.workloads import extract

    ids = {}
    for name in models:
        m = ingest(db, store, name).model
        extract(db, store, m, HW)
        ids[name] = m.id
    created, _ = shard_queue.plan(db, HW, target_trials=trials)
    if created:
        t0 = time.perf_counter()
        print(f"tuning {len(created)} shards ({sum(s.trials for s in created)} trials)...", flush=True)
        summary = drain(db, HW, TuneOptions(seed=seed), store=None)  # the training data is tuned cold
        print(f"  tuned in {time.perf_counter() - t0:.0f}s: {summary.measured} measured, "
              f"{summary.shards_failed} shards failed")
    return ids


def metrics_table(table: Any, heldout: set[str], seed: int) -> tuple[str, dict[str, Any]]:
    from tunefleet.learning import costmodel

    train_t, test_t = costmodel.split_by_workload(table, heldout=heldout)
    rows: dict[str, dict[str, Any]] = {}
    for obj in costmodel.OBJECTIVES:
        t0 = time.perf_counter()
        model = costmodel.train(train_t, objective=obj, seed=seed)
        rows[obj] = {**costmodel.evaluate(model, test_t, seed=seed), "train_s": time.perf_counter() - t0}
    rows.update(costmodel.baselines(test_t, seed))
    print(f"\ncost model on held-out workloads: {len(set(test_t['workload_hash'].to_pylist()))} workloads, "
          f"{test_t.num_rows} rows (trained on {len(set(train_t['workload_hash'].to_pylist()))} workloads, "
          f"{train_t.num_rows} rows)")
    print(f"{'model':<22}{'pairwise':>10}{'peak@1':>9}{'peak@5':>9}{'R2':>9}")
    for name, m in rows.items():
        print(f"{name:<22}{_fmt(m['pairwise_accuracy']):>10}{_fmt(m['peak@1']):>9}{_fmt(m['peak@5']):>9}"
              f"{_fmt(m.get('r2')):>9}")
    better = max(costmodel.OBJECTIVES, key=lambda o: costmodel._rank_key(rows[o]))
    keys = ("pairwise_accuracy", "peak@1", "peak@5")
    passed = all((rows[better][k] or 0) > (rows[b][k] or 0) for b in ("random", "untrained") for k in keys)
    print(f"better objective: {better}; beats the untrained model and random on every metric: "
          f"{'PASS' if passed else 'FAIL'}")
    return better, rows


def copy_without(home: Path, src_db: Path, workload_ids: list[int], name: str) -> Path:
    """A copy of the SQLite database with these workloads' measurements, shards and predictions removed."""
    import sqlite3

    dst = home / f"{name}.db"
    src = sqlite3.connect(src_db)
    con = sqlite3.connect(dst)
    src.backup(con)  # a consistent copy, WAL included
    src.close()
    marks = ",".join("?" * len(workload_ids))
    for table in ("measurements", "shards", "predictions"):
        con.execute(f"DELETE FROM {table} WHERE workload_id IN ({marks})", workload_ids)  # noqa: S608
    con.commit()
    con.close()
    return dst


def zero_shot(home: Path, db: Any, store: Any, heldout_models: list[str], heldout: set[str],
              verify: int, seed: int) -> None:
    from tunefleet.delivery.build import build_model
    from tunefleet.delivery.zeroshot import predict_workloads

    hw = db.hardware_class(HW)
    ids = [db.workload(h).id for h in sorted(heldout)]
    tuned_best = {i: db.best_measurements(i, hw.id, 1)[0].mean_run_s for i in ids if db.best_measurements(i, hw.id, 1)}
    with tempfile.TemporaryDirectory(dir=home) as tmp:
        copy = copy_without(Path(tmp), home / "tunefleet.db", ids, "zeroshot")
        _, zdb, _ = open_home(Path(tmp), db_file=copy, store_path=store.root)
        t0 = time.perf_counter()
        res = predict_workloads(zdb, store, HW, ids, verify=verify * len(ids), seed=seed)  # top-K of each
        print(f"\nzero-shot on {len(ids)} unseen workloads: {res.seconds_per_task:.2f} s per task (search only; "
              f"median {statistics.median(w.seconds for w in res.searched):.2f} s, max "
              f"{max(w.seconds for w in res.searched):.2f} s); {time.perf_counter() - t0:.0f}s in all with --verify {verify}")
        ratios = []
        if verify:
            for i in ids:
                got = zdb.best_measurements(i, hw.id, 1)
                if got and i in tuned_best:
                    ratios.append(tuned_best[i] / got[0].mean_run_s)
            print(f"per workload, zero-shot top-{verify} throughput / fully tuned ({len(ratios)} workloads): geomean "
                  f"{math.exp(statistics.fmean(math.log(r) for r in ratios)):.3f}, min {min(ratios):.3f}, "
                  f"max {max(ratios):.3f}")
        print(f"\n{'model':<14}{'untuned ms':>12}{'tuned ms':>10}{'zero-shot ms':>14}{'zs/tuned thr':>14}{'zs/untuned thr':>16}")
        model_ratios = []
        for name in heldout_models:
            tuned = build_model(db, store, db.model(name), HW, compare_torch=False)
            zs = build_model(zdb, store, zdb.model(name), HW, compare_torch=False, zero_shot=True, verify=0)
            r = tuned.tuned_ms / zs.tuned_ms
            model_ratios.append(r)
            print(f"{name:<14}{_fmt(zs.untuned_ms):>12}{_fmt(tuned.tuned_ms):>10}{_fmt(zs.tuned_ms):>14}"
                  f"{r:>14.3f}{zs.untuned_ms / zs.tuned_ms:>16.3f}")
        print(f"geomean zero-shot / tuned throughput over models: "
              f"{math.exp(statistics.fmean(math.log(r) for r in model_ratios)):.3f}")
        zdb.close()


def warm_start(home: Path, db: Any, store: Any, heldout: set[str], n: int, trials: int, seed: int) -> None:
    from tunefleet.planning import shard_queue
    from tunefleet.engine.options import TuneOptions
    from tunefleet.engine.worker import drain

    hw = db.hardware_class(HW)
    heavy = sorted((db.workload(h) for h in heldout), key=lambda w: -w.flops)[:n]
    ids = [w.id for w in heavy]
    curves: dict[str, dict[int, list[float]]] = {}
    seconds = {}
    for arm in ("cold", "warm"):
        with tempfile.TemporaryDirectory(dir=home) as tmp:
            copy = copy_without(Path(tmp), home / "tunefleet.db", ids, arm)
            _, adb, _ = open_home(Path(tmp), db_file=copy, store_path=store.root)
            shard_queue.plan(adb, HW, target_trials=trials)
            t0 = time.perf_counter()
            drain(adb, HW, TuneOptions(seed=seed, warm_start=arm == "warm"), store=store)
            seconds[arm] = time.perf_counter() - t0
            curves[arm] = {}
            for i in ids:
                best, curve = math.inf, []
                for m in adb.measurements(hardware_class_id=hw.id):
                    if m.workload_id == i and m.mean_run_s is not None:
                        best = min(best, m.mean_run_s)
                    if m.workload_id == i:
                        curve.append(best)
                curves[arm][i] = curve
            adb.close()
    print(f"\nwarm start on the {n} heaviest held-out workloads, {trials} trials each, seed {seed} "
          f"(cold {seconds['cold']:.0f}s, warm {seconds['warm']:.0f}s)")
    print(f"{'workload':<48}{'cold final ms':>14}{'warm final ms':>14}{'warm trials to cold final':>27}")
    reached = []
    for w in heavy:
        cold, warm = curves["cold"][w.id], curves["warm"][w.id]
        target = cold[-1]
        hit = next((k + 1 for k, v in enumerate(warm) if v <= target), None)
        reached.append(hit if hit is not None else math.inf)
        print(f"{w.name[:46]:<48}{target * 1e3:>14.4f}{warm[-1] * 1e3:>14.4f}"
              f"{(str(hit) + ' of ' + str(len(warm))) if hit else 'not reached':>27}")
    finite = [r for r in reached if r != math.inf]
    print(f"warm start reached the cold final latency on {len(finite)} of {len(reached)} workloads; "
          f"median trials needed {statistics.median(reached) if finite else 'n/a'} of {trials}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--home", type=Path, required=True, help="a tunefleet home kept between runs")
    ap.add_argument("--train", default="resnet18,mobilenet_v2")
    ap.add_argument("--heldout", default="resnet50,small-cnn")
    ap.add_argument("--trials", type=int, default=16, help="trials per workload (all models)")
    ap.add_argument("--verify", type=int, default=1)
    ap.add_argument("--warm-workloads", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))

    from tunefleet.learning import costmodel
    from tunefleet.learning import dataset

    train_models = [m for m in args.train.split(",") if m]
    heldout_models = [m for m in args.heldout.split(",") if m]
    args.home.mkdir(parents=True, exist_ok=True)
    _, db, store = open_home(args.home)
    tune_all(db, store, train_models + heldout_models, args.trials, args.seed)
    t0 = time.perf_counter()
    version = dataset.export(db, store)
    print(f"export: {'v%d, %d rows' % (version.version, version.row_count) if version else 'nothing new'} "
          f"in {time.perf_counter() - t0:.0f}s")
    table = dataset.renormalise(dataset.load(db, store, hardware=HW))
    heldout = costmodel.model_holdout(db, heldout_models)
    print(f"dataset: {table.num_rows} rows, {len(set(table['workload_hash'].to_pylist()))} workloads; "
          f"held out: {len(heldout)} workloads only {', '.join(heldout_models)} have")
    better, _ = metrics_table(table, heldout, args.seed)
    res = costmodel.retrain(db, store, HW, objective=better, holdout_models=heldout_models, seed=args.seed)
    if not res.promoted:
        print(f"retrained v{res.version} not promoted ({res.reason}); the bench makes it current")
        db.promote_cost_model(res.cost_model_id)
    zero_shot(args.home, db, store, heldout_models, heldout, args.verify, args.seed)
    if args.warm_workloads:
        warm_start(args.home, db, store, heldout, args.warm_workloads, args.trials, args.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
