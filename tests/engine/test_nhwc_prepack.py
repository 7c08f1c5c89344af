"""The CPU recipe end to end: NHWC + weight prepacking, tuned for real, built with every record.

One backend (SQLite): the database side of recipes is in the contract suite; this checks what
only real TVM shows - the converted, prepacked build computes what the unconverted model does,
its weights are repacked once at build time (never per call), and every measured workload is
found at build time. How layouts convert is in tests/tvm/test_extract.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tunefleet.config import load_settings
from tunefleet.db import Database
from tunefleet.delivery.best import best
from tunefleet.delivery.build import build_model
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.worker import drain
from tunefleet.hardware import seed_hardware_classes
from tunefleet.models.ingest import ingest
from tunefleet.models.workloads import extract
from tunefleet.planning import shard_queue
from tunefleet.store import LocalStore

# serial: which schedule measures fastest decides whether the build prepacks weights; beside
# another test's load the untuned default won once, and nothing was prepacked
pytestmark = [pytest.mark.slow, pytest.mark.serial]


def test_small_cnn_tunes_and_builds_nhwc_prepacked(tmp_path: Path) -> None:
    settings = load_settings(home=tmp_path / "home")
    db = Database.from_settings(settings)
    seed_hardware_classes(db, settings)
    store = LocalStore(settings.effective_store_path)
    model = ingest(db, store, "small-cnn", image_size=16).model
    ex = extract(db, store, model, "x86")
    assert ex.recipe == "nhwc+prepack+fastmath+fold+winograd"
    hw = db.hardware_class("x86")
    workloads = db.workloads(model.id, hw.id)
    assert any(wl.op_kind == "conv2d" for wl, _ in workloads)
    shard_queue.plan(db, "x86", target_trials=8, model=model.id)
    summary = drain(db, "x86", TuneOptions(seed=0, trials_per_iter=8))
    assert summary.shards_failed == 0

    # The search picked packed weight layouts somewhere: RewriteLayout left its mark in a trace.
    traces = [m.trace_json for m in db.measurements() if m.mean_run_s is not None]
    assert any("layout_rewrite" in t for t in traces)
    for wl, _ in workloads:  # never slower than the default schedule (measured first in every shard)
        top = best(db, wl.structural_hash, "x86")[0]
        assert top.untuned_s is not None and top.mean_run_s <= top.untuned_s

    # build_model checks the tuned outputs against the unconverted model's (CorrectnessError if not).
    report = build_model(db, store, model, "x86", compare_torch=False)
    assert report.recipe == "nhwc+prepack+fastmath+fold+winograd"
    assert report.database_hits == report.tuned_workloads == report.workloads == len(workloads)
    assert report.max_abs_diff is not None and report.tuned_ms is not None
    # Weights repacked once at build time: some kernel reads packed weights, and no repacking
    # is left in main (else it would run on every call).
    assert report.prepacked_weights >= 1
    # The class tuned its own recipe only: the others have no stored schedule and are not built.
    assert report.notes == ["not built under recipe native+prepack+fastmath+fold, native+fastmath+fold: no stored "
                            "schedule of its own (its kernels would run default schedules, which the untuned build "
                            "stands for)"]
    assert set(report.builds_ms) == {"nhwc+prepack+fastmath+fold+winograd", "untuned"}
    db.close()

