"""Database benchmark: bulk-commit realistic measurements, then time "best 5" queries.

Usage::

    python bench/db_bench.py                      # 10,000 workloads x 100 = 1,000,000 rows, both backends
    python bench/db_bench.py --workloads 1000     # smaller run

PostgreSQL is a real server started here with fsync ON (durable commits); SQLite is a WAL file.
Prints what it measured; nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tunefleet.db import Database, NewMeasurement
from tunefleet.testing.postgres import PostgresServer



def realistic_trace(rng: random.Random, target_size: int = 2500) -> str:
    """A MetaSchedule-shaped trace JSON (instructions + decisions) of about ``target_size`` bytes."""
    insts = []
    i = 0
    while True:
        kind = rng.choice(["SamplePerfectTile", "Split", "Reorder", "Parallel", "Vectorize", "Annotate",
                           "GetLoops", "ComputeAt", "CacheWrite", "Unroll"])
        insts.append([kind, [f"b{rng.randrange(64)}", f"l{rng.randrange(64)}"], [rng.randrange(1, 512)], [f"v{i}"]])
        i += 1
        text = json.dumps([insts, [[j, rng.randrange(1, 64)] for j in range(0, i, 3)]], separators=(",", ":"))
        if len(text) >= target_size:
            return text


def bench_backend(name: str, url: str, n_workloads: int, per_workload: int, batch: int, queries: int) -> dict[str, float]:
    rng = random.Random(0)
    db = Database(url, connect_timeout_s=10)
    hw = db.upsert_hardware_class("x86", {"kind": "llvm", "num-cores": 2}, "x86")
    db.upsert_hardware_class("arm", {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, "arm")
    t0 = time.perf_counter()
    wl_ids: list[tuple[int, str]] = []
    for w in range(n_workloads):
        h = f"{rng.getrandbits(64):016x}"
        wl, _ = db.add_workload(structural_hash=h, name=f"fused_op_{w}", op_kind="conv2d", flops=1e6, tir_json="{}")
        wl_ids.append((wl.id, h))
    setup_s = time.perf_counter() - t0

    # Pre-generate a pool of traces so the generator is not what we time.
    pool = [realistic_trace(rng) for _ in range(2000)]
    total = n_workloads * per_workload
    pending: list[NewMeasurement] = []
    committed = 0
    commit_s = 0.0
    last_report = time.perf_counter()
    for idx in range(total):
        wl_id, _ = wl_ids[idx % n_workloads]
        trace = pool[idx % len(pool)] + f" {idx}"  # unique per measurement
        err = (idx // n_workloads) % 20 == 7  # 5% errors, spread over every workload
        run = None if err else [rng.uniform(1e-5, 1e-2) for _ in range(3)]
        pending.append(NewMeasurement(wl_id, hw.id, trace, run, build_s=0.4, error_kind="run" if err else None,
                                      error_msg="timeout" if err else None, tvm_version="0.27.0", target="llvm"))
        if len(pending) == batch:
            t = time.perf_counter()
            committed += db.commit_measurements(pending)
            commit_s += time.perf_counter() - t
            pending.clear()
            if time.perf_counter() - last_report > 30:
                print(f"  [{name}] {committed:,}/{total:,} rows, {committed / commit_s:,.0f}/s", flush=True)
                last_report = time.perf_counter()
    if pending:
        t = time.perf_counter()
        committed += db.commit_measurements(pending)
        commit_s += time.perf_counter() - t

    # Steady state before timing queries: statistics up to date and the bulk load's dirty pages
    # flushed (otherwise autovacuum and the checkpointer of a just-loaded 2.5 GB table dominate
    # the tail), then 200 warm-up queries that are not counted.
    t = time.perf_counter()
    if db.dialect == "postgresql":
        with db.engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            conn.exec_driver_sql("VACUUM ANALYZE measurements")
            conn.exec_driver_sql("CHECKPOINT")
    else:
        with db.engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
            conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    maintenance_s = time.perf_counter() - t
    for _ in range(200):
        db.best_measurements(wl_ids[rng.randrange(n_workloads)][1], "x86", 5)

    # "best 5 for (workload, hardware class)": by structural hash + class name (the API a user calls)
    # and by ids (what the tuner calls in its hot loop).
    by_name, by_id = [], []
    for q in range(queries):
        wl_id, h = wl_ids[rng.randrange(n_workloads)]
        t = time.perf_counter()
        best = db.best_measurements(h, "x86", 5)
        by_name.append(time.perf_counter() - t)
        t = time.perf_counter()
        db.best_measurements(wl_id, hw.id, 5)
        by_id.append(time.perf_counter() - t)
        assert len(best) == 5
    db.close()

    def pct(xs: list[float], p: float) -> float:
        return statistics.quantiles(xs, n=100)[int(p) - 1] * 1000

    return {
        "rows": committed,
        "setup_s": setup_s,
        "maintenance_s": maintenance_s,
        "commit_s": commit_s,
        "rows_per_s": committed / commit_s,
        "p50_ms_by_hash": pct(by_name, 50),
        "p99_ms_by_hash": pct(by_name, 99),
        "p50_ms_by_id": pct(by_id, 50),
        "p99_ms_by_id": pct(by_id, 99),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workloads", type=int, default=10_000)
    ap.add_argument("--per-workload", type=int, default=100)
    ap.add_argument("--batch", type=int, default=1000, help="measurements per commit")
    ap.add_argument("--queries", type=int, default=2000)
    ap.add_argument("--backends", default="postgresql,sqlite")
    args = ap.parse_args()

    results: dict[str, dict[str, float]] = {}
    for backend in args.backends.split(","):
        print(f"== {backend}: {args.workloads:,} workloads x {args.per_workload} measurements, batch {args.batch}",
              flush=True)
        if backend == "postgresql":
            with PostgresServer(fsync=True) as pg:
                results[backend] = bench_backend(backend, pg.url(pg.create_database("bench")), args.workloads,
                                                 args.per_workload, args.batch, args.queries)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                url = f"sqlite:///{Path(tmp) / 'bench.db'}"
                results[backend] = bench_backend(backend, url, args.workloads, args.per_workload, args.batch,
                                                 args.queries)
    print()
    print(f"{'backend':<11} {'rows':>10} {'rows/s':>9} {'best5 p50':>10} {'best5 p99':>10} {'by-id p50':>10} {'by-id p99':>10}")
    for backend, r in results.items():
        print(f"{backend:<11} {r['rows']:>10,.0f} {r['rows_per_s']:>9,.0f} {r['p50_ms_by_hash']:>8.2f}ms "
              f"{r['p99_ms_by_hash']:>8.2f}ms {r['p50_ms_by_id']:>8.2f}ms {r['p99_ms_by_id']:>8.2f}ms")
    for backend, r in results.items():
        print(f"{backend}: ANALYZE + checkpoint before the query phase took {r['maintenance_s']:.1f} s")
    if len(results) == 2:
        pg, lite = results.get("postgresql"), results.get("sqlite")
        if pg and lite:
            print(f"ratio postgresql/sqlite commit throughput: {pg['rows_per_s'] / lite['rows_per_s']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
