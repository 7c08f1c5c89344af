"""The Winograd recipe end to end: a class with ``winograd`` on tunes a 32-channel 3x3 convolution
as Winograd for real and builds it from its records.

How the convolutions are computed, which ones qualify and the settings' errors are in
tests/tvm/test_extract.py and tests/engine/test_ingest.py; the database side in the contract
suite.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tunefleet.config import load_settings
from tunefleet.db import Database, NewMeasurement
from tunefleet.delivery.confirm import confirm_by_tile
from tunefleet.delivery.build import build_model
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.worker import drain
from tunefleet.hardware import seed_hardware_classes
from tunefleet.models.ingest import ingest
from tunefleet.models.workloads import extract
from tunefleet.planning import shard_queue
from tunefleet.store import LocalStore
from tunefleet.tvm.partition import PREFER_DEPTH, PREFER_WITHIN, ordered_for_build, splits_by_tile, thread_local
from tunefleet.tvm.threads import class_threads

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # serial: the paired timing needs the two cores


def test_a_winograd_class_tunes_and_builds_winograd_convolutions(tmp_path: Path) -> None:
    """A class with ``winograd`` on: the 3x3 32-channel convolution is tuned as Winograd (TVM's
    own schedule rules for its transforms apply to our compute), and the build finds its records
    and computes what the model does."""
    import torch

    path = tmp_path / "block.onnx"
    block = torch.nn.Sequential(torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU())
    torch.onnx.export(block, (torch.zeros(1, 32, 16, 16),), str(path), dynamo=False, input_names=["x"])
    settings = load_settings(home=tmp_path / "home", hardware={"x86": {"winograd": True}})
    db = Database.from_settings(settings)
    seed_hardware_classes(db, settings)
    store = LocalStore(settings.effective_store_path)
    model = ingest(db, store, str(path)).model
    assert extract(db, store, model, "x86").recipe == "nhwc+prepack+fastmath+fold+winograd"
    workloads = db.workloads(model.id, db.hardware_class("x86").id)
    convs = [wl.name for wl, _ in workloads if wl.op_kind == "conv2d"]
    assert len(convs) == 1 and convs[0].startswith("fused_conv2d_winograd_add_relu"), convs
    shard_queue.plan(db, "x86", target_trials=4, model=model.id)
    summary = drain(db, "x86", TuneOptions(seed=0, trials_per_iter=4))
    assert summary.shards_failed == 0 and summary.errors == 0
    report = build_model(db, store, model, "x86", compare_torch=False)  # checks the outputs
    assert report.database_hits == report.tuned_workloads == report.workloads == len(workloads)
    assert report.max_abs_diff is not None and report.tuned_ms is not None

    # A schedule whose batched products split the transform positions between the threads (the
    # tuned one re-tiled so), recorded fastest: a build times it beside its rewrite split by tile and
    # commits both as paired figures, which rank nothing and decide between the two; once only.
    hw = db.hardware_class("x86")
    threads = class_threads(hw.target)
    conv = next(wl for wl, _ in workloads if wl.op_kind == "conv2d")
    # the fastest searched schedule (the default one, unscheduled, has no tiling to re-tile)
    tuned = next(r for r in db.best_measurements(conv.id, hw.id, 100) if splits_by_tile(r.trace_json) is not None)
    eps_first = _eps_first(tuned.trace_json)
    assert threads >= 2, "a class of one thread hands nothing between threads: run it serial"
    assert splits_by_tile(eps_first) is False
    db.commit_measurements([NewMeasurement(conv.id, hw.id, eps_first, [1e-9], args_info=tuned.args_info)])
    assert confirm_by_tile(db, hw, {conv.id: 1}) == 1
    report = build_model(db, store, model, "x86", compare_torch=False)
    variant = thread_local(eps_first, threads)
    assert variant is not None
    paired = db.paired_measurements(conv.id, hw.id)
    pair = [paired.get(hashlib.sha256(t.encode()).hexdigest()) for t in (eps_first, variant)]
    assert all(r is not None and r.mean_run_s and r.mean_run_s > 1e-6 for r in pair), paired  # timed here
    rows = db.best_measurements(conv.id, hw.id, 100)
    assert rows[0].trace_sha256 == pair[0].trace_sha256 and rows[0].mean_run_s == 1e-9  # the record still ranks
    assert not [r for r in rows if (r.measure_mode or "").startswith("paired:")]
    assert confirm_by_tile(db, hw, {conv.id: 1}) == 0  # paired before: nothing more to time
    won = pair[1].mean_run_s <= pair[0].mean_run_s * (1 + PREFER_WITHIN)
    assert any(n.startswith(f"{int(won)} of 1 Winograd workloads run a schedule whose threads keep their own tiles")
               for n in report.notes), (report.notes, pair)
    assert (ordered_for_build(db, conv.id, hw.id, threads, PREFER_DEPTH)[0].trace_sha256 == pair[1].trace_sha256) == won
    db.close()


def _eps_first(trace_json: str) -> str:
    """The trace with its batched products' outer tiles on the transform positions (eps: 2, nu: 6),
    the tile axis P and the output channels whole at that level: the split that hands data between
    the threads. P goes whole to the second level, so that its rewrite can split it (a tuned P all
    in the inner levels has none)."""
    insts, decisions = json.loads(trace_json)
    block = next(i[3][0] for i in insts if i[0] == "GetSBlock" and i[2][0] == "bgemm")
    loops = next(i[3] for i in insts if i[0] == "GetLoops" and i[1] == [block])[:4]
    tiles = {loops.index(i[1][0]): k for k, i in enumerate(insts) if i[0] == "SamplePerfectTile" and i[1][0] in loops}
    decided = dict((k, d) for k, d in decisions)
    for axis, k in tiles.items():
        f = decided[k]
        total = f[0] * f[1] * f[2] * f[3]
        if axis in (0, 1):  # eps, nu: 6 positions, split 2 x 3 and 6 x 1 at the two outer levels
            decided[k] = [2, 3, 1, 1] if axis == 0 else [6, 1, 1, 1]
        elif axis == 2:  # P: whole at the outermost level, all of it at the next (so a rewrite can split it)
            decided[k] = [1, total, 1, 1]
        else:  # the output channels: whole at the outermost level
            decided[k] = [1, total // (f[2] * f[3]), f[2], f[3]]
    return json.dumps([insts, [[k, decided[k]] for k, _ in decisions]], separators=(",", ":"))
