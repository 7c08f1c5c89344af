"""Read-only aggregates for reports: energy per workload and class, shard states, budget outlooks."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import case, func, select

from tunefleet.db.catalog import CatalogMixin, model_links
from tunefleet.db.tables import HardwareClass, Measurement, Model, Shard, TuningState, Workload
from tunefleet.vocab import CANCELLED, DEFAULT_TRACE_SHA256, FILTERED


@dataclass(frozen=True)
class EnergyGroup:
    """Measurements of one (workload, class) sharing a ``useful`` flag and an energy source."""

    workload_id: int
    hardware_class_id: int
    useful: bool | None
    energy_source: str | None
    joules: float
    count: int
    """Rows, errors and filtered candidates included."""
    errors: int
    """Rows with an error kind, filtered candidates included."""
    best_s: float | None
    filtered: int


@dataclass(frozen=True)
class EnergyTotals:
    """Everything an energy report adds up, read in one transaction."""

    hardware_names: dict[int, str]
    groups: list[EnergyGroup]
    shard_costs: dict[tuple[int, int], float]
    """Money per (workload, class), summed over its shards."""
    links: list[tuple[int, int, int]]
    """Every ``(model id, workload id, weight)``."""
    model_names: dict[int, str]
    workload_counts: dict[int, int]
    """Workloads per model id."""


@dataclass(frozen=True)
class OutlookInputs:
    """What budget outlooks are computed from, for some workloads on one class."""

    workload_ids: list[int]
    weights: dict[int, int]
    """Call counts summed over models (absent: no model links the workload)."""
    preempted: set[int]
    trials: list[tuple[int, float | None, float | None]]
    """``(workload id, mean_run_s, energy_j)`` of every non-filtered measurement, in id order."""


@dataclass(frozen=True)
class WorkloadProgress:
    """Where one workload of a model stands on one class, for a live progress display."""

    workload_id: int
    name: str
    weight: int
    shards: dict[str, int]
    """Shards of the workload on the class by state."""
    trials: int
    """Trials planned over its shards that are not cancelled."""
    spent: int
    """Rows committed by those shards (measured, errored or filtered)."""
    measured_since: int
    errors_since: int
    """Rows committed since the given time, and how many of them are build or run errors."""
    best_s: float | None
    default_s: float | None
    """Mean run time of the unscheduled program, when it was measured."""
    rounds: dict[int, dict[str, int]]
    """Shards of the workload on the class created since the given time that a budget's round
    planned (:func:`tunefleet.planning.rounds.plan_round` records the round in the shard's
    ``planned`` event), by round, then by state; empty without a budget."""


@dataclass(frozen=True)
class TimelinePoint:
    """One measured candidate, as much of it as a tuning-progress chart needs."""

    id: int
    workload_id: int
    mean_run_s: float | None
    """NULL for errors and filtered candidates."""
    error_kind: str | None
    created_at: dt.datetime


class ReportsMixin(CatalogMixin):
    """Aggregates over measurements and shards."""

    def energy_totals(self, hardware_class_id: int | None = None) -> EnergyTotals:
        """Energy, counts and best latency per (workload, class, useful, source), with costs and links."""
        m = Measurement.__table__
        hw_filter = [m.c.hardware_class_id == hardware_class_id] if hardware_class_id is not None else []
        with self.session() as s:
            hw_names = {h.id: h.name for h in s.scalars(select(HardwareClass))}
            rows = s.execute(
                select(m.c.workload_id, m.c.hardware_class_id, m.c.useful, m.c.energy_source,
                       func.coalesce(func.sum(m.c.energy_j), 0.0), func.count(), func.count(m.c.error_kind),
                       func.min(m.c.mean_run_s), func.sum(case((m.c.error_kind == FILTERED, 1), else_=0)))
                .where(*hw_filter)
                .group_by(m.c.workload_id, m.c.hardware_class_id, m.c.useful, m.c.energy_source)
            ).all()
            costs = {(wl, hw): float(c) for wl, hw, c in s.execute(
                select(Shard.workload_id, Shard.hardware_class_id, func.coalesce(func.sum(Shard.cost), 0.0))
                .group_by(Shard.workload_id, Shard.hardware_class_id))}
            linked = model_links()
            links = s.execute(select(linked.c.model_id, linked.c.workload_id, linked.c.weight)).all()
            models = {mo.id: mo.name for mo in s.scalars(select(Model))}
            n_workloads = dict(s.execute(select(linked.c.model_id, func.count())
                                         .group_by(linked.c.model_id)).all())
        groups = [EnergyGroup(wl, hw, useful, source, float(joules), int(n), int(errors),
                              float(best) if best is not None else None, int(filtered or 0))
                  for wl, hw, useful, source, joules, n, errors, best, filtered in rows]
        return EnergyTotals(hw_names, groups, costs, [(int(a), int(b), int(c)) for a, b, c in links], models,
                            {int(k): int(v) for k, v in n_workloads.items()})

    def shard_state_counts(self) -> dict[str, dict[str, int]]:
        """``{hardware class name: {state: shards}}``, every class present (possibly empty)."""
        with self.session() as s:
            names = {h.id: h.name for h in s.scalars(select(HardwareClass))}
            rows = s.execute(select(Shard.hardware_class_id, Shard.state, func.count())
                             .group_by(Shard.hardware_class_id, Shard.state)).all()
        out: dict[str, dict[str, int]] = {name: {} for name in names.values()}
        for hw_id, state, n in rows:
            out[names[hw_id]][state] = int(n)
        return out

    def measurement_timeline(self, hardware_class_id: int, workload_ids: Sequence[int]) -> list[TimelinePoint]:
        """Every measurement of the workloads given on one class, errors and filtered included, in id order.

        Reads only the columns a progress chart needs (never the traces).
        """
        ids = list(workload_ids)
        if not ids:
            return []
        m = Measurement.__table__
        with self.session() as s:
            rows = s.execute(
                select(m.c.id, m.c.workload_id, m.c.mean_run_s, m.c.error_kind, m.c.created_at)
                .where(m.c.hardware_class_id == hardware_class_id, m.c.workload_id.in_(ids),
                       m.c.attempt == 0)  # tuning's trials: a build's re-timings are not
                .order_by(m.c.id)
            ).all()
        return [TimelinePoint(int(i), int(w), mean, err, created) for i, w, mean, err, created in rows]

    def outlook_inputs(self, hardware_class_id: int, workload_ids: Sequence[int] | None = None) -> OutlookInputs:
        """Weights, preemption and trial history of the workloads given (default: those with shards)."""
        m = Measurement.__table__
        with self.session() as s:
            if workload_ids is None:
                workload_ids = sorted(set(s.scalars(select(Shard.workload_id)
                                                    .where(Shard.hardware_class_id == hardware_class_id))))
            ids = list(workload_ids)
            if not ids:
                return OutlookInputs([], {}, set(), [])
            weights: dict[int, int] = defaultdict(int)
            linked = model_links(hardware_class_id)
            for wl, w in s.execute(select(linked.c.workload_id, linked.c.weight)
                                   .where(linked.c.workload_id.in_(ids))):
                weights[wl] += int(w)
            preempted = set(s.scalars(select(TuningState.workload_id).where(
                TuningState.hardware_class_id == hardware_class_id, TuningState.preempted.is_(True),
                TuningState.workload_id.in_(ids))))
            rows = s.execute(
                select(m.c.workload_id, m.c.mean_run_s, m.c.energy_j)
                .where(m.c.hardware_class_id == hardware_class_id, m.c.workload_id.in_(ids), m.c.attempt == 0,
                       (m.c.error_kind.is_(None)) | (m.c.error_kind != FILTERED))
                .order_by(m.c.id)
            ).all()
        return OutlookInputs(ids, dict(weights), preempted, [(int(w), mean, e) for w, mean, e in rows])

    def model_progress(self, model_id: int, hardware_class_id: int, since: dt.datetime) -> list[WorkloadProgress]:
        """Per workload of a model on one class: shards by state, trials planned and spent, rows
        committed since ``since`` (and their errors; first attempts only: a re-timing is no
        candidate), the best and the default schedule's run time,
        and the budget rounds planned since ``since`` with their shards' states."""
        m = Measurement
        with self.session() as s:
            linked = model_links(hardware_class_id)
            links = s.execute(select(Workload.id, Workload.name, linked.c.weight)
                              .join(linked, linked.c.workload_id == Workload.id)
                              .where(linked.c.model_id == model_id).order_by(Workload.id)).all()
            ids = [row[0] for row in links]
            states: dict[int, dict[str, int]] = defaultdict(dict)
            trials: dict[int, int] = defaultdict(int)
            for wl, state, n, t in s.execute(
                    select(Shard.workload_id, Shard.state, func.count(), func.sum(Shard.trials))
                    .where(Shard.hardware_class_id == hardware_class_id, Shard.workload_id.in_(ids))
                    .group_by(Shard.workload_id, Shard.state)):
                states[wl][state] = int(n)
                trials[wl] += 0 if state == CANCELLED else int(t or 0)
            spent = dict(s.execute(select(Shard.workload_id, func.count(m.id)).join(m, m.shard_id == Shard.id)
                                   .where(Shard.hardware_class_id == hardware_class_id, Shard.workload_id.in_(ids),
                                          Shard.state != CANCELLED).group_by(Shard.workload_id)).all())
            scope = (m.hardware_class_id == hardware_class_id, m.workload_id.in_(ids))
            recent = {wl: (int(n), int(e or 0)) for wl, n, e in s.execute(
                select(m.workload_id, func.count(m.id), func.sum(case((m.error_kind.in_(["build", "run"]), 1), else_=0)))
                .where(*scope, m.created_at >= since, m.repeat == 0).group_by(m.workload_id))}
            best = dict(s.execute(select(m.workload_id, func.min(m.mean_run_s)).where(*scope)
                                  .group_by(m.workload_id)).all())
            default = dict(s.execute(select(m.workload_id, func.min(m.mean_run_s))
                                     .where(*scope, m.trace_sha256 == DEFAULT_TRACE_SHA256).group_by(m.workload_id)).all())
            rounds: dict[int, dict[int, dict[str, int]]] = defaultdict(dict)
            for wl, state, history in s.execute(
                    select(Shard.workload_id, Shard.state, Shard.history)
                    .where(Shard.hardware_class_id == hardware_class_id, Shard.workload_id.in_(ids),
                           Shard.created_at >= since)):
                planned = (history or [{}])[0].get("round")
                if planned is not None:
                    by_state = rounds[wl].setdefault(int(planned), {})
                    by_state[state] = by_state.get(state, 0) + 1
        return [WorkloadProgress(wl, name, int(weight), dict(states[wl]), trials[wl], int(spent.get(wl, 0)),
                                 *recent.get(wl, (0, 0)), best.get(wl), default.get(wl), dict(rounds[wl]))
                for wl, name, weight in links]

    def queue_progress(self, shard_ids: Sequence[int], since: dt.datetime) -> list[WorkloadProgress]:
        """:meth:`model_progress` over given shards (e.g. the queue a worker found when it started),
        per workload; weights are 1, and neither the run times nor the rounds are read (no model to
        weigh by, no model's budget)."""
        m = Measurement
        ids = list(shard_ids)
        with self.session() as s:
            rows = s.execute(select(Shard.id, Shard.workload_id, Workload.name, Shard.state, Shard.trials)
                             .join(Workload, Workload.id == Shard.workload_id).where(Shard.id.in_(ids))
                             .order_by(Shard.workload_id)).all()
            spent = dict(s.execute(select(m.shard_id, func.count(m.id)).where(m.shard_id.in_(ids))
                                   .group_by(m.shard_id)).all())
            recent = {sid: (int(n), int(e or 0)) for sid, n, e in s.execute(
                select(m.shard_id, func.count(m.id), func.sum(case((m.error_kind.in_(["build", "run"]), 1), else_=0)))
                .where(m.shard_id.in_(ids), m.created_at >= since).group_by(m.shard_id))}
        per: dict[int, dict[str, Any]] = {}
        for sid, wl, name, state, trials in rows:
            w = per.setdefault(wl, {"name": name, "shards": defaultdict(int), "trials": 0, "spent": 0, "n": 0, "e": 0})
            w["shards"][state] += 1
            w["trials"] += 0 if state == CANCELLED else int(trials)
            w["spent"] += int(spent.get(sid, 0))
            n, e = recent.get(sid, (0, 0))
            w["n"], w["e"] = w["n"] + n, w["e"] + e
        return [WorkloadProgress(wl, w["name"], 1, dict(w["shards"]), w["trials"], w["spent"], w["n"], w["e"],
                                 None, None, {}) for wl, w in per.items()]
