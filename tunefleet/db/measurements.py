"""Measurements (committed candidates, best-n, counts, trace hashes) and plateau state."""

from __future__ import annotations

import datetime as dt
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, or_, select, update

from tunefleet.db._base import sha256_text
from tunefleet.db.catalog import CatalogMixin
from tunefleet.db.shards import LeaseFence, check_fence, clear_in_flight
from tunefleet.db.tables import Measurement, TuningState, Workload
from tunefleet.vocab import DEFAULT_TRACE_SHA256, task_name_key

# Batches at least this large go through PostgreSQL's COPY path (see _pg_copy.py).
_COPY_MIN_ROWS = 32

PAIRED_MODE = "paired"
"""``measure_mode`` prefix (``paired:<rounds>``) of a schedule timed side by side with another to
decide between the two (:func:`tunefleet.delivery.confirm.confirm_by_tile`): such a figure answers
which of the two is faster at one moment, and ranks nothing (:meth:`MeasurementsMixin.best_measurements`
leaves it out; :meth:`MeasurementsMixin.paired_measurements` reads it)."""


def _not_paired(column: Any) -> Any:
    return or_(column.is_(None), ~column.like(f"{PAIRED_MODE}:%"))


@dataclass
class NewMeasurement:
    """A measured candidate to commit. ``mean_run_s`` is derived: NULL for errors."""

    workload_id: int
    hardware_class_id: int
    trace_json: str
    run_secs: list[float] | None = None
    build_s: float | None = None
    error_kind: str | None = None  # "build" | "run" | FILTERED | None
    error_msg: str | None = None
    args_info: list[Any] | None = None
    shard_id: int | None = None
    repeat: int = 0
    """Which measurement of this candidate (0: the first; a deliberate re-measurement counts up)."""
    energy_j: float | None = None
    energy_source: str | None = None
    useful: bool | None = None
    measure_mode: str | None = None
    tvm_version: str = ""
    target: str = ""
    trace_sha256: str = field(default="")

    def __post_init__(self) -> None:
        if not self.trace_sha256:
            self.trace_sha256 = sha256_text(self.trace_json)

    @property
    def mean_run_s(self) -> float | None:
        if self.error_kind or not self.run_secs:
            return None
        return float(statistics.fmean(self.run_secs))

    def row(self) -> dict[str, Any]:
        return {
            "workload_id": self.workload_id,
            "hardware_class_id": self.hardware_class_id,
            "shard_id": self.shard_id,
            "trace_json": self.trace_json,
            "trace_sha256": self.trace_sha256,
            "repeat": self.repeat,
            "args_info": self.args_info,
            "run_secs": [float(x) for x in self.run_secs] if self.run_secs is not None else None,
            "mean_run_s": self.mean_run_s,
            "build_s": self.build_s,
            "error_kind": self.error_kind,
            "error_msg": self.error_msg,
            "energy_j": self.energy_j,
            "energy_source": self.energy_source,
            "useful": self.useful,
            "measure_mode": self.measure_mode,
            "tvm_version": self.tvm_version,
            "target": self.target,
        }


@dataclass(frozen=True)
class SimilarWorkload:
    """A measured workload of the same operator as another, at another shape."""

    id: int
    structural_hash: str
    name: str
    flops: float
    best_s: float
    """Its fastest successful scheduled measurement on the class."""


def _flops_distance(flops: float, other: float) -> float:
    """|log(flops ratio)|: 0 for equal work; unknown FLOPs (0) rank last."""
    return abs(math.log(other / flops)) if flops > 0 and other > 0 else math.inf


class MeasurementsMixin(CatalogMixin):
    """Every measured candidate, and the plateau state tuning keeps per (workload, class)."""

    # -- measurements ---------------------------------------------------------------------
    def commit_measurements(self, records: Iterable[NewMeasurement], *, fence: LeaseFence | None = None) -> int:
        """Append measurements; a retried commit of the same (trace, repeat) is a no-op.

        With ``fence`` (the committing worker's lease), the lease is checked in the same
        transaction first: a stale one raises :class:`~tunefleet.errors.StaleLeaseError` and
        nothing is stored; the committed candidates are no longer in flight. Returns the number
        of rows actually inserted.
        """
        rows = [r.row() for r in records]
        if not rows:
            return 0
        with self.session() as s:
            if fence is not None:
                check_fence(s, self.dialect, fence, f"commit of {len(rows)} measurement(s)")
                clear_in_flight(s, fence.shard_id, [r["trace_sha256"] for r in rows])
            if self.dialect == "postgresql" and len(rows) >= _COPY_MIN_ROWS:
                from tunefleet.db._pg_copy import copy_insert_measurements

                return copy_insert_measurements(s.connection().connection.dbapi_connection, rows)
            stmt = self._insert(Measurement).on_conflict_do_nothing(
                index_elements=["workload_id", "hardware_class_id", "trace_sha256", "attempt"]
            )
            # RETURNING works with executemany (SQLAlchemy's insertmanyvalues) on both backends and
            # returns only the rows actually inserted, so skipped duplicates are not counted.
            return len(s.execute(stmt.returning(Measurement.id), rows).all())

    def best_measurements(self, workload: int | str, hardware: int | str, n: int = 5, *,
                          before: dt.datetime | None = None) -> list[Any]:
        """The ``n`` fastest successful measurements of a workload on one hardware class.

        ``workload`` is an id or a structural hash, ``hardware`` an id or a class name;
        ``before`` (naive UTC, as stored) keeps only those committed earlier. A schedule measured
        again (a later ``attempt``: a build's re-timing, :mod:`tunefleet.delivery.confirm`) is
        ranked by its latest measurement only — a failed one leaves it out — since its first
        figure was picked for being the fastest of many noisy ones. A paired figure
        (:data:`PAIRED_MODE`) neither ranks nor supersedes: it was measured to compare two schedules
        at one moment, and at a slow moment it would drop both behind records of a faster one. One query walking
        ``ix_measurements_best`` in order (the later attempt looked up through the candidate's
        unique key); rows are read-only records with the columns of
        :class:`~tunefleet.db.tables.Measurement` as attributes (``attempt`` among them).
        """
        hw_id = hardware if isinstance(hardware, int) else self._hardware_id(hardware)
        table = Measurement.__table__
        if isinstance(workload, int):
            wl_filter = table.c.workload_id == workload
        else:
            wl_filter = table.c.workload_id == (
                select(Workload.id).where(Workload.structural_hash == workload).scalar_subquery()
            )
        when = [table.c.created_at < before] if before is not None else []
        later = Measurement.__table__.alias("later")
        superseded = (
            select(later.c.id)
            .where(later.c.workload_id == table.c.workload_id, later.c.hardware_class_id == table.c.hardware_class_id,
                   later.c.trace_sha256 == table.c.trace_sha256, later.c.attempt > table.c.attempt,
                   _not_paired(later.c.measure_mode), *([later.c.created_at < before] if before is not None else []))
            .exists()
        )
        stmt = (
            select(table)
            .where(wl_filter, table.c.hardware_class_id == hw_id, table.c.mean_run_s.is_not(None),
                   _not_paired(table.c.measure_mode), *when, ~superseded)
            .order_by(table.c.mean_run_s, table.c.id)
            .limit(n)
        )
        with self.session() as s:
            return list(s.execute(stmt).all())

    def paired_measurements(self, workload_id: int, hardware_class_id: int) -> dict[str, Any]:
        """The latest paired measurement (:data:`PAIRED_MODE`) of each schedule of a workload that
        has one, by trace sha256; a failed one too (``mean_run_s`` None). Rows as
        :meth:`best_measurements` gives them."""
        table = Measurement.__table__
        stmt = (
            select(table)
            .where(table.c.workload_id == workload_id, table.c.hardware_class_id == hardware_class_id,
                   table.c.measure_mode.like(f"{PAIRED_MODE}:%"))
            .order_by(table.c.attempt)
        )
        with self.session() as s:
            return {m.trace_sha256: m for m in s.execute(stmt).all()}

    def latest_attempts(self, workload_id: int, hardware_class_id: int, shas: Iterable[str]) -> dict[str, int]:
        """The highest ``attempt`` stored for each of these schedules (by trace sha256) that has one."""
        wanted = list(shas)
        if not wanted:
            return {}
        stmt = (
            select(Measurement.trace_sha256, func.max(Measurement.repeat))
            .where(Measurement.workload_id == workload_id, Measurement.hardware_class_id == hardware_class_id,
                   Measurement.trace_sha256.in_(wanted))
            .group_by(Measurement.trace_sha256)
        )
        with self.session() as s:
            return {sha: int(n) for sha, n in s.execute(stmt)}

    def similar_measured_workloads(self, hardware_class_id: int, op_kind: str, name_key: str, *,
                                   exclude_id: int | None = None, flops: float = 0.0,
                                   limit: int = 4) -> list[SimilarWorkload]:
        """Workloads of one operator at other shapes with a scheduled measurement on the class.

        Same ``op_kind`` and the same fused-op sequence (``name_key``, as
        :func:`tunefleet.vocab.task_name_key` gives it), a successful measurement other than the
        unscheduled default on the class; ``exclude_id`` left out. Closest in FLOPs to ``flops``
        first (by ratio), then the fastest; at most ``limit``.
        """
        m, w = Measurement, Workload
        stmt = (
            select(w.id, w.structural_hash, w.name, w.flops, func.min(m.mean_run_s))
            .join(m, m.workload_id == w.id)
            .where(w.op_kind == op_kind, m.hardware_class_id == hardware_class_id, m.mean_run_s.is_not(None),
                   m.trace_sha256 != DEFAULT_TRACE_SHA256,
                   # a superset of the names with this key ("_" matches any one character): checked below
                   w.name.like("%" + "%".join(name_key.split("_")) + "%"))
            .group_by(w.id, w.structural_hash, w.name, w.flops)
        )
        if exclude_id is not None:
            stmt = stmt.where(w.id != exclude_id)
        with self.session() as s:
            rows = s.execute(stmt).all()
        found = [SimilarWorkload(int(i), h, n, float(f or 0.0), float(best)) for i, h, n, f, best in rows
                 if task_name_key(n) == name_key]
        found.sort(key=lambda x: (_flops_distance(flops, x.flops), x.best_s, x.id))
        return found[:max(limit, 0)]

    def count_measurements(
        self,
        workload_id: int | None = None,
        hardware_class_id: int | None = None,
        *,
        shard_id: int | None = None,
        errors: bool = True,
    ) -> int:
        """Measurements matching every filter given (errors included unless ``errors=False``)."""
        with self.session() as s:
            stmt = select(func.count()).select_from(Measurement)
            for column, value in ((Measurement.workload_id, workload_id),
                                  (Measurement.hardware_class_id, hardware_class_id),
                                  (Measurement.shard_id, shard_id)):
                if value is not None:
                    stmt = stmt.where(column == value)
            if not errors:
                stmt = stmt.where(Measurement.mean_run_s.is_not(None))
            return int(s.scalar(stmt) or 0)

    def measured_trace_hashes(self, workload_id: int, hardware_class_id: int) -> set[str]:
        """sha256 of every trace already measured for (workload, hardware class)."""
        with self.session() as s:
            stmt = select(Measurement.trace_sha256).where(
                Measurement.workload_id == workload_id, Measurement.hardware_class_id == hardware_class_id
            )
            return set(s.scalars(stmt))

    def measurements(
        self, *, hardware_class_id: int | None = None, after_id: int = 0, limit: int | None = None
    ) -> list[Measurement]:
        """Measurements in id order (for exports), optionally after a given id."""
        with self.session() as s:
            stmt = select(Measurement).where(Measurement.id > after_id).order_by(Measurement.id)
            if hardware_class_id is not None:
                stmt = stmt.where(Measurement.hardware_class_id == hardware_class_id)
            if limit is not None:
                stmt = stmt.limit(limit)
            return list(s.scalars(stmt))

    def best_run_s_by_workload(self, hardware_class_id: int, up_to_id: int) -> dict[int, float]:
        """Fastest successful ``mean_run_s`` per workload of one class, over ids up to ``up_to_id``."""
        stmt = (
            select(Measurement.workload_id, func.min(Measurement.mean_run_s))
            .where(
                Measurement.hardware_class_id == hardware_class_id,
                Measurement.id <= up_to_id,
                Measurement.mean_run_s.is_not(None),
            )
            .group_by(Measurement.workload_id)
        )
        with self.session() as s:
            return {int(wl): float(best) for wl, best in s.execute(stmt) if best is not None}

    def trace_run_s(self, workload_id: int, hardware_class_id: int, trace_sha256: str) -> float | None:
        """Mean run time of one trace measured successfully on a class (None if it never was)."""
        with self.session() as s:
            stmt = select(Measurement.mean_run_s).where(
                Measurement.workload_id == workload_id, Measurement.hardware_class_id == hardware_class_id,
                Measurement.trace_sha256 == trace_sha256, Measurement.mean_run_s.is_not(None),
            )
            return s.scalars(stmt).first()

    # -- plateau state (tunefleet.planning.preemption) ---------------------------------------------
    def tuning_state(self, workload_id: int, hardware_class_id: int) -> TuningState | None:
        with self.session() as s:
            return s.get(TuningState, (workload_id, hardware_class_id))

    def save_tuning_state(self, state: TuningState) -> None:
        """Insert or replace the state of ``(state.workload_id, state.hardware_class_id)``."""
        with self.session() as s:
            s.merge(state)

    def tuning_states(self, hardware_class_id: int, *, preempted: bool | None = None) -> list[TuningState]:
        with self.session() as s:
            stmt = select(TuningState).where(TuningState.hardware_class_id == hardware_class_id)
            if preempted is not None:
                stmt = stmt.where(TuningState.preempted == preempted)
            return list(s.scalars(stmt.order_by(TuningState.workload_id)))

    def reset_plateaus(self, hardware_class_id: int, workload_ids: Sequence[int] | None = None) -> int:
        """Forget the plateau state (so preempted workloads are planned and tuned again)."""
        with self.session() as s:
            stmt = update(TuningState).where(TuningState.hardware_class_id == hardware_class_id)
            if workload_ids:
                stmt = stmt.where(TuningState.workload_id.in_(list(workload_ids)))
            res = s.execute(stmt.values(preempted=False, stale_rounds=0, recent=[], reason=None))
            return int(res.rowcount or 0)

    def add_freed_trials(self, workload_id: int, hardware_class_id: int, trials: int) -> None:
        """Add to the trials a preempted workload gave up (kept on its state; none kept without one)."""
        with self.session() as s:
            state = s.get(TuningState, (workload_id, hardware_class_id))
            if state is not None:
                state.freed_trials = (state.freed_trials or 0) + max(trials, 0)
