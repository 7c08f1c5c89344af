"""Dataset export (pipeline step 6): measurements + PerStoreFeature features + normalised labels
as versioned, incremental Parquet in the artifact store — on SQLite and PostgreSQL, on a local
directory and a real S3 server (SeaweedFS), from hand-made measurements of real TIR (fast) and
from a real tiny tuning run (slow)."""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import on_backend
from tunefleet.learning import dataset
from tunefleet.learning.dataset import DatasetError
from tunefleet.db import Database, NewMeasurement
from tunefleet.errors import ConflictError, NotFoundError, TunefleetError
from tunefleet.store import ArtifactStore, LocalStore, S3Store
from tunefleet.testing.seaweedfs import unique_bucket_name
from tunefleet.tvm.targets import arm_target, host_cpu_target, target_fingerprint

BOGUS_TRACE = '[[["NoSuchInstruction",[],[],["b0"]]],[]]'


# -- helpers ------------------------------------------------------------------------------------
def _setup(db: Database, workloads: list[Any], classes: tuple[str, ...] = ("x86",)) -> dict[str, Any]:
    """Hardware classes and the mlp workloads in the database; their ids."""
    specs = {"x86": host_cpu_target(2), "arm": arm_target(4)}
    hw = {name: db.upsert_hardware_class(name, specs[name], name).id for name in classes}
    wl = [db.add_workload(structural_hash=w.structural_hash, name=w.name, op_kind=w.op_kind, flops=w.flops,
                          tir_json=w.tir_json)[0].id for w in workloads]
    return {"hw": hw, "wl": wl, "targets": {n: target_fingerprint(specs[n]) for n in classes}}


def _m(ids: dict[str, Any], w: Any, i: int, trace: str, run_s: float | None, *, hw: str = "x86",
       repeat: int = 0, error: str | None = None) -> NewMeasurement:
    return NewMeasurement(
        ids["wl"][i], ids["hw"][hw], trace, None if run_s is None else [run_s, run_s], build_s=0.1,
        error_kind=error, error_msg="boom" if error else None, args_info=w.args_info, repeat=repeat,
        tvm_version="0.27.0", target=ids["targets"][hw],
    )


def _first_batch(ids: dict[str, Any], workloads: list[Any], hw: str = "x86") -> list[NewMeasurement]:
    """Every trace of every workload measured once (distinct times), one build error, one bogus trace."""
    out = []
    for i, w in enumerate(workloads):
        for j, trace in enumerate(w.traces):
            out.append(_m(ids, w, i, trace, 1e-4 * (i + 1) * (j + 2), hw=hw))
    out.append(_m(ids, workloads[0], 0, workloads[0].traces[1], None, hw=hw, repeat=1, error="build"))
    out.append(_m(ids, workloads[1], 1, BOGUS_TRACE, 0.5, hw=hw))  # its trace cannot be replayed
    return out


def _db_rows(db: Database) -> dict[int, Any]:
    return {m.id: m for m in db.measurements()}


def _check_rows(table: pa.Table, db: Database, *, first_export: bool) -> None:
    """Features, labels and raw columns of exported rows agree with the database."""
    rows = _db_rows(db)
    assert table.schema.field("features").type == pa.list_(pa.list_(pa.float32(), 164))
    features, offsets = dataset.feature_matrix(table)
    assert features.shape == (offsets[-1], 164) and np.isfinite(features).all()
    n_stores = table["n_stores"].to_pylist()
    assert list(np.diff(offsets)) == n_stores and min(n_stores) >= 1
    best: dict[tuple[int, int], float] = {}
    for m in rows.values():
        if m.mean_run_s is not None:
            key = (m.workload_id, m.hardware_class_id)
            best[key] = min(best.get(key, math.inf), m.mean_run_s)
    ones: dict[tuple[str, str], int] = defaultdict(int)
    for row in table.drop_columns(["features"]).to_pylist():
        m = rows[row["measurement_id"]]
        assert row["trace_sha256"] == m.trace_sha256 and row["mean_run_s"] == m.mean_run_s
        assert row["error_kind"] == m.error_kind and row["target"] == m.target
        assert json.loads(row["trace_json"]) == json.loads(m.trace_json)
        if m.error_kind:
            assert row["label"] == 0.0 and row["mean_run_s"] is None
            continue
        expected = best[(m.workload_id, m.hardware_class_id)] / m.mean_run_s
        assert row["label"] == pytest.approx(expected, rel=1e-12) and 0.0 < row["label"] <= 1.0
        assert row["flops"] > 0 and row["best_mean_run_s"] == best[(m.workload_id, m.hardware_class_id)]
        ones[(row["workload_hash"], row["hardware"])] += row["label"] == 1.0
    if first_export:
        assert ones and set(ones.values()) == {1}, "exactly one label 1.0 per (workload, hardware class)"


# -- fast: hand-made measurements of real TIR ------------------------------------------------------
def test_export_incremental_versions(db_url: str, tmp_path, mlp_workloads) -> None:  # type: ignore[no-untyped-def]
    db = Database(db_url)
    store = LocalStore(tmp_path / "artifacts")
    ids = _setup(db, mlp_workloads)
    assert dataset.export(db, store) is None, "nothing measured: nothing exported"
    assert dataset.list_versions(db) == [] and list(store.list()) == []

    db.commit_measurements(_first_batch(ids, mlp_workloads))
    all_ids = sorted(_db_rows(db))
    bogus = [m.id for m in db.measurements() if m.trace_json == BOGUS_TRACE]
    seen: list[tuple[int, int]] = []
    v1 = dataset.export(db, store, batch_size=4, progress=lambda done, total: seen.append((done, total)))
    assert v1 is not None and v1.version == 1 and v1.complete and v1.parents == []
    n_traces = sum(len(w.traces) for w in mlp_workloads)
    assert v1.row_count == n_traces + 1 == len(all_ids) - 1  # all successes + the build error; bogus skipped
    assert seen[-1] == (len(all_ids), len(all_ids)) and [d for d, _ in seen] == sorted(d for d, _ in seen)

    folder = v1.manifest["folder"]  # a folder of its own: datasets/v1-<token>/
    assert re.fullmatch(r"datasets/v1-[0-9a-f]{8}/", folder)
    manifest = json.loads(store.get_bytes(f"{folder}manifest.json"))
    assert manifest == v1.manifest == dataset.list_versions(db)[0].manifest
    assert manifest["schema_version"] == dataset.SCHEMA_VERSION and manifest["version"] == 1
    assert manifest["parents"] == [] and manifest["row_counts"] == {"x86": n_traces + 1}
    assert manifest["workloads"] == {"x86": sorted(w.structural_hash for w in mlp_workloads)}
    kept = [i for i in all_ids if i not in bogus]
    assert manifest["measurement_ids"] == {"min": kept[0], "max": kept[-1]}  # of the rows written
    assert manifest["high_water"] == {"x86": all_ids[-1]}
    assert manifest["feature_extractor"]["name"] == "PerStoreFeature"
    assert manifest["feature_extractor"]["dims"] == 164
    assert manifest["tvm_version"].startswith("0.27")
    x86 = manifest["hardware"]["x86"]
    assert (x86["labelled"], x86["errors"], x86["skipped_ids"]) == (n_traces, 1, bogus)
    assert x86["file"] == f"{folder}hardware=x86/part-0.parquet"
    assert dt_parse(manifest["created_at"]) and v1.uri == store.uri(f"{folder}manifest.json")
    assert [(a.kind, a.key) for a in db.artifacts()] == [("dataset", folder)], "the database registered its folder"

    t1 = dataset.load(db, store)
    assert t1.schema == dataset.schema() and t1.num_rows == v1.row_count
    assert t1["measurement_id"].to_pylist() == kept
    assert set(t1["hardware"].to_pylist()) == {"x86"} and set(t1["dataset_version"].to_pylist()) == {1}
    _check_rows(t1, db, first_export=True)

    # Nothing new: no version, nothing written.
    keys = list(store.list())
    assert dataset.export(db, store) is None
    assert list(store.list()) == keys and len(dataset.list_versions(db)) == 1

    # More tuning: a faster schedule for workload 0, a slower one for workload 1.
    w0, w1 = mlp_workloads[0], mlp_workloads[1]
    db.commit_measurements([_m(ids, w0, 0, w0.traces[0], 1e-5, repeat=1), _m(ids, w1, 1, w1.traces[0], 1.0, repeat=1)])
    v2 = dataset.export(db, store)
    assert v2 is not None and (v2.version, v2.parents, v2.row_count) == (2, [1], 2)
    assert v2.measurement_ids["min"] > v1.measurement_ids["max"], "version id ranges are disjoint"
    t2 = dataset.load(db, store, [2])
    assert t2["measurement_id"].to_pylist() == sorted(_db_rows(db))[-2:]
    assert t2["label"].to_pylist()[0] == 1.0 and 0.0 < t2["label"].to_pylist()[1] < 1e-3
    _check_rows(t2, db, first_export=False)

    union = dataset.load(db, store)
    assert union.num_rows == t1.num_rows + 2 and union.num_rows == len(set(union["measurement_id"].to_pylist()))
    assert union["measurement_id"].to_pylist() == [i for i in sorted(_db_rows(db)) if i not in bogus]
    assert dataset.load(db, store, [1, 2]).equals(union)
    # v1's best row of workload 0 is stale until renormalised against v2's faster schedule.
    relabelled = dataset.renormalise(union)
    _check_rows(relabelled, db, first_export=True)
    assert dataset.load(db, store, hardware="arm").num_rows == 0
    assert dataset.load(db, store, hardware="arm").schema == dataset.schema()
    db.close()


def test_export_per_hardware_class(db_url: str, tmp_path, mlp_workloads) -> None:  # type: ignore[no-untyped-def]
    """Each class keeps its own high-water mark: exporting one class never skips another's rows."""
    db = Database(db_url)
    store = LocalStore(tmp_path / "artifacts")
    ids = _setup(db, mlp_workloads, ("x86", "arm"))
    db.commit_measurements(_first_batch(ids, mlp_workloads, "x86")[:-1] + _first_batch(ids, mlp_workloads, "arm")[:-1])
    v1 = dataset.export(db, store, hardware="arm")
    assert v1 is not None and list(v1.row_counts) == ["arm"]
    assert dataset.export(db, store, hardware="arm") is None
    v2 = dataset.export(db, store)
    assert v2 is not None and v2.parents == [1] and list(v2.row_counts) == ["x86"]
    assert v2.manifest["high_water"] == {"arm": v1.manifest["high_water"]["arm"], "x86": v2.manifest["high_water"]["x86"]}
    assert dataset.export(db, store) is None
    union = dataset.load(db, store)
    assert sorted(union["measurement_id"].to_pylist()) == sorted(_db_rows(db))
    assert [r for r in union["hardware"].to_pylist()] == ["arm"] * v1.row_count + ["x86"] * v2.row_count
    assert dataset.load(db, store, hardware=["arm"]).num_rows == v1.row_count
    _check_rows(union, db, first_export=True)
    with pytest.raises(NotFoundError, match="unknown hardware class 'gpu'"):
        dataset.export(db, store, hardware="gpu")
    db.close()


def _late_row(ids: dict[str, Any], w: Any, trace: str, run_s: float, repeat: int) -> dict[str, Any]:
    """Column values of one measurement written by hand (a commit outside the tunefleet commit path)."""
    from tunefleet.db.database import sha256_text
    from tunefleet.db.tables import utcnow

    return {"workload_id": ids["wl"][0], "hardware_class_id": ids["hw"]["x86"], "trace_json": trace,
            "trace_sha256": sha256_text(trace), "attempt": repeat, "args_info": w.args_info,
            "run_secs": [run_s, run_s], "mean_run_s": run_s, "build_s": 0.1, "tvm_version": "0.27.0",
            "target": ids["targets"]["x86"], "created_at": utcnow()}


def test_late_commit_with_a_lower_id_is_exported_next(db_url: str, tmp_path, mlp_workloads) -> None:  # type: ignore[no-untyped-def]
    """A measurement committed after an export read its rows, with an id below the ones it
    exported, is in the next version (nothing is skipped for good)."""
    from tunefleet.db.tables import Measurement

    db = Database(db_url)
    store = LocalStore(tmp_path / "artifacts")
    ids = _setup(db, mlp_workloads)
    w = mlp_workloads[0]
    db.commit_measurements(_first_batch(ids, mlp_workloads)[:3])
    measurements = Measurement.__table__
    late = _late_row(ids, w, w.traces[1], 2e-5, repeat=7)
    conn = db.engine.connect()
    try:
        if db.dialect == "postgresql":
            # The real race: a tuning transaction takes its id, then commits only after a later
            # transaction committed and an export ran.
            held = conn.begin()
            late_id = conn.execute(measurements.insert().values(**late).returning(measurements.c.id)).scalar_one()
            db.commit_measurements([_m(ids, mlp_workloads[1], 1, mlp_workloads[1].traces[0], 3e-4, repeat=1)])
            v1 = dataset.export(db, store)
            held.commit()
        else:
            # SQLite has one writer at a time, so ids are visible in order; the same gap is a row
            # written below the mark after the export (e.g. copied back from another database).
            db.commit_measurements([_m(ids, w, 0, w.traces[1], 2e-5, repeat=7),
                                    _m(ids, mlp_workloads[1], 1, mlp_workloads[1].traces[0], 3e-4, repeat=1)])
            late_id = next(m.id for m in db.measurements() if m.repeat == 7)
            with conn.begin():
                conn.execute(measurements.delete().where(measurements.c.id == late_id))
            v1 = dataset.export(db, store)
            with conn.begin():
                conn.execute(measurements.insert().values(id=late_id, **late))
    finally:
        conn.close()
    assert v1 is not None and late_id not in dataset.load(db, store, [1])["measurement_id"].to_pylist()
    assert late_id < max(dataset.load(db, store, [1])["measurement_id"].to_pylist()), "the late row has a lower id"

    v2 = dataset.export(db, store)
    assert v2 is not None and v2.row_count == 1, "the late measurement is exported by the next version"
    assert dataset.load(db, store, [2])["measurement_id"].to_pylist() == [late_id]
    assert db.unexported_measurements() == [] and dataset.export(db, store) is None
    union = dataset.load(db, store)["measurement_id"].to_pylist()
    assert sorted(union) == sorted(_db_rows(db))
    db.close()


def test_concurrent_exports_never_take_a_measurement_twice(db_url: str, tmp_path, mlp_workloads) -> None:  # type: ignore[no-untyped-def]
    """A second export that completes while the first is still writing takes the rows; the first
    then registers nothing, removes its files and says to run it again."""
    db = Database(db_url)
    store = LocalStore(tmp_path / "artifacts")
    ids = _setup(db, mlp_workloads)
    db.commit_measurements(_first_batch(ids, mlp_workloads))
    inner: list[Any] = []

    def race(done: int, total: int) -> None:
        if not inner:  # after the first page: the other export runs from start to end
            inner.append(dataset.export(db, store))

    with pytest.raises(ConflictError, match="another export completed a version with some of the same") as err:
        dataset.export(db, store, batch_size=4, progress=race)
    assert "\n" not in str(err.value) and "run the export again" in str(err.value)
    (other,) = inner
    assert other is not None and other.version == 2
    assert [v.version for v in dataset.list_versions(db)] == [2], "the loser's reserved v1 is removed"
    assert not [k for k in store.list() if k.startswith("datasets/v1-")], "the loser's files are removed"
    bogus = [m.id for m in db.measurements() if m.trace_json == BOGUS_TRACE]
    marks = db.dataset_marks(db.datasets()[0].id)
    assert sorted(marks) == sorted(_db_rows(db)) and [i for i, o in marks.items() if o == "skipped"] == bogus
    ids_exported = dataset.load(db, store)["measurement_id"].to_pylist()
    assert len(ids_exported) == len(set(ids_exported)) == len(_db_rows(db)) - 1
    assert dataset.export(db, store) is None and db.unexported_measurements() == []
    db.close()


def test_failed_export_leaves_nothing(tmp_path, mlp_workloads) -> None:  # type: ignore[no-untyped-def]
    db = Database(f"sqlite:///{tmp_path / 'tf.db'}")
    store = LocalStore(tmp_path / "artifacts")
    ids = _setup(db, mlp_workloads)
    db.commit_measurements(_first_batch(ids, mlp_workloads))

    def interrupt(done: int, total: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dataset.export(db, store, batch_size=4, progress=interrupt)
    assert dataset.list_versions(db) == [] and [k for k in store.list() if k.endswith(".parquet")] == []
    with pytest.raises(NotFoundError, match="no dataset in the database yet"):
        dataset.load(db, store)
    v1 = dataset.export(db, store)
    assert v1 is not None and v1.version == 1
    db.close()


def test_missing_or_corrupt_files_name_the_file(tmp_path, mlp_workloads) -> None:  # type: ignore[no-untyped-def]
    db = Database(f"sqlite:///{tmp_path / 'tf.db'}")
    store = LocalStore(tmp_path / "artifacts")
    ids = _setup(db, mlp_workloads)
    db.commit_measurements(_first_batch(ids, mlp_workloads))
    v1 = dataset.export(db, store)
    assert v1 is not None
    key = v1.manifest["hardware"]["x86"]["file"]
    good = store.get_bytes(key)

    store.put_bytes(key, b"not parquet at all" * 10)
    with pytest.raises(DatasetError) as err:
        dataset.load(db, store)
    assert key in str(err.value) and "not a readable Parquet file" in str(err.value) and "\n" not in str(err.value)

    store.put_bytes(key, good[: len(good) // 2])  # truncated
    with pytest.raises(DatasetError, match="part-0.parquet") as err:
        dataset.load(db, store)
    assert "\n" not in str(err.value)

    store.delete(key)
    with pytest.raises(DatasetError, match=f"dataset file '{key}' .* is missing") as err:
        dataset.load(db, store, [1])
    assert "\n" not in str(err.value)

    store.put_bytes(key, good)
    assert dataset.load(db, store).num_rows == dataset.list_versions(db)[0].row_count
    with pytest.raises(NotFoundError, match=r"no dataset version 7 .*\(versions: v1\)"):
        dataset.load(db, store, [7])
    # The manifest that counts is the database's; the store's copy is for other readers.
    store.put_bytes(f"{v1.manifest['folder']}manifest.json", b"{half")
    assert dataset.load(db, store).num_rows == v1.row_count
    assert isinstance(err.value, TunefleetError)
    db.close()


def test_export_to_s3(seaweedfs, tmp_path, mlp_workloads) -> None:  # type: ignore[no-untyped-def]
    """The same through a real S3 server: pyarrow's S3 filesystem writes, the store sees the keys."""
    db = Database(f"sqlite:///{tmp_path / 'tf.db'}")
    store: ArtifactStore = S3Store(seaweedfs.endpoint, seaweedfs.access_key, seaweedfs.secret_key,
                                   unique_bucket_name("dataset"), prefix="tunefleet")
    ids = _setup(db, mlp_workloads)
    db.commit_measurements(_first_batch(ids, mlp_workloads))
    v1 = dataset.export(db, store)
    assert v1 is not None and v1.uri.startswith("s3://")
    folder = v1.manifest["folder"]
    assert v1.uri.endswith(f"/tunefleet/{folder}manifest.json")
    assert sorted(store.list("datasets/")) == [f"{folder}hardware=x86/part-0.parquet", f"{folder}manifest.json"]
    w = mlp_workloads[2]
    db.commit_measurements([_m(ids, w, 2, w.traces[0], 1e-6, repeat=3)])
    v2 = dataset.export(db, store)
    assert v2 is not None and v2.parents == [1] and v2.row_count == 1
    assert [v.version for v in dataset.list_versions(db)] == [1, 2]
    union = dataset.load(db, store)
    assert union.num_rows == v1.row_count + 1
    _check_rows(dataset.renormalise(union), db, first_export=True)
    part = v2.manifest["hardware"]["x86"]["file"]
    store.put_bytes(part, b"garbage")
    with pytest.raises(DatasetError, match=f"'{part}' in s3://"):
        dataset.load(db, store)
    db.close()


def dt_parse(text: str) -> Any:
    import datetime as dt

    return dt.datetime.fromisoformat(text)


# -- slow: measurements from a real tiny tuning run ------------------------------------------------
@pytest.mark.slow
@on_backend("sqlite")
def test_export_real_tuning(db_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tunefleet.planning import shard_queue
    from tunefleet.config import load_settings
    from tunefleet.hardware import seed_hardware_classes
    from tunefleet.models.ingest import ingest
    from tunefleet.engine.options import TuneOptions
    from tunefleet.engine.worker import drain
    from tunefleet.models.workloads import extract

    settings = load_settings(home=tmp_path / "home", database_url=db_url)
    db = Database.from_settings(settings)
    seed_hardware_classes(db, settings)
    store = LocalStore(settings.effective_store_path)
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    shard_queue.plan(db, "x86", target_trials=4, model=model.id)
    assert drain(db, "x86", TuneOptions(seed=0, trials_per_iter=4)).shards_failed == 0

    v1 = dataset.export(db, store)
    n1 = db.count_measurements()
    assert v1 is not None and v1.row_count == n1 >= 12, "every measurement, errors included, is a row"
    assert v1.row_counts == {"x86": n1} and len(v1.manifest["workloads"]["x86"]) == 3
    assert v1.manifest["hardware"]["x86"]["labelled"] == db.count_measurements(errors=False)
    t1 = dataset.load(db, store)
    assert t1["measurement_id"].to_pylist() == sorted(_db_rows(db))
    _check_rows(t1, db, first_export=True)
    assert dataset.export(db, store) is None

    shard_queue.plan(db, "x86", target_trials=6, model=model.id)  # top up: a few more trials per workload
    assert drain(db, "x86", TuneOptions(seed=1, trials_per_iter=2)).shards_failed == 0
    v2 = dataset.export(db, store)
    assert v2 is not None and v2.parents == [1] and v2.row_count == db.count_measurements() - n1 > 0
    assert v2.measurement_ids["min"] > v1.measurement_ids["max"]
    union = dataset.load(db, store)
    assert union["measurement_id"].to_pylist() == sorted(_db_rows(db))
    _check_rows(dataset.renormalise(union), db, first_export=True)
    assert [v.version for v in dataset.list_versions(db)] == [1, 2]
    db.close()
