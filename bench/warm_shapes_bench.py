"""Warm start across shapes: a workload new to the class, tuned cold and seeded from another shape.

Usage::

    python bench/warm_shapes_bench.py                      # small-cnn's first conv2d, image 32 -> 16, 2 rounds of 8
    python bench/warm_shapes_bench.py --donor-size 16 --size 32 --trials 32 --per-iter 16
    python bench/warm_shapes_bench.py --model mlp --task matmul_add_relu --donor-size 1 --size 8

Workload A is the ``--which``-th ``--task`` workload of ``--model`` at ``--donor-size`` (the image
size of ``small-cnn``, the batch size of ``mlp``); workload B is the same task at ``--size``: one
operator, two shapes. A is tuned first (one shard of ``--trials``); then B is tuned from that same
database state twice, in two copies of it, with the same seed, trials and batch size: ``cold``
(``warm_start_shapes`` off: the first round is the default schedule and MetaSchedule's own
samples) and ``warm`` (the first round also measures A's best schedules fitted to B,
:class:`tunefleet.engine.policies.ShapeWarmStart`). Both on SQLite in a temporary directory, with
the x86 class of this host. Prints what it measured — the seeds tried, applied as is, adapted and
skipped; the unscheduled default's run time; B's best after the first round (and of the first
round's search candidates alone: with one search thread and numpy's global random state seeded
alike before each arm, the search should pick the same first round in both, so their difference is
measurement noise; the bench prints how many candidates the arms share) and after the budget in
each arm; the seeds' own run times — and asserts nothing. Run times on a busy machine are noisy:
compare arms of one run.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _open(home: Path) -> tuple[Any, Any, Any]:
    from tunefleet.config import load_settings
    from tunefleet.db import Database
    from tunefleet.hardware import seed_hardware_classes
    from tunefleet.store import open_store

    settings = load_settings(home=home, database_url=f"sqlite:///{home / 'bench.db'}")
    db = Database.from_settings(settings)
    seed_hardware_classes(db, settings)
    return settings, db, open_store(settings)


def _workload(db: Any, store: Any, model: str, size: int, task: str, which: int) -> Any:
    """The model's ``which``-th workload (fewest FLOPs first) whose fused-op sequence is ``task``."""
    from tunefleet.models.workloads import extract
    from tunefleet.models.ingest import ingest
    from tunefleet.vocab import task_name_key

    option = {"image_size": size} if model != "mlp" else {"batch_size": size}
    m = ingest(db, store, model, name=f"{model}-{size}", **option).model
    extract(db, store, m, "x86")
    workloads = [wl for wl, _ in db.workloads(m.id, db.hardware_class("x86").id)]
    found = sorted((wl for wl in workloads if task_name_key(wl.name) == task), key=lambda wl: wl.flops)
    if len(found) <= which:
        keys = sorted({task_name_key(wl.name) for wl in workloads})
        raise SystemExit(f"{model} at {size} has {len(found)} {task!r} workload(s); its fused-op sequences: {keys}")
    return found[which]


def _tune(db: Any, workload_id: int, trials: int, per_iter: int, seed: int, warm: bool,
          seeded: frozenset[str] = frozenset()) -> dict[str, Any]:
    """One shard of the workload; the best after every committed batch, the best of the first
    batch's search candidates (neither the default nor a seed), and the result."""
    from tunefleet.vocab import DEFAULT_TRACE_SHA256

    import numpy as np

    from tunefleet.planning import shard_queue
    from tunefleet.engine.options import TuneOptions
    from tunefleet.engine.shard import ShardKit, run_shard

    (created,) = db.add_shards(db.hardware_class("x86").id, [(workload_id, trials, 1.0)])
    shard = shard_queue.lease(db, "x86", "bench", shard_id=created.id)
    rounds: list[float | None] = []
    searched: list[float | None] = []
    first_shas: set[str] = set()
    default: list[float | None] = []

    def on_batch(_shard_id: int | None, batch: list[tuple[str, float | None]]) -> None:
        best = min((t for _, t in batch if t is not None), default=None)
        default.extend(t for sha, t in batch if sha == DEFAULT_TRACE_SHA256)
        if not rounds:
            first_shas.update(sha for sha, _ in batch if sha not in seeded and sha != DEFAULT_TRACE_SHA256)
            searched.append(min((t for sha, t in batch if t is not None and sha not in seeded
                                 and sha != DEFAULT_TRACE_SHA256), default=None))
        prev = rounds[-1] if rounds else None
        rounds.append(best if prev is None else prev if best is None else min(prev, best))

    options = TuneOptions(seed=seed, trials_per_iter=per_iter, warm_start_shapes=warm, transfer=False)
    # MetaSchedule's XGBModel scores candidates with numpy's global random numbers until it has
    # seen 100 measurements: seeded alike, both arms' searches pick the same first round.
    np.random.seed(seed)
    start = time.perf_counter()
    # one search thread: MetaSchedule samples with a random state per thread, handed out to the
    # threads as they come, so a multi-threaded search is not reproducible
    result = run_shard(db, shard, "bench", options, ShardKit(on_batch=on_batch, num_threads=1))
    return {"rounds": rounds, "searched": searched[0] if searched else None, "first_shas": first_shas,
            "default": default[0] if default else None, "result": result,
            "wall_s": time.perf_counter() - start, "shard_id": created.id}


def _ms(x: float | None) -> str:
    return f"{x * 1e3:.4f}" if x is not None else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="small-cnn", choices=["small-cnn", "mlp"])
    ap.add_argument("--task", default="conv2d_add_relu",
                    help="the fused-op sequence (task name without fused_ and numeric suffixes) in both models")
    ap.add_argument("--which", type=int, default=0,
                    help="which workload of that sequence, fewest FLOPs first (small-cnn: 0 its first conv2d, 1 "
                    "its second)")
    ap.add_argument("--donor-size", type=int, default=32, help="workload A: image size (small-cnn), batch (mlp)")
    ap.add_argument("--size", type=int, default=16, help="workload B: image size (small-cnn), batch (mlp)")
    ap.add_argument("--trials", type=int, default=16, help="trials of A, and of B in each arm")
    ap.add_argument("--per-iter", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import logging

    logging.basicConfig(level=logging.WARNING)
    from tunefleet.tvm.traces import candidate, trace_sha256_of
    from tunefleet.planning.warm_shapes import MAX_SEEDS, shape_seeds

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        _, db, store = _open(base)
        a = _workload(db, store, args.model, args.donor_size, args.task, args.which)
        b = _workload(db, store, args.model, args.size, args.task, args.which)
        hw = db.hardware_class("x86")
        print(f"A: {a.name} {a.structural_hash[:8]} ({args.model} at {args.donor_size}, {a.flops:.3g} FLOPs)")
        print(f"B: {b.name} {b.structural_hash[:8]} ({args.model} at {args.size}, {b.flops:.3g} FLOPs)")
        print(f"target {hw.target}; {args.trials} trials, {args.per_iter} per batch, seed {args.seed}", flush=True)
        tuned_a = _tune(db, a.id, args.trials, args.per_iter, args.seed, warm=False)
        print(f"A tuned: best {_ms(tuned_a['result'].best_s)} ms in {tuned_a['wall_s']:.0f} s", flush=True)
        db.close()

        arms: dict[str, dict[str, Any]] = {}
        for arm in ("cold", "warm"):
            home = Path(tmp) / arm
            shutil.copytree(base, home)
            _, db, _ = _open(home)
            seeded: frozenset[str] = frozenset()
            if arm == "warm":
                import tvm

                wl = db.workload(b.id)
                found = shape_seeds(db, wl, hw, limit=min(MAX_SEEDS, args.trials // 2))
                print(f"seeds for B: {found.summary()}")
                for reason in found.reasons:
                    print(f"  skipped: {reason}")
                mod = tvm.ir.load_json(wl.tir_json)
                seeded = frozenset(trace_sha256_of(candidate(mod, t).sch) for t in found.traces)
            arms[arm] = out = _tune(db, b.id, args.trials, args.per_iter, args.seed, warm=arm == "warm",
                                    seeded=seeded)
            if arm == "warm":
                times = [m.mean_run_s for m in db.measurements() if m.shard_id == out["shard_id"]
                         and m.trace_sha256 in seeded]
                out["seed_times"] = sorted(t for t in times if t is not None)
                out["seed_errors"] = len(times) - len(out["seed_times"])
            db.close()
            print(f"B {arm}: best by round (ms) {[_ms(x) for x in out['rounds']]} in {out['wall_s']:.0f} s", flush=True)

    print()
    print(f"{'arm':<6} {'seeds':>5} {'default ms':>10} {'round 1 best ms':>16} {'(search only)':>14} "
          f"{'final best ms':>14} {'measured':>8} {'errors':>6} {'wall s':>7}")
    for arm, out in arms.items():
        r = out["result"]
        first = out["rounds"][0] if out["rounds"] else None
        print(f"{arm:<6} {r.shape_seeds:>5} {_ms(out['default']):>10} {_ms(first):>16} {_ms(out['searched']):>14} "
              f"{_ms(r.best_s):>14} {r.measured:>8} {r.errors:>6} {out['wall_s']:>7.1f}")
    warm = arms["warm"]
    print(f"the seeds measured on B (ms): {[_ms(t) for t in warm['seed_times']]}"
          + (f", {warm['seed_errors']} failed" if warm["seed_errors"] else ""))
    common = arms["cold"]["first_shas"] & warm["first_shas"]
    print(f"round 1 search candidates in both arms: {len(common)} of {len(warm['first_shas'])} (warm), "
          f"{len(arms['cold']['first_shas'])} (cold)")
    cold_first, warm_first = arms["cold"]["rounds"][:1], warm["rounds"][:1]
    if cold_first and warm_first and cold_first[0] and warm_first[0]:
        print(f"round 1 best, warm/cold: {warm_first[0] / cold_first[0]:.2f}; "
              f"final best, warm/cold: {warm['result'].best_s / arms['cold']['result'].best_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
