"""SQLAlchemy ORM models: the tunefleet schema.

Every key that identifies a result is target-aware: (workload structural hash, hardware class).
Times are naive UTC (``utcnow``) on every backend so comparisons behave the same on SQLite and
PostgreSQL. Migrations live in ``tunefleet/db/migrations``; change both together.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Stable constraint names so Alembic migrations are identical on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# BIGINT primary keys on PostgreSQL; SQLite only autoincrements "INTEGER PRIMARY KEY".
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Model(Base):
    """An ingested model; its bytes live content-addressed in the artifact store."""

    __tablename__ = "models"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    source: Mapped[str] = mapped_column(String(20))  # zoo | onnx | pt2
    format: Mapped[str] = mapped_column(String(20))
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    artifact_uri: Mapped[str] = mapped_column(Text)
    input_info: Mapped[list[Any]] = mapped_column(JSON, default=list)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class Workload(Base):
    """A TIR function to tune, identified by its structural hash; stored once."""

    __tablename__ = "workloads"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    structural_hash: Mapped[str] = mapped_column(String(32), unique=True)
    name: Mapped[str] = mapped_column(String(200))
    op_kind: Mapped[str] = mapped_column(String(50), index=True)
    flops: Mapped[float] = mapped_column(Float, default=0.0)
    tir_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class ModelWorkload(Base):
    """Which workloads a model contains, and how often it calls each (the weight)."""

    __tablename__ = "model_workloads"
    model_id: Mapped[int] = mapped_column(ForeignKey("models.id", ondelete="CASCADE"), primary_key=True)
    # Per class: a class's extraction recipe (layout, prepacking) decides which workloads a model has.
    hardware_class_id: Mapped[int] = mapped_column(ForeignKey("hardware_classes.id", ondelete="CASCADE"),
                                                   primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id", ondelete="CASCADE"), primary_key=True)
    weight: Mapped[int] = mapped_column(Integer, default=1)
    recipe: Mapped[str] = mapped_column(String(64), default="native")


class HardwareClass(Base):
    """A class of hardware tuned for as one: target, node pool, power and price."""

    __tablename__ = "hardware_classes"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    target: Mapped[dict[str, Any]] = mapped_column(JSON)  # TVM target, dict form
    node_pool: Mapped[str] = mapped_column(String(128))
    watts_per_core: Mapped[float] = mapped_column(Float, default=0.0)
    idle_watts: Mapped[float] = mapped_column(Float, default=0.0)
    watts_per_gpu: Mapped[float] = mapped_column(Float, default=0.0)
    price_per_hour: Mapped[float] = mapped_column(Float, default=0.0)
    capabilities: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    layout: Mapped[str | None] = mapped_column(String(16), nullable=True)
    """conv2d layout of the extraction recipe ("NHWC", "native"); None: the target's default."""
    winograd: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """Whether the extraction recipe computes the qualifying 3x3 convolutions as Winograd."""
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)


class Shard(Base):
    """A unit of tuning work: trials for one (workload, hardware class), leased to a worker."""

    __tablename__ = "shards"
    __table_args__ = (
        Index("ix_shards_queue", "hardware_class_id", "state", "priority"),
        # One leased shard per (workload, class) at a time: two workers never search one workload at
        # once, so neither measures a candidate the other has in flight (and each round's search
        # starts from everything committed before it).
        Index("uq_shards_one_lease_per_workload", "workload_id", "hardware_class_id", unique=True,
              postgresql_where=text("state = 'leased'"), sqlite_where=text("state = 'leased'")),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id", ondelete="CASCADE"))
    hardware_class_id: Mapped[int] = mapped_column(ForeignKey("hardware_classes.id", ondelete="CASCADE"))
    trials: Mapped[int] = mapped_column(Integer)
    priority: Mapped[float] = mapped_column(Float, default=0.0)
    state: Mapped[str] = mapped_column(String(16), default="pending")  # pending|leased|done|failed|cancelled
    lease_owner: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    # Leases taken so far, and how many a shard gets before it fails (the columns keep their
    # first names, "attempts"; the CLI and JSON still say attempts).
    leases: Mapped[int] = mapped_column("attempts", Integer, default=0)
    max_leases: Mapped[int] = mapped_column("max_attempts", Integer, default=3)
    # The fencing token: bumped on every lease and reclaim; commits and heartbeats of an older
    # generation are refused (tunefleet.db.shards.LeaseFence).
    lease_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Leases lost (the worker died or stopped heartbeating), counted apart from ``leases``.
    lost_leases: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # No lease before this time (database clock): the backoff after a lost lease.
    not_before: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    history: Mapped[list[Any]] = mapped_column(JSON, default=list)
    # Accounting, summed over the shard's attempts (see tunefleet.energy.accounting).
    energy_j: Mapped[float | None] = mapped_column(Float, nullable=True)
    energy_source: Mapped[str | None] = mapped_column(String(32), nullable=True)
    node_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    cpu_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    cost: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)


class InFlight(Base):
    """A candidate handed to the builder and not committed yet, kept to tell which one kills workers.

    ``current``: in the batch measured now. ``deaths``: how many times its worker died with it
    in flight; a candidate with deaths is a suspect, re-measured alone when the shard resumes
    (:func:`tunefleet.planning.shard_queue.requeue_expired`).
    """

    __tablename__ = "in_flight"
    shard_id: Mapped[int] = mapped_column(ForeignKey("shards.id", ondelete="CASCADE"), primary_key=True)
    trace_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    trace_json: Mapped[str] = mapped_column(Text)
    args_info: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    target: Mapped[str] = mapped_column(Text, default="")
    tvm_version: Mapped[str] = mapped_column(String(64), default="")
    current: Mapped[bool] = mapped_column(Boolean, default=True)
    deaths: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class TuningState(Base):
    """The plateau state of one (workload, hardware class), kept across shards and attempts.

    Updated after every measured round (see :mod:`tunefleet.planning.preemption`): ``recent`` holds the
    last rounds' ``{"gain_s", "joules", "best_s"}``; a ``preempted`` pair receives no more trials
    (planning skips it, its shards end at once) until it is reset.
    """

    __tablename__ = "tuning_states"
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id", ondelete="CASCADE"), primary_key=True)
    hardware_class_id: Mapped[int] = mapped_column(ForeignKey("hardware_classes.id", ondelete="CASCADE"),
                                                   primary_key=True)
    rounds: Mapped[int] = mapped_column(Integer, default=0)
    stale_rounds: Mapped[int] = mapped_column(Integer, default=0)
    best_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    recent: Mapped[list[Any]] = mapped_column(JSON, default=list)
    preempted: Mapped[bool] = mapped_column(Boolean, default=False)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    freed_trials: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow, onupdate=utcnow)


class Measurement(Base):
    """One measured candidate (append-only). ``mean_run_s`` is NULL for errors.

    A retried commit of the same candidate is idempotent through the unique key
    (workload, hardware class, trace_sha256, attempt); a deliberate re-measurement uses a new
    attempt number. The trace text itself is never indexed.
    """

    __tablename__ = "measurements"
    __table_args__ = (
        UniqueConstraint(
            "workload_id", "hardware_class_id", "trace_sha256", "attempt", name="uq_measurements_candidate"
        ),
        Index("ix_measurements_best", "workload_id", "hardware_class_id", "mean_run_s"),
        Index("ix_measurements_shard_id", "shard_id"),
        # What the live line counts each second (first attempts since the run started, and their
        # errors) without reading the rows' traces (migrations 0013, 0014).
        Index("ix_measurements_recent", "hardware_class_id", "created_at", "workload_id", "error_kind", "attempt"),
    )
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id", ondelete="CASCADE"))
    hardware_class_id: Mapped[int] = mapped_column(ForeignKey("hardware_classes.id", ondelete="CASCADE"))
    shard_id: Mapped[int | None] = mapped_column(ForeignKey("shards.id", ondelete="SET NULL"), nullable=True)
    trace_json: Mapped[str] = mapped_column(Text)
    trace_sha256: Mapped[str] = mapped_column(String(64))
    # Which measurement of this candidate the row is: 0 first, a deliberate re-measurement counts
    # up (column "attempt"; not a shard's lease).
    repeat: Mapped[int] = mapped_column("attempt", Integer, default=0)
    args_info: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    run_secs: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    mean_run_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    build_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # build | run | crash (killed its worker twice) | filtered (scored out by the cost model before measuring: never built or run) | None
    error_kind: Mapped[str | None] = mapped_column(String(16), nullable=True)
    error_msg: Mapped[str | None] = mapped_column(Text, nullable=True)
    energy_j: Mapped[float | None] = mapped_column(Float, nullable=True)
    energy_source: Mapped[str | None] = mapped_column(String(16), nullable=True)
    useful: Mapped[bool | None] = mapped_column(Boolean, nullable=True)  # beat the best so far when committed
    # None or "serial": measured alone; "parallel:N": measured N at a time and calibrated against
    # serial re-measurements (tunefleet.tvm.parallel_runner)
    measure_mode: Mapped[str | None] = mapped_column(String(16), nullable=True)
    tvm_version: Mapped[str] = mapped_column(String(64), default="")
    target: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class Prediction(Base):
    """A schedule proposed by a cost model; never mixed with measurements."""

    __tablename__ = "predictions"
    __table_args__ = (
        UniqueConstraint(
            "workload_id", "hardware_class_id", "cost_model_id", "trace_sha256", name="uq_predictions_candidate"
        ),
        Index("ix_predictions_best", "workload_id", "hardware_class_id", "score"),
    )
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id", ondelete="CASCADE"))
    hardware_class_id: Mapped[int] = mapped_column(ForeignKey("hardware_classes.id", ondelete="CASCADE"))
    cost_model_id: Mapped[int | None] = mapped_column(ForeignKey("cost_models.id", ondelete="SET NULL"), nullable=True)
    trace_json: Mapped[str] = mapped_column(Text)
    trace_sha256: Mapped[str] = mapped_column(String(64))
    args_info: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    score: Mapped[float] = mapped_column(Float)  # higher is better (predicted throughput)
    rank: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class Dataset(Base):
    """A versioned export of measurements + features in the artifact store."""

    __tablename__ = "datasets"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, unique=True)
    uri: Mapped[str] = mapped_column(Text)
    manifest: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    row_count: Mapped[int] = mapped_column(BigInteger, default=0)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class DatasetRow(Base):
    """Which dataset version took a measurement (at most one: the primary key).

    The export marks every measurement it read, in the transaction that completes its dataset
    version, with what it did: ``row`` (written), ``skipped`` (its trace could not be
    featurised) or ``filtered`` (never measured: no label). A committed measurement without a
    mark is in no dataset version yet, whatever its id; the next export takes it. Removing a
    version (an export that failed) removes its marks.
    """

    __tablename__ = "dataset_rows"
    __table_args__ = (Index("ix_dataset_rows_dataset_id", "dataset_id"),)
    measurement_id: Mapped[int] = mapped_column(
        BigId, ForeignKey("measurements.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    dataset_id: Mapped[int] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"))
    outcome: Mapped[str] = mapped_column(String(16))  # row | skipped | filtered


class CostModel(Base):
    """A trained cost model, its metrics and whether it is the current one for its class."""

    __tablename__ = "cost_models"
    __table_args__ = (UniqueConstraint("hardware_class_id", "version", name="uq_cost_models_version"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    hardware_class_id: Mapped[int] = mapped_column(ForeignKey("hardware_classes.id", ondelete="CASCADE"))
    version: Mapped[int] = mapped_column(Integer)
    dataset_id: Mapped[int | None] = mapped_column(ForeignKey("datasets.id", ondelete="SET NULL"), nullable=True)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    artifact_uri: Mapped[str] = mapped_column(Text)
    promoted: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class HubImport(Base):
    """A hub bundle imported into this database (:mod:`tunefleet.learning.hub`), once per file.

    Its records are ordinary measurements under hub classes (node pool
    :data:`~tunefleet.vocab.HUB_POOL`, never leased): the class named for the class and CPU they
    were tuned on. ``summary`` holds what the bundle says of itself (its classes, CPUs, counts);
    ``counts`` what this import added and skipped.
    """

    __tablename__ = "hub_imports"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    source: Mapped[str] = mapped_column(Text)
    format_version: Mapped[int] = mapped_column(Integer)
    tvm_version: Mapped[str] = mapped_column(String(64))
    bundle_created_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    counts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    imported_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)


class ApiToken(Base):
    """A bearer token of the schedule registry (``tunefleet serve``): one team's key, ``read`` or
    ``write`` (write includes read), with an optional expiry; revoked, never deleted (the audit
    lines name its id). Only the token's SHA-256 is stored: the token itself is shown once, when it
    is created (``tunefleet token create``)."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    team: Mapped[str] = mapped_column(String(128))
    scope: Mapped[str] = mapped_column(String(16))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    note: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
    expires_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(DateTime, nullable=True)


class Artifact(Base):
    """Something in the artifact store that the database points to: one object, or a folder of them.

    The database says what exists; the store holds only what a row here lists. Every kind of
    artifact is written first, under a key no other write uses (a version number and a random
    token), and registered here in the transaction that records its owner (a dataset version's
    marks, a cost model's metrics and promotion). Files no row lists are garbage — an export or
    a retrain killed before its commit, or one whose commit failed — which ``tunefleet gc``
    deletes once they are older than a grace period (:mod:`tunefleet.learning.artifacts`).

    ``key`` is a store key, or a folder when it ends with ``/`` (a dataset version's Parquet files
    and manifest). Each row belongs to one owner and goes with it (``ON DELETE CASCADE``). A new
    kind (a hub bundle, a built library) registers the same way: a nullable owner column here,
    and its root in the store in ``tunefleet.learning.artifacts.KINDS``. Nothing references this
    table, so adding that column may rebuild it (Alembic's batch mode on SQLite) safely.
    """

    __tablename__ = "artifacts"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))  # dataset | cost_model
    key: Mapped[str] = mapped_column(String(1024), unique=True)
    dataset_id: Mapped[int | None] = mapped_column(ForeignKey("datasets.id", ondelete="CASCADE"), nullable=True)
    cost_model_id: Mapped[int | None] = mapped_column(ForeignKey("cost_models.id", ondelete="CASCADE"), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime, default=utcnow)
