"""A bundle made on one class, replayed on another (real tuning; on PostgreSQL only, whose queries the
contract suite checks on both backends, to keep the suite inside CI's time): the hub's schedules are measured here first, as this class's own measurements, and every report says
which came from the hub."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tunefleet import api
from tunefleet.budget import Budget
from tunefleet.engine.worker import Tuner, drain
from tunefleet.planning import shard_queue
from tunefleet.planning.rounds import Rounds
from tunefleet.vocab import DEFAULT_TRACE_SHA256

from tests.conftest import on_backend

pytestmark = pytest.mark.slow


@on_backend("postgresql")
def test_a_bundle_tuned_on_x86_seeds_x86_avx2_in_a_new_database(make_home: Any, tmp_path: Path, db_url: str) -> None:
    from tunefleet.delivery.best import best, export_json_database
    from tunefleet.delivery.build import build_model
    from tunefleet.learning.hub import hub_report
    from tunefleet.planning.transfer import compatibility

    src = make_home("src")
    model = api.ingest(src, "mlp").model
    api.extract(src, model, "x86")
    shard_queue.plan(src.db, "x86", target_trials=8, model=model.id)
    api.tune(src, "x86", src.options(trials_per_iter=8, seed=0))
    exported = api.hub_export(src, tmp_path / "x86.parquet", hardware=["x86"])
    assert exported.workloads == 3

    dst = make_home("dst")  # another database: nothing measured, the bundle imported
    [hub_name] = api.hub_import(dst, tmp_path / "x86.parquet").classes
    db = dst.db
    avx2, hub_class = db.hardware_class("x86-avx2"), db.hardware_class(hub_name)
    assert compatibility(avx2, hub_class) is not None
    model = api.ingest(dst, "mlp").model
    api.extract(dst, model, "x86-avx2")
    before = hub_report(db, [wl.id for wl, _ in db.workloads(model.id, avx2.id)], avx2.id)
    assert (before.workloads, before.from_hub, before.measured) == (3, 3, 0)
    assert before.line().startswith("3 of 3 workloads start from the hub (tuned as x86 on ")
    shard_queue.plan(db, "x86-avx2", target_trials=8, model=model.id)
    summary = api.tune(dst, "x86-avx2", dst.options(trials_per_iter=8, seed=0))
    assert (summary.shards_done, summary.shards_failed) == (3, 0)

    workloads = [wl for wl, _ in db.workloads(model.id, avx2.id)]
    after = hub_report(db, [wl.id for wl in workloads], avx2.id)
    # Each shard (8 trials) measured up to 4 hub schedules first (half its trials), not the default
    # one; its search may find more of the bundle's schedules again (both databases' searches start
    # from the same shipped cost model), never one the bundle does not hold.
    assert 3 <= after.measured <= exported.records and after.failed + after.slower <= after.measured
    origins = db.hub_origins([wl.id for wl in workloads])
    from_hub = 0
    for wl in workloads:
        mine = db.measured_trace_hashes(wl.id, avx2.id)
        seeded = {sha for (wl_id, sha) in origins if wl_id == wl.id} & mine
        assert seeded, f"no hub schedule of {wl.name} was measured on x86-avx2"
        assert db.count_measurements(wl.id, avx2.id) == 8  # the seeds count as the shard's trials
        top = best(db, wl.structural_hash, "x86-avx2")[0]
        assert top.origin.startswith("hub: x86 on ") == ((wl.id, db.best_measurements(wl.id, avx2.id, 1)[0].trace_sha256)
                                                        in origins)
        from_hub += top.origin.startswith("hub:")
    # The hub's own records stay under the hub class: x86-avx2's best are its measurements.
    assert all(r.hardware_class_id == avx2.id for wl in workloads for r in db.best_measurements(wl.id, avx2.id, 10))

    assert export_json_database(db, "x86-avx2", tmp_path / "msdb").from_hub == from_hub
    report = build_model(db, dst.store, model, "x86-avx2", rounds=2, compare_torch=False)
    assert report.hub_workloads == from_hub and report.hub == after.line()
    assert any("from the hub" in n for n in report.notes) == bool(from_hub)

    # A budget too short for a round of search (the build's reserve alone is longer) on a class
    # that never measured the model: each workload measures its default and the hub's 2 best, no more.
    # The clock stands still, past the 1 s budget: the replay round's own deadline is an estimate
    # of its shards' time, which a slow CI machine overran (the third shard was cut), and what this
    # checks is which schedules the round measures, not how fast the machine is.
    api.extract(dst, model, "x86")
    x86 = db.hardware_class("x86")
    options = dst.options(trials_per_iter=8, seed=0)
    tuner = Tuner(db, "x86", options)
    try:
        started = time.time()
        rounds = Rounds("x86", [model.id], Budget(seconds=1), started_at=started, reserve_builds=1,
                        clock=lambda: started + 2)
        summary = drain(db, "x86", options, tuner=tuner, refill=rounds)
    finally:
        tuner.close()
    assert summary.budget is not None and "measure the hub's schedules only" in summary.budget["stopped"]
    assert (summary.measured, summary.shards_done) == (9, 3)
    for wl in workloads:
        assert db.count_measurements(wl.id, x86.id) == 3
        assert DEFAULT_TRACE_SHA256 in db.measured_trace_hashes(wl.id, x86.id)
        assert {sha for (wl_id, sha) in origins if wl_id == wl.id} & db.measured_trace_hashes(wl.id, x86.id)
