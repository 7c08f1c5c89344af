"""Orchestration benchmark: per-shard overhead of tuning under Prefect (lease, task start, commit, states).

Usage::

    python bench/orchestration_bench.py                    # 100 shards of 16 trials (~10-20 min)
    python bench/orchestration_bench.py --shards 4         # a quick smoke run

A real PostgreSQL 15 (fsync on) holds two databases: tunefleet's and the one of a real
``prefect server start``. The ``mlp`` zoo model is ingested and extracted for x86 and cut into
shards of ``--trials`` trials (about ``--shards`` of them). The ``tune`` flow then runs in a
subprocess whose environment points at that server: the flow run and its states go through the
server's REST API, the task runs and their states as the events Prefect 3 emits to it (task runs
are orchestrated client-side). Each shard is one ``tune_shard`` task run with one batch of
``--trials`` candidates (seed 0).

The subprocess times the flow call (wall W) and, with a thin wrapper around the task's function,
when each task body starts and ends (same clock). With the shards' own figures (``seconds`` inside
the core's tune_shard, of which ``commit_s`` committing and marking done; ``lease_s`` leasing) the
wall time splits exactly into::

    W = tuning compute (seconds - commit_s; the first shard's includes the builder's warm-up)
      + lease + commit/mark done
      + in-task other (task body minus lease and tune_shard: context, result dict), 2nd task on
      + between tasks (task body end -> next body start: Prefect's task end + next task start)
      + flow start (flow call -> first task body) + flow end (last task body -> flow returned)
      + tuner start (the first task body's "in-task other": it starts the builder and runner
        worker processes, a one-time cost drain() without Prefect pays as well)

Printed: the all-in overhead (W - compute), the orchestration overhead (less the tuner start),
the steady state per shard (shards 2..n, no one-time cost), the table of components, and
Prefect's own view (task runs read back from its API: start/end time, total run time; Prefect's
in-task and between-task overhead). Prints what it measured; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_T_PROCESS = time.time()  # the child reports when its interpreter got here (before heavy imports)

ROOT = Path(__file__).resolve().parents[1]
HARDWARE = "x86"


# --------------------------------------------------------------------------------------------
# Child: runs the flow against the Prefect server given in its environment.


def child_main(out: Path, shards: int, trials: int, seed: int) -> int:
    t_imports = time.time()
    from prefect.runtime import flow_run, task_run

    import tunefleet.tasks.steps as task_steps
    from tunefleet.flows.step_flows import tune

    t_imported = time.time()
    bodies: list[dict[str, Any]] = []
    inner = task_steps.tune_shard.fn

    # Time each task body (two clock reads around the real function): the flow calls
    # ``steps.tune_shard`` through the module, so a copy of the task with this fn is what runs.
    def timed_tune_shard(*args: Any, **kwargs: Any) -> Any:
        rec = {"start": time.perf_counter(), "start_epoch": time.time(), "task_run_id": str(task_run.id),
               "flow_run_id": str(flow_run.id)}
        try:
            return inner(*args, **kwargs)
        finally:
            rec["end"] = time.perf_counter()
            rec["end_epoch"] = time.time()
            bodies.append(rec)

    import copy
    import functools

    functools.update_wrapper(timed_tune_shard, inner)
    timed_task = copy.copy(task_steps.tune_shard)
    timed_task.fn = timed_tune_shard
    task_steps.tune_shard = timed_task

    call_epoch = time.time()
    t0 = time.perf_counter()
    summary = tune(hardware=HARDWARE, max_shards=shards, trials_per_iter=trials, seed=seed)
    t1 = time.perf_counter()
    out.write_text(json.dumps({
        "summary": summary, "bodies": bodies, "call_start": t0, "call_end": t1, "call_epoch": call_epoch,
        "process_epoch": _T_PROCESS, "imports_epoch": t_imports, "imported_epoch": t_imported,
        "flow_run_id": bodies[0]["flow_run_id"] if bodies else None,
    }, default=str))
    return 0


# --------------------------------------------------------------------------------------------
# Parent: servers, data, the child, the figures.


def prepare(env: dict[str, str], shards: int, trials: int) -> tuple[int, int]:
    """Ingest ``mlp``, extract for x86, plan shards; returns (shards planned, workloads)."""
    from tunefleet.planning import shard_queue
    from tunefleet.config import load_settings
    from tunefleet.db import Database
    from tunefleet.hardware import seed_hardware_classes
    from tunefleet.models.ingest import ingest
    from tunefleet.models.workloads import extract
    from tunefleet.store import open_store

    settings = load_settings(home=Path(env["TUNEFLEET_HOME"]), database_url=env["TUNEFLEET_DATABASE_URL"])
    db = Database.from_settings(settings)
    try:
        seed_hardware_classes(db, settings)
        store = open_store(settings)
        model = ingest(db, store, "mlp").model
        found = extract(db, store, model, HARDWARE)
        per_workload = math.ceil(shards / found.workloads)
        planned, _ = shard_queue.plan(db, HARDWARE, target_trials=trials * per_workload, shard_trials=trials,
                                    model=model.id)
        return len(planned), found.workloads
    finally:
        db.close()


def run_child(server: Any, env: dict[str, str], out: Path, log: Path, shards: int, trials: int, seed: int,
              poll_s: float) -> tuple[int, float, float]:
    """Run the flow in a subprocess, printing progress; returns (exit code, spawn epoch, wall seconds)."""
    from tunefleet.planning import shard_queue
    from tunefleet.config import load_settings
    from tunefleet.db import Database

    db = Database.from_settings(load_settings(home=Path(env["TUNEFLEET_HOME"]),
                                              database_url=env["TUNEFLEET_DATABASE_URL"]))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", str(out), "--shards", str(shards),
           "--trials", str(trials), "--seed", str(seed)]
    spawn_epoch = time.time()
    t0 = time.monotonic()
    with open(log, "wb") as fh:
        proc = subprocess.Popen(cmd, env=server.env(**env), stdout=fh, stderr=subprocess.STDOUT, cwd=str(ROOT))
    try:
        next_report = t0 + poll_s
        while proc.poll() is None:
            time.sleep(0.5)
            if time.monotonic() >= next_report:
                next_report += poll_s
                done = len(shard_queue.list_shards(db, hardware=HARDWARE, state="done"))
                print(f"  {time.monotonic() - t0:7.0f} s: {done}/{shards} shards done, "
                      f"{db.count_measurements()} measurements", flush=True)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        db.close()
    return proc.returncode, spawn_epoch, time.monotonic() - t0


def read_task_runs(api_url: str, flow_run_id: str, expected: int, wait_s: float = 60.0) -> list[Any]:
    """The flow run's task runs, once Prefect has recorded all of them as finished (or after ``wait_s``)."""
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + wait_s
    with SyncPrefectClient(api_url) as client:
        while True:
            runs: list[Any] = []
            while True:
                page = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
                                             limit=200, offset=len(runs))
                runs += page
                if len(page) < 200:
                    break
            finished = [r for r in runs if r.end_time is not None]
            if len(finished) >= expected or time.monotonic() > deadline:
                return runs
            time.sleep(1)


def _stats(values: list[float]) -> tuple[float, float]:
    """(mean, median) in ms."""
    if not values:
        return float("nan"), float("nan")
    return statistics.fmean(values) * 1e3, statistics.median(values) * 1e3


def report(data: dict[str, Any], task_runs: list[Any], spawn_epoch: float, planned: int, workloads: int,
           trials: int, child_wall: float) -> None:
    summary = data["summary"]
    shard_rows = summary["shards"]
    bodies = sorted(data["bodies"], key=lambda b: b["start"])
    n = len(shard_rows)
    W = data["call_end"] - data["call_start"]
    print()
    print(f"shards planned {planned} ({workloads} workloads x {math.ceil(planned / max(1, workloads))}), "
          f"tuned {n}: {summary['shards_done']} done, {summary['shards_failed']} failed; "
          f"{summary['measured']} candidates measured, {summary['errors']} errors, "
          f"{summary['skipped_known']} skipped as known")
    if n == 0:
        print("no shard was tuned; nothing to report")
        return
    if len(bodies) != n:
        print(f"WARNING: {len(bodies)} task bodies timed for {n} shard results (a task retried or returned None)")

    compute = [r["seconds"] - r["commit_s"] for r in shard_rows]
    lease = [r["lease_s"] for r in shard_rows]
    commit = [r["commit_s"] for r in shard_rows]
    # The flow appends results in order and each result comes from one body, in the same order;
    # a last body that found no shard left (or a retried one) has no result: counted on its own.
    pairs = list(zip(bodies[:n], shard_rows))
    extra = sum(b["end"] - b["start"] for b in bodies[n:])
    body = [b["end"] - b["start"] for b, _ in pairs]
    in_task_all = [bd - r["lease_s"] - r["seconds"] for bd, (_, r) in zip(body, pairs)]
    # The first task also creates the process's tuner (builder and runner worker processes):
    # a one-time start-up that drain() without Prefect pays as well, reported on its own.
    tuner_start, in_task = in_task_all[0], in_task_all[1:]
    between = [bodies[i + 1]["start"] - bodies[i]["end"] for i in range(len(bodies) - 1)]
    flow_start = bodies[0]["start"] - data["call_start"]
    flow_end = data["call_end"] - bodies[-1]["end"]
    overhead = W - sum(compute)
    parts = {
        "lease": (sum(lease), lease),
        "commit + mark done": (sum(commit), commit),
        "in-task other (2nd on)": (sum(in_task), in_task),
        "between tasks (Prefect)": (sum(between), between),
        "flow start (one-time)": (flow_start, []),
        "flow end (one-time)": (flow_end, []),
        "tuner start (one-time)": (tuner_start, []),
    }
    if len(bodies) > n:
        parts["tasks with no shard"] = (extra, [])
    accounted = sum(total for total, _ in parts.values())
    orchestration = overhead - tuner_start

    print()
    print(f"flow wall W {W:.1f} s (child process {child_wall:.1f} s); tuning compute {sum(compute):.1f} s "
          f"(first shard's includes builder warm-up)")
    print(f"all-in overhead (W - compute):        {overhead:8.2f} s = {overhead / n * 1e3:8.1f} ms/shard = "
          f"{overhead / W * 100:6.2f}% of W")
    print(f"orchestration (less tuner start-up):  {orchestration:8.2f} s = {orchestration / n * 1e3:8.1f} ms/shard = "
          f"{orchestration / W * 100:6.2f}% of W   (target <= 5%)")
    if n > 1:
        steady = [lease[i] + commit[i] + in_task_all[i] + between[i - 1] for i in range(1, n)]
        steady_wall = statistics.fmean([body[i] + between[i - 1] for i in range(1, n)])
        steady_mean = statistics.fmean(steady)
        print(f"steady state (shards 2..{n}):          {steady_mean * 1e3:8.1f} ms/shard mean "
              f"({statistics.median(steady) * 1e3:.1f} median) = {steady_mean / steady_wall * 100:6.2f}% of a "
              f"shard's {steady_wall:.2f} s wall")
    print()
    print(f"{'component':<26} {'total s':>9} {'ms/shard':>9} {'mean ms':>9} {'median ms':>10} {'max ms':>9} "
          f"{'% of W':>7}")
    for name, (total, vals) in parts.items():
        mean, med = _stats(vals)
        mx = max(vals) * 1e3 if vals else float("nan")
        print(f"{name:<26} {total:>9.3f} {total / n * 1e3:>9.1f} {mean:>9.1f} {med:>10.1f} {mx:>9.1f} "
              f"{total / W * 100:>6.2f}%")
    print(f"{'= all-in overhead':<26} {accounted:>9.3f} {accounted / n * 1e3:>9.1f} {'':>9} {'':>10} {'':>9} "
          f"{accounted / W * 100:>6.2f}%")
    mean, med = _stats(compute)
    print(f"{'tuning compute':<26} {sum(compute):>9.3f} {sum(compute) / n * 1e3:>9.1f} {mean:>9.1f} {med:>10.1f} "
          f"{max(compute) * 1e3:>9.1f} {sum(compute) / W * 100:>6.2f}%")
    if abs(accounted - overhead) > 0.05:
        print(f"NOTE: components sum to {accounted:.3f} s, W - compute is {overhead:.3f} s")
    later = [r["seconds"] for r in shard_rows[1:]]
    print(f"tune_shard seconds: first shard {shard_rows[0]['seconds']:.2f} s, later median "
          f"{statistics.median(later) if later else float('nan'):.2f} s")

    # Prefect's view of the same task runs.
    print()
    first_body_epoch = bodies[0]["start_epoch"]
    print(f"one-time flow-start latency: {first_body_epoch - spawn_epoch:.2f} s from subprocess spawn to first task "
          f"body (interpreter + imports {data['imported_epoch'] - spawn_epoch:.2f} s, flow call -> first body "
          f"{flow_start:.2f} s)")
    by_id = {b["task_run_id"]: b for b in bodies}
    done = [r for r in task_runs if r.start_time is not None and r.end_time is not None]
    print(f"Prefect task runs for flow run {data['flow_run_id']}: {len(task_runs)} recorded, {len(done)} with "
          f"start and end time; states: "
          + ", ".join(f"{s}: {sum(1 for r in task_runs if r.state_name == s)}"
                      for s in sorted({str(r.state_name) for r in task_runs})))
    matched = [(r, by_id[str(r.id)]) for r in done if str(r.id) in by_id]
    if matched:
        wall = [(r.end_time - r.start_time).total_seconds() for r, _ in matched]
        run_time = [r.total_run_time.total_seconds() for r, _ in matched]
        pbody = [b["end_epoch"] - b["start_epoch"] for _, b in matched]
        pre = [b["start_epoch"] - r.start_time.timestamp() for r, b in matched]
        post = [r.end_time.timestamp() - b["end_epoch"] for r, b in matched]
        ordered = sorted(done, key=lambda r: r.start_time)
        gaps = [(ordered[i + 1].start_time - ordered[i].end_time).total_seconds() for i in range(len(ordered) - 1)]
        print(f"{'Prefect view, per task run':<34} {'mean ms':>10} {'median ms':>10} {'max ms':>10}")
        for name, vals in (("task run wall (end - start)", wall), ("total_run_time", run_time),
                           ("task body (our clock)", pbody),
                           ("wall - body (Prefect in-task)", [w - b for w, b in zip(wall, pbody)]),
                           ("  start -> body entry", pre), ("  body exit -> end", post),
                           ("end -> next task run start", gaps)):
            mean, med = _stats(vals)
            print(f"{name:<34} {mean:>10.1f} {med:>10.1f} {(max(vals) * 1e3 if vals else float('nan')):>10.1f}")
        in_task_ms = statistics.fmean([w - b for w, b in zip(wall, pbody)]) * 1e3
        gap_ms = statistics.fmean(gaps) * 1e3 if gaps else 0.0
        print(f"Prefect's own per-task overhead: {in_task_ms:.1f} ms in the task run + {gap_ms:.1f} ms between task "
              f"runs = {in_task_ms + gap_ms:.1f} ms per shard")
    else:
        print("no recorded task run matches a timed task body (Prefect's task-run recorder may lag)")


def measure(pg: Any, server: Any, work: Path, args: argparse.Namespace) -> int:
    fleet_db = pg.create_database("tunefleet")
    env = {"TUNEFLEET_HOME": str(work / "home"), "TUNEFLEET_DATABASE_URL": pg.url(fleet_db)}
    t1 = time.monotonic()
    planned, workloads = prepare(env, args.shards, args.trials)
    print(f"mlp on {HARDWARE}: {workloads} workloads, {planned} shards of {args.trials} trials planned "
          f"({time.monotonic() - t1:.1f} s); tuning {min(planned, args.shards)} in the tune flow, "
          f"{args.trials} trials per batch, seed {args.seed}", flush=True)
    out, log = work / "result.json", work / "flow.log"
    rc, spawn_epoch, child_wall = run_child(server, env, out, log, args.shards, args.trials, args.seed, args.poll)
    if rc != 0 or not out.exists():
        print(f"flow subprocess exited with {rc}; last of its log ({log}):", flush=True)
        print(log.read_text(errors="replace")[-6000:])
        return 1
    data = json.loads(out.read_text())
    task_runs = read_task_runs(server.api_url, data["flow_run_id"], len(data["bodies"])) if data["flow_run_id"] else []
    report(data, task_runs, spawn_epoch, planned, workloads, args.trials, child_wall)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=100, help="shards to tune (about this many are planned)")
    ap.add_argument("--trials", type=int, default=16, help="trials per shard (and per batch: one batch a shard)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--poll", type=float, default=30.0, help="seconds between progress lines")
    ap.add_argument("--keep", action="store_true",
                    help="keep the work directory (tunefleet home, flow log, result json, server logs)")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        return child_main(args.child, args.shards, args.trials, args.seed)

    import shutil

    from tunefleet.testing.postgres import PostgresServer
    from tunefleet.testing.prefect_server import PrefectServer

    work = Path(tempfile.mkdtemp(prefix="tf-orch-bench-"))
    t0 = time.monotonic()
    try:
        with PostgresServer(fsync=True) as pg:
            with PrefectServer(pg.url(pg.create_database("prefect"), driver="asyncpg")) as server:
                print(f"PostgreSQL 127.0.0.1:{pg.port} (fsync on), Prefect server {server.api_url} "
                      f"({time.monotonic() - t0:.1f} s to start both)", flush=True)
                try:
                    return measure(pg, server, work, args)
                finally:
                    if args.keep:  # both servers delete their directories when they stop
                        for src, name in ((server.home, "server.log"), (pg.dir, "log")):
                            if src is not None and (src / name).exists():
                                shutil.copy(src / name, work / f"{'prefect' if src == server.home else 'postgres'}-{name}")
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
