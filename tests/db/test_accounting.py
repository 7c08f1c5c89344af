"""Energy accounting arithmetic on SQLite and PostgreSQL, with a scripted meter (no TVM)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tunefleet.db import Database, NewMeasurement
from tunefleet.energy.accounting import ShardAccountant, add_shard_energy, energy_report, shard_state_counts
from tunefleet.energy.meters import EnergyMeter, EnergyReading
from tunefleet.planning import shard_queue


class ScriptedMeter(EnergyMeter):
    """A meter whose cumulative readings are given in advance (test double, not a power source)."""

    source = "estimate"

    def __init__(self, joules: list[float]) -> None:
        self.joules = list(joules)
        self.reads = 0

    def start(self) -> None:
        self.reads = 0

    def read(self) -> EnergyReading:
        value = self.joules[min(self.reads, len(self.joules) - 1)]
        self.reads += 1
        return EnergyReading(value, self.source, wall_s=10.0 * self.reads, cpu_s=5.0 * self.reads)


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    database.upsert_hardware_class("x86", {"kind": "llvm", "num-cores": 2}, "x86", watts_per_core=10.0,
                                   idle_watts=20.0, price_per_hour=3.6)
    yield database
    database.close()


def _m(db: Database, wl: int, trace: str, mean: float | None, build_s: float = 1.0, shard: int | None = None
       ) -> NewMeasurement:
    hw = db.hardware_class("x86").id
    if mean is None:
        return NewMeasurement(wl, hw, trace, None, build_s=build_s, error_kind="build", error_msg="x", shard_id=shard)
    return NewMeasurement(wl, hw, trace, [mean], build_s=build_s, shard_id=shard)


def test_rounds_split_energy_and_mark_useful_candidates(db: Database) -> None:
    wl, _ = db.add_workload(structural_hash="a" * 16, name="w", op_kind="dense", flops=1.0, tir_json="{}")
    db.commit_measurements([_m(db, wl.id, "old", 0.5)])  # best so far: 0.5 s
    hw = db.hardware_class("x86")
    acc = ShardAccountant(db, hw, wl, meter=ScriptedMeter([30.0, 70.0, 75.0]))
    round1 = [_m(db, wl.id, "t1", 0.6), _m(db, wl.id, "t2", 0.4, build_s=2.0), _m(db, wl.id, "t3", None)]
    r1 = acc.annotate(round1)
    # 30 J split by build + run seconds: 1.6, 2.4, 1.0 of 5.0
    assert [round(r.energy_j, 6) for r in round1] == [9.6, 14.4, 6.0]
    assert [r.useful for r in round1] == [False, True, False]  # only t2 beat 0.5 s; errors are wasted
    assert (r1.useful, r1.wasted, r1.build_errors) == (1, 2, 1)
    round2 = [_m(db, wl.id, "t4", 0.4), _m(db, wl.id, "t5", 0.3)]
    r2 = acc.annotate(round2)
    assert r2.joules == pytest.approx(40.0)  # cumulative 70 J minus the 30 J already accounted
    assert [r.useful for r in round2] == [False, True]  # equal is not better; 0.3 beats 0.4
    db.commit_measurements(round1 + round2)
    total = acc.finish()
    assert total.joules == 75.0 and total.source == "estimate"
    assert total.cost == pytest.approx(3.6 * total.node_s / 3600)


def test_report_splits_shared_workloads_by_weight(db: Database) -> None:
    a, _ = db.add_model(name="a", source="zoo", format="x", sha256="1" * 64, artifact_uri="u1")
    b, _ = db.add_model(name="b", source="zoo", format="x", sha256="2" * 64, artifact_uri="u2")
    shared, _ = db.add_workload(structural_hash="s" * 16, name="s", op_kind="dense", flops=1.0, tir_json="{}")
    only_a, _ = db.add_workload(structural_hash="o" * 16, name="o", op_kind="dense", flops=1.0, tir_json="{}")
    db.link_model_workload(a.id, shared.id, 1)
    db.link_model_workload(b.id, shared.id, 3)
    db.link_model_workload(a.id, only_a.id, 2)
    created, _ = shard_queue.plan(db, "x86", target_trials=4)
    hw = db.hardware_class("x86")
    for shard in created:
        wl = db.workload(shard.workload_id)
        acc = ShardAccountant(db, hw, wl, meter=ScriptedMeter([40.0, 40.0]))
        recs = [_m(db, wl.id, f"{wl.name}{i}", mean, shard=shard.id) for i, mean in enumerate([0.2, 0.3, 0.1, None])]
        acc.annotate(recs)  # weights 1.2, 1.3, 1.1, 1.0: useful 0.2 and 0.1
        db.commit_measurements(recs)
        add_shard_energy(db, shard.id, acc.finish())
    rows = {(r.model, r.hardware): r for r in energy_report(db)}
    ra, rb = rows[("a", "x86")], rows[("b", "x86")]
    # a: all of only_a (40 J) + 1/4 of shared (10 J); b: 3/4 of shared (30 J)
    assert ra.joules == pytest.approx(50.0) and rb.joules == pytest.approx(30.0)
    useful_share = (1.2 + 1.1) / 4.6
    assert ra.useful_joules == pytest.approx(50.0 * useful_share)
    assert ra.wasted_pct == pytest.approx(100 * (1 - useful_share))
    assert (ra.trials, ra.errors, rb.trials) == (8, 2, 4)
    # best latency = sum of best mean x calls: a = 0.1 x 1 + 0.1 x 2 s
    assert ra.best_latency_ms == pytest.approx(300.0) and rb.best_latency_ms == pytest.approx(300.0)
    # money: each shard's node time (10 s per read, 2 reads) at 3.6/h = 0.02; a gets 1 + 1/4 shards
    assert ra.cost == pytest.approx(0.02 * 1.25) and rb.cost == pytest.approx(0.02 * 0.75)
    assert ra.sources == "estimate" and ra.kwh == pytest.approx(50.0 / 3.6e6)
    only = energy_report(db, model="b")
    assert [r.model for r in only] == ["b"]
    assert shard_state_counts(db)["x86"] == {"pending": 2}
