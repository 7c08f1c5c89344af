"""Cost-efficiency benchmark: stock MetaSchedule vs tunefleet with the efficiency levers off and on.

Usage::

    python bench/efficiency_bench.py --models mlp,small-cnn --trials 32 --per-iter 8 --patience 2
    python bench/efficiency_bench.py --arms off,preempt,filter,energy,on   # one lever at a time
    python bench/efficiency_bench.py --models mlp --trials 16 --per-iter 4 --arms off,on   # quick
    python bench/efficiency_bench.py --arms stock,off,filter,on --seeds 0,1,2 --stock-builder persistent
    python bench/efficiency_bench.py --arms stock,off-cold,on-cold --seeds 0,1,2 --stock-builder persistent

One run, same models, same maximum trials per workload, same trials per round, same seed, same
machine, the arms in turn:

* ``stock`` — ``ms.tune_tasks`` with LocalBuilder, LocalRunner, JSONDatabase, round-robin over all
  tasks of each model (what ``bench/tune_bench.py`` runs);
* ``off`` — tunefleet's engine (ingest, extract, plan, drain) with every lever off;
* ``on`` — the same with ``TuneOptions.efficient()``: plateau preemption with reallocation, filtering of
  half of each round by the class's trained cost model, energy-aware leasing;
* ``preempt``, ``filter``, ``energy``, ``parallel`` — one lever alone (``--parallel`` also adds
  the adaptive parallel runner to ``on``);
* any of these with ``-cold`` (``off-cold``, ``on-cold``, ...) — the same without warm start: the
  search is guided by MetaSchedule's own online XGBModel alone, as in stock, and the trained
  model only filters (``filter``/``on``);
* ``off-keepwarm``, ``on-keepwarm`` (any warm arm) — the warm start is never dropped: without the
  audit that drops the trained model from a shard's search once it misranks the shard's
  measurements (``warm_start_min_agreement=0``, :class:`tunefleet.engine.learned.FleetCostModel`);
* ``on-noaudit``, ``filter-noaudit`` (also with ``-cold``) — filtering never stops: without the
  audit that stops it in a shard whose measurements the model does not rank
  (``filter_min_agreement=0``, :mod:`tunefleet.learning.filter_audit`).

The fleet's trained cost model: before the arms, a "prior" fleet tunes other shapes of the zoo's
tiny models (``--prior``, never the benchmarked workloads), exports them and trains the x86 cost
model, which is made current. Every tunefleet arm starts from a copy of that database (and
shares its artifact store), so ``off``
warm-starts with the model like ``on`` (tunefleet's default) and ``filter``/``on`` filter with
it. The prior's own tuning is not part of any arm's figures (a fleet trains once for every
model it tunes); its time is printed. ``--prior ''`` skips it (then nothing is filtered).

``--seeds 0,1,2`` repeats every arm with each seed (the prior fleet is trained once, with the
first) and ends with each arm's latency ratio to stock per seed and their geometric mean: at 32
trials one seed's latency moves by tens of percent from seed to seed. ``--stock-builder
persistent`` gives the stock arm tunefleet's persistent builder instead of ``LocalBuilder`` (which
starts fresh build workers every round, ~1 min each here): the search, runner, cost model and
database stay stock, so its latencies are stock's, but its wall time and energy are not stock's
(the ratios of those are then not printed).

Per arm it reports the final latency of each model (median of 3 builds x runs), wall time,
energy with its source label (the node's meter around the whole arm: RAPL/NVML where present,
else the CPU-time estimate) and the wasted share: joules spent on candidates that did not beat
the best so far of their workload (``fstop``: shards in which the audit stopped filtering;
``wdrop``: shards that dropped their warm start, which misranked their measurements).
tunefleet's share comes from its own accounting (each round's joules split over its candidates
by build + run seconds); stock's from a measure callback that splits each round's joules evenly
over its candidates (stock does not expose build times per candidate). Prints what it measured;
asserts nothing.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from tune_bench import _latency_ms  # noqa: E402  (same latency measurement as the tuning bench)
from zeroshot_bench import open_home  # noqa: E402

HW = "x86"


def _fresh_latency_ms(model: str, *, sqlite: Path | None = None, json_dir: str | None = None) -> float:
    """The model's latency built from a database, timed in a fresh process.

    Timed inside the process that just tuned (builder and runner pools, TVM's thread pool pinned
    by the tuning threads), the same schedules measured 2-3x slower than in a fresh process, and
    by different amounts from arm to arm; a fresh process per figure keeps the arms comparable.
    """
    import subprocess

    where = ["--latency-sqlite", str(sqlite)] if sqlite is not None else ["--latency-json", str(json_dir)]
    out = subprocess.run([sys.executable, __file__, "--latency-of", model, *where], capture_output=True, text=True,
                         timeout=1800)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("LATENCY_MS ")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"latency of {model} failed (exit {out.returncode}): {out.stderr.strip()[-2000:]}")
    return float(lines[-1].split()[1])


def _latency_main(model: str, sqlite: str | None, json_dir: str | None) -> int:
    from tvm.s_tir import meta_schedule as ms

    from tunefleet.config import load_settings
    from tunefleet.db import Database
    from tunefleet.hardware import builtin_classes
    from tunefleet.models.zoo import build_zoo_model
    from tunefleet.tvm.bridge import FleetDatabase
    from tunefleet.tvm.targets import make_target

    with tempfile.TemporaryDirectory() as home:
        spec = builtin_classes(load_settings(home=Path(home)))[HW]["target"]
    target = make_target(spec)
    threads = int(spec.get("num-cores") or 1)
    loaded = build_zoo_model(model).loaded
    if sqlite is not None:
        db = Database(f"sqlite:///{sqlite}")
        ms_ = _latency_ms(lambda: FleetDatabase(db, HW), loaded, target, threads)
    else:
        ms_ = _latency_ms(lambda: ms.database.JSONDatabase(work_dir=json_dir), loaded, target, threads)
    print(f"LATENCY_MS {ms_!r}")
    return 0


def _meter(settings: Any) -> Any:
    from tunefleet.hardware import builtin_classes
    from tunefleet.energy.meters import probe

    spec = builtin_classes(settings)[HW]
    return probe(spec["target"], watts_per_core=spec["watts_per_core"], idle_watts=spec["idle_watts"])


def _round_energy_callback(meter: Any) -> Any:
    """A MeasureCallback that keeps, per task, each candidate's share of its round's joules and
    whether it beat that task's best so far (stock arm only)."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class RoundEnergy(ms.measure_callback.PyMeasureCallback):
        def __init__(self) -> None:
            self.accounted = 0.0
            self.useful_j = self.wasted_j = 0.0
            self.best: dict[int, float] = {}
            self.candidates = 0

        def apply(self, task_scheduler: Any, task_id: int, measure_candidates: list[Any],
                  builder_results: list[Any], runner_results: list[Any]) -> None:
            joules = meter.read().joules
            round_j, self.accounted = joules - self.accounted, joules
            share = round_j / max(1, len(measure_candidates))
            for built, ran in zip(builder_results, runner_results, strict=True):
                self.candidates += 1
                secs = None if (built.error_msg or ran.error_msg) else [float(x) for x in ran.run_secs]
                mean = statistics.fmean(secs) if secs else None
                if mean is not None and mean < self.best.get(task_id, float("inf")):
                    self.best[task_id] = mean
                    self.useful_j += share
                else:
                    self.wasted_j += share

    return RoundEnergy()


def stock_arm(models: list[str], settings: Any, trials: int, per_iter: int, seed: int, threads: int,
              target: Any, builder: str = "local") -> dict[str, Any]:
    from tvm.s_tir import meta_schedule as ms

    from tunefleet.models.zoo import build_zoo_model
    from tunefleet.tvm.builder import PersistentBuilder
    from tunefleet.tvm.extract import extract_workloads

    out: dict[str, Any] = {"latency_ms": {}, "candidates": 0}
    useful = wasted = joules = tuned = 0.0
    source = ""
    for name in models:
        loaded = build_zoo_model(name).loaded
        with tempfile.TemporaryDirectory() as work:
            meter = _meter(settings)  # metered: extraction + tuning, as in the tunefleet arms
            meter.start()
            t0 = time.perf_counter()
            found = extract_workloads(loaded.mod, target, params=loaded.params)
            ctxs, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
                [w.task for w in found], work, space="post-order-apply", strategy="evolutionary",
                num_threads=threads, seed=seed)
            database = ms.database.JSONDatabase(work_dir=work)
            energy = _round_energy_callback(meter)
            pb = PersistentBuilder(max_workers=threads) if builder == "persistent" else None
            ms.tune_tasks(tasks=ctxs, task_weights=weights, work_dir=work,
                          max_trials_global=trials * len(found), max_trials_per_task=trials,
                          num_trials_per_iter=per_iter, builder=pb or ms.builder.LocalBuilder(timeout_sec=600),
                          runner=ms.runner.LocalRunner(), database=database, cost_model="xgb",
                          measure_callbacks=[*ms.measure_callback.MeasureCallback.create("default"), energy],
                          task_scheduler="round-robin")
            if pb is not None:
                pb.shutdown()
            tuned += time.perf_counter() - t0
            reading = meter.read()
            joules, source = joules + reading.joules, reading.source
            useful, wasted = useful + energy.useful_j, wasted + energy.wasted_j
            out["candidates"] += energy.candidates
            out["latency_ms"][name] = _fresh_latency_ms(name, json_dir=work)
    out.update(wall_s=tuned, source=source if builder == "local" else f"{source}*", joules=joules, wasted_pct=100 * wasted / max(1e-9, useful + wasted),
               filtered=0, preempted=0, filter_stopped=0, warm_dropped=0)
    return out


PRIOR = "mlp:batch_size=4,mlp:batch_size=16,small-cnn:image_size=16,small-cnn:image_size=48"


def prior_fleet(home: Path, spec: str, trials: int, per_iter: int, seed: int) -> dict[str, Any]:
    """Tune other shapes of the zoo models in ``home``, export, train the x86 cost model, make it current."""
    from tunefleet.learning import costmodel
    from tunefleet.learning import dataset
    from tunefleet.planning import shard_queue
    from tunefleet.models.ingest import ingest
    from tunefleet.engine.options import TuneOptions
    from tunefleet.engine.worker import drain
    from tunefleet.models.workloads import extract

    home.mkdir(parents=True, exist_ok=True)
    _, db, store = open_home(home)
    t0 = time.perf_counter()
    for item in filter(None, spec.split(",")):
        zoo, _, opt = item.partition(":")
        key, _, value = opt.partition("=")
        kwargs = {key: int(value)} if key else {}
        m = ingest(db, store, zoo, name=f"prior-{zoo}-{key}{value}", **kwargs).model
        extract(db, store, m, HW)
        shard_queue.plan(db, HW, target_trials=trials, model=m.id)
    summary = drain(db, HW, TuneOptions(seed=seed, trials_per_iter=per_iter), store=None)
    version = dataset.export(db, store, hardware=HW)
    res = costmodel.retrain(db, store, HW, holdout_fraction=0.25, seed=seed)
    if not res.promoted:
        db.promote_cost_model(res.cost_model_id)
    held = res.metrics["heldout"]
    out = {"wall_s": time.perf_counter() - t0, "measured": summary.measured, "workloads": len(db.workloads()),
           "rows": version.row_count if version else 0, "version": res.version,
           "pairwise": held["pairwise_accuracy"], "peak@1": held["peak@1"], "guard": res.reason or "promoted"}
    db.close()
    return out


def _efficiency(arm: str, patience: int, filter_fraction: float, parallel: bool) -> dict[str, Any]:
    """The arm's tuning knobs (:class:`tunefleet.engine.options.TuneOptions` fields)."""
    arm = arm.removesuffix("-keepwarm").removesuffix("-cold")
    audit = {"filter_min_agreement": 0.0} if arm.endswith("-noaudit") else {}
    arm = arm.removesuffix("-noaudit")
    preempt = {"preempt": True, "preempt_patience": patience}
    arms: dict[str, dict[str, Any]] = {
        "off": {},
        "preempt": preempt,
        "filter": {"filter_fraction": filter_fraction, **audit},
        "energy": {"energy_aware": True},
        "parallel": {"parallel_measure": True},
        "on": {**preempt, "energy_aware": True, "filter_fraction": filter_fraction, "parallel_measure": parallel,
               **audit},
    }
    if arm not in arms:
        raise SystemExit(f"efficiency_bench: unknown arm {arm!r} (known: stock, {', '.join(arms)})")
    return arms[arm]


def tunefleet_arm(models: list[str], arm: str, trials: int, per_iter: int, seed: int, prior: Path | None,
                  patience: int = 3, filter_fraction: float = 0.5, parallel: bool = False) -> dict[str, Any]:
    import shutil

    from tunefleet.planning import shard_queue
    from tunefleet.energy.accounting import energy_report
    from tunefleet.vocab import DEFAULT_MIN_AGREEMENT
    from tunefleet.models.ingest import ingest
    from tunefleet.engine.options import TuneOptions
    from tunefleet.engine.worker import drain
    from tunefleet.models.workloads import extract

    keep_warm = arm.endswith("-keepwarm")  # the warm start is never dropped (before its audit)
    arm = arm.removesuffix("-keepwarm")
    eff = _efficiency(arm, patience, filter_fraction, parallel)
    warm = not arm.endswith("-cold")
    out: dict[str, Any] = {"latency_ms": {}}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        home.mkdir()
        if prior is not None:  # its database copied; its artifact store (the cost model) shared
            shutil.copy(prior / "tunefleet.db", home / "tunefleet.db")
        settings, db, store = open_home(home, store_path=None if prior is None else prior / "artifacts")
        meter = _meter(settings)
        meter.start()
        t0 = time.perf_counter()
        ids = []
        for name in models:
            m = ingest(db, store, name).model
            extract(db, store, m, HW)
            shard_queue.plan(db, HW, target_trials=trials, model=m.id)
            ids.append(m.id)
        options = TuneOptions(seed=seed, trials_per_iter=per_iter, warm_start=warm,
                              warm_start_min_agreement=0.0 if keep_warm else DEFAULT_MIN_AGREEMENT, **eff)
        summary = drain(db, HW, options, store=store)
        wall = time.perf_counter() - t0
        reading = meter.read()
        # the wasted share from tunefleet's own per-candidate accounting (shared workloads are split
        # between models by weight, so the model rows add up to the class total)
        rows = [r for mid in ids for r in energy_report(db, model=mid, hardware=HW)]
        accounted = sum(r.joules for r in rows)
        wasted = sum(r.wasted_joules for r in rows)
        db.close()
        for name in models:
            out["latency_ms"][name] = _fresh_latency_ms(name, sqlite=home / "tunefleet.db")
        out.update(wall_s=wall, source=reading.source, joules=reading.joules, accounted_joules=accounted,
                   wasted_pct=100 * wasted / max(1e-9, accounted), candidates=summary.measured,
                   filtered=summary.filtered, preempted=summary.preempted, shards=summary.shards_done,
                   failed=summary.shards_failed, filter_stopped=summary.filter_stopped,
                   warm_dropped=summary.warm_start_dropped)
    return out


def _report(results: dict[str, dict[str, Any]], models: list[str], seed: int, *, stock_costs: bool) -> None:
    print(f"\n-- seed {seed}" + ("" if stock_costs else " (* stock with the persistent builder: its wall and energy "
                                                      "are not stock's)"))
    head = f"{'arm':<6} {'measured':>8} {'filtered':>8} {'fstop':>5} {'wdrop':>5} {'preempt':>7} {'wall s':>8} " \
           f"{'energy J':>10} " \
           f"{'source':>9} " \
           f"{'wasted %':>8} " + " ".join(f"{m + ' ms':>14}" for m in models)
    print(head)
    for arm, r in results.items():
        print(f"{arm:<6} {r['candidates']:>8} {r['filtered']:>8} {r['filter_stopped']:>5} {r['warm_dropped']:>5} "
              f"{r['preempted']:>7} {r['wall_s']:>8.1f} "
              f"{r['joules']:>10.0f} {r['source']:>9} {r['wasted_pct']:>8.1f} "
              + " ".join(f"{r['latency_ms'][m]:>14.4f}" for m in models))
    base = results.get("stock")
    if base is not None:
        for arm, r in results.items():
            if arm == "stock":
                continue
            lat = " ".join(f"{m} {r['latency_ms'][m] / base['latency_ms'][m]:.3f}x" for m in models)
            costs = f"wall {r['wall_s'] / base['wall_s']:.3f}x, energy {r['joules'] / base['joules']:.3f}x, " \
                if stock_costs else ""
            print(f"{arm}/stock: {costs}latency {lat}")
    for arm, r in results.items():
        ref_name = "off-cold" if arm.endswith("-cold") else "off"  # levers against the same search
        off = results.get(ref_name)
        if off is None or arm in ("stock", ref_name):
            continue
        lat = " ".join(f"{m} {r['latency_ms'][m] / off['latency_ms'][m]:.3f}x" for m in models)
        print(f"{arm}/{ref_name}: wall {r['wall_s'] / off['wall_s']:.3f}x, energy {r['joules'] / off['joules']:.3f}x, "
              f"latency {lat}")


def _latency_summary(runs: dict[int, dict[str, dict[str, Any]]], models: list[str]) -> None:
    """Per arm and model: latency per seed, and the geometric mean of its ratios to stock's."""
    import math

    seeds = sorted(runs)
    print(f"\n-- latency over seeds {','.join(map(str, seeds))} (ms per seed; ratio to stock: geometric mean "
          f"[min-max])")
    for arm in runs[seeds[0]]:
        for m in models:
            lats = [runs[s][arm]["latency_ms"][m] for s in seeds]
            line = f"{arm:<6} {m:<10} " + " ".join(f"{x:.4f}" for x in lats)
            if arm != "stock" and "stock" in runs[seeds[0]]:
                ratios = [runs[s][arm]["latency_ms"][m] / runs[s]["stock"]["latency_ms"][m] for s in seeds]
                gmean = math.exp(statistics.fmean(math.log(r) for r in ratios))
                line += f"   vs stock {gmean:.3f}x [{min(ratios):.3f}-{max(ratios):.3f}]"
            print(line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp,small-cnn")
    ap.add_argument("--trials", type=int, default=32, help="maximum trials per workload, every arm")
    ap.add_argument("--per-iter", type=int, default=8, help="candidates per round, every arm")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", help="comma-separated seeds: every arm once per seed (overrides --seed)")
    ap.add_argument("--stock-builder", choices=("local", "persistent"), default="local",
                    help="stock arm's builder: 'persistent' for latency comparisons only (see above)")
    ap.add_argument("--arms", default="stock,off,on")
    ap.add_argument("--patience", type=int, default=3, help="'on' arm: stale rounds that make a plateau")
    ap.add_argument("--filter-fraction", type=float, default=0.5, help="'on' arm: fraction of each round measured")
    ap.add_argument("--parallel", action="store_true", help="'on' arm: the adaptive parallel runner too")
    ap.add_argument("--prior", default=PRIOR, help="zoo model shapes the prior fleet tunes to train the cost model "
                    "('' for none); comma-separated zoo[:option=value]")
    ap.add_argument("--prior-trials", type=int, default=32, help="trials per workload of the prior fleet")
    ap.add_argument("--latency-of", help=argparse.SUPPRESS)  # internal: time one model in this fresh process
    ap.add_argument("--latency-sqlite", help=argparse.SUPPRESS)
    ap.add_argument("--latency-json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.latency_of:
        return _latency_main(args.latency_of, args.latency_sqlite, args.latency_json)

    from tunefleet.config import load_settings
    from tunefleet.hardware import builtin_classes
    from tunefleet.tvm.targets import make_target

    with tempfile.TemporaryDirectory() as home:
        settings = load_settings(home=Path(home))
    spec = builtin_classes(settings)[HW]["target"]
    target = make_target(spec)
    from tunefleet.tvm.threads import class_threads
    threads = class_threads(spec)
    models = args.models.split(",")
    arms = args.arms.split(",")
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    for arm in arms:
        if arm != "stock":
            _efficiency(arm, args.patience, args.filter_fraction, args.parallel)  # unknown arms fail before any work
    prior_dir = tempfile.TemporaryDirectory()
    prior: Path | None = None
    if args.prior and any(a != "stock" for a in arms):
        prior = Path(prior_dir.name) / "home"
        print(f"== prior fleet: {args.prior}, {args.prior_trials} trials per workload", flush=True)
        p = prior_fleet(prior, args.prior, args.prior_trials, args.per_iter, seeds[0])
        print(f"prior: {p['workloads']} workloads, {p['measured']} measured in {p['wall_s']:.0f} s; cost model "
              f"v{p['version']} on {p['rows']} rows, held-out pairwise accuracy {p['pairwise']:.3f}, "
              f"peak@1 {p['peak@1']:.3f} ({p['guard']}; made current)", flush=True)
    runs: dict[int, dict[str, dict[str, Any]]] = {}
    for seed in seeds:
        results = runs[seed] = {}
        for arm in arms:
            print(f"== {arm}: {','.join(models)}, <= {args.trials} trials per workload, {args.per_iter} per round, "
                  f"seed {seed}", flush=True)
            if arm == "stock":
                results[arm] = stock_arm(models, settings, args.trials, args.per_iter, seed, threads, target,
                                         args.stock_builder)
            else:
                results[arm] = tunefleet_arm(models, arm, args.trials, args.per_iter, seed, prior, args.patience,
                                             args.filter_fraction, args.parallel)
            print(results[arm], flush=True)
        _report(results, models, seed, stock_costs=args.stock_builder == "local")
    if len(seeds) > 1:
        _latency_summary(runs, models)
    prior_dir.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
