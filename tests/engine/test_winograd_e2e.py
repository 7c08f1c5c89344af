"""The Winograd recipe end to end: a class with ``winograd`` on tunes a 32-channel 3x3 convolution
as Winograd for real and builds it from its records.

How the convolutions are computed, which ones qualify and the settings' errors are in
tests/tvm/test_extract.py and tests/engine/test_ingest.py; the database side in the contract
suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tunefleet.config import load_settings
from tunefleet.db import Database
from tunefleet.delivery.build import build_model
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.worker import drain
from tunefleet.hardware import seed_hardware_classes
from tunefleet.models.ingest import ingest
from tunefleet.models.workloads import extract
from tunefleet.planning import shard_queue
from tunefleet.store import LocalStore

pytestmark = pytest.mark.slow


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
    db.close()
