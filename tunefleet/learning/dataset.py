"""Export measurements as a versioned Parquet dataset of program features and throughput labels.

Pipeline step 6. Each :func:`export` writes one *version* under a folder of its own::

    datasets/v{N}-{token}/hardware={class}/part-0.parquet   one file per hardware class with new rows
    datasets/v{N}-{token}/manifest.json                     what the version holds (a copy of its row's)

through the artifact store's ``pyarrow.fs`` filesystem (``token``: random, so no two exports ever
write to one folder), then registers the version in the database. Exports are incremental: a
version holds the committed measurements that no earlier version took, so the dataset is the
union of all versions (:func:`load` reads them with hive partitioning on ``hardware``). When
nothing is new, :func:`export` writes nothing and returns None.

The database says which versions exist. The version number is reserved first (a ``datasets``
row without a URI), the files are written, and then one transaction registers the version: its
URI and manifest, its folder (table ``artifacts``) and the mark of every measurement the export
read (table ``dataset_rows``: written as a row, skipped or filtered). :func:`load` and retraining
list versions from the database, never from the store, and read the files their manifests
(kept in the database) name: files no registered version points to — an export killed between
writing and committing, or one whose commit failed — are never read, and are garbage that
``tunefleet gc`` deletes after a grace period (:mod:`tunefleet.learning.artifacts`). A failed
export removes its own files at once only when the database says it registered nothing; when
the commit went through and only its acknowledgement was lost, the export returns the version it
registered; when the database cannot say (unreachable), the files are left for ``gc``.

Selection is by the marks, not by id: a measurement whose transaction got a lower id but
committed after an export read its rows is simply unmarked, and the next export takes it.
:meth:`Database.unexported_measurements` lists what no version took.

Rows and decisions
------------------
- One row per measurement, **errors included**: a candidate that failed to build or run has
  ``mean_run_s`` NULL, ``error_kind`` set (``"build"`` or ``"run"``) and ``label`` 0.0 — the
  convention of MetaSchedule's own cost models, which score failed candidates as zero
  throughput, so a model trained on the dataset learns to avoid them. Filter on
  ``error_kind IS NULL`` for successful rows only. Candidates the cost model *filtered* before
  measuring (``error_kind = "filtered"`` in the database) were never run: they are not rows,
  and each class's manifest entry counts them under ``filtered``.
- ``label`` is the normalised throughput ``best / mean_run_s`` where ``best`` (column
  ``best_mean_run_s``) is the fastest successful ``mean_run_s`` of the same (workload,
  hardware class) over *all* its measurements up to the version's high-water mark, older
  versions included. So labels lie in (0, 1], 1.0 being the best known schedule at export time.
  A later version may find a faster schedule, which makes older rows' labels stale; the raw
  ``mean_run_s`` (and ``flops``) are kept so a reader can renormalise, and
  :func:`renormalise` does it for a loaded table.
- ``features`` are MetaSchedule's ``PerStoreFeature`` (default parameters): one 164-float
  vector per buffer store of the scheduled program, stored as
  ``list<fixed_size_list<float32, 164>>`` (one inner list per store; ``n_stores`` repeats its
  length). The vector length is in the Arrow type and in the manifest. :func:`feature_matrix`
  turns a column into one numpy array without copying per row.
- A measurement whose trace cannot be replayed or featurised (a corrupt trace, a TVM change)
  is skipped with a warning and listed under ``skipped_ids`` in the manifest; it is marked
  ``skipped`` and not retried by later exports.

Concurrent exports: each writes to its own folder, so none writes over another's files. They
are serialised per hardware class where it matters, when a version is registered: the class rows
are locked, and a measurement can be marked by one version only. An export that read
measurements another one registered meanwhile registers nothing, removes its files and raises
:class:`~tunefleet.errors.ConflictError` (retryable: run it again to export what is left).
The pipeline's export task also runs under a Prefect tag with a concurrency limit of 1, which
avoids that wasted work.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from tunefleet.errors import ConflictError, NotFoundError, TunefleetError, one_line
from tunefleet.learning.artifacts import DATASET, unique_name
from tunefleet.vocab import FILTERED

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from tunefleet.db import Database
    from tunefleet.db.tables import Dataset, HardwareClass, Measurement
    from tunefleet.store import ArtifactStore

log = logging.getLogger(__name__)

#: Layout of the rows and the manifest; bumped on any incompatible change.
SCHEMA_VERSION = 1
#: Key prefix of every dataset version in the artifact store.
PREFIX = DATASET.root.rstrip("/")
#: Length of one PerStoreFeature vector (default parameters).
FEATURE_DIMS = 164
#: Name of the partition column (a directory level ``hardware={name}``, not stored in the files).
PARTITION = "hardware"
_CONTEXT_CACHE = 128  # TuneContexts kept while exporting (one per workload and hardware class)
#: What an export did with a measurement it read (``dataset_rows.outcome``).
ROW, SKIPPED = "row", "skipped"  # and FILTERED: a candidate never measured

Progress = Callable[[int, int], None]


class DatasetError(TunefleetError):
    """A dataset version cannot be written or read (missing or corrupt file, bad manifest)."""


def _arrow_schema() -> pa.Schema:
    import pyarrow as pa

    return pa.schema([
        pa.field("measurement_id", pa.int64(), nullable=False),
        pa.field("workload_hash", pa.string(), nullable=False),
        pa.field("workload_name", pa.string()),
        pa.field("op_kind", pa.string()),
        pa.field("flops", pa.float64()),
        pa.field("target", pa.string()),
        pa.field("trace_sha256", pa.string()),
        pa.field("trace_json", pa.string()),
        pa.field("args_info", pa.string()),  # JSON text
        pa.field("run_secs", pa.list_(pa.float64())),
        pa.field("mean_run_s", pa.float64()),  # NULL for errors
        pa.field("build_s", pa.float64()),
        pa.field("error_kind", pa.string()),  # NULL | "build" | "run"
        pa.field("best_mean_run_s", pa.float64()),  # the normaliser of `label`
        pa.field("label", pa.float64(), nullable=False),
        pa.field("n_stores", pa.int32(), nullable=False),
        pa.field("features", pa.list_(pa.list_(pa.float32(), FEATURE_DIMS))),
        pa.field("tvm_version", pa.string()),
        pa.field("created_at", pa.timestamp("us", tz="UTC")),
        pa.field("dataset_version", pa.int32(), nullable=False),
    ])


def schema() -> pa.Schema:
    """The Arrow schema of a loaded dataset: the file columns plus the ``hardware`` partition."""
    import pyarrow as pa

    return _arrow_schema().append(pa.field(PARTITION, pa.string()))


@dataclass
class DatasetVersion:
    """One registered dataset version (a row of the ``datasets`` table and its manifest)."""

    version: int
    uri: str
    created_at: dt.datetime
    row_count: int
    complete: bool
    row_counts: dict[str, int] = field(default_factory=dict)
    parents: list[int] = field(default_factory=list)
    measurement_ids: dict[str, int] | None = None  # {"min": ..., "max": ...} of the rows written
    manifest: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: Dataset) -> DatasetVersion:
        manifest = dict(row.manifest or {})
        return cls(
            version=row.version,
            uri=row.uri,
            created_at=row.created_at,
            row_count=int(row.row_count or 0),
            complete=manifest.get("state") == "complete",
            row_counts=dict(manifest.get("row_counts") or {}),
            parents=list(manifest.get("parents") or []),
            measurement_ids=manifest.get("measurement_ids"),
            manifest=manifest,
        )


def version_folder(version: int) -> str:
    """A new folder for the files of version ``version`` (``datasets/v{N}-{token}``), unused so far."""
    return f"{PREFIX}/{unique_name(version)}"


def manifest_key(folder: str) -> str:
    """Key of the manifest of the version written to ``folder``."""
    return f"{folder}/manifest.json"


def part_key(folder: str, hardware: str) -> str:
    """Key of a version's Parquet file for one hardware class (name URI-encoded as hive does)."""
    return f"{folder}/{PARTITION}={quote(hardware, safe='')}/part-0.parquet"


# -- registry ---------------------------------------------------------------------------------
def list_versions(db: Database, *, include_incomplete: bool = True) -> list[DatasetVersion]:
    """Registered dataset versions, oldest first.

    A version is *incomplete* while its export runs, or for good when that export was killed
    (its version number stays used; its files, if any, are never read by :func:`load`).
    """
    versions = [DatasetVersion.from_row(row) for row in db.datasets()]
    return versions if include_incomplete else [v for v in versions if v.complete]


def _high_water(versions: Iterable[DatasetVersion]) -> dict[str, int]:
    """Per hardware class, the newest measurement id when a complete version read it (for the manifest)."""
    marks: dict[str, int] = {}
    for v in versions:
        for name, mark in (v.manifest.get("high_water") or {}).items():
            marks[name] = max(marks.get(name, 0), int(mark))
    return marks


# -- export -----------------------------------------------------------------------------------
@dataclass
class _ClassPlan:
    hw: HardwareClass
    high_water: int  # the class's newest id: export unexported ids up to it
    count: int


def _plan(db: Database, hardware: str | None) -> list[_ClassPlan]:
    classes = [db.hardware_class(hardware)] if hardware is not None else db.hardware_classes()
    plans = []
    for hw in classes:
        window = db.unexported_window(hw.id)  # (newest id, unexported count), None when nothing is new
        if window is not None:
            plans.append(_ClassPlan(hw, *window))
    return plans


class _Featurizer:
    """PerStoreFeature over measurement rows, one TuneContext per (workload, hardware class)."""

    def __init__(self, db: Database) -> None:
        from tvm.s_tir import meta_schedule as ms

        from tunefleet.tvm.builder import import_tensor_intrinsics

        import_tensor_intrinsics()  # TuneContext would otherwise import them slowly
        self.db = db
        self.extractor = ms.feature_extractor.PerStoreFeature()
        if int(self.extractor.feature_vector_length) != FEATURE_DIMS:
            raise DatasetError(
                f"PerStoreFeature gives {self.extractor.feature_vector_length} features per store, "
                f"this dataset schema expects {FEATURE_DIMS}; bump tunefleet.learning.dataset.SCHEMA_VERSION"
            )
        self.threads = max(1, len(os.sched_getaffinity(0)))
        self._contexts: OrderedDict[tuple[int, int], tuple[Any, Any]] = OrderedDict()
        self._workloads: dict[int, Any] = {}

    def workload(self, workload_id: int) -> Any:
        wl = self._workloads.get(workload_id)
        if wl is None:
            wl = self._workloads[workload_id] = self.db.workload(workload_id)
        return wl

    def _context(self, workload_id: int, hw: HardwareClass) -> tuple[Any, Any]:
        key = (workload_id, hw.id)
        found = self._contexts.get(key)
        if found is not None:
            self._contexts.move_to_end(key)
            return found
        import tvm
        from tvm.s_tir import meta_schedule as ms
        from tvm.s_tir.meta_schedule.database import Workload

        from tunefleet.tvm.targets import make_target

        wl = self.workload(workload_id)
        mod = tvm.ir.load_json(wl.tir_json)
        ctx = ms.TuneContext(mod, target=make_target(hw.target), task_name=wl.name, num_threads=self.threads)
        found = self._contexts[key] = (ctx, Workload(mod))
        if len(self._contexts) > _CONTEXT_CACHE:
            self._contexts.popitem(last=False)
        return found

    def features(self, workload_id: int, hw: HardwareClass, rows: Sequence[Measurement]) -> list[np.ndarray | None]:
        """A (n_stores, 164) float32 matrix per row; None for a row that cannot be featurised."""
        from tunefleet.tvm.bridge import record_from_row

        ctx, workload = self._context(workload_id, hw)
        candidates: list[Any] = []
        for m in rows:
            try:
                candidates.append(
                    record_from_row(m.trace_json, m.run_secs, m.target, m.args_info, workload).as_measure_candidate()
                )
            except Exception as exc:  # TVM raises ValueError/RuntimeError/TypeError... for a bad trace
                log.warning("measurement %d: cannot replay its trace, skipped: %s", m.id, one_line(exc))
                candidates.append(None)
        good = [c for c in candidates if c is not None]
        try:
            matrices = iter(self._extract(ctx, good))
        except Exception:
            matrices = iter(self._extract_one_by_one(ctx, good, [m for m, c in zip(rows, candidates) if c is not None]))
        return [next(matrices) if c is not None else None for c in candidates]

    def _extract(self, ctx: Any, candidates: list[Any]) -> list[np.ndarray]:
        import numpy as np

        if not candidates:
            return []
        return [np.asarray(t.numpy(), dtype=np.float32) for t in self.extractor.extract_from(ctx, candidates)]

    def _extract_one_by_one(self, ctx: Any, candidates: list[Any], rows: list[Measurement]) -> list[np.ndarray | None]:
        out: list[np.ndarray | None] = []
        for cand, m in zip(candidates, rows, strict=True):
            try:
                out.append(self._extract(ctx, [cand])[0])
            except Exception as exc:  # noqa: PERF203 - isolate the candidate TVM cannot featurise
                log.warning("measurement %d: PerStoreFeature failed, skipped: %s", m.id, one_line(exc))
                out.append(None)
        return out


def features_array(matrices: Sequence[np.ndarray]) -> pa.Array:
    """The ``features`` column of a dataset table: one list of ``PerStoreFeature`` rows per candidate."""
    import numpy as np
    import pyarrow as pa

    counts = np.array([m.shape[0] for m in matrices], dtype=np.int32)
    offsets = np.zeros(len(matrices) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    flat = np.concatenate([m.reshape(-1) for m in matrices]) if matrices else np.zeros(0, np.float32)
    stores = pa.FixedSizeListArray.from_arrays(pa.array(flat.astype(np.float32, copy=False)), FEATURE_DIMS)
    return pa.ListArray.from_arrays(pa.array(offsets), stores, type=pa.list_(pa.list_(pa.float32(), FEATURE_DIMS)))


def _rows_table(version: int, rows: list[tuple[Measurement, np.ndarray]], db_workload: Callable[[int], Any],
                best: dict[int, float]) -> pa.Table:
    import pyarrow as pa

    cols: dict[str, list[Any]] = {name: [] for name in _arrow_schema().names if name != "features"}
    for m, feats in rows:
        wl = db_workload(m.workload_id)
        best_s = best.get(m.workload_id)
        mean = m.mean_run_s
        cols["measurement_id"].append(m.id)
        cols["workload_hash"].append(wl.structural_hash)
        cols["workload_name"].append(wl.name)
        cols["op_kind"].append(wl.op_kind)
        cols["flops"].append(float(wl.flops or 0.0))
        cols["target"].append(m.target)
        cols["trace_sha256"].append(m.trace_sha256)
        cols["trace_json"].append(m.trace_json)
        cols["args_info"].append(json.dumps(m.args_info, separators=(",", ":")) if m.args_info is not None else None)
        cols["run_secs"].append([float(x) for x in m.run_secs] if m.run_secs is not None else None)
        cols["mean_run_s"].append(mean)
        cols["build_s"].append(m.build_s)
        cols["error_kind"].append(m.error_kind)
        cols["best_mean_run_s"].append(best_s)
        cols["label"].append(best_s / mean if (mean and best_s is not None and not m.error_kind) else 0.0)
        cols["n_stores"].append(int(feats.shape[0]))
        cols["tvm_version"].append(m.tvm_version)
        cols["created_at"].append(m.created_at.replace(tzinfo=dt.timezone.utc) if m.created_at else None)
        cols["dataset_version"].append(version)
    arrays = {name: cols[name] if name != "features" else features_array([f for _, f in rows])
              for name in _arrow_schema().names}
    return pa.Table.from_pydict(arrays, schema=_arrow_schema())


def export(
    db: Database,
    store: ArtifactStore,
    *,
    hardware: str | None = None,
    batch_size: int = 512,
    progress: Progress | None = None,
) -> DatasetVersion | None:
    """Export the measurements not in any dataset version yet as the next version.

    Parameters
    ----------
    db
        The tunefleet database.
    store
        The artifact store; files are written through :meth:`ArtifactStore.filesystem`.
    hardware
        Export only this hardware class (by name); every class by default. Each class keeps
        its own high-water mark, so exporting one class never skips another's measurements.
    batch_size
        Measurements read (and written as one Parquet row group) at a time.
    progress
        Called as ``progress(done, total)`` with measurement counts after each batch.

    Returns
    -------
    DatasetVersion or None
        The new version, or None (nothing written, nothing registered) when there is no new
        measurement.

    Raises
    ------
    DatasetError
        When a file cannot be written; the reserved version is removed again.
    ConflictError
        When another export registered a version with some of the same measurements while this
        one ran; this one's files and reserved version are removed again (run it again).
    DatabaseError
        When the database fails, with the version not registered — or maybe registered, when
        it fails while committing and stays unreachable: then the files stay (``tunefleet gc``
        deletes them if the version was not registered after all).
    NotFoundError
        When ``hardware`` names no hardware class.
    """
    if batch_size < 1:
        raise DatasetError(f"batch_size must be positive, got {batch_size}")
    previous = list_versions(db, include_incomplete=False)
    plans = _plan(db, hardware)
    total = sum(p.count for p in plans)
    if total == 0:
        log.info("dataset export: no new measurements%s", f" for {hardware}" if hardware else "")
        return None

    import tvm

    created = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    # Reserve the version number first: the files carry it. They go to a folder of their own,
    # and the version exists once one transaction registers it with its marks.
    reserved = db.add_dataset(uri="", manifest={"state": "writing", "schema_version": SCHEMA_VERSION,
                                                "created_at": created.isoformat()}, row_count=0)
    version = reserved.version
    folder = version_folder(version)
    fs, base = store.filesystem()
    written: list[str] = []
    log.info("dataset export v%d: %d new measurements in %d hardware class(es)", version, total, len(plans))
    try:
        featurizer = _Featurizer(db)
        done = 0
        per_class: dict[str, dict[str, Any]] = {}
        marks: dict[int, str] = {}
        for plan in plans:
            stats, done = _export_class(db, fs, base, store.location, version, folder, plan, featurizer,
                                        batch_size, written, progress, done, total, marks)
            per_class[plan.hw.name] = stats
        all_ids = [s["measurement_ids"] for s in per_class.values() if s["measurement_ids"]]
        manifest: dict[str, Any] = {
            "state": "complete",
            "schema_version": SCHEMA_VERSION,
            "version": version,
            "folder": f"{folder}/",
            "created_at": created.isoformat(),
            "parents": [v.version for v in previous],
            "row_counts": {name: s["rows"] for name, s in per_class.items()},
            "workloads": {name: s["workloads"] for name, s in per_class.items()},
            "measurement_ids": ({"min": min(r["min"] for r in all_ids), "max": max(r["max"] for r in all_ids)}
                                if all_ids else None),
            "high_water": {**_high_water(previous), **{p.hw.name: p.high_water for p in plans}},
            "hardware": per_class,
            "feature_extractor": {
                "name": "PerStoreFeature",
                "dims": FEATURE_DIMS,
                "params": {
                    "buffers_per_store": int(featurizer.extractor.buffers_per_store),
                    "arith_intensity_curve_num_samples": int(featurizer.extractor.arith_intensity_curve_num_samples),
                    "cache_line_bytes": int(featurizer.extractor.cache_line_bytes),
                    "extract_workload": bool(featurizer.extractor.extract_workload),
                },
            },
            "label": {
                "name": "normalised_throughput",
                "definition": "best_mean_run_s / mean_run_s; best = fastest successful mean_run_s of the "
                              "(workload, hardware class) over measurements up to high_water; 0.0 for errors",
            },
            "partitioning": {"flavor": "hive", "field": PARTITION},
            "columns": _arrow_schema().names,
            "tvm_version": tvm.__version__,
        }
        key = manifest_key(folder)
        written.append(key)
        uri = store.put_bytes(key, json.dumps(manifest, indent=2, sort_keys=True).encode(),
                              content_type="application/json")
        row_count = sum(s["rows"] for s in per_class.values())
        try:
            db.update_dataset(reserved.id, uri=uri, manifest=manifest, row_count=row_count, marks=marks,
                              hardware_class_ids=[p.hw.id for p in plans], artifact_key=f"{folder}/")
        except ConflictError:
            raise ConflictError(
                f"dataset export v{version}: another export completed a version with some of the same "
                f"measurements meanwhile; v{version} is not registered, run the export again"
            ) from None
    except BaseException as exc:
        registered = _abandon(db, fs, base, reserved.id, version, written)
        if registered is None or not isinstance(exc, Exception):
            raise
        return DatasetVersion.from_row(registered)  # the commit went through: only its acknowledgement was lost
    result = DatasetVersion(version=version, uri=uri, created_at=reserved.created_at, row_count=row_count,
                            complete=True, row_counts=manifest["row_counts"], parents=manifest["parents"],
                            measurement_ids=manifest["measurement_ids"], manifest=manifest)
    log.info("dataset export v%d: %d rows (%s) at %s", version, row_count,
             ", ".join(f"{k}={v}" for k, v in result.row_counts.items()), uri)
    return result


def _export_class(
    db: Database, fs: Any, base: str, location: str, version: int, folder: str, plan: _ClassPlan,
    featurizer: _Featurizer, batch_size: int, written: list[str], progress: Progress | None, done: int, total: int,
    marks: dict[int, str],
) -> tuple[dict[str, Any], int]:
    """Write one class's unexported measurements; record in ``marks`` what became of each one read."""
    import pyarrow.parquet as pq

    hw = plan.hw
    best = db.best_run_s_by_workload(hw.id, plan.high_water)
    key = part_key(folder, hw.name)
    path = f"{base}/{key}"
    writer = None
    rows = errors = filtered = 0
    skipped: list[int] = []
    workloads: set[str] = set()
    id_range: dict[str, int] | None = None
    cursor = 0
    try:
        while cursor < plan.high_water:
            page = db.unexported_measurements(hw.id, after_id=cursor, up_to_id=plan.high_water, limit=batch_size)
            if not page:
                break
            cursor = page[-1].id
            page_size = len(page)
            filtered += sum(1 for m in page if m.error_kind == FILTERED)
            marks.update((m.id, FILTERED) for m in page if m.error_kind == FILTERED)
            page = [m for m in page if m.error_kind != FILTERED]  # never measured: no label to learn
            by_workload: dict[int, list[Measurement]] = {}
            for m in page:
                by_workload.setdefault(m.workload_id, []).append(m)
            feats: dict[int, np.ndarray | None] = {}
            for workload_id, group in by_workload.items():
                feats.update(zip((m.id for m in group), featurizer.features(workload_id, hw, group), strict=True))
            kept = [(m, feats[m.id]) for m in page if feats[m.id] is not None]
            skipped += [m.id for m in page if feats[m.id] is None]
            marks.update((m.id, ROW if feats[m.id] is not None else SKIPPED) for m in page)
            if kept:
                table = _rows_table(version, kept, featurizer.workload, best)
                if writer is None:
                    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
                    written.append(key)
                    writer = pq.ParquetWriter(path, table.schema, filesystem=fs, compression="zstd")
                writer.write_table(table)
                rows += len(kept)
                errors += sum(1 for m, _ in kept if m.error_kind)
                workloads.update(featurizer.workload(m.workload_id).structural_hash for m, _ in kept)
                lo, hi = kept[0][0].id, kept[-1][0].id
                id_range = {"min": lo, "max": hi} if id_range is None else {"min": id_range["min"], "max": hi}
            done += page_size
            if progress is not None:
                progress(done, total)
    except OSError as exc:  # pyarrow reports filesystem failures as OSError
        raise DatasetError(f"cannot write dataset file {key!r} to {location}: {one_line(exc)}") from None
    finally:
        if writer is not None:
            writer.close()
    if skipped:
        log.warning("dataset export v%d: %s: %d measurement(s) could not be featurised and were skipped",
                    version, hw.name, len(skipped))
    log.info("dataset export v%d: %s: %d rows (%d errors) from %d workloads", version, hw.name, rows, errors,
             len(workloads))
    stats = {
        "rows": rows,
        "labelled": rows - errors,
        "errors": errors,
        "filtered": filtered,
        "skipped_ids": skipped,
        "workloads": sorted(workloads),
        "measurement_ids": id_range,
        "high_water": plan.high_water,
        "file": key if rows else None,
        "target": hw.target,
    }
    return stats, done


def _abandon(db: Database, fs: Any, base: str, dataset_id: int, version: int,
             written: list[str]) -> Dataset | None:
    """Undo a failed export as far as the database says it failed (best effort, never masking).

    The reservation is given back only while it is one; then nothing points to the files and
    they are removed. When its registering commit went through (only the acknowledgement was
    lost), the registered version is returned and its files stay. When the database cannot say,
    the files stay too: unregistered, ``tunefleet gc`` deletes them after its grace period.
    """
    try:
        registered = db.abandon_dataset(dataset_id)
    except Exception as exc:  # noqa: BLE001 - cleanup must not hide the export's own error
        log.warning("dataset export v%d failed, and the database cannot say whether it registered it (%s); "
                    "its files stay: `tunefleet gc` deletes them if it did not", version, one_line(exc))
        return None
    if registered is not None:
        log.warning("dataset export v%d: the database registered it (its commit went through, the acknowledgement "
                    "was lost); its files stay", version)
        return registered
    for key in written:
        try:
            fs.delete_file(f"{base}/{key}")
        except FileNotFoundError:
            pass  # never written (the failure came first)
        except Exception as exc:  # noqa: BLE001 - same: the original error is re-raised by the caller
            log.warning("dataset export v%d failed; could not remove %s (`tunefleet gc` will): %s", version, key,
                        one_line(exc))
    return None


# -- reading ----------------------------------------------------------------------------------
def _registered_manifest(v: DatasetVersion) -> dict[str, Any]:
    """The manifest of a registered version, checked to be one this tunefleet reads."""
    manifest = v.manifest
    if "schema_version" not in manifest:
        raise DatasetError(f"dataset version {v.version} has no schema_version in its manifest")
    if int(manifest["schema_version"]) > SCHEMA_VERSION:
        raise DatasetError(
            f"dataset version {v.version} has schema version {manifest['schema_version']}; this tunefleet reads "
            f"up to {SCHEMA_VERSION}: upgrade tunefleet"
        )
    return manifest


def load(
    db: Database,
    store: ArtifactStore,
    versions: Sequence[int] | None = None,
    *,
    hardware: str | Sequence[str] | None = None,
) -> pa.Table:
    """Read dataset versions back as one Arrow table (see :func:`schema`).

    Which versions exist, and which files each one holds, the database says (the versions it
    registered, with their manifests); files in the store that no registered version names are
    never read.

    Parameters
    ----------
    db
        The tunefleet database the versions are registered in.
    store
        The artifact store the versions were exported to.
    versions
        Versions to read; every registered (complete) version by default. Since versions are
        incremental, reading all of them gives every exported measurement once.
    hardware
        Only these hardware classes (a name or names); all by default.

    Returns
    -------
    pyarrow.Table
        Rows in (version, hardware, measurement id) order, with the ``hardware`` partition
        column last. Labels are as exported; see :func:`renormalise`.

    Raises
    ------
    NotFoundError
        When the database registered no dataset version, or not a requested one.
    DatasetError
        When a file the manifest lists is missing or not a readable Parquet file (the message
        names the file).
    """
    import pyarrow as pa
    import pyarrow.dataset as pads
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    registered = {v.version: v for v in list_versions(db, include_incomplete=False)}
    if versions is None:
        versions = sorted(registered)
        if not versions:
            raise NotFoundError("no dataset in the database yet; run `tunefleet dataset export` first")
    missing = sorted(set(versions) - set(registered))
    if missing:
        known = ", ".join(f"v{v}" for v in sorted(registered)) or "none"
        raise NotFoundError(f"no dataset version {missing[0]} in the database (versions: {known})")
    wanted = {hardware} if isinstance(hardware, str) else (set(hardware) if hardware is not None else None)
    fs, base = store.filesystem()
    full = schema()
    partitioning = pads.partitioning(pa.schema([full.field(PARTITION)]), flavor="hive")
    parts: list[pa.Table] = []
    for version in sorted(set(versions)):
        manifest = _registered_manifest(registered[version])
        for name in sorted(manifest.get("hardware") or {}):
            entry = manifest["hardware"][name]
            if not entry.get("file") or (wanted is not None and name not in wanted):
                continue
            key = entry["file"]
            path = f"{base}/{key}"
            where = f"{key!r} in {store.location} (dataset version {version})"
            try:
                if fs.get_file_info(path).type == pafs.FileType.NotFound:
                    raise DatasetError(f"dataset file {where} is missing; its manifest lists it")
                meta = pq.read_metadata(path, filesystem=fs)
            except (OSError, pa.ArrowException) as exc:
                raise DatasetError(f"dataset file {where} is not a readable Parquet file: {one_line(exc)}") from None
            if meta.num_rows != int(entry["rows"]):
                raise DatasetError(
                    f"dataset file {where} has {meta.num_rows} rows, its manifest says {entry['rows']}"
                )
            try:
                table = pads.dataset([path], schema=full, filesystem=fs, format="parquet", partitioning=partitioning,
                                     partition_base_dir=f"{base}/{key.rsplit(f'/{PARTITION}=', 1)[0]}").to_table()
            except (OSError, pa.ArrowException) as exc:
                raise DatasetError(f"dataset file {where} cannot be read: {one_line(exc)}") from None
            parts.append(table)
    if not parts:
        return full.empty_table()
    return pa.concat_tables(parts)


def renormalise(table: pa.Table) -> pa.Table:
    """Recompute ``label`` and ``best_mean_run_s`` against the best known of the whole table.

    For each (workload, hardware class) the normaliser becomes the fastest of the rows'
    ``mean_run_s`` and their exported ``best_mean_run_s`` (the best known when each version was
    exported), so rows of older versions are relabelled against a faster schedule found later.
    Error rows keep label 0.0.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows == 0:
        return table
    candidates = pc.min_element_wise(table["mean_run_s"], table["best_mean_run_s"])
    keyed = pa.table({"w": table["workload_hash"], "h": table[PARTITION], "b": candidates})
    best = keyed.group_by(["w", "h"]).aggregate([("b", "min")])
    joined = keyed.append_column("i", pa.array(range(table.num_rows), pa.int64())).join(best, ["w", "h"])
    joined = joined.sort_by("i")
    new_best = joined["b_min"]
    ok = pc.and_(pc.is_null(table["error_kind"]), pc.is_valid(table["mean_run_s"]))
    label = pc.if_else(ok, pc.divide(new_best, table["mean_run_s"]), 0.0)
    label = pc.fill_null(label, 0.0)
    idx = table.schema.get_field_index
    table = table.set_column(idx("best_mean_run_s"), "best_mean_run_s", new_best.cast(pa.float64()))
    return table.set_column(idx("label"), "label", label.cast(pa.float64()))


def feature_matrix(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """All feature vectors of a table as one array, and where each row's stores start.

    Returns
    -------
    (features, offsets)
        ``features`` is float32 of shape ``(total stores, 164)``; row ``i``'s stores are
        ``features[offsets[i]:offsets[i + 1]]`` (``offsets`` has ``num_rows + 1`` entries).
    """
    import numpy as np
    import pyarrow.compute as pc

    column = table["features"]
    lengths = pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = pc.list_flatten(pc.list_flatten(column)).to_numpy(zero_copy_only=False)
    return np.asarray(flat, dtype=np.float32).reshape(-1, FEATURE_DIMS), offsets

__all__ = [
    "FEATURE_DIMS",
    "SCHEMA_VERSION",
    "DatasetError",
    "DatasetVersion",
    "export",
    "feature_matrix",
    "features_array",
    "list_versions",
    "load",
    "manifest_key",
    "part_key",
    "renormalise",
    "schema",
    "version_folder",
]
