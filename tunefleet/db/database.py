"""The tunefleet database: one class over SQLite and PostgreSQL.

Every method opens its own short transaction, so a caller never holds locks across TVM work.
Storage errors are never swallowed: connection problems surface as :class:`DatabaseError`
with one line naming the database (password masked) and the driver's reason.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select, update
from sqlalchemy.dialects import postgresql as pg_dialect
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from tunefleet.db.engine import describe_db_error, ensure_schema, is_connection_problem, make_engine, masked_url
from tunefleet.db.models import (
    CostModel,
    Dataset,
    HardwareClass,
    Measurement,
    Model,
    ModelWorkload,
    Prediction,
    TuningState,
    Workload,
)
from tunefleet.errors import DatabaseError, DatabaseUnavailableError, NotFoundError
from tunefleet.vocab import FILTERED

if TYPE_CHECKING:
    from tunefleet.config import Settings

log = logging.getLogger(__name__)


# Batches at least this large go through PostgreSQL's COPY path (see _pg_copy.py).
_COPY_MIN_ROWS = 32


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


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
    attempt: int = 0
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
            "attempt": self.attempt,
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


class Database:
    """Access to the tunefleet schema on SQLite or PostgreSQL.

    Parameters
    ----------
    url:
        SQLAlchemy URL (``sqlite:///path`` or ``postgresql+psycopg2://...``).
    connect_timeout_s:
        Bound on connecting (and on SQLite's wait for a lock).
    auto_migrate:
        Create the schema in an empty database. An outdated or unknown schema is always refused.
    """

    def __init__(
        self,
        url: str,
        *,
        connect_timeout_s: float = 5.0,
        statement_timeout_s: float = 0.0,
        auto_migrate: bool = True,
        check_schema: bool = True,
    ) -> None:
        self.url = url
        self.engine = make_engine(url, connect_timeout_s=connect_timeout_s, statement_timeout_s=statement_timeout_s)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._hw_ids: dict[str, int] = {}
        if check_schema:
            ensure_schema(self.engine, auto_migrate=auto_migrate)

    @classmethod
    def from_settings(cls, settings: Settings, **kwargs: Any) -> Database:
        return cls(
            settings.effective_database_url,
            connect_timeout_s=settings.db_connect_timeout_s,
            statement_timeout_s=settings.db_statement_timeout_s,
            auto_migrate=settings.db_auto_migrate,
            **kwargs,
        )

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    def __repr__(self) -> str:
        return f"Database({masked_url(self.url)!r})"

    @contextmanager
    def session(self) -> Iterator[Session]:
        """A transaction: committed on success, rolled back on error."""
        try:
            with self._sessions.begin() as sess:
                yield sess
        except OperationalError as exc:
            cls = DatabaseUnavailableError if is_connection_problem(exc) else DatabaseError
            raise cls(f"database {masked_url(self.url)} failed: {describe_db_error(exc)}") from exc

    def _insert(self, table: Any) -> Any:
        return (pg_dialect.insert if self.dialect == "postgresql" else sqlite_dialect.insert)(table)

    # -- hardware classes -----------------------------------------------------------------
    def upsert_hardware_class(
        self,
        name: str,
        target: dict[str, Any],
        node_pool: str,
        *,
        watts_per_core: float = 0.0,
        idle_watts: float = 0.0,
        watts_per_gpu: float = 0.0,
        price_per_hour: float = 0.0,
        capabilities: dict[str, Any] | None = None,
    ) -> HardwareClass:
        """Create or update a hardware class by name."""
        values = {
            "target": target,
            "node_pool": node_pool,
            "watts_per_core": watts_per_core,
            "idle_watts": idle_watts,
            "watts_per_gpu": watts_per_gpu,
            "price_per_hour": price_per_hour,
            "capabilities": capabilities or {},
        }
        with self.session() as s:
            stmt = self._insert(HardwareClass).values(name=name, **values)
            s.execute(stmt.on_conflict_do_nothing(index_elements=["name"]))
            hw = s.scalars(select(HardwareClass).where(HardwareClass.name == name)).one()
            changed = {k: v for k, v in values.items() if getattr(hw, k) != v}
            for key, value in changed.items():
                setattr(hw, key, value)
            return hw

    def hardware_class(self, ref: int | str) -> HardwareClass:
        """A hardware class by name (or by id)."""
        with self.session() as s:
            if isinstance(ref, int):
                hw = s.get(HardwareClass, ref)
            else:
                hw = s.scalars(select(HardwareClass).where(HardwareClass.name == ref)).one_or_none()
            if hw is None:
                known = ", ".join(s.scalars(select(HardwareClass.name).order_by(HardwareClass.name))) or "none"
                raise NotFoundError(f"unknown hardware class {ref!r} (known: {known})")
            return hw

    def hardware_classes(self) -> list[HardwareClass]:
        with self.session() as s:
            return list(s.scalars(select(HardwareClass).order_by(HardwareClass.name)))

    # -- models ---------------------------------------------------------------------------
    def add_model(
        self,
        *,
        name: str,
        source: str,
        format: str,
        sha256: str,
        artifact_uri: str,
        input_info: list[Any] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> tuple[Model, bool]:
        """Register a model by content hash; return (model, created). Same bytes → same row."""
        with self.session() as s:
            stmt = self._insert(Model).values(
                name=name, source=source, format=format, sha256=sha256, artifact_uri=artifact_uri,
                input_info=input_info or [], meta=meta or {},
            )
            res = s.execute(stmt.on_conflict_do_nothing(index_elements=["sha256"]))
            model = s.scalars(select(Model).where(Model.sha256 == sha256)).one()
            return model, bool(res.rowcount)

    def model(self, ref: int | str) -> Model:
        """A model by id, name (newest of that name) or sha256 prefix (>= 8 chars)."""
        with self.session() as s:
            if isinstance(ref, int) or (isinstance(ref, str) and ref.isdigit()):
                found = s.get(Model, int(ref))
            else:
                found = s.scalars(select(Model).where(Model.name == ref).order_by(Model.id.desc()).limit(1)).first()
                if found is None and len(ref) >= 8:
                    found = s.scalars(select(Model).where(Model.sha256.startswith(ref))).first()
            if found is None:
                raise NotFoundError(f"no model {ref!r}; see `tunefleet models list`")
            return found

    def models(self) -> list[Model]:
        with self.session() as s:
            return list(s.scalars(select(Model).order_by(Model.id)))

    # -- workloads ------------------------------------------------------------------------
    def add_workload(
        self, *, structural_hash: str, name: str, op_kind: str, flops: float, tir_json: str
    ) -> tuple[Workload, bool]:
        """Store a workload once by structural hash; return (workload, created)."""
        with self.session() as s:
            stmt = self._insert(Workload).values(
                structural_hash=structural_hash, name=name, op_kind=op_kind, flops=flops, tir_json=tir_json
            )
            res = s.execute(stmt.on_conflict_do_nothing(index_elements=["structural_hash"]))
            wl = s.scalars(select(Workload).where(Workload.structural_hash == structural_hash)).one()
            return wl, bool(res.rowcount)

    def link_model_workload(self, model_id: int, workload_id: int, weight: int) -> None:
        """Record that a model calls a workload ``weight`` times (last write wins)."""
        with self.session() as s:
            stmt = self._insert(ModelWorkload).values(model_id=model_id, workload_id=workload_id, weight=weight)
            s.execute(
                stmt.on_conflict_do_update(index_elements=["model_id", "workload_id"], set_={"weight": weight})
            )

    def workload(self, ref: int | str) -> Workload:
        """A workload by id or structural hash (a unique prefix of >= 6 hex digits works)."""
        with self.session() as s:
            if isinstance(ref, int):
                found = s.get(Workload, ref)
            else:
                found = s.scalars(select(Workload).where(Workload.structural_hash == ref)).one_or_none()
                if found is None and len(ref) >= 6:
                    matches = list(s.scalars(select(Workload).where(Workload.structural_hash.startswith(ref)).limit(2)))
                    if len(matches) > 1:
                        raise NotFoundError(f"workload prefix {ref!r} is ambiguous; give more digits")
                    found = matches[0] if matches else None
            if found is None:
                raise NotFoundError(f"no workload {ref!r}; see `tunefleet workloads list`")
            return found

    def workloads(self, model_id: int | None = None) -> list[tuple[Workload, int]]:
        """Workloads with their weight (total call count across models, or in one model)."""
        with self.session() as s:
            weight = func.coalesce(func.sum(ModelWorkload.weight), 0)
            stmt = (
                select(Workload, weight)
                .outerjoin(ModelWorkload, ModelWorkload.workload_id == Workload.id)
                .group_by(Workload.id)
                .order_by(Workload.id)
            )
            if model_id is not None:
                stmt = stmt.where(ModelWorkload.model_id == model_id)
            return [(wl, int(w)) for wl, w in s.execute(stmt)]

    # -- measurements ---------------------------------------------------------------------
    def commit_measurements(self, records: Iterable[NewMeasurement]) -> int:
        """Append measurements; a retried commit of the same (trace, attempt) is a no-op.

        Returns the number of rows actually inserted.
        """
        rows = [r.row() for r in records]
        if not rows:
            return 0
        with self.session() as s:
            if self.dialect == "postgresql" and len(rows) >= _COPY_MIN_ROWS:
                from tunefleet.db._pg_copy import copy_insert_measurements

                return copy_insert_measurements(s.connection().connection.dbapi_connection, rows)
            stmt = self._insert(Measurement).on_conflict_do_nothing(
                index_elements=["workload_id", "hardware_class_id", "trace_sha256", "attempt"]
            )
            # RETURNING works with executemany (SQLAlchemy's insertmanyvalues) on both backends and
            # returns only the rows actually inserted, so skipped duplicates are not counted.
            return len(s.execute(stmt.returning(Measurement.id), rows).all())

    def best_measurements(self, workload: int | str, hardware: int | str, n: int = 5) -> list[Any]:
        """The ``n`` fastest successful measurements of a workload on one hardware class.

        ``workload`` is an id or a structural hash, ``hardware`` an id or a class name. One
        query walking ``ix_measurements_best`` in order; rows are read-only records with the
        columns of :class:`~tunefleet.db.models.Measurement` as attributes.
        """
        hw_id = hardware if isinstance(hardware, int) else self._hardware_id(hardware)
        table = Measurement.__table__
        if isinstance(workload, int):
            wl_filter = table.c.workload_id == workload
        else:
            wl_filter = table.c.workload_id == (
                select(Workload.id).where(Workload.structural_hash == workload).scalar_subquery()
            )
        stmt = (
            select(table)
            .where(wl_filter, table.c.hardware_class_id == hw_id, table.c.mean_run_s.is_not(None))
            .order_by(table.c.mean_run_s, table.c.id)
            .limit(n)
        )
        with self.session() as s:
            return list(s.execute(stmt).all())

    def _hardware_id(self, name: str) -> int:
        """Hardware class id by name, cached (classes are upserted by name, ids never change)."""
        hw_id = self._hw_ids.get(name)
        if hw_id is None:
            hw_id = self._hw_ids[name] = self.hardware_class(name).id
        return hw_id

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

    def workload_weight(self, workload_id: int) -> int:
        """Total calls of a workload over every model that contains it (1 if none links it)."""
        with self.session() as s:
            total = s.scalar(select(func.sum(ModelWorkload.weight)).where(ModelWorkload.workload_id == workload_id))
        return int(total or 1)

    # -- plateau state (tunefleet.preemption) ---------------------------------------------
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

    # -- predictions ----------------------------------------------------------------------
    def add_predictions(
        self,
        workload_id: int,
        hardware_class_id: int,
        proposals: Sequence[tuple[str, float, list[Any] | None]],
        *,
        cost_model_id: int | None = None,
    ) -> int:
        """Store cost-model proposals (trace JSON, score, args_info), ranked by score."""
        ranked = sorted(proposals, key=lambda p: -p[1])
        rows = [
            {
                "workload_id": workload_id,
                "hardware_class_id": hardware_class_id,
                "cost_model_id": cost_model_id,
                "trace_json": trace,
                "trace_sha256": sha256_text(trace),
                "args_info": args,
                "score": float(score),
                "rank": rank,
            }
            for rank, (trace, score, args) in enumerate(ranked)
        ]
        if not rows:
            return 0
        with self.session() as s:
            stmt = self._insert(Prediction).on_conflict_do_nothing(
                index_elements=["workload_id", "hardware_class_id", "cost_model_id", "trace_sha256"]
            )
            return len(s.execute(stmt.returning(Prediction.id), rows).all())

    def best_predictions(self, workload_id: int, hardware_class_id: int, n: int = 5) -> list[Prediction]:
        """The ``n`` best-scored predictions of the cost model that predicted this workload last.

        Scores of different models are not comparable, so one model's proposals are returned.
        """
        where = (Prediction.workload_id == workload_id, Prediction.hardware_class_id == hardware_class_id)
        with self.session() as s:
            last = s.execute(select(Prediction.cost_model_id).where(*where).order_by(Prediction.id.desc()).limit(1)).first()
            if last is None:
                return []
            same_model = (Prediction.cost_model_id.is_(None) if last[0] is None
                          else Prediction.cost_model_id == last[0])
            stmt = select(Prediction).where(*where, same_model).order_by(Prediction.score.desc(), Prediction.id).limit(n)
            return list(s.scalars(stmt))

    def has_predictions(self, workload_id: int, hardware_class_id: int, cost_model_id: int | None) -> bool:
        """Whether this cost model already stored predictions for the workload on the class."""
        model = Prediction.cost_model_id.is_(None) if cost_model_id is None else Prediction.cost_model_id == cost_model_id
        with self.session() as s:
            stmt = select(Prediction.id).where(Prediction.workload_id == workload_id,
                                               Prediction.hardware_class_id == hardware_class_id, model).limit(1)
            return s.execute(stmt).first() is not None

    # -- datasets and cost models ---------------------------------------------------------
    def add_dataset(self, *, uri: str, manifest: dict[str, Any], row_count: int) -> Dataset:
        """Register the next dataset version."""
        with self.session() as s:
            version = int(s.scalar(select(func.coalesce(func.max(Dataset.version), 0))) or 0) + 1
            ds = Dataset(version=version, uri=uri, manifest=json.loads(json.dumps(manifest)), row_count=row_count)
            s.add(ds)
            s.flush()
            return ds

    def datasets(self) -> list[Dataset]:
        with self.session() as s:
            return list(s.scalars(select(Dataset).order_by(Dataset.version)))

    def add_cost_model(
        self, *, hardware_class_id: int, artifact_uri: str, metrics: dict[str, Any], dataset_id: int | None = None
    ) -> CostModel:
        """Register the next cost-model version of a hardware class (not promoted)."""
        with self.session() as s:
            version = int(
                s.scalar(
                    select(func.coalesce(func.max(CostModel.version), 0)).where(
                        CostModel.hardware_class_id == hardware_class_id
                    )
                )
                or 0
            ) + 1
            cm = CostModel(
                hardware_class_id=hardware_class_id, version=version, dataset_id=dataset_id,
                metrics=metrics, artifact_uri=artifact_uri, promoted=False,
            )
            s.add(cm)
            s.flush()
            return cm

    def promote_cost_model(self, cost_model_id: int) -> None:
        """Make a cost model the current one of its hardware class."""
        with self.session() as s:
            cm = s.get(CostModel, cost_model_id)
            if cm is None:
                raise NotFoundError(f"no cost model {cost_model_id}")
            s.execute(
                update(CostModel).where(CostModel.hardware_class_id == cm.hardware_class_id).values(promoted=False)
            )
            cm.promoted = True

    def current_cost_model(self, hardware_class_id: int) -> CostModel | None:
        with self.session() as s:
            stmt = select(CostModel).where(
                CostModel.hardware_class_id == hardware_class_id, CostModel.promoted.is_(True)
            )
            return s.scalars(stmt).one_or_none()


__all__ = ["Database", "NewMeasurement"]
