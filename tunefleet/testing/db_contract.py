"""Contract test suite for :class:`tunefleet.db.Database`, shipped with the package.

Bind it to a backend by subclassing in a test module and providing a ``db_url`` fixture that
yields the URL of an empty database::

    class TestMyBackend(DatabaseContract):
        pass

Every backend tunefleet supports runs this whole suite (tests/db/test_db_contract.py). The
cases of shards and leases (:class:`ShardCases`) and of reports, export bookkeeping and the
learning registry (:class:`ReportCases`) are part of :class:`DatabaseContract`.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import event, text
from sqlalchemy.engine import make_url

from tunefleet.db import Database, NewMeasurement, TrialGrant, current_revision, downgrade, head_revision, upgrade
from tunefleet.db.database import sha256_text
from tunefleet.db.tables import TuningState, utcnow
from tunefleet.db.measurements import _COPY_MIN_ROWS
from tunefleet.errors import (ConflictError, DatabaseUnavailableError, NotFoundError, ParameterError, SchemaOutdatedError,
                              SchemaTooNewError)
from tunefleet.testing.tcp_proxy import TcpProxy
from tunefleet.vocab import CANCELLED, DEFAULT_TRACE_JSON, DONE, FAILED, FILTERED, LEASED, PENDING

TARGET = {"kind": "llvm", "num-cores": 2}


def _trace(i: int, size: int = 2500) -> str:
    body = f'{{"insts": [["SamplePerfectTile", {i}]], "decisions": [{i}]}}'
    return body + " " * max(0, size - len(body))


def _commit_worker(url: str, wl_id: int, hw_id: int, offset: int, n: int, batch: int) -> None:
    db = Database(url)
    for start in range(0, n, batch):
        db.commit_measurements(
            NewMeasurement(wl_id, hw_id, _trace(offset + i), [1e-3 + (offset + i) * 1e-6])
            for i in range(start, min(n, start + batch))
        )
    db.close()


def _state(wl: int, hw: int, *, preempted: bool = False) -> TuningState:
    return TuningState(workload_id=wl, hardware_class_id=hw, rounds=0, stale_rounds=0, best_s=None, recent=[],
                       preempted=preempted, reason=None, freed_trials=0)


def _workloads(db: Database, n: int) -> list[int]:
    """``n`` more workloads (a workload has one leased shard at a time: shards leased together
    belong to different workloads)."""
    return [db.add_workload(structural_hash=f"ff{i:02d}", name=f"w{i}", op_kind="dense", flops=1e6,
                            tir_json="{}")[0].id for i in range(n)]


class ShardCases:
    """Shard rows and the lease state machine: every change a compare-and-set on state (and owner).

    Part of :class:`DatabaseContract` (its ``seeded`` fixture: classes x86 and arm, workload 00ab).
    """

    def test_planning_view_counts_spent_and_outstanding_trials(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, arm = seeded
        wl2, _ = db.add_workload(structural_hash="00cd", name="conv", op_kind="conv2d", flops=0.0, tir_json="{}")
        model, _ = db.add_model(name="m", source="zoo", format="x", sha256="a" * 64, artifact_uri="u")
        db.link_model_workload(model.id, wl, 3)
        db.commit_measurements(NewMeasurement(wl, hw, _trace(i), [0.1]) for i in range(2))
        created = db.add_shards(hw, [(wl, 10, 3.5), (wl, 5, 3.5)], max_leases=2)
        assert [(s.trials, s.priority, s.state, s.max_leases) for s in created] == [(10, 3.5, PENDING, 2),
                                                                                       (5, 3.5, PENDING, 2)]
        assert [e["event"] for e in db.shard(created[0].id).history] == ["planned"]
        assert db.add_shards(hw, []) == []
        leased = db.lease_shard(hw, "w", lease_s=60)
        assert leased is not None and leased.id == created[0].id  # equal priority: lowest id first
        db.save_tuning_state(_state(wl2.id, hw, preempted=True))
        view = db.planning_view(hw)
        assert [(r.workload_id, r.structural_hash, r.weight, r.measured, r.trials_by_state, r.preempted)
                for r in view] == [(wl, "00ab", 3, 2, {PENDING: 5, LEASED: 10}, False),
                                   (wl2.id, "00cd", 1, 0, {}, True)]
        assert [r.workload_id for r in db.planning_view(hw, model.id)] == [wl]
        assert [(r.measured, r.trials_by_state, r.preempted) for r in db.planning_view(arm)] == [(0, {}, False)] * 2

    def test_budget_view_sums_history_open_trials_and_rounds(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, arm = seeded
        wl2, _ = db.add_workload(structural_hash="00cd", name="conv", op_kind="conv2d", flops=5.0, tir_json="{}")
        wl3, _ = db.add_workload(structural_hash="00ef", name="other", op_kind="dense", flops=1.0, tir_json="{}")
        m1, _ = db.add_model(name="m1", source="zoo", format="x", sha256="1" * 64, artifact_uri="u")
        m2, _ = db.add_model(name="m2", source="zoo", format="x", sha256="2" * 64, artifact_uri="u")
        db.link_model_workload(m1.id, wl, 2)
        db.link_model_workload(m2.id, wl, 3)
        db.link_model_workload(m1.id, wl2.id, 1)
        db.link_model_workload(m2.id, wl3.id, 1)  # not in m1
        old = db.add_shards(hw, [(wl, 2, 1.0)])[0]
        db.commit_measurements([NewMeasurement(wl, hw, DEFAULT_TRACE_JSON, [0.5], shard_id=old.id, build_s=1.0,
                                               energy_j=2.0)])
        since = utcnow()
        a, b = db.add_shards(hw, [(wl, 4, 9.0), (wl2.id, 6, 8.0)], info={"round": 2, "budget": "40"})
        assert db.shard(a.id).history[0]["round"] == 2 and db.shard(a.id).history[0]["event"] == "planned"
        db.commit_measurements([
            NewMeasurement(wl, hw, _trace(1), [0.25], shard_id=a.id, build_s=3.0, energy_j=4.0),
            NewMeasurement(wl, hw, _trace(2), None, error_kind="run", error_msg="x", shard_id=a.id),
            NewMeasurement(wl, hw, _trace(3), None, error_kind=FILTERED, shard_id=a.id),
            NewMeasurement(wl, arm, _trace(4), [0.01]),  # another class
        ])
        assert db.lease_shard(hw, "w", lease_s=60, shard_id=b.id) is not None
        db.end_lease(b.id, "w", state=DONE, error=None, event="done-short", info={"cause": "exhausted"})
        db.save_tuning_state(_state(wl2.id, hw, preempted=True))
        view = db.budget_view(hw, [m1.id], since - dt.timedelta(seconds=1))
        r1, r2 = view.rows
        assert (r1.workload_id, r1.weight, r1.flops, r1.run_s, r1.committed, r1.committed_since) == (
            wl, 2, 2e6, [0.5, 0.25, None], 4, 4)  # (second resolution on SQLite: the old row too)
        assert (r1.outstanding, r1.default_s, r1.exhausted, r1.preempted) == (1 + 1, 0.5, False, False)
        assert (r1.joules_per_trial, r1.build_s) == (3.0, 2.0)
        assert (r2.workload_id, r2.outstanding, r2.exhausted, r2.preempted, r2.run_s) == (wl2.id, 0, True, True, [])
        assert (view.rounds, view.open_round_shards) == (2, [a.id])
        both = db.budget_view(hw, [m1.id, m2.id], since - dt.timedelta(seconds=1))
        assert [(r.workload_id, r.weight) for r in both.rows] == [(wl, 5), (wl2.id, 1), (wl3.id, 1)]
        later = db.budget_view(hw, [m1.id], utcnow() + dt.timedelta(minutes=1))
        assert (later.rounds, later.open_round_shards, later.rows[0].committed_since) == (0, [], 0)
        assert db.budget_view(arm, [m1.id], since).rows[0].run_s == [0.01]
        assert db.budget_view(hw, [], since) == db.budget_view(hw, [m1.id + m2.id], since)

    def test_lease_goes_to_the_highest_priority_and_only_once(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, arm = seeded
        (wl2,) = _workloads(db, 1)
        low, high = db.add_shards(hw, [(wl, 8, 1.0), (wl2, 8, 5.0)])
        now = utcnow().replace(microsecond=0)
        first = db.lease_shard(hw, "a", lease_s=60, now=now)
        assert first is not None and first.id == high.id
        assert (first.state, first.lease_owner, first.leases) == (LEASED, "a", 1)
        assert first.lease_expires_at == now + dt.timedelta(seconds=60)
        assert db.lease_shard(hw, "b", lease_s=60, shard_id=high.id) is None  # taken
        assert db.lease_shard(arm, "b", lease_s=60) is None  # per class
        second = db.lease_shard(hw, "b", lease_s=60)
        assert second is not None and second.id == low.id
        assert db.lease_shard(hw, "c", lease_s=60) is None
        assert db.heartbeat_lease(high.id, "a", lease_s=600)
        assert db.shard(high.id).lease_expires_at > now + dt.timedelta(seconds=300)
        assert not db.heartbeat_lease(high.id, "b", lease_s=600)
        again = db.reclaim_lease(hw, "a", lease_s=60)
        assert again is not None and again.id == high.id and again.leases == 1
        assert db.shard(high.id).history[-1]["event"] == "reclaimed"
        assert db.reclaim_lease(hw, "c", lease_s=60) is None
        assert db.reclaim_lease(arm, "a", lease_s=60) is None
        assert db.reclaim_lease(hw, "a", lease_s=60, shard_id=low.id) is None  # b's

    def test_release_leases_gives_back_only_this_process_leases(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, _ = seeded
        mine, task, other, done = db.add_shards(hw, [(w, 8, 4.0 - i) for i, w in enumerate([wl, *_workloads(db, 3)])])
        assert db.lease_shard(hw, "host:12", lease_s=60, shard_id=mine.id) is not None
        assert db.lease_shard(hw, "host:12:task-run", lease_s=60, shard_id=task.id) is not None
        assert db.lease_shard(hw, "host:123", lease_s=60, shard_id=other.id) is not None  # another pid
        assert db.lease_shard(hw, "host:12", lease_s=60, shard_id=done.id) is not None
        assert db.end_lease(done.id, "host:12", state=DONE, error=None, event="done")
        assert sorted(db.release_leases("host:12")) == [mine.id, task.id]
        for shard in (mine, task):
            got = db.shard(shard.id)
            assert (got.state, got.lease_owner, got.leases) == (PENDING, None, 0)  # the lease is not spent
            assert got.history[-1]["event"] == "released"
        assert (db.shard(other.id).state, db.shard(done.id).state) == (LEASED, DONE)
        assert db.release_leases("host:12") == []

    def test_end_lease_refuses_another_owner_or_state(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, _ = seeded
        (shard,) = db.add_shards(hw, [(wl, 8, 1.0)])
        past = utcnow() - dt.timedelta(hours=1)
        assert db.lease_shard(hw, "a", lease_s=1, now=past) is not None
        assert [s.id for s in db.expired_leases(utcnow())] == [shard.id]
        assert db.expired_leases(past) == []
        assert not db.end_lease(shard.id, "b", state=DONE, error=None, event="done")
        assert db.shard(shard.id).state == LEASED
        assert db.end_lease(shard.id, "a", state=FAILED, error="boom", event="x", info={"to": FAILED})
        got = db.shard(shard.id)
        assert (got.state, got.lease_owner, got.lease_expires_at, got.error) == (FAILED, None, None, "boom")
        assert {k: v for k, v in got.history[-1].items() if k != "at"} == {"event": "x", "owner": "a", "to": FAILED}
        assert not db.end_lease(shard.id, "a", state=DONE, error=None, event="done")  # no longer leased
        assert db.expired_leases(utcnow()) == []
        with pytest.raises(NotFoundError, match="no shard 999999"):
            db.end_lease(999999, "a", state=DONE, error=None, event="done")

    def test_retry_and_cancel_move_only_their_states(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, arm = seeded
        pending, leased, failed, done = db.add_shards(hw, [(w, 8, 4.0 - i) for i, w in enumerate([wl, *_workloads(db, 3)])])
        for shard, end in ((leased, None), (failed, FAILED), (done, DONE)):
            assert db.lease_shard(hw, "w", lease_s=60, shard_id=shard.id) is not None
            if end is not None:
                assert db.end_lease(shard.id, "w", state=end, error="e", event=end)
        assert [s.id for s in db.shards(states=[LEASED])] == [leased.id]
        assert db.cancel_shards(hardware_class_id=arm) == []
        assert db.cancel_shards([pending.id, leased.id, failed.id, done.id]) == [pending.id, leased.id, failed.id]
        assert not db.heartbeat_lease(leased.id, "w", lease_s=60)  # its worker lost the lease
        assert db.shard(leased.id).lease_owner is None
        assert db.shard(done.id).state == DONE
        assert db.retry_shards([pending.id, done.id]) == [pending.id]
        got = db.shard(pending.id)
        assert (got.state, got.leases, got.error) == (PENDING, 0, None)
        assert got.history[-1]["event"] == "retry" and got.history[-1]["previous"] == CANCELLED
        assert db.retry_shards(hardware_class_id=hw) == [leased.id, failed.id]
        assert [s.id for s in db.shards()] == [pending.id, leased.id, failed.id, done.id]
        assert [s.id for s in db.shards(shard_ids=[done.id], hardware_class_id=hw)] == [done.id]
        assert db.shards(hardware_class_id=arm) == []
        with pytest.raises(NotFoundError, match="no shard 999999"):
            db.shard(999999)

    def test_priorities_and_grants_touch_only_pending_shards(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, _ = seeded
        wl2, _ = db.add_workload(structural_hash="00cd", name="conv", op_kind="conv2d", flops=1.0, tir_json="{}")
        leased, pending = db.add_shards(hw, [(wl2.id, 8, 9.0), (wl, 8, 1.0)])
        assert db.lease_shard(hw, "w", lease_s=60) is not None
        assert db.pending_shards(hw) == [(pending.id, wl)]
        assert db.set_shard_priorities({pending.id: 7.0, leased.id: 0.5}) == 1
        assert (db.shard(pending.id).priority, db.shard(leased.id).priority) == (7.0, 9.0)
        event = {"at": "now", "event": "reallocated"}
        grants = [TrialGrant(wl, 4, 1.0, event), TrialGrant(wl2.id, 3, 2.5, event), TrialGrant(wl, 0, 1.0, event)]
        out = db.grant_trials(hw, grants, max_leases=5)
        assert [(g.workload_id, extended) for _, g, extended in out] == [(wl, True), (wl2.id, False)]
        assert out[0][0] == pending.id
        got = db.shard(pending.id)
        assert got.trials == 12 and got.priority == 7.0 and got.history[-1] == event
        new = db.shard(out[1][0])
        assert (new.workload_id, new.trials, new.priority, new.state, new.max_leases, new.history) == (
            wl2.id, 3, 2.5, PENDING, 5, [event])
        assert db.shard(leased.id).trials == 8

    def test_shard_energy_adds_up_and_states_are_counted(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, _ = seeded
        shard, _ = db.add_shards(hw, [(wl, 8, 1.0), (wl, 8, 1.0)])
        assert db.lease_shard(hw, "w", lease_s=60, shard_id=shard.id) is not None
        db.add_shard_energy(shard.id, joules=2.0, source="estimate", node_s=1.0, cpu_s=0.5, cost=0.25)
        db.add_shard_energy(shard.id, joules=3.0, source="rapl", node_s=2.0, cpu_s=1.5, cost=0.5)
        got = db.shard(shard.id)
        assert (got.energy_j, got.energy_source, got.node_s, got.cpu_s, got.cost) == (5.0, "rapl", 3.0, 2.0, 0.75)
        assert db.shard_state_counts() == {"x86": {PENDING: 1, LEASED: 1}, "arm": {}}


class ReportCases:
    """Aggregates over measurements and shards, export bookkeeping, the learning registry.

    Part of :class:`DatabaseContract` (its ``seeded`` fixture).
    """

    def test_model_progress_counts_shards_trials_and_recent_rows(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, arm = seeded
        model, _ = db.add_model(name="p", source="zoo", format="x", sha256="b" * 64, artifact_uri="u")
        db.link_model_workload(model.id, wl, 2)
        before = utcnow() - dt.timedelta(seconds=1)
        a, b, c = db.add_shards(hw, [(wl, 4, 1.0), (wl, 6, 1.0), (wl, 9, 1.0)])
        db.cancel_shards([c.id])
        db.commit_measurements([
            NewMeasurement(wl, hw, DEFAULT_TRACE_JSON, [0.4], shard_id=a.id),
            NewMeasurement(wl, hw, _trace(20), [0.1], shard_id=a.id),
            NewMeasurement(wl, hw, _trace(21), None, error_kind="build", error_msg="x", shard_id=a.id),
            NewMeasurement(wl, hw, _trace(22), None, error_kind=FILTERED, shard_id=b.id),
            NewMeasurement(wl, arm, _trace(23), [0.01]),  # another class: not counted
            NewMeasurement(wl, hw, _trace(20), [0.12], repeat=1),  # a re-timing (build --confirm-top): no candidate
        ])
        (row,) = db.model_progress(model.id, hw, before)
        assert (row.workload_id, row.name, row.weight) == (wl, "dense", 2)
        assert row.shards == {PENDING: 2, CANCELLED: 1} and (row.trials, row.spent) == (10, 4)
        assert (row.measured_since, row.errors_since) == (4, 1)  # filtered rows count, and are no error
        assert (row.best_s, row.default_s) == (0.1, 0.4)
        (later,) = db.model_progress(model.id, hw, utcnow() + dt.timedelta(minutes=1))
        assert (later.measured_since, later.errors_since) == (0, 0)
        assert db.model_progress(model.id + 1, hw, before) == []

    def test_model_progress_counts_recent_rows_from_an_index_not_the_rows(self, seeded: tuple[Database, int, int, int]) -> None:
        """The live line reads model_progress once a second during a run: its count of the rows
        committed since the run started reads ``ix_measurements_recent`` (on SQLite as a covering
        index: the plan says so), not every measurement row with its trace."""
        from sqlalchemy import inspect

        db, wl, hw, _ = seeded
        assert "ix_measurements_recent" in {i["name"] for i in inspect(db.engine).get_indexes("measurements")}
        model, _ = db.add_model(name="p", source="zoo", format="x", sha256="c" * 64, artifact_uri="u")
        db.link_model_workload(model.id, wl, 1)
        seen: list[tuple[str, object]] = []

        def capture(conn: object, cursor: object, statement: str, parameters: object, *_: object) -> None:
            if "measurements.created_at >=" in statement:
                seen.append((statement, parameters))

        event.listen(db.engine, "before_cursor_execute", capture)
        try:
            db.model_progress(model.id, hw, utcnow() - dt.timedelta(hours=1))
        finally:
            event.remove(db.engine, "before_cursor_execute", capture)
        ((statement, parameters),) = seen
        if db.dialect == "sqlite":
            with db.engine.connect() as conn:
                plan = " ".join(str(row[3]) for row in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + statement,
                                                                             parameters))  # type: ignore[arg-type]
            assert "COVERING INDEX ix_measurements_recent" in plan, plan

    def test_queue_progress_counts_the_given_shards_per_workload(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, _ = seeded
        before = utcnow() - dt.timedelta(seconds=1)
        a, b, other = db.add_shards(hw, [(wl, 4, 1.0), (wl, 6, 1.0), (wl, 9, 1.0)])
        db.commit_measurements([
            NewMeasurement(wl, hw, _trace(30), [0.1], shard_id=a.id),
            NewMeasurement(wl, hw, _trace(31), None, error_kind="run", error_msg="x", shard_id=b.id),
            NewMeasurement(wl, hw, _trace(32), [0.2], shard_id=other.id),  # not asked for
        ])
        (row,) = db.queue_progress([a.id, b.id], before)
        assert (row.workload_id, row.name, row.shards, row.trials, row.spent) == (wl, "dense", {PENDING: 2}, 10, 2)
        assert (row.measured_since, row.errors_since, row.best_s, row.default_s) == (2, 1, None, None)
        assert db.queue_progress([], before) == []

    def test_energy_totals_group_measurements_with_costs_and_links(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, arm = seeded
        m1, _ = db.add_model(name="a", source="zoo", format="x", sha256="1" * 64, artifact_uri="u")
        m2, _ = db.add_model(name="b", source="zoo", format="x", sha256="2" * 64, artifact_uri="u")
        db.link_model_workload(m1.id, wl, 2)
        db.link_model_workload(m2.id, wl, 1)
        db.commit_measurements([
            NewMeasurement(wl, hw, _trace(1), [0.2], energy_j=1.0, energy_source="rapl", useful=True),
            NewMeasurement(wl, hw, _trace(2), [0.1], energy_j=2.0, energy_source="rapl", useful=True),
            NewMeasurement(wl, hw, _trace(3), None, error_kind="run", energy_j=4.0, energy_source="rapl", useful=False),
            NewMeasurement(wl, hw, _trace(4), None, error_kind=FILTERED, energy_j=0.0, useful=False),
            NewMeasurement(wl, arm, _trace(5), [0.3], energy_j=8.0, energy_source="estimate", useful=True),
        ])
        (shard,) = db.add_shards(hw, [(wl, 8, 1.0)])
        db.add_shard_energy(shard.id, joules=7.0, source="rapl", node_s=1.0, cpu_s=1.0, cost=0.5)
        totals = db.energy_totals()
        assert totals.hardware_names == {hw: "x86", arm: "arm"}
        assert totals.model_names == {m1.id: "a", m2.id: "b"}
        assert sorted(totals.links) == sorted([(m1.id, wl, 2), (m2.id, wl, 1)])
        assert totals.workload_counts == {m1.id: 1, m2.id: 1}
        assert totals.shard_costs == {(wl, hw): 0.5}
        groups = {(g.hardware_class_id, g.useful, g.energy_source): g for g in totals.groups}
        useful = groups[(hw, True, "rapl")]
        assert (useful.joules, useful.count, useful.errors, useful.best_s, useful.filtered) == (3.0, 2, 0, 0.1, 0)
        wasted = groups[(hw, False, "rapl")]
        assert (wasted.joules, wasted.count, wasted.errors, wasted.best_s, wasted.filtered) == (4.0, 1, 1, None, 0)
        filtered = groups[(hw, False, None)]
        assert (filtered.count, filtered.errors, filtered.filtered) == (1, 1, 1)
        assert groups[(arm, True, "estimate")].joules == 8.0
        assert {g.hardware_class_id for g in db.energy_totals(arm).groups} == {arm}

    def test_measurement_timeline_keeps_errors_and_filtered_in_id_order(
            self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, arm = seeded
        wl2, _ = db.add_workload(structural_hash="00cd", name="conv", op_kind="conv2d", flops=1.0, tir_json="{}")
        wl3, _ = db.add_workload(structural_hash="00ef", name="pool", op_kind="pool", flops=1.0, tir_json="{}")
        db.commit_measurements([
            NewMeasurement(wl2.id, hw, _trace(1), [0.4, 0.2]),
            NewMeasurement(wl, hw, _trace(2), None, error_kind="build"),
            NewMeasurement(wl, hw, _trace(3), None, error_kind=FILTERED),
            NewMeasurement(wl3.id, hw, _trace(4), [0.5]),   # a workload not asked for
            NewMeasurement(wl, arm, _trace(5), [0.1]),      # another class
            NewMeasurement(wl, hw, _trace(6), [0.1]),
        ])
        points = db.measurement_timeline(hw, [wl, wl2.id])
        assert [(p.workload_id, p.mean_run_s, p.error_kind) for p in points] == [
            (wl2.id, pytest.approx(0.3), None), (wl, None, "build"), (wl, None, FILTERED), (wl, 0.1, None)]
        assert [p.id for p in points] == sorted(p.id for p in points)
        assert all(isinstance(p.created_at, dt.datetime) for p in points)
        assert db.measurement_timeline(hw, []) == []
        assert db.measurement_timeline(arm, [wl2.id]) == []

    def test_outlook_inputs_skip_filtered_candidates_in_id_order(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, arm = seeded
        wl2, _ = db.add_workload(structural_hash="00cd", name="conv", op_kind="conv2d", flops=1.0, tir_json="{}")
        m1, _ = db.add_model(name="a", source="zoo", format="x", sha256="1" * 64, artifact_uri="u")
        m2, _ = db.add_model(name="b", source="zoo", format="x", sha256="2" * 64, artifact_uri="u")
        db.link_model_workload(m1.id, wl, 2)
        db.link_model_workload(m2.id, wl, 3)
        assert db.outlook_inputs(hw).workload_ids == []  # no shards yet
        db.add_shards(hw, [(wl2.id, 8, 1.0), (wl, 8, 1.0)])
        db.save_tuning_state(_state(wl2.id, hw, preempted=True))
        db.commit_measurements([NewMeasurement(wl, hw, _trace(1), [0.3], energy_j=1.0),
                                NewMeasurement(wl, hw, _trace(2), None, error_kind=FILTERED),
                                NewMeasurement(wl, hw, _trace(3), None, error_kind="build"),
                                NewMeasurement(wl, arm, _trace(4), [0.1])])
        got = db.outlook_inputs(hw)
        assert got.workload_ids == sorted([wl, wl2.id])
        assert got.weights == {wl: 5} and got.preempted == {wl2.id}
        assert got.trials == [(wl, 0.3, 1.0), (wl, None, None)]
        assert db.outlook_inputs(hw, [wl]).preempted == set()
        assert db.outlook_inputs(arm, [wl]).trials == [(wl, 0.1, None)]

    def test_export_window_best_per_workload_and_trace_time(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, arm = seeded
        db.commit_measurements([NewMeasurement(wl, hw, _trace(i), [0.5 - i * 0.1]) for i in range(3)])
        db.commit_measurements([NewMeasurement(wl, hw, "[[],[]]", None, error_kind="run")])
        ids = [m.id for m in db.measurements(hardware_class_id=hw)]
        assert db.unexported_window(hw) == (ids[-1], 4)
        assert db.unexported_window(arm) is None
        assert db.best_run_s_by_workload(hw, ids[-1]) == {wl: pytest.approx(0.3)}
        assert db.best_run_s_by_workload(hw, ids[0]) == {wl: pytest.approx(0.5)}
        assert db.best_run_s_by_workload(arm, ids[-1]) == {}
        assert db.trace_run_s(wl, hw, sha256_text(_trace(1))) == pytest.approx(0.4)
        assert db.trace_run_s(wl, hw, sha256_text("[[],[]]")) is None  # an error has no run time
        assert db.trace_run_s(wl, arm, sha256_text(_trace(1))) is None

    def test_freed_trials_add_up_on_an_existing_state(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, _ = seeded
        db.add_freed_trials(wl, hw, 5)  # no state yet: nothing to keep it on
        assert db.tuning_state(wl, hw) is None
        db.save_tuning_state(_state(wl, hw, preempted=True))
        db.add_freed_trials(wl, hw, 5)
        db.add_freed_trials(wl, hw, 3)
        db.add_freed_trials(wl, hw, -2)
        got = db.tuning_state(wl, hw)
        assert got is not None and got.freed_trials == 8

    def test_dataset_rows_and_cost_model_registry(self, seeded: tuple[Database, int, int, int]) -> None:
        db, _, hw, arm = seeded
        reserved = db.add_dataset(uri="", manifest={"state": "writing"}, row_count=0)
        db.update_dataset(reserved.id, uri="s3://b/v1", manifest={"state": "complete"}, row_count=7)
        (got,) = db.datasets()
        assert (got.version, got.uri, got.manifest, got.row_count) == (1, "s3://b/v1", {"state": "complete"}, 7)
        doomed = db.add_dataset(uri="", manifest={}, row_count=0)
        db.delete_dataset(doomed.id)
        assert [d.version for d in db.datasets()] == [1]
        reserved = db.add_cost_model(hardware_class_id=hw, artifact_uri="", metrics={})
        with pytest.raises(NotFoundError, match="has no artifact"):
            db.promote_cost_model(reserved.id)  # a retrain that never finished
        db.delete_cost_model(reserved.id)
        assert db.next_cost_model_version(hw) == 1
        c1 = db.add_cost_model(hardware_class_id=hw, artifact_uri="u1", metrics={"objective": "rank"})
        assert db.next_cost_model_version(hw) == 2 and db.next_cost_model_version(arm) == 1
        db.set_cost_model_uri(c1.id, "s3://b/cm/v1")
        db.set_cost_model_uri(999999, "nowhere")  # a missing model changes nothing
        got_cm = db.cost_model_version(hw, 1)
        assert got_cm is not None and got_cm.artifact_uri == "s3://b/cm/v1"
        assert db.cost_model_version(hw, 2) is None and db.cost_model_version(arm, 1) is None
        db.add_cost_model(hardware_class_id=hw, artifact_uri="u2", metrics={})
        db.add_cost_model(hardware_class_id=arm, artifact_uri="u3", metrics={})
        assert [(name, cm.version, cm.artifact_uri) for cm, name in db.cost_models()] == [
            ("arm", 1, "u3"), ("x86", 1, "s3://b/cm/v1"), ("x86", 2, "u2")]


    def test_unexported_measurements_are_those_no_version_marked(
        self, seeded: tuple[Database, int, int, int]
    ) -> None:
        db, wl, hw, arm = seeded
        db.commit_measurements([NewMeasurement(wl, hw, _trace(i), [0.1 * (i + 1)]) for i in range(4)])
        db.commit_measurements([NewMeasurement(wl, arm, _trace(9), [0.2])])
        ids = [m.id for m in db.measurements(hardware_class_id=hw)]
        (arm_id,) = [m.id for m in db.measurements(hardware_class_id=arm)]
        v1 = db.add_dataset(uri="", manifest={}, row_count=0)
        # Marks are per measurement: an id below a marked one can stay unexported.
        db.update_dataset(v1.id, uri="u1", manifest={"state": "complete"}, row_count=1,
                          marks={ids[0]: "row", ids[2]: "skipped"}, hardware_class_ids=[hw])
        assert db.dataset_marks(v1.id) == {ids[0]: "row", ids[2]: "skipped"}
        assert [m.id for m in db.unexported_measurements(hw)] == [ids[1], ids[3]]
        assert [m.id for m in db.unexported_measurements()] == [ids[1], ids[3], arm_id]
        assert [m.id for m in db.unexported_measurements(hw, after_id=ids[1], up_to_id=ids[3], limit=5)] == [ids[3]]
        assert [m.id for m in db.unexported_measurements(hw, limit=1)] == [ids[1]]
        assert db.unexported_window(hw) == (ids[-1], 2)

        # A second version marking a measurement the first took is refused as a whole.
        v2 = db.add_dataset(uri="", manifest={"state": "writing"}, row_count=0)
        with pytest.raises(ConflictError, match="run it again"):
            db.update_dataset(v2.id, uri="u2", manifest={"state": "complete"}, row_count=2,
                              marks={ids[1]: "row", ids[2]: "row"}, hardware_class_ids=[hw])
        assert db.dataset_marks(v2.id) == {} and db.datasets()[1].manifest == {"state": "writing"}
        assert db.dataset_marks(v1.id) == {ids[0]: "row", ids[2]: "skipped"}
        db.update_dataset(v2.id, uri="u2", manifest={"state": "complete"}, row_count=2,
                          marks={ids[1]: "row", ids[3]: "filtered", arm_id: "row"}, hardware_class_ids=[arm, hw])
        assert db.unexported_measurements() == [] and db.unexported_window(hw) is None
        db.delete_dataset(v1.id)  # a removed version gives its measurements back
        assert [m.id for m in db.unexported_measurements()] == [ids[0], ids[2]]

    def test_migration_marks_what_earlier_versions_covered(
        self, db_url: str, seeded: tuple[Database, int, int, int]
    ) -> None:
        from alembic.script import ScriptDirectory

        from tunefleet.db.connection import alembic_config

        db, wl, hw, arm = seeded
        db.commit_measurements([NewMeasurement(wl, hw, _trace(i), [0.1 * (i + 1)]) for i in range(4)])
        db.commit_measurements([NewMeasurement(wl, hw, _trace(7), None, error_kind=FILTERED)])
        db.commit_measurements([NewMeasurement(wl, arm, _trace(9), [0.2])])
        ids = [m.id for m in db.measurements(hardware_class_id=hw)]
        (arm_id,) = [m.id for m in db.measurements(hardware_class_id=arm)]
        script = ScriptDirectory.from_config(alembic_config(None))  # type: ignore[arg-type]
        revision = next(r for r in script.walk_revisions() if r.path.endswith("_dataset_exports.py"))
        downgrade(db.engine, str(revision.down_revision))
        # Versions as exports before marks wrote them: per class a high-water mark in the manifest.
        old = [
            {"state": "complete", "hardware": {"x86": {"high_water": ids[1], "skipped_ids": [ids[1]]}}},
            {"state": "writing", "hardware": {"x86": {"high_water": ids[3]}}},  # killed: never counted
            {"state": "complete", "hardware": {"x86": {"high_water": ids[4], "skipped_ids": []},
                                               "arm": {"high_water": arm_id - 1, "skipped_ids": []}}},
        ]
        for version, manifest in enumerate(old, 1):
            db.add_dataset(uri=f"u{version}", manifest=manifest, row_count=0)
        upgrade(db.engine)
        again = Database(db_url)
        v1, v2, v3 = again.datasets()
        assert again.dataset_marks(v1.id) == {ids[0]: "row", ids[1]: "skipped"}
        assert again.dataset_marks(v2.id) == {}
        assert again.dataset_marks(v3.id) == {ids[2]: "row", ids[3]: "row", ids[4]: "filtered"}
        assert [m.id for m in again.unexported_measurements()] == [arm_id]
        again.close()

    def test_artifacts_are_registered_with_their_owner_or_not_at_all(
        self, seeded: tuple[Database, int, int, int]
    ) -> None:
        db, wl, hw, _ = seeded
        db.commit_measurements([NewMeasurement(wl, hw, _trace(i), [0.1 * (i + 1)]) for i in range(2)])
        ids = [m.id for m in db.measurements(hardware_class_id=hw)]
        taken = db.add_dataset(uri="", manifest={}, row_count=0)
        db.update_dataset(taken.id, uri="u1", manifest={"state": "complete"}, row_count=1, marks={ids[0]: "row"},
                          hardware_class_ids=[hw], artifact_key="datasets/v1-aa/")
        v2 = db.add_dataset(uri="", manifest={"state": "writing"}, row_count=0)
        with pytest.raises(ConflictError):  # a mark taken: neither the version nor its files are registered
            db.update_dataset(v2.id, uri="u2", manifest={"state": "complete"}, row_count=1,
                              marks={ids[0]: "row"}, hardware_class_ids=[hw], artifact_key="datasets/v2-bb/")
        with pytest.raises(ConflictError, match="registered already"):  # a key is registered once
            db.update_dataset(v2.id, uri="u2", manifest={"state": "complete"}, row_count=1,
                              marks={ids[1]: "row"}, hardware_class_ids=[hw], artifact_key="datasets/v1-aa/")
        assert [(a.kind, a.key, a.dataset_id) for a in db.artifacts()] == [("dataset", "datasets/v1-aa/", taken.id)]
        db.update_dataset(v2.id, uri="u2", manifest={"state": "complete"}, row_count=1, marks={ids[1]: "row"},
                          hardware_class_ids=[hw], artifact_key="datasets/v2-bb/")
        with pytest.raises(NotFoundError, match="not a reserved version"):  # registered: not again
            db.update_dataset(v2.id, uri="u3", manifest={}, row_count=0)

        cm = db.add_cost_model(hardware_class_id=hw, artifact_uri="", metrics={"state": "training"})
        assert db.finish_cost_model(cm.id, artifact_uri="u", metrics={"ok": 1}, promote=True, expected_current=None,
                                    artifact_key="costmodels/x86/v1-cc.json")
        with pytest.raises(NotFoundError, match="not a reservation"):
            db.finish_cost_model(cm.id, artifact_uri="u", metrics={}, promote=False, expected_current=None)
        assert [(a.kind, a.key) for a in db.artifacts("cost_model")] == [("cost_model", "costmodels/x86/v1-cc.json")]
        assert [a.key for a in db.artifacts()] == ["costmodels/x86/v1-cc.json", "datasets/v1-aa/", "datasets/v2-bb/"]

        # Removing an owner removes what it registered: its files become garbage.
        db.delete_dataset(taken.id)
        assert [a.key for a in db.artifacts("dataset")] == ["datasets/v2-bb/"]
        db.delete_cost_model(cm.id)
        assert db.artifacts("cost_model") == []

    def test_abandoning_gives_back_a_reservation_never_a_registration(
        self, seeded: tuple[Database, int, int, int]
    ) -> None:
        """What a failed export or retrain calls when it cannot know whether its commit went through."""
        db, _, hw, _ = seeded
        reserved = db.add_dataset(uri="", manifest={"state": "writing"}, row_count=0)
        assert db.abandon_dataset(reserved.id) is None and db.datasets() == []
        assert db.abandon_dataset(reserved.id) is None  # gone already: nothing
        registered = db.add_dataset(uri="", manifest={"state": "writing"}, row_count=0)
        db.update_dataset(registered.id, uri="u", manifest={"state": "complete"}, row_count=0,
                          artifact_key="datasets/v1-aa/")
        kept = db.abandon_dataset(registered.id)  # its commit went through: the registration stands
        assert kept is not None and kept.id == registered.id and kept.uri == "u"
        assert [d.id for d in db.datasets()] == [registered.id] and len(db.artifacts()) == 1

        old = db.add_cost_model(hardware_class_id=hw, artifact_uri="", metrics={})
        assert db.finish_cost_model(old.id, artifact_uri="u1", metrics={}, promote=True, expected_current=None)
        reserved_cm = db.add_cost_model(hardware_class_id=hw, artifact_uri="", metrics={})
        assert db.abandon_cost_model(reserved_cm.id) is None
        assert db.next_cost_model_version(hw) == 2, "the reserved version is given back"
        new = db.add_cost_model(hardware_class_id=hw, artifact_uri="", metrics={})
        assert db.finish_cost_model(new.id, artifact_uri="u2", metrics={}, promote=True, expected_current=old.id,
                                    artifact_key="costmodels/x86/v2-dd.json")
        kept_cm = db.abandon_cost_model(new.id)  # promoted, then its acknowledgement lost: still current
        assert kept_cm is not None and kept_cm.promoted
        current = db.current_cost_model(hw)
        assert current is not None and current.id == new.id
        assert [a.key for a in db.artifacts("cost_model")] == ["costmodels/x86/v2-dd.json"]

    def test_migration_registers_the_files_earlier_versions_wrote(
        self, db_url: str, seeded: tuple[Database, int, int, int]
    ) -> None:
        from alembic.script import ScriptDirectory

        from tunefleet.db.connection import alembic_config

        db, _, hw, arm = seeded
        script = ScriptDirectory.from_config(alembic_config(None))  # type: ignore[arg-type]
        revision = next(r for r in script.walk_revisions() if r.path.endswith("_artifacts.py"))
        downgrade(db.engine, str(revision.down_revision))
        # As exports and retrains before it left them: a killed export and an unfinished retrain
        # (no URI) next to complete ones, under the keys they always used.
        db.add_dataset(uri="u1", manifest={"state": "complete"}, row_count=1)
        db.add_dataset(uri="", manifest={"state": "writing"}, row_count=0)
        db.add_dataset(uri="u3", manifest={"state": "complete"}, row_count=1)
        db.add_cost_model(hardware_class_id=hw, artifact_uri="s3://b/costmodels/x86/v1.json", metrics={})
        db.add_cost_model(hardware_class_id=hw, artifact_uri="", metrics={})
        db.add_cost_model(hardware_class_id=arm, artifact_uri="file:///a/costmodels/arm/v1.json", metrics={})
        upgrade(db.engine)
        again = Database(db_url)
        v1, _, v3 = again.datasets()
        assert [(a.kind, a.key, a.dataset_id) for a in again.artifacts("dataset")] == [
            ("dataset", "datasets/v1/", v1.id), ("dataset", "datasets/v3/", v3.id)]
        assert [a.key for a in again.artifacts("cost_model")] == ["costmodels/arm/v1.json", "costmodels/x86/v1.json"]
        again.close()


class DatabaseContract(ShardCases, ReportCases):
    """What every database backend must do."""

    @pytest.fixture
    def db(self, db_url: str) -> Iterator[Database]:
        database = Database(db_url, connect_timeout_s=5)
        yield database
        database.close()

    @pytest.fixture
    def seeded(self, db: Database) -> tuple[Database, int, int, int]:
        hw = db.upsert_hardware_class("x86", TARGET, "x86", watts_per_core=10, price_per_hour=0.1)
        other = db.upsert_hardware_class("arm", {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, "arm")
        wl, _ = db.add_workload(structural_hash="00ab", name="dense", op_kind="dense", flops=2e6, tir_json="{}")
        return db, wl.id, hw.id, other.id

    # -- schema ---------------------------------------------------------------------------
    def test_empty_database_is_migrated_on_first_use(self, db: Database) -> None:
        assert current_revision(db.engine) == head_revision()

    def test_migrations_down_and_up(self, db: Database) -> None:
        from alembic.autogenerate import compare_metadata
        from alembic.runtime.migration import MigrationContext

        from tunefleet.db.tables import Base

        downgrade(db.engine, "base")
        assert current_revision(db.engine) is None
        upgrade(db.engine, "0001")
        assert current_revision(db.engine) == "0001"
        upgrade(db.engine)
        assert current_revision(db.engine) == head_revision()
        with db.engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []

    def test_older_revision_asks_for_upgrade(self, db_url: str, db: Database) -> None:
        downgrade(db.engine, "0001")
        with pytest.raises(SchemaOutdatedError, match="run `tunefleet db upgrade`"):
            Database(db_url)

    def test_unknown_revision_is_refused(self, db_url: str, db: Database) -> None:
        with db.engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = 'ffff9999'"))
        with pytest.raises(SchemaTooNewError, match="newer tunefleet"):
            Database(db_url)

    def test_outdated_data_survives_upgrade(self, db_url: str, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, arm = seeded
        model, _ = db.add_model(name="m", source="zoo", format="x", sha256="a" * 64, artifact_uri="u")
        db.set_model_workloads(model.id, hw, "nhwc+prepack", {wl: 3})
        db.commit_measurements([NewMeasurement(wl, hw, _trace(1), [0.5])])
        downgrade(db.engine, "0001")
        upgrade(db.engine)
        again = Database(db_url)
        assert [m.mean_run_s for m in again.best_measurements(wl, hw)] == [0.5]
        # Links made before recipes existed apply to every class, as extracted with the frontend's layout.
        assert again.model_recipes(model.id, hw) == ["native"] and again.model_recipes(model.id, arm) == ["native"]
        assert [(w.id, n) for w, n in again.workloads(model.id, arm)] == [(wl, 3)]

    # -- hardware classes, models, workloads ----------------------------------------------
    def test_hardware_class_upsert_and_lookup(self, db: Database) -> None:
        db.upsert_hardware_class("x86", TARGET, "x86", watts_per_core=5)
        hw = db.upsert_hardware_class("x86", TARGET, "x86-pool", watts_per_core=7)
        assert db.hardware_class("x86").id == hw.id
        assert db.hardware_class("x86").node_pool == "x86-pool"
        assert db.hardware_class("x86").target == TARGET
        assert [h.name for h in db.hardware_classes()] == ["x86"]
        with pytest.raises(NotFoundError, match="unknown hardware class 'tpu'.*x86"):
            db.hardware_class("tpu")

    def test_a_class_records_one_cpu_by_compare_and_set(self, db: Database) -> None:
        db.upsert_hardware_class("x86", TARGET, "x86", capabilities={"isa": ["avx2"]})
        first, second = {"model": "A", "id": "a", "isa": ["avx2"]}, {"model": "B", "id": "b", "isa": []}
        adopt = {"target": {**TARGET, "mcpu": "znver3"}, "capabilities": {"isa": ["avx", "avx2"]}}
        assert db.claim_hardware_cpu("x86", first, adopt=adopt) == first
        assert db.claim_hardware_cpu("x86", second, adopt={"target": TARGET, "capabilities": {}}) == first
        hw = db.hardware_class("x86")
        assert hw.capabilities == {"isa": ["avx", "avx2"], "cpu": first} and hw.target == adopt["target"]
        with pytest.raises(NotFoundError):
            db.claim_hardware_cpu("tpu", first)

    def test_registry_tokens_are_stored_hashed_scoped_expire_and_revoke(self, db: Database) -> None:
        from tunefleet.db.tokens import grants, token_digest

        token, row = db.create_token("vision", "read", note="ci")
        assert token.startswith("tf_") and len(token) > 40 and row.token_sha256 == token_digest(token)
        assert token not in str([(t.team, t.token_sha256, t.note) for t in db.api_tokens()])  # only its digest
        seen = db.authenticate(token)
        assert seen is not None and (seen.team, seen.scope) == ("vision", "read") and seen.last_used_at is not None
        assert db.authenticate(token[:-1] + ("A" if token[-1] != "A" else "B")) is None
        assert db.authenticate("Bearer " + token) is None
        writer, _ = db.create_token("vision", "write", expires_at=utcnow() + dt.timedelta(hours=1))
        assert grants("write", "read") and grants("write", "write") and not grants("read", "write")
        assert db.authenticate(writer) is not None
        with db.session() as s:  # an hour later
            s.execute(text("UPDATE api_tokens SET expires_at = :t WHERE scope = 'write'"),
                      {"t": utcnow() - dt.timedelta(seconds=1)})
        assert db.authenticate(writer) is None
        revoked = db.revoke_token(row.id)
        assert revoked.revoked_at is not None and db.authenticate(token) is None
        assert db.revoke_token(row.id).revoked_at == revoked.revoked_at  # once
        with pytest.raises(NotFoundError, match="unknown token id 99"):
            db.revoke_token(99)
        with pytest.raises(ParameterError, match="invalid scope: 'admin'"):
            db.create_token("vision", "admin")
        with pytest.raises(ParameterError, match="invalid expiry"):
            db.create_token("vision", "read", expires_at=utcnow() - dt.timedelta(days=1))
        assert [t.team for t in db.api_tokens()] == ["vision", "vision"]

    def test_a_hub_import_is_whole_idempotent_and_kept_apart(self, seeded: tuple[Database, int, int, int]) -> None:
        from tunefleet.vocab import HUB_POOL

        db, wl, hw, _ = seeded
        local = db.hardware_class(hw)
        wl_hash = db.workload(wl).structural_hash
        db.commit_measurements([NewMeasurement(wl, hw, _trace(7), [0.4]), NewMeasurement(wl, hw, _trace(8), [0.2])])
        exported = db.hub_export_records(hw, 1)
        assert [(r["workload_hash"], r["trace_json"], r["rank"]) for r in exported] == [(wl_hash, _trace(8), 0)]
        hub_class = {"name": "hub:x86@a-000000", "target": TARGET, "capabilities": {"hub": {"class": "x86"}}}
        new_wl = {"structural_hash": "f" * 16, "name": "new", "op_kind": "dense/matmul", "flops": 1.0, "tir_json": "{}"}
        records = [{"class_name": hub_class["name"], "workload_hash": h, "trace_json": _trace(n),
                    "trace_sha256": sha256_text(_trace(n)), "args_info": None, "run_secs": [0.1], "mean_run_s": 0.1,
                    "tvm_version": "0.27", "target": "{}", "measured_at": None} for h, n in ((wl_hash, 9), ("f" * 16, 9))]

        def load(sha: str):  # type: ignore[no-untyped-def]
            return db.hub_import(sha256=sha, source="b.parquet", format_version=1, tvm_version="0.27",
                                 bundle_created_at=None, summary={}, classes=[hub_class], workloads=[new_wl],
                                 records=records, counts={"records": 2})

        row, new = load("1" * 64)
        assert new and row.counts == {"records": 2, "classes_created": 1, "workloads_new": 1, "records_new": 2,
                                      "records_present": 0}
        assert load("1" * 64)[1] is False  # the same file again
        row, new = load("2" * 64)  # the same records in another file
        assert new and (row.counts["classes_created"], row.counts["records_new"], row.counts["records_present"]) \
            == (0, 0, 2)
        [hub] = db.hub_classes()
        assert hub.node_pool == HUB_POOL and [i.sha256 for i in db.hub_imports()] == ["1" * 64, "2" * 64]
        assert [m.mean_run_s for m in db.best_measurements(wl, hw, 5)] == [0.2, 0.4]  # the hub's stay apart
        assert all(m.hardware_class_id == local.id for m in db.best_measurements(wl, hw, 5))
        origins = db.hub_origins([wl])
        assert origins == {(wl, sha256_text(_trace(9))): (hub.name, {"hub": {"class": "x86"}})}
        # what this class measured of the hub's schedules: one, slower than nothing known (no default here)
        db.commit_measurements([NewMeasurement(wl, hw, _trace(9), [0.3])])
        replay = db.hub_replays([wl], hw)[wl]
        assert (replay["records"], replay["measured"], replay["failed"], replay["sources"]) == (1, 1, 0, [hub.name])

    def test_model_is_content_addressed(self, db: Database) -> None:
        kwargs = dict(name="mlp", source="zoo", format="relax-nn", sha256="f" * 64, artifact_uri="file:///x")
        first, created = db.add_model(**kwargs)
        again, created_again = db.add_model(**{**kwargs, "name": "other-name"})
        assert created and not created_again and first.id == again.id
        assert db.model("mlp").id == first.id and db.model(first.id).id == first.id
        assert db.model("ffffffff").id == first.id
        with pytest.raises(NotFoundError):
            db.model("nope")

    def test_a_models_step_times_are_kept_per_class_and_summed_over_models(self, db: Database) -> None:
        a, _ = db.add_model(name="a", source="zoo", format="x", sha256="1" * 64, artifact_uri="u",
                            meta={"zoo": "a"})
        b, _ = db.add_model(name="b", source="zoo", format="x", sha256="2" * 64, artifact_uri="u")
        hw = db.upsert_hardware_class("x86", {"kind": "llvm"}, "x86").id
        arm = db.upsert_hardware_class("arm", {"kind": "llvm"}, "arm").id
        assert db.step_seconds([a.id], hw) == {}
        db.note_step_seconds(a.id, hw, "extract", 20.5)
        db.note_step_seconds(a.id, hw, "build", 150.0)
        db.note_step_seconds(a.id, hw, "build", 140.25)  # the last time counts
        db.note_step_seconds(b.id, hw, "extract", 10.0)
        db.note_step_seconds(a.id, arm, "extract", 99.0)
        assert db.step_seconds([a.id], hw) == {"extract": 20.5, "build": 140.25}
        assert db.step_seconds([a.id, b.id], hw) == {"extract": 30.5}  # b was never built: no build time for both
        assert db.step_seconds([a.id], arm) == {"extract": 99.0}
        assert db.step_seconds([b.id], arm) == {} and db.step_seconds([], hw) == {}
        assert db.model(a.id).meta["zoo"] == "a"  # what ingest keeps there stays
        with pytest.raises(NotFoundError):
            db.note_step_seconds(10**6, hw, "build", 1.0)

    def test_workload_stored_once_with_weights(self, db: Database) -> None:
        m1, _ = db.add_model(name="a", source="zoo", format="x", sha256="1" * 64, artifact_uri="u")
        m2, _ = db.add_model(name="b", source="zoo", format="x", sha256="2" * 64, artifact_uri="u")
        wl, created = db.add_workload(structural_hash="beef", name="conv", op_kind="conv2d", flops=1.0, tir_json="{}")
        same, created_again = db.add_workload(structural_hash="beef", name="conv", op_kind="conv2d", flops=1.0, tir_json="{}")
        assert created and not created_again and wl.id == same.id
        hw = db.upsert_hardware_class("x86", {"kind": "llvm"}, "x86").id
        arm = db.upsert_hardware_class("arm", {"kind": "llvm"}, "arm").id
        db.link_model_workload(m1.id, wl.id, 3)  # every class
        db.link_model_workload(m2.id, wl.id, 2, hardware_class_id=hw)
        db.link_model_workload(m2.id, wl.id, 2, hardware_class_id=hw)  # idempotent
        assert [(w.structural_hash, n) for w, n in db.workloads()] == [("beef", 5)]
        assert [(w.structural_hash, n) for w, n in db.workloads(m1.id)] == [("beef", 3)]
        assert [(w.structural_hash, n) for w, n in db.workloads(hardware_class_id=arm)] == [("beef", 3)]
        assert db.workload_weight(wl.id, hw) == 5 and db.workload_weight(wl.id, arm) == 3
        assert db.workload("beef").id == wl.id

    def test_a_class_keeps_its_winograd_setting_and_recipe_names_up_to_64_characters(self, db: Database) -> None:
        hw = db.upsert_hardware_class("x86", {"kind": "llvm"}, "x86", layout="NHWC", winograd=True).id
        assert db.hardware_class("x86").winograd
        db.upsert_hardware_class("x86", {"kind": "llvm"}, "x86", layout="NHWC")
        assert not db.hardware_class("x86").winograd
        model, _ = db.add_model(name="a", source="zoo", format="x", sha256="1" * 64, artifact_uri="u")
        wl = db.add_workload(structural_hash="aa0", name="conv", op_kind="conv2d", flops=1.0, tir_json="{}")[0].id
        name = "nhwc+prepack+fastmath+fold+winograd"  # 35 characters
        db.set_model_workloads(model.id, hw, name, {wl: 2})
        assert db.model_recipes(model.id, hw) == [name]
        other, _ = db.add_model(name="b", source="zoo", format="x", sha256="2" * 64, artifact_uri="u")
        db.set_model_workloads(other.id, hw, "nhwc+prepack+fastmath+fold", {wl: 1})
        db.commit_measurements([NewMeasurement(wl, hw, _trace(0), [0.1])])
        # Below 0012 no recipe name is longer than 32 characters: the Winograd links go, the rest stays
        downgrade(db.engine, "0011")
        with db.engine.connect() as conn:
            rows = conn.execute(text("SELECT model_id, recipe FROM model_workloads")).all()
            assert [tuple(r) for r in rows] == [(other.id, "nhwc+prepack+fastmath+fold")]
            assert conn.execute(text("SELECT count(*) FROM measurements")).scalar() == 1
        upgrade(db.engine)
        assert db.model_recipes(other.id, hw) == ["nhwc+prepack+fastmath+fold"]

    def test_model_workloads_follow_the_recipe(self, db: Database) -> None:
        # Re-extracting under another recipe replaces a model's links on that class only, and says
        # how much tuning of the unlinked workloads no longer applies.
        model, _ = db.add_model(name="a", source="zoo", format="x", sha256="1" * 64, artifact_uri="u")
        hw = db.upsert_hardware_class("x86", {"kind": "llvm"}, "x86", layout="NHWC").id
        arm = db.upsert_hardware_class("arm", {"kind": "llvm"}, "arm").id
        assert db.hardware_class("x86").layout == "NHWC" and db.hardware_class("arm").layout is None
        old = [db.add_workload(structural_hash=f"aa{i}", name="conv", op_kind="conv2d", flops=1.0, tir_json="{}")[0].id
               for i in range(2)]
        new = db.add_workload(structural_hash="bb0", name="conv", op_kind="conv2d", flops=1.0, tir_json="{}")[0].id
        for cls in (hw, arm):
            first = db.set_model_workloads(model.id, cls, "native", {old[0]: 2, old[1]: 1})
            assert (first.linked, first.unlinked, first.previous_recipes) == (2, [], [])
        db.commit_measurements([NewMeasurement(old[0], hw, _trace(i), [0.1]) for i in range(3)]
                               + [NewMeasurement(old[0], arm, _trace(9), [0.1])])
        change = db.set_model_workloads(model.id, hw, "nhwc+prepack", {old[1]: 1, new: 4})
        assert (change.linked, change.unlinked, change.unlinked_measured, change.previous_recipes) == (
            2, [old[0]], 3, ["native"])
        assert db.model_recipes(model.id, hw) == ["nhwc+prepack"] and db.model_recipes(model.id, arm) == ["native"]
        assert {w.id: n for w, n in db.workloads(model.id, hw)} == {old[1]: 1, new: 4}
        assert {w.id: n for w, n in db.workloads(model.id, arm)} == {old[0]: 2, old[1]: 1}
        assert [r.workload_id for r in db.planning_view(hw, model.id)] == [old[1], new]
        assert len(db.best_measurements(old[0], hw, 5)) == 3  # measurements stay
        again = db.set_model_workloads(model.id, hw, "nhwc+prepack", {old[1]: 1, new: 4})
        assert (again.unlinked, again.previous_recipes) == ([], [])  # idempotent

    # -- measurements ---------------------------------------------------------------------
    def test_best_n_is_target_aware_and_skips_errors(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, arm = seeded
        recs = [NewMeasurement(wl, hw, _trace(i), [0.010 - i * 0.001, 0.010 - i * 0.001]) for i in range(8)]
        recs.append(NewMeasurement(wl, hw, _trace(100), None, error_kind="run", error_msg="timeout"))
        recs.append(NewMeasurement(wl, arm, _trace(200), [1e-9]))  # faster, but another class
        assert db.commit_measurements(recs) == 10
        best = db.best_measurements("00ab", "x86", n=5)
        assert [round(m.mean_run_s, 6) for m in best] == [0.003, 0.004, 0.005, 0.006, 0.007]
        assert all(m.hardware_class_id == hw for m in best)
        assert db.count_measurements(wl, hw) == 9
        assert db.count_measurements(wl, hw, errors=False) == 8
        assert [m.mean_run_s for m in db.best_measurements(wl, arm)] == [1e-9]

    def test_best_before_a_time_leaves_out_later_measurements(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, _ = seeded
        db.commit_measurements([NewMeasurement(wl, hw, _trace(i), [0.010 - i * 0.001]) for i in range(3)])
        time.sleep(0.02)  # the later batch gets later timestamps
        db.commit_measurements([NewMeasurement(wl, hw, _trace(10 + i), [0.001 - i * 1e-4]) for i in range(2)])
        later = min(m.created_at for m in db.measurements() if m.mean_run_s is not None and m.mean_run_s < 0.002)
        assert [round(m.mean_run_s, 6) for m in db.best_measurements(wl, hw, 5, before=later)] == [0.008, 0.009, 0.010]
        assert [round(m.mean_run_s, 6) for m in db.best_measurements(wl, hw, 1)] == [0.0009]

    def test_a_schedule_measured_again_ranks_by_its_latest_measurement(
            self, seeded: tuple[Database, int, int, int]) -> None:
        """A re-timed record (a later attempt) replaces its lucky first figure; a failed re-timing
        leaves the schedule out; ``before`` sees the attempts committed before it only."""
        db, wl, hw, _ = seeded
        db.commit_measurements([NewMeasurement(wl, hw, _trace(i), [0.001 * (i + 1)]) for i in range(3)])
        time.sleep(0.02)
        first = db.measurements()[-1].created_at
        db.commit_measurements([NewMeasurement(wl, hw, _trace(0), [0.0025, 0.0027], repeat=1),
                                NewMeasurement(wl, hw, _trace(1), None, repeat=1, error_kind="run", error_msg="boom")])
        best = db.best_measurements(wl, hw, 5)
        assert [(round(m.mean_run_s, 6), m.attempt) for m in best] == [(0.0026, 1), (0.003, 0)]
        assert best[0].trace_sha256 == NewMeasurement(wl, hw, _trace(0)).trace_sha256
        assert [round(m.mean_run_s, 6) for m in db.best_measurements(wl, hw, 5, before=first + dt.timedelta(
            milliseconds=5))] == [0.001, 0.002, 0.003]

    def test_a_paired_figure_neither_ranks_nor_supersedes(self, seeded: tuple[Database, int, int, int]) -> None:
        """Two schedules timed side by side (``paired:<rounds>``, at a slow moment here): the ranking
        keeps the figures they were tuned with and never lists the paired ones, even the faster
        pairing of a schedule never measured otherwise; ``paired_measurements`` gives each one's
        latest (a failed one too), ``latest_attempts`` every schedule's highest attempt."""
        db, wl, hw, _ = seeded
        db.commit_measurements([NewMeasurement(wl, hw, _trace(i), [0.001 * (i + 1)]) for i in range(3)])
        db.commit_measurements([NewMeasurement(wl, hw, _trace(0), [0.009], repeat=1, measure_mode="paired:3"),
                                NewMeasurement(wl, hw, _trace(9), [0.0005], measure_mode="paired:3")])
        db.commit_measurements([NewMeasurement(wl, hw, _trace(0), None, repeat=2, measure_mode="paired:3",
                                               error_kind="run", error_msg="boom")])
        best = db.best_measurements(wl, hw, 5)
        assert [(round(m.mean_run_s, 6), m.attempt) for m in best] == [(0.001, 0), (0.002, 0), (0.003, 0)]
        paired = db.paired_measurements(wl, hw)
        assert set(paired) == {sha256_text(_trace(0)), sha256_text(_trace(9))}
        assert paired[sha256_text(_trace(0))].attempt == 2 and paired[sha256_text(_trace(0))].mean_run_s is None
        assert paired[sha256_text(_trace(9))].mean_run_s == 0.0005
        assert db.latest_attempts(wl, hw, [sha256_text(_trace(i)) for i in (0, 1, 9, 42)]) == {
            sha256_text(_trace(0)): 2, sha256_text(_trace(1)): 0, sha256_text(_trace(9)): 0}
        assert db.latest_attempts(wl, hw, []) == {}

    def test_error_measurement_has_null_mean(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, _ = seeded
        db.commit_measurements([NewMeasurement(wl, hw, _trace(1), [0.1], error_kind="build", error_msg="boom")])
        (row,) = db.measurements()
        assert row.mean_run_s is None and row.error_kind == "build" and row.error_msg == "boom"

    def test_retried_commit_is_idempotent_new_attempt_is_kept(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, _ = seeded
        rec = NewMeasurement(wl, hw, _trace(7), [0.2])
        assert db.commit_measurements([rec]) == 1
        assert db.commit_measurements([rec, NewMeasurement(wl, hw, _trace(7), [0.2])]) == 0
        assert db.commit_measurements([NewMeasurement(wl, hw, _trace(7), [0.3], repeat=1)]) == 1
        assert db.count_measurements(wl, hw) == 2
        assert db.measured_trace_hashes(wl, hw) == {rec.trace_sha256}

    def test_bulk_batch_round_trips_and_skips_duplicates(self, seeded: tuple[Database, int, int, int]) -> None:
        """Large batches (PostgreSQL's COPY path) keep every value and stay idempotent."""
        db, wl, hw, _ = seeded
        odd = 'quote" tab\t newline\n backslash\\ \\N unicode é'
        batch = [
            NewMeasurement(wl, hw, _trace(i) + odd, [1e-3 * (i + 1), 2e-3], build_s=0.25, args_info=[["TENSOR", "float32", [1, 64]]],
                           tvm_version="0.27", target='{"kind": "llvm"}', shard_id=None, energy_j=1.5, energy_source="estimate")
            for i in range(100)
        ]
        batch.append(NewMeasurement(wl, hw, "err" + odd, None, error_kind="build", error_msg=odd))
        assert db.commit_measurements(batch) == 101
        more = [NewMeasurement(wl, hw, _trace(1000 + i), [0.5]) for i in range(50)]
        assert db.commit_measurements(batch + more) == 50
        assert db.count_measurements(wl, hw) == 151
        best = db.best_measurements(wl, hw, n=1)[0]
        assert best.trace_json == _trace(0) + odd
        assert best.run_secs == [1e-3, 2e-3] and best.mean_run_s == 1.5e-3
        assert best.args_info == [["TENSOR", "float32", [1, 64]]]
        assert (best.build_s, best.energy_j, best.energy_source, best.tvm_version) == (0.25, 1.5, "estimate", "0.27")
        errors = [m for m in db.measurements() if m.error_kind]
        assert len(errors) == 1 and errors[0].error_msg == odd and errors[0].run_secs is None

    def test_large_trace_is_stored(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, _ = seeded
        big = _trace(3, size=64_000)  # far above PostgreSQL's ~2.7 KB btree row limit
        assert db.commit_measurements([NewMeasurement(wl, hw, big, [0.1])]) == 1
        assert db.best_measurements(wl, hw)[0].trace_json == big

    @pytest.mark.parametrize("rows", [4, _COPY_MIN_ROWS], ids=["insert", "copy"])
    def test_commit_through_a_dropped_connection_is_transient(self, db_url: str, rows: int,
                                                              seeded: tuple[Database, int, int, int]) -> None:
        """A connection the network drops is a transient error on every commit path, PostgreSQL's
        COPY of large batches (on the raw driver connection) included, and the next try reconnects."""
        if not db_url.startswith("postgresql"):
            pytest.skip("SQLite has no network connection to drop")
        _, wl, hw, _ = seeded
        url = make_url(db_url)
        with TcpProxy(url.host or "127.0.0.1", url.port or 5432) as proxy:
            db = Database(url.set(port=proxy.port).render_as_string(hide_password=False), connect_timeout_s=2)
            dropped: list[int] = []

            @event.listens_for(db.engine, "begin")
            def _drop_once(_conn: object) -> None:  # the connection is checked out, nothing sent yet
                if not dropped:
                    dropped.append(proxy.drop_connections())

            batch = [NewMeasurement(wl, hw, _trace(i), [0.1]) for i in range(rows)]
            with pytest.raises(DatabaseUnavailableError, match="failed: .*(closed|terminated)"):
                db.commit_measurements(batch)
            assert dropped == [1]
            assert db.commit_measurements(batch) == rows  # a fresh connection: nothing was half-written
            db.close()

    def test_two_processes_commit_at_once(self, db_url: str, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, _ = seeded
        ctx = multiprocessing.get_context("spawn")
        procs = [ctx.Process(target=_commit_worker, args=(db_url, wl, hw, k * 10_000, 300, 25)) for k in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
        assert db.count_measurements(wl, hw) == 600

    def test_measurements_pages_by_id(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, _ = seeded
        db.commit_measurements(NewMeasurement(wl, hw, _trace(i), [0.1]) for i in range(5))
        first = db.measurements(limit=2)
        rest = db.measurements(after_id=first[-1].id)
        assert len(first) == 2 and len(rest) == 3 and rest[0].id > first[-1].id

    def test_similar_measured_workloads_same_ops_other_shapes_closest_first(
            self, seeded: tuple[Database, int, int, int]) -> None:
        db, _, hw, arm = seeded

        def workload(key: str, name: str, flops: float, op_kind: str = "conv2d") -> int:
            return db.add_workload(structural_hash=key, name=name, op_kind=op_kind, flops=flops, tir_json="{}")[0].id

        new = workload("c0", "fused_conv2d_add_relu", 1e6)
        far = workload("c1", "fused_conv2d1_add1_relu1", 8e6)
        near = workload("c2", "fused_conv2d2_add2_relu", 2e6)
        near_slow = workload("c3", "fused_conv2d_add_relu3", 5e5)
        other_ops = workload("c4", "fused_conv2d_add", 1e6)
        other_kind = workload("c5", "fused_conv2d_add_relu", 1e6, op_kind="pool")
        errors_only = workload("c6", "fused_conv2d_add_relu", 1e6)
        default_only = workload("c7", "fused_conv2d_add_relu", 1e6)
        only_arm = workload("c8", "fused_conv2d_add_relu", 1e6)
        db.commit_measurements([
            NewMeasurement(new, hw, _trace(1), [1e-3]),  # the asking workload itself: left out
            NewMeasurement(far, hw, _trace(2), [4e-3]), NewMeasurement(far, hw, _trace(3), [3e-3]),
            NewMeasurement(near, hw, _trace(4), [2e-3]),
            NewMeasurement(near_slow, hw, _trace(5), [9e-3]),
            NewMeasurement(other_ops, hw, _trace(6), [1e-3]), NewMeasurement(other_kind, hw, _trace(7), [1e-3]),
            NewMeasurement(errors_only, hw, _trace(8), None, error_kind="build", error_msg="boom"),
            NewMeasurement(default_only, hw, DEFAULT_TRACE_JSON, [1e-3]),
            NewMeasurement(only_arm, arm, _trace(9), [1e-3]),
        ])
        found = db.similar_measured_workloads(hw, "conv2d", "conv2d_add_relu", exclude_id=new, flops=1e6)
        # 2e6 and 5e5 are as far from 1e6 by ratio: the faster first; 8e6 is farthest
        assert [(w.id, w.best_s) for w in found] == [(near, 2e-3), (near_slow, 9e-3), (far, 3e-3)]
        assert found[0].name == "fused_conv2d2_add2_relu" and found[0].flops == 2e6
        assert [w.id for w in db.similar_measured_workloads(hw, "conv2d", "conv2d_add_relu", exclude_id=new,
                                                            flops=1e6, limit=1)] == [near]
        assert [w.id for w in db.similar_measured_workloads(arm, "conv2d", "conv2d_add_relu")] == [only_arm]
        assert db.similar_measured_workloads(hw, "dense", "conv2d_add_relu") == []

    # -- predictions, datasets, cost models -----------------------------------------------
    def test_predictions_never_returned_as_measurements(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, _ = seeded
        assert db.add_predictions(wl, hw, [(_trace(1), 5.0, None), (_trace(2), 9.0, None)]) == 2
        assert db.best_measurements(wl, hw) == []
        assert db.count_measurements(wl, hw) == 0
        assert [p.rank for p in db.best_predictions(wl, hw)] == [0, 1]
        assert db.best_predictions(wl, hw)[0].score == 9.0

    def test_predictions_come_from_the_last_model_that_predicted(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, _ = seeded
        old = db.add_cost_model(hardware_class_id=hw, artifact_uri="u1", metrics={})
        new = db.add_cost_model(hardware_class_id=hw, artifact_uri="u2", metrics={})
        assert not db.has_predictions(wl, hw, old.id)
        db.add_predictions(wl, hw, [(_trace(1), 50.0, None)], cost_model_id=old.id)
        db.add_predictions(wl, hw, [(_trace(2), 0.2, None), (_trace(3), 0.9, None)], cost_model_id=new.id)
        assert db.has_predictions(wl, hw, old.id) and db.has_predictions(wl, hw, new.id)
        assert not db.has_predictions(wl, hw, None)
        best = db.best_predictions(wl, hw, 5)
        assert [p.cost_model_id for p in best] == [new.id, new.id]  # scores of models are not comparable
        assert [p.score for p in best] == [0.9, 0.2]

    def test_dataset_versions_and_cost_model_promotion(self, seeded: tuple[Database, int, int, int]) -> None:
        db, _, hw, _ = seeded
        d1 = db.add_dataset(uri="s3://b/ds/1", manifest={"rows": 1}, row_count=1)
        d2 = db.add_dataset(uri="s3://b/ds/2", manifest={"rows": 2}, row_count=2)
        assert (d1.version, d2.version) == (1, 2)
        assert [d.version for d in db.datasets()] == [1, 2]
        c1 = db.add_cost_model(hardware_class_id=hw, artifact_uri="u1", metrics={"peak@1": 0.5}, dataset_id=d1.id)
        c2 = db.add_cost_model(hardware_class_id=hw, artifact_uri="u2", metrics={"peak@1": 0.7}, dataset_id=d2.id)
        assert (c1.version, c2.version) == (1, 2)
        assert db.current_cost_model(hw) is None
        db.promote_cost_model(c1.id)
        db.promote_cost_model(c2.id)
        current = db.current_cost_model(hw)
        assert current is not None and current.id == c2.id

    # -- cost-efficient tuning --------------------------------------------------------------
    def test_tuning_state_round_trips_and_resets(self, seeded: tuple[Database, int, int, int]) -> None:
        from tunefleet.planning.preemption import new_state

        db, wl, hw, other = seeded
        assert db.tuning_state(wl, hw) is None
        state = new_state(wl, hw, 0.5)
        state.rounds, state.stale_rounds, state.recent = 4, 2, [{"gain_s": 0.1, "joules": 3.0, "best_s": 0.5}]
        db.save_tuning_state(state)
        state.preempted, state.reason = True, "plateau"
        db.save_tuning_state(state)  # an upsert, not a second row
        got = db.tuning_state(wl, hw)
        assert got is not None and (got.rounds, got.stale_rounds, got.preempted, got.reason) == (4, 2, True, "plateau")
        assert got.recent == [{"gain_s": 0.1, "joules": 3.0, "best_s": 0.5}]
        assert db.tuning_state(wl, other) is None  # per hardware class
        assert [s.workload_id for s in db.tuning_states(hw, preempted=True)] == [wl]
        assert db.reset_plateaus(hw) == 1
        got = db.tuning_state(wl, hw)
        assert got is not None and not got.preempted and got.stale_rounds == 0 and got.rounds == 4

    def test_filtered_candidates_are_known_but_never_best(self, seeded: tuple[Database, int, int, int]) -> None:
        db, wl, hw, _ = seeded
        db.commit_measurements([NewMeasurement(wl, hw, _trace(1), [0.2]),
                                NewMeasurement(wl, hw, _trace(2), None, error_kind=FILTERED, energy_j=0.0),
                                NewMeasurement(wl, hw, _trace(3), [0.1], measure_mode="parallel:2")])
        assert [r.mean_run_s for r in db.best_measurements(wl, hw, 5)] == [0.1, 0.2]
        assert db.best_measurements(wl, hw, 1)[0].measure_mode == "parallel:2"
        assert sha256_text(_trace(2)) in db.measured_trace_hashes(wl, hw)  # never proposed again
        assert db.count_measurements(wl, hw) == 3 and db.count_measurements(wl, hw, errors=False) == 2
