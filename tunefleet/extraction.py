"""A stored model's tuning tasks for one hardware class, stored once as workloads."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.db.models import Model
    from tunefleet.store import ArtifactStore

log = logging.getLogger(__name__)


@dataclass
class ExtractResult:
    model_id: int
    hardware: str
    workloads: int
    new_workloads: int
    total_weight: int


def extract(db: Database, store: ArtifactStore, model: Model, hardware: str) -> ExtractResult:
    """Extract the tuning tasks of a model for one hardware class and store the workloads once."""
    from tunefleet.models.ingest import load_model
    from tunefleet.tvm.extract import extract_workloads
    from tunefleet.tvm.targets import make_target

    hw = db.hardware_class(hardware)
    loaded = load_model(db, store, model)
    found = extract_workloads(loaded.mod, make_target(hw.target), params=loaded.params)
    new = 0
    for w in found:
        row, created = db.add_workload(structural_hash=w.structural_hash, name=w.name, op_kind=w.op_kind,
                                       flops=float(w.flops), tir_json=w.tir_json)
        new += int(created)
        db.link_model_workload(model.id, row.id, int(w.weight))
    log.info("model %s on %s: %d workloads (%d new)", model.name, hardware, len(found), new)
    return ExtractResult(model.id, hardware, len(found), new, sum(int(w.weight) for w in found))
