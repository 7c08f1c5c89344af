"""End to end on real TVM tuning with tiny models and budgets, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from tunefleet import api
from tests.conftest import on_backend
from tunefleet.planning import shard_queue
from tunefleet.db.database import sha256_text
from tunefleet.delivery.best import best, export_json_database, metaschedule_database
from tunefleet.delivery.build import build_model
from tunefleet.models.ingest import ingest
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.worker import drain
from tunefleet.models.workloads import extract

pytestmark = pytest.mark.slow
EMPTY_TRACE_SHA = sha256_text("[[],[]]")


def test_tune_end_to_end(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings, db, store = engine
    model = ingest(db, store, "mlp").model
    ex = extract(db, store, model, "x86")
    assert ex.workloads == 3
    created, _ = shard_queue.plan(db, "x86", target_trials=12, model=model.id)
    assert len(created) == 3
    summary = drain(db, "x86", TuneOptions(seed=0, trials_per_iter=6))
    assert (summary.shards_done, summary.shards_failed) == (3, 0)
    assert summary.measured == 36
    hw = db.hardware_class("x86")
    for wl, _ in db.workloads(model.id):
        assert db.count_measurements(wl.id, hw.id) == 12
        assert EMPTY_TRACE_SHA in db.measured_trace_hashes(wl.id, hw.id), "default schedule measured as a candidate"
        top = best(db, wl.structural_hash, "x86")[0]
        assert top.untuned_s is not None and top.mean_run_s <= top.untuned_s
        assert db.best_measurements(wl.id, "arm") == []  # target-aware: nothing for another class
    assert shard_queue.plan(db, "x86", target_trials=12, model=model.id)[0] == []

    report = build_model(db, store, model, "x86", output=tmp_path / "mlp.so")
    assert (report.workloads, report.tuned_workloads, report.default_workloads) == (3, 3, 0)
    assert report.tuned_ms is not None and report.untuned_ms is not None
    # What the user would run instead: mlp is built in Relax (no PyTorch module, not ingested as ONNX),
    # so the report says why neither alternative was timed instead of a figure.
    assert (report.torch_ms, report.onnxruntime_ms) == (None, None)
    why_not = ["no PyTorch module for this model: eager latency not measured",
               "no ONNX model and no PyTorch module to export: onnxruntime latency not measured"]
    assert [note for note in report.notes if note in why_not] == why_not
    # Which recipe's build is fastest is a timing, and a busy machine can change it (CI saw the
    # class's recipe at 2 ms beside another at 0.02), or make another recipe's first call slow enough
    # to leave it untimed (a fresh clone's suite saw 2.022 ms, 11x the fastest): the other notes may
    # only say that, or which build was delivered.
    others = [note for note in report.notes if note not in why_not]
    delivered = [note for note in others if note.startswith("delivered ")]
    assert len(delivered) <= 1
    assert all(note.startswith(f"delivered the build under recipe {report.delivered}")
               or note.startswith("delivered the UNTUNED build") for note in delivered)
    # mlp was tuned under the class's recipe only: the other recipe has no stored schedule, not built.
    skipped = ("not built under recipe nhwc+fastmath+fold+winograd: no stored schedule of its own (its kernels "
               "would run default schedules, which the untuned build stands for)")
    assert skipped in others and "nhwc+fastmath+fold+winograd" not in report.builds_ms
    assert all(re.fullmatch(r"the build under recipe \S+ was not timed: its first call took [0-9.]+ ms, [0-9]+x the "
                            r"fastest build's", note) for note in others if note not in (*delivered, skipped)), others
    assert (tmp_path / "mlp.so").stat().st_size > 0

    # Any TVM user can compile with the fleet's schedules, or take them as JSON database files.
    import tvm
    from tvm.s_tir import meta_schedule as ms

    fleet_db = metaschedule_database(db, "x86")
    wl = db.workloads(model.id)[0][0]
    records = fleet_db.get_top_k(fleet_db.commit_workload(tvm.ir.load_json(wl.tir_json)), 2)
    assert len(records) == 2 and records[0].run_secs is not None
    exported = export_json_database(db, "x86", tmp_path / "msdb")
    assert exported == (3, 3, 0, "nhwc+prepack+fastmath+fold+winograd")  # nothing from a hub here; the recipe they need
    loaded = ms.database.JSONDatabase(work_dir=str(tmp_path / "msdb"))
    assert len(loaded) == 3
    # A pipeline with tunefleet but no database builds its own Relax module from the directory alone.
    from tunefleet.models.ingest import load_model

    from tunefleet.tvm.compile import build_with_database

    frontend = load_model(db, store, model)
    built = api.build_exported(frontend.mod, tmp_path / "msdb", params=frontend.params)
    live = build_with_database(frontend.mod, db.hardware_class("x86").target, fleet_db, params=frontend.params)
    # What the database itself gives, but for a workload whose best is the default schedule: the live
    # database returns its empty trace (a hit that schedules nothing), the exported files no record
    # JSONDatabase applies (no hit: the default schedule all the same). Which schedule measures
    # fastest is a timing (CI's load made one default best).
    # A best whose trace is only the postprocessors of the unscheduled function (no sampled
    # decision; the fastest on tiny workloads now and then) is in the exported files, but TVM
    # 0.27's JSONDatabase returns no top-k for it (seen once in a fresh-clone run; its cause in TVM
    # not found): the directory build leaves that workload on its default schedule too.
    bests = [db.best_measurements(wl.id, db.hardware_class("x86").id, 1)[0] for wl, _ in db.workloads(model.id)]
    not_in_files = sum(b.trace_sha256 == EMPTY_TRACE_SHA or (json.loads(b.trace_json)[0] or [[None]])[0][0] == "EnterPostproc"
                       for b in bests)
    assert live.hits and set(built.hits) <= set(live.hits) and len(built.hits) >= len(live.hits) - not_in_files


def _committed(db, shard_id: int) -> dict[int, str]:  # type: ignore[no-untyped-def]
    return {m.id: m.trace_sha256 for m in db.measurements() if m.shard_id == shard_id}


@on_backend("postgresql")
def test_warm_restart_after_kill(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Kill -9 a worker mid-shard: the next worker resumes, measures nothing already committed,
    and every committed measurement survives."""
    settings, db, store = engine
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    (shard, *_), _ = shard_queue.plan(db, "x86", target_trials=20, model=model.id)
    for other in shard_queue.list_shards(db):
        if other.id != shard.id:
            shard_queue.cancel(db, [other.id])

    env = {**os.environ, "TUNEFLEET_HOME": str(settings.home), "TUNEFLEET_DATABASE_URL": settings.effective_database_url}
    worker = subprocess.Popen(
        [sys.executable, "-m", "tunefleet.cli.app", "tune", "--hardware", "x86", "--lease-s", "4",
         "--trials-per-iter", "5", "--seed", "1"],
        env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 300
    while len(_committed(db, shard.id)) < 10:
        assert worker.poll() is None, worker.stderr.read().decode()[-2000:] if worker.stderr else ""
        assert time.monotonic() < deadline, "worker committed nothing in time"
        time.sleep(0.2)
    os.killpg(worker.pid, signal.SIGKILL)  # the worker and its builder processes, mid-shard
    worker.wait(30)
    before = _committed(db, shard.id)
    assert 10 <= len(before) < 20
    assert shard_queue.get_shard(db, shard.id).state == "leased"

    time.sleep(4.5)  # the dead worker's lease expires
    seen: list[str] = []
    summary = drain(db, "x86", TuneOptions(seed=2, trials_per_iter=5, lease_s=30),
                    on_batch=lambda _sid, batch: seen.extend(sha for sha, _ in batch))
    assert summary.shards_done == 1
    after = _committed(db, shard.id)
    assert set(before) <= set(after), "a committed measurement was lost"
    assert not set(seen) & set(before.values()), "run 2 measured a candidate run 1 had committed"
    assert len(seen) == 20 - len(before) and len(after) == 20
    final = shard_queue.get_shard(db, shard.id)
    assert final.state == "done" and (final.leases, final.lost_leases) == (1, 1)  # a lost lease is no attempt
    assert [h["event"] for h in final.history][:3] == ["planned", "leased", "lease-expired"]
