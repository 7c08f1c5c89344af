"""``FleetDatabase`` on its own, in the style of TVM's database tests.

(``tests/python/s_tir/meta_schedule/test_meta_schedule_database.py`` upstream.) A real tunefleet
:class:`~tunefleet.db.Database` on every backend (``db_url``: SQLite and PostgreSQL), two hardware
classes, a 16x16 matmul and a few real schedule traces of it. What is checked:

* workloads: ``commit_workload`` / ``has_workload``;
* records: a committed record comes back with the same trace, run times, target and args_info
  (also to a fresh ``FleetDatabase``, i.e. from the database and not from a cache);
* top-k: ordered by mean run time, ``k`` larger than the count, ``k == 0``; errors never in it;
* scoping: a record of one hardware class is invisible from another (``get_top_k``, ``__len__``,
  ``get_all_tuning_records``, ``query_tuning_record``);
* predictions: never returned as measurements; only with ``with_predictions=True``, without run
  times, and only while the workload has no measurement;
* MetaSchedule's failed-run marker (``run_secs=[1e10]``) is an error, as in TVM's own databases
  (stored as a run error, never as a latency).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

import pytest
import tvm
from tvm import s_tir
from tvm.ir import IRModule
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

from tests.tvm.conftest import matmul_mod
from tunefleet.db import Database
from tunefleet.tvm.bridge import FleetDatabase, record_parts
from tunefleet.tvm.extract import workload_hash

CLASS_A = "class-a"
CLASS_B = "class-b"
TARGET_SPEC = {"kind": "llvm", "num-cores": 2}


# -- a tiny workload and schedules of it ---------------------------------------------------------


# Six distinct schedules: tunefleet keys a measurement by its trace (a second commit of the same
# trace is an idempotent retry), so unlike TVM's sorting test every record needs its own trace.
SCHEDULES = [(axis, factor) for axis in (0, 1) for factor in (2, 4, 8)]


def _trace(mod: IRModule, axis: int, factor: int) -> Any:
    sch = s_tir.Schedule(mod)
    loops = sch.get_loops(sch.get_sblock("C"))
    sch.split(loops[axis], [None, factor])
    return sch.trace


def _target() -> Any:
    return tvm.target.Target(TARGET_SPEC)


def _record(workload: Workload, schedule: int, run_secs: list[float] | None) -> TuningRecord:
    mod = workload.mod
    return TuningRecord(
        _trace(mod, *SCHEDULES[schedule]),
        workload,
        run_secs,
        _target(),
        ms.arg_info.ArgInfo.from_prim_func(func=mod["main"]),
    )


def _run_secs(record: TuningRecord) -> list[float] | None:
    return None if record.run_secs is None else [float(x) for x in record.run_secs]


def _equal_record(a: TuningRecord, b: TuningRecord) -> None:
    """TVM's ``_equal_record``: trace, run times, target, workload and args_info agree."""
    assert str(a.trace) == str(b.trace)
    assert str(a.trace.as_json()) == str(b.trace.as_json())
    assert _run_secs(a) == pytest.approx(_run_secs(b))
    # the target as a dict: tunefleet stores it with sorted keys, so its printed form may reorder
    assert (a.target is None) == (b.target is None)
    if a.target is not None:
        assert dict(a.target.export()) == dict(b.target.export())
    tvm.ir.assert_structural_equal(a.workload.mod, b.workload.mod)
    assert len(a.args_info) == len(b.args_info)
    for arg0, arg1 in zip(a.args_info, b.args_info):
        assert str(arg0.as_json()) == str(arg1.as_json())


# -- fixtures ------------------------------------------------------------------------------------


@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    """An empty tunefleet database (SQLite and PostgreSQL) with two hardware classes."""
    database = Database(db_url)
    database.upsert_hardware_class(CLASS_A, dict(TARGET_SPEC), CLASS_A)
    database.upsert_hardware_class(CLASS_B, dict(TARGET_SPEC), CLASS_B)
    try:
        yield database
    finally:
        database.close()


@pytest.fixture(scope="module")
def mod() -> IRModule:
    return matmul_mod(16)


# -- workloads -----------------------------------------------------------------------------------


def test_commit_workload_and_has_workload(db: Database, mod: IRModule) -> None:
    fleet = FleetDatabase(db, CLASS_A)
    other = matmul_mod(32)
    assert not fleet.has_workload(mod)
    workload = fleet.commit_workload(mod)
    assert isinstance(workload, Workload)
    tvm.ir.assert_structural_equal(workload.mod, mod)
    assert fleet.has_workload(mod)
    assert not fleet.has_workload(other)
    # stored in the database, not only in this object
    assert FleetDatabase(db, CLASS_A).has_workload(mod)
    assert db.workload(workload_hash(mod)).structural_hash == workload_hash(mod)
    # committing again is idempotent
    fleet.commit_workload(mod)
    assert len(db.workloads()) == 1
    assert len(fleet) == 0  # workloads are not records


# -- records -------------------------------------------------------------------------------------


def test_tuning_record_round_trip(db: Database, mod: IRModule) -> None:
    fleet = FleetDatabase(db, CLASS_A)
    workload = fleet.commit_workload(mod)
    record = _record(workload, 1, [1.5, 2.5, 1.8])
    fleet.commit_tuning_record(record)
    assert len(fleet) == 1

    for reader in (fleet, FleetDatabase(db, CLASS_A)):  # the writer, and a fresh one reading the database
        (got,) = reader.get_top_k(reader.commit_workload(mod), 3)
        _equal_record(got, record)
        assert got.as_json() == record.as_json()
        (everything,) = reader.get_all_tuning_records()
        _equal_record(everything, record)

    # what MetaSchedule's own queries (and so relax's build with a database) see
    best = FleetDatabase(db, CLASS_A).query_tuning_record(mod, _target(), "main")
    assert best is not None
    _equal_record(best, record)


def test_top_k_ordered_by_mean_run_time(db: Database, mod: IRModule) -> None:
    """TVM's sorting case: the order is by the *mean* of run_secs, not its min or first value."""
    fleet = FleetDatabase(db, CLASS_A)
    workload = fleet.commit_workload(mod)
    run_secs = [[7.0, 8.0, 9.0], [1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [1.1, 1.2, 600.0], [1.0, 100.0, 6.0], [4.0, 9.0, 8.0]]
    records = [_record(workload, i, secs) for i, secs in enumerate(run_secs)]
    for record in records:
        fleet.commit_tuning_record(record)
    by_mean = sorted(records, key=lambda r: statistics.fmean(_run_secs(r) or []))

    top2 = fleet.get_top_k(workload, 2)
    assert len(top2) == 2
    for got, want in zip(top2, by_mean[:2]):
        _equal_record(got, want)

    everything = fleet.get_top_k(workload, 100)  # k larger than the count: all of them, in order
    assert len(everything) == len(records)
    for got, want in zip(everything, by_mean):
        _equal_record(got, want)
    means = [statistics.fmean(_run_secs(r) or []) for r in everything]
    assert means == sorted(means)

    (best,) = fleet.get_top_k(workload, 1)
    _equal_record(best, by_mean[0])
    assert fleet.get_top_k(workload, 0) == []
    assert fleet.get_top_k(Workload(matmul_mod(32)), 5) == []  # a workload never committed
    assert len(fleet) == len(records)


def test_records_without_run_times_are_never_top_k(db: Database, mod: IRModule) -> None:
    fleet = FleetDatabase(db, CLASS_A)
    workload = fleet.commit_workload(mod)
    fleet.commit_tuning_record(_record(workload, 0, None))  # a failed build/run: no run times
    assert fleet.get_top_k(workload, 5) == []
    assert fleet.get_all_tuning_records() == []
    assert FleetDatabase(db, CLASS_A).query_tuning_record(mod, _target(), "main") is None

    good = _record(workload, 1, [3.0, 3.0])
    fleet.commit_tuning_record(good)
    fleet.commit_tuning_record(_record(workload, 2, None))
    (only,) = fleet.get_top_k(workload, 5)
    _equal_record(only, good)
    (everything,) = fleet.get_all_tuning_records()
    _equal_record(everything, good)


def test_failed_run_marker_is_an_error(db: Database, mod: IRModule) -> None:
    """MetaSchedule's AddToDatabase commits a run that failed with ``run_secs=[1e10]``; TVM's own
    Memory/JSON databases never return such a record (checked here), so neither may FleetDatabase."""
    failed_run = [1e10]
    stock = ms.database.MemoryDatabase()
    stock.commit_tuning_record(_record(stock.commit_workload(mod), 0, failed_run))
    assert stock.get_top_k(stock.commit_workload(mod), 5) == []
    assert stock.query_tuning_record(mod, _target(), "main") is None

    fleet = FleetDatabase(db, CLASS_A)
    workload = fleet.commit_workload(mod)
    fleet.commit_tuning_record(_record(workload, 0, failed_run))
    assert fleet.get_top_k(workload, 5) == []
    assert fleet.get_all_tuning_records() == []
    assert fleet.query_tuning_record(mod, _target(), "main") is None


def test_records_scoped_to_one_hardware_class(db: Database, mod: IRModule) -> None:
    fleet_a, fleet_b = FleetDatabase(db, CLASS_A), FleetDatabase(db, CLASS_B)
    workload = fleet_a.commit_workload(mod)
    on_a = [_record(workload, 0, [2.0]), _record(workload, 1, [1.0])]
    for record in on_a:
        fleet_a.commit_tuning_record(record)

    assert fleet_b.get_top_k(fleet_b.commit_workload(mod), 5) == []
    assert len(fleet_b) == 0
    assert fleet_b.get_all_tuning_records() == []
    assert fleet_b.query_tuning_record(mod, _target(), "main") is None
    assert len(fleet_a) == 2
    assert len(fleet_a.get_all_tuning_records()) == 2

    # the same trace measured on B is B's own record; A's answers do not change
    on_b = _record(workload, 0, [0.5])
    fleet_b.commit_tuning_record(on_b)
    (got_b,) = fleet_b.get_top_k(workload, 5)
    _equal_record(got_b, on_b)
    (got_b_all,) = fleet_b.get_all_tuning_records()
    _equal_record(got_b_all, on_b)
    assert len(fleet_b) == 1
    got_a = fleet_a.get_top_k(workload, 5)
    assert [_run_secs(r) for r in got_a] == [[1.0], [2.0]]
    assert len(fleet_a) == 2
    assert len(FleetDatabase(db, CLASS_A).get_all_tuning_records()) == 2


# -- predictions ---------------------------------------------------------------------------------


def _predict(db: Database, mod: IRModule, hardware: str, proposals: list[tuple[TuningRecord, float]]) -> None:
    """Store cost-model proposals (trace, score) for ``mod`` on ``hardware``, as the zero-shot path does."""
    parts = [(record_parts(record), score) for record, score in proposals]
    stored = db.add_predictions(
        db.workload(workload_hash(mod)).id,
        db.hardware_class(hardware).id,
        [(p["trace_json"], score, p["args_info"]) for p, score in parts],
    )
    assert stored == len(proposals)


def test_predictions_are_never_measurements(db: Database, mod: IRModule) -> None:
    plain = FleetDatabase(db, CLASS_A)
    workload = plain.commit_workload(mod)
    low, high = _record(workload, 0, None), _record(workload, 1, None)
    _predict(db, mod, CLASS_A, [(low, 0.2), (high, 0.9)])

    # the default database answers with measurements only
    assert plain.get_top_k(workload, 5) == []
    assert plain.get_all_tuning_records() == []
    assert len(plain) == 0
    assert plain.query_tuning_record(mod, _target(), "main") is None

    # asked for: the best-scored predictions, marked by having no run times
    predicting = FleetDatabase(db, CLASS_A, with_predictions=True)
    got = predicting.get_top_k(workload, 5)
    assert len(got) == 2
    assert all(r.run_secs is None for r in got)
    assert [str(r.trace) for r in got] == [str(high.trace), str(low.trace)]  # by score
    assert got[0].trace.as_json() is not None and str(got[0].trace.as_json()) == str(high.trace.as_json())
    assert [str(a.as_json()) for a in got[0].args_info] == [str(a.as_json()) for a in high.args_info]
    assert len(predicting.get_top_k(workload, 1)) == 1
    assert predicting.get_top_k(workload, 0) == []
    assert len(predicting) == 0  # predictions are not records
    # predictions are per hardware class too
    assert FleetDatabase(db, CLASS_B, with_predictions=True).get_top_k(workload, 5) == []

    # once the workload is measured, the measurement answers, never a prediction
    measured = _record(workload, 2, [4.0, 4.0])
    plain.commit_tuning_record(measured)
    for fleet in (plain, FleetDatabase(db, CLASS_A, with_predictions=True)):
        (only,) = fleet.get_top_k(workload, 5)
        _equal_record(only, measured)
        assert _run_secs(only) == [4.0, 4.0]


def test_the_default_schedule_is_stored_as_the_shared_empty_trace(mod: IRModule) -> None:
    """Progress and reports find a workload's default-schedule measurement by this trace's hash."""
    import hashlib

    from tunefleet.tvm.traces import candidate, trace_json_of, trace_sha256_of
    from tunefleet.vocab import DEFAULT_TRACE_JSON, DEFAULT_TRACE_SHA256

    default = candidate(mod)
    assert trace_json_of(default.sch) == DEFAULT_TRACE_JSON
    assert trace_sha256_of(default.sch) == DEFAULT_TRACE_SHA256 == hashlib.sha256(DEFAULT_TRACE_JSON.encode()).hexdigest()
