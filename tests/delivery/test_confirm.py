"""Re-timing each workload's fastest schedules before a build (:mod:`tunefleet.delivery.confirm`).

The tiny zoo ``mlp`` on the host's ``x86`` class; its heaviest workload gets two recorded
schedules (the default one, with an impossibly lucky record, and its design space's), really
built and timed here."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from tunefleet.db import Database, NewMeasurement
from tunefleet.delivery import confirm
from tunefleet.delivery.build import resolve
from tunefleet.models.ingest import ingest
from tunefleet.models.workloads import extract

EMPTY_TRACE = "[[],[]]"  # the default schedule
LUCKY_S = 1e-9  # no dense layer runs in a nanosecond: a record no re-timing can match


def _space_trace(wl: Any, hw: Any) -> str:
    """The workload's first design space (its sampled decisions as drawn) as trace JSON."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tunefleet.tvm.builder import import_tensor_intrinsics
    from tunefleet.tvm.targets import make_target
    from tunefleet.tvm.traces import trace_json_of

    import_tensor_intrinsics()
    ctx = ms.TuneContext(tvm.ir.load_json(wl.tir_json), target=make_target(hw.target),
                         space_generator="post-order-apply", task_name=wl.name, num_threads=1)
    return trace_json_of(ctx.generate_design_space()[0])


def _recorded(db: Database, store: Any) -> tuple[Any, Any, Any, dict[int, int]]:
    """mlp on x86: its heaviest workload recorded with two schedules, another with one."""
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    hw = db.hardware_class("x86")
    workloads = sorted(db.workloads(model.id, hw.id), key=lambda p: -p[0].flops)
    (heavy, _), (single, _) = workloads[0], workloads[1]
    db.commit_measurements([NewMeasurement(heavy.id, hw.id, EMPTY_TRACE, [LUCKY_S] * 5),
                            NewMeasurement(heavy.id, hw.id, _space_trace(heavy, hw), [1e-3] * 5),
                            NewMeasurement(single.id, hw.id, EMPTY_TRACE, [LUCKY_S] * 5)])
    return model, hw, heavy, {wl.id: weight for wl, weight in workloads}


def test_the_fastest_schedules_are_re_timed_once_and_the_lucky_record_gives_way(fleet) -> None:  # type: ignore[no-untyped-def]
    db, store = fleet
    model, hw, heavy, weights = _recorded(db, store)
    since = dt.datetime(2000, 1, 1)
    trials = {r.workload_id: r.committed for r in db.budget_view(hw.id, [model.id], since).rows}

    done = confirm.confirm_bests(db, hw, weights, top=3, rounds=2)
    # the single-schedule workload is left alone; one pass settles the other (both its schedules re-timed)
    assert (done.workloads, done.schedules, done.failed, done.passes, done.unsettled) == (1, 2, 0, 1, 0)
    assert done.workload_ids == [heavy.id] and done.recorded_s == pytest.approx(weights[heavy.id] * LUCKY_S)
    best = db.best_measurements(heavy.id, hw.id, 5)
    assert [m.attempt for m in best] == [1, 1]  # both ranked by their re-timing only
    assert all(m.measure_mode == "retimed:2" and len(m.run_secs) == 2 for m in best)
    assert best[0].mean_run_s > 100 * LUCKY_S
    assert done.confirmed_s == pytest.approx(weights[heavy.id] * best[0].mean_run_s)
    assert done.changed == (best[0].trace_sha256 != NewMeasurement(heavy.id, hw.id, EMPTY_TRACE).trace_sha256)
    # a re-timing is no tuning trial: the budget's counts stay
    assert {r.workload_id: r.committed for r in db.budget_view(hw.id, [model.id], since).rows} == trials

    count = db.count_measurements(heavy.id, hw.id)
    again = confirm.confirm_bests(db, hw, weights, top=3, rounds=2)
    assert (again.workloads, again.schedules) == (0, 0) and db.count_measurements(heavy.id, hw.id) == count
    assert "nothing to do" in again.summary()


def test_a_re_timing_that_fails_leaves_the_schedule_out_and_is_counted(fleet, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    db, store = fleet
    _, hw, heavy, weights = _recorded(db, store)

    def retime(hw: Any, rows: list[Any], **_: Any) -> list[confirm.Retimed]:
        # the lucky record fails to run now; the other re-times at 2 ms
        return [confirm.Retimed(error="RuntimeError: boom", error_kind="run") if m.mean_run_s == LUCKY_S
                else confirm.Retimed(runs=[2e-3, 2e-3]) for _, m in rows]

    monkeypatch.setattr(confirm, "retime", retime)
    done = confirm.confirm_bests(db, hw, weights, top=3, rounds=2)
    assert (done.workloads, done.schedules, done.failed, done.changed) == (1, 2, 1, 1)
    (best,) = db.best_measurements(heavy.id, hw.id, 5)
    assert (best.mean_run_s, best.attempt) == (pytest.approx(2e-3), 1)
    failed = [m for m in db.measurements() if m.workload_id == heavy.id and m.error_kind]
    assert [(m.error_kind, m.error_msg, m.repeat) for m in failed] == [("run", "RuntimeError: boom", 1)]
    assert "1 re-timings failed" in done.summary()


def test_a_re_timing_leaves_no_measuring_process_behind(fleet, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The build that follows a re-timing times the model in this process: the re-timing's runner
    is stopped when it ends, not left to the garbage collector (the test holds a reference, as a
    traceback might)."""
    from tests.processes import live_workers
    from tunefleet.tvm import runner as runners

    db, store = fleet
    _, hw, _, weights = _recorded(db, store)
    held, make = [], runners.make_runner
    monkeypatch.setattr(runners, "make_runner", lambda *a, **k: held.append(make(*a, **k)) or held[-1])
    before = live_workers()
    done = confirm.confirm_bests(db, hw, weights, top=3, rounds=1)
    assert done.schedules == 2 and len(held) == 1
    assert not live_workers() - before


def test_resolve_re_times_before_it_counts_and_says_so_in_the_report(fleet) -> None:  # type: ignore[no-untyped-def]
    db, store = fleet
    model, hw, heavy, _ = _recorded(db, store)
    off = resolve(db, store, model, "x86", confirm_top=0)
    assert off.report.confirmed is None and db.best_measurements(heavy.id, hw.id, 1)[0].mean_run_s == LUCKY_S

    on = resolve(db, store, model, "x86", confirm_top=2)
    assert on.report.confirmed is not None and on.report.confirmed["workloads"] == 1
    assert any(n.startswith("re-timed the 2 fastest schedules of 1 workloads") for n in on.report.notes)
    assert db.best_measurements(heavy.id, hw.id, 1)[0].attempt == 1


def test_a_lucky_record_surfacing_after_a_pass_is_re_timed_in_the_next_with_scripted_timings(
        fleet, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Racing, with the timer scripted (the real one is the first test's): pass 1 re-times the two
    fastest records, both slower than the third record; pass 2 re-times that one with the
    incumbent. With one pass allowed, the workload stays unsettled and the summary says so."""
    db, store = fleet
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    hw = db.hardware_class("x86")
    wl = db.workloads(model.id, hw.id)[0][0]
    traces = {f'[["t{i}"],[]]': s for i, s in enumerate([1e-9, 1.0e-3, 1.1e-3])}
    truth = dict(zip(traces, [3e-3, 2e-3, 1.5e-3]))  # what each schedule re-times at
    db.commit_measurements([NewMeasurement(wl.id, hw.id, t, [s]) for t, s in traces.items()])
    calls: list[list[str]] = []

    def retime(hw: Any, rows: list[Any], **_: Any) -> list[confirm.Retimed]:
        calls.append([m.trace_json for _, m in rows])
        return [confirm.Retimed(runs=[truth[m.trace_json]] * 2) for _, m in rows]

    monkeypatch.setattr(confirm, "retime", retime)
    one = confirm.confirm_bests(db, hw, {wl.id: 1}, top=2, rounds=2, passes=1)
    assert (one.passes, one.schedules, one.unsettled, one.changed) == (1, 2, 1, 1)
    assert "1 workloads still build with a record not re-timed" in one.summary()
    assert db.best_measurements(wl.id, hw.id, 1)[0].trace_json == '[["t2"],[]]'  # its lucky record, not re-timed yet

    rest = confirm.confirm_bests(db, hw, {wl.id: 1}, top=2, rounds=2)
    assert calls[-1] == ['[["t2"],[]]', '[["t1"],[]]']  # the new top with the incumbent, side by side
    assert (rest.passes, rest.unsettled) == (1, 0)
    (best,) = db.best_measurements(wl.id, hw.id, 1)
    assert (best.trace_json, best.attempt, best.mean_run_s) == ('[["t2"],[]]', 1, pytest.approx(1.5e-3))
