"""Capability-aware transfer on real tuning of the tiny ``mlp``, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from tests.conftest import on_backend
from tunefleet.planning import shard_queue
from tunefleet.db import NewMeasurement
from tunefleet.db.tables import HardwareClass
from tunefleet.delivery.best import best
from tunefleet.delivery.build import build_model
from tunefleet.errors import NotFoundError
from tunefleet.models.ingest import ingest
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.worker import drain, verify_transfer
from tunefleet.models.workloads import extract
from tunefleet.planning.transfer import builds_for, compatibility, transfer_best
from tunefleet.tvm.targets import host_cpu_target

BOGUS_TRACE = '[[["NoSuchInstruction",[],[],["b0"]]],[]]'


def _hw(name: str, target: dict, caps: dict) -> HardwareClass:  # type: ignore[type-arg]
    return HardwareClass(name=name, target=target, node_pool=name, capabilities=caps)


def test_compatibility_rules() -> None:
    x86 = _hw("x86", {"kind": "llvm"}, {"arch": "x86_64", "cores": 2, "isa": ["avx2", "fma"]})
    x86_512 = _hw("big", {"kind": "llvm"}, {"arch": "x86_64", "cores": 2, "isa": ["avx2", "avx512f", "fma"]})
    arm = _hw("arm", {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, {"arch": "aarch64", "isa": ["neon"]})
    sm80 = _hw("a100", {"kind": "cuda", "arch": "sm_80"}, {"arch": "cuda", "sm": "sm_80"})
    sm90 = _hw("h100", {"kind": "cuda", "arch": "sm_90"}, {"arch": "cuda", "sm": "sm_90"})
    assert compatibility(x86, arm) is None and compatibility(arm, x86) is None  # other ISA family
    assert compatibility(x86, sm80) is None
    assert compatibility(sm90, sm80) is not None and compatibility(sm80, sm90) is None  # newer GPU code never goes down
    # a schedule from a class whose ISA the asker fully has is safer than one tuned with avx512
    assert compatibility(x86_512, x86) > compatibility(x86, x86_512)


@pytest.mark.slow
@on_backend("sqlite")
def test_transfer_returns_only_schedules_that_build(engine) -> None:  # type: ignore[no-untyped-def]
    settings, db, store = engine
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    shard_queue.plan(db, "x86", target_trials=6, model=model.id)
    assert drain(db, "x86", TuneOptions(seed=0, trials_per_iter=6)).shards_failed == 0
    x86 = db.hardware_class("x86")
    twin = db.upsert_hardware_class("x86b", host_cpu_target(1), "x86b", capabilities=dict(x86.capabilities))
    wl = db.workloads(model.id)[0][0]
    real_best = db.best_measurements(wl.id, x86.id, 1)[0]
    # the fastest record of x86 is a schedule that cannot be replayed: transfer must skip it
    db.commit_measurements([NewMeasurement(wl.id, x86.id, BOGUS_TRACE, [real_best.mean_run_s / 10])])
    assert db.best_measurements(wl.id, x86.id, 1)[0].trace_json == BOGUS_TRACE
    assert not builds_for(wl, twin, BOGUS_TRACE)

    found = transfer_best(db, wl.structural_hash, "x86b")
    assert found is not None and found.source_hardware == "x86" and found.hardware == "x86b"
    assert found.trace_json == real_best.trace_json and found.as_dict()["source"] == "transferred"
    assert builds_for(wl, twin, found.trace_json)
    assert transfer_best(db, wl.structural_hash, "arm") is None  # aarch64 never borrows x86 schedules
    with pytest.raises(NotFoundError):
        best(db, wl.structural_hash, "x86b")  # transferred schedules are not measurements

    from tunefleet.tvm.bridge import FleetDatabase

    import tvm

    plain = FleetDatabase(db, "x86b")
    borrowing = FleetDatabase(db, "x86b", transfer=lambda wl_id: transfer_best(db, wl_id, "x86b"))
    workload = plain.commit_workload(tvm.ir.load_json(wl.tir_json))
    assert plain.get_top_k(workload, 1) == []
    (record,) = borrowing.get_top_k(workload, 1)
    assert record.run_secs is None  # marked: measured elsewhere

    report = build_model(db, store, model, "x86b", transfer=True, compare_torch=False)
    assert (report.tuned_workloads, report.transferred_workloads, report.default_workloads) == (0, 3, 0)

    verified = transfer_best(db, wl.structural_hash, "x86b")
    assert verified is not None and verify_transfer(db, verified) is not None
    assert verified.verified_mean_run_s is not None
    assert [m.trace_sha256 for m in db.best_measurements(wl.id, twin.id, 5)] == [real_best.trace_sha256]

    # new shards of x86b measure the transferred schedule first (the verified workload is already measured);
    # planning needs the model's workloads on x86b (links are per class: extraction recipes)
    extract(db, store, model, "x86b")
    shard_queue.plan(db, "x86b", target_trials=2, model=model.id)
    assert drain(db, "x86b", TuneOptions(seed=0, trials_per_iter=2)).shards_failed == 0
    for other, _ in db.workloads(model.id, x86.id)[1:]:
        source = db.best_measurements(other.id, x86.id, 1)[0]
        assert source.trace_sha256 in db.measured_trace_hashes(other.id, twin.id)
