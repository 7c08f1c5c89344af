"""Hub bundles on SQLite and PostgreSQL: export, import (validated, idempotent, all or nothing),
hub classes that are never measured, the first-use import, and s3:// on a real SeaweedFS."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tunefleet import api
from tunefleet.db import NewMeasurement
from tunefleet.errors import NotSupportedError, ParameterError
from tunefleet.learning import hub
from tunefleet.vocab import HUB_POOL


def _measure(ctx: Any, workloads: list[Any], hardware: str = "x86", recipe: str = "nhwc+prepack+fastmath+fold") -> None:
    """Commit every trace of the mlp workloads on ``hardware`` as if tuned there (the last fastest)."""
    from tunefleet.hardware import claim_for_this_cpu

    db = ctx.db
    hw = claim_for_this_cpu(db, hardware)  # what a tuner does first: the class records this CPU
    model = db.add_model(name="mlp", source="zoo", format="relax-nn", sha256="ab" * 32, artifact_uri="file:///x")[0]
    weights = {}
    for w in workloads:
        row, _ = db.add_workload(structural_hash=w.structural_hash, name=w.name, op_kind=w.op_kind, flops=w.flops,
                                 tir_json=w.tir_json)
        weights[row.id] = 1
        n = len(w.traces)
        db.commit_measurements([NewMeasurement(row.id, hw.id, t, run_secs=[1e-5 * (n - i)] * 3, args_info=w.args_info,
                                               tvm_version=hub.tvm_version(), target=json.dumps(hw.target))
                                for i, t in enumerate(w.traces)])
    db.set_model_workloads(model.id, hw.id, recipe, weights)


def _table(path: Path) -> Any:
    import pyarrow.parquet as pq

    return pq.read_table(path)


def _rewrite(src: Path, dst: Path, *, meta: dict[str, str] | None = None, column: tuple[str, Any] | None = None,
             drop: str | None = None) -> Path:
    """A copy of a bundle with metadata changed, one column's values replaced, or a column dropped."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = _table(src)
    old = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    if column is not None:
        name, fn = column
        values = [fn(i, v) for i, v in enumerate(table.column(name).to_pylist())]
        table = table.set_column(table.schema.get_field_index(name), name, pa.array(values, table.schema.field(name).type))
    if drop is not None:
        table = table.drop_columns([drop])
    table = table.replace_schema_metadata({**old, **(meta or {})})
    pq.write_table(table, dst)
    return dst


@pytest.fixture
def bundle(make_home: Any, mlp_workloads: list[Any], tmp_path: Path) -> tuple[Any, Path]:
    """A database with the mlp workloads measured on x86, and its bundle (top 3)."""
    src = make_home("src")
    _measure(src, mlp_workloads)
    result = api.hub_export(src, tmp_path / "mlp.parquet", top_k=3)
    assert result.classes == ["x86"] and result.workloads == len(mlp_workloads)
    assert result.records == sum(min(3, len(w.traces)) for w in mlp_workloads)
    return src, tmp_path / "mlp.parquet"


def test_a_bundle_holds_the_best_records_with_their_workload_class_cpu_and_recipe(bundle: Any,
                                                                                  mlp_workloads: list[Any]) -> None:
    src, path = bundle
    table = _table(path)
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    assert (meta["format"], meta["version"], meta["tvm"]) == (hub.FORMAT, "1", hub.tvm_version())
    rows = table.to_pylist()
    x86 = src.db.hardware_class("x86")
    for w in mlp_workloads:
        mine = [r for r in rows if r["workload_hash"] == w.structural_hash]
        assert [r["rank"] for r in mine] == list(range(min(3, len(w.traces))))
        assert [r["trace_json"] for r in mine] == w.traces[::-1][:3]  # the fastest first
        assert all(r["tir_json"] == w.tir_json and r["recipe"] == "nhwc+prepack+fastmath+fold" for r in mine)
        assert all(json.loads(r["cpu"]) == x86.capabilities["cpu"] and json.loads(r["target"]) == x86.target
                   for r in mine)
    # per model: a model's workloads on each class
    only = api.hub_export(src, path.with_name("model.parquet"), model="mlp", top_k=1)
    assert (only.workloads, only.records) == (len(mlp_workloads), len(mlp_workloads))


def test_import_loads_records_under_a_hub_class_once(bundle: Any, make_home: Any, mlp_workloads: list[Any]) -> None:
    src, path = bundle
    dst = make_home("dst")
    first = api.hub_import(dst, path)
    n = _table(path).num_rows
    assert first.new and first.counts["records_new"] == n and first.counts["workloads_new"] == len(mlp_workloads)
    assert "skipped" not in first.line()
    [hub_class] = dst.db.hub_classes()
    assert hub_class.name == first.classes[0] and hub_class.node_pool == HUB_POOL
    assert hub_class.name.startswith("hub:x86@") and len(hub_class.name) <= 64
    assert hub_class.capabilities["cpu"] == src.db.hardware_class("x86").capabilities["cpu"]
    assert hub_class.capabilities["hub"]["class"] == "x86"
    assert dst.db.count_measurements(hardware_class_id=hub_class.id) == n
    # the same file again: nothing to do; the same records in another file: nothing new
    again = api.hub_import(dst, path)
    assert not again.new and "imported before" in again.line()
    fewer = api.hub_export(src, path.with_name("top2.parquet"), top_k=2)
    other = api.hub_import(dst, path.with_name("top2.parquet"))
    assert other.new and (other.counts["records_new"], other.counts["records_present"]) == (0, fewer.records)
    assert dst.db.count_measurements(hardware_class_id=hub_class.id) == n
    assert len(dst.db.hub_imports()) == 2
    # imported records are never this database's own: the local class has none, and none is measured here
    x86 = dst.db.hardware_class("x86")
    assert dst.db.count_measurements(hardware_class_id=x86.id) == 0
    from tunefleet.hardware import claim_for_this_cpu

    with pytest.raises(NotSupportedError, match="holds records imported from a hub bundle"):
        claim_for_this_cpu(dst.db, hub_class.name)
    import tvm

    from tunefleet.delivery.best import metaschedule_database

    fleet = metaschedule_database(dst.db, "x86")
    wl = mlp_workloads[0]
    assert len(fleet.get_top_k(fleet.commit_workload(tvm.ir.load_json(wl.tir_json)), 5)) == 0
    # a hub class is not exported again as if measured here
    with pytest.raises(ParameterError, match="holds imported hub records"):
        api.hub_export(dst, path.with_name("x.parquet"), hardware=[hub_class.name])


def test_a_bundle_is_validated_before_anything_is_loaded(bundle: Any, make_home: Any, tmp_path: Path) -> None:
    _, path = bundle
    dst = make_home("dst")
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ParameterError, match=r"^not a hub bundle: .*junk.parquet"):
        api.hub_import(dst, tmp_path / "junk.parquet")
    with pytest.raises(ParameterError, match="no hub bundle at"):
        api.hub_import(dst, tmp_path / "missing.parquet")
    unmarked = _rewrite(path, tmp_path / "unmarked.parquet", meta={"format": "something-else"})
    with pytest.raises(ParameterError, match="without the 'tunefleet-hub' format mark"):
        api.hub_import(dst, unmarked)
    future = _rewrite(path, tmp_path / "v2.parquet", meta={"version": "2"})
    with pytest.raises(NotSupportedError, match="format version '2'.*reads version 1"):
        api.hub_import(dst, future)
    foreign = _rewrite(path, tmp_path / "tvm.parquet", meta={"tvm": "0.8.0"})
    with pytest.raises(NotSupportedError, match=r"TVM 0\.8\.0; this is TVM"):
        api.hub_import(dst, foreign)
    no_trace = _rewrite(path, tmp_path / "cols.parquet", drop="trace_json")
    with pytest.raises(ParameterError, match="missing column.*trace_json"):
        api.hub_import(dst, no_trace)
    # record by record: another TVM version, an unknown recipe, a trace whose hash does not match
    rows = _table(path).num_rows
    odd = _rewrite(path, tmp_path / "odd.parquet", column=("tvm_version", lambda i, v: "0.8.0" if i == 0 else v))
    odd = _rewrite(odd, tmp_path / "odd2.parquet", column=("recipe", lambda i, v: "nchw+bogus" if i == 1 else v))
    odd = _rewrite(odd, tmp_path / "odd3.parquet", column=("trace_sha256", lambda i, v: "0" * 64 if i == 2 else v))
    done = api.hub_import(dst, odd)
    assert (done.counts["skipped_tvm_version"], done.counts["skipped_recipe"], done.counts["skipped_invalid"]) == (1, 1, 1)
    assert done.counts["records_new"] == rows - 3
    assert "skipped: 1 (invalid), 1 (recipe), 1 (tvm_version)" in done.line()
    every = _rewrite(path, tmp_path / "all.parquet", column=("tvm_version", lambda i, v: "0.8.0"))
    with pytest.raises(ParameterError, match=rf"nothing to import .*all {rows} records skipped \({rows} tvm_version\)"):
        api.hub_import(dst, every)
    # nothing of the refused bundles was loaded: one import, its records only
    assert len(dst.db.hub_imports()) == 1
    assert dst.db.count_measurements(hardware_class_id=dst.db.hub_classes()[0].id) == rows - 3


def test_an_import_interrupted_midway_loads_nothing_and_the_next_loads_all(bundle: Any, make_home: Any,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from tunefleet.db import hub as db_hub

    _, path = bundle
    dst = make_home("dst")
    real = db_hub._chunks
    calls = {"n": 0}

    def dying(items: Any) -> Any:
        for chunk in real(items):
            calls["n"] += 1
            if calls["n"] == 3:  # after the workloads and the first records were inserted
                raise RuntimeError("killed mid-import")
            yield chunk

    monkeypatch.setattr(db_hub, "IMPORT_CHUNK", 2)
    monkeypatch.setattr(db_hub, "_chunks", dying)
    with pytest.raises(RuntimeError, match="killed mid-import"):
        api.hub_import(dst, path)
    assert dst.db.hub_imports() == [] and dst.db.hub_classes() == [] and dst.db.workloads() == []
    monkeypatch.setattr(db_hub, "_chunks", real)
    done = api.hub_import(dst, path)
    assert done.new and done.counts["records_new"] == _table(path).num_rows


def test_a_database_imports_the_hub_setting_bundle_on_first_use(bundle: Any, make_home: Any,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _, path = bundle
    off = make_home("off")
    assert off.db.hub_imports() == []
    monkeypatch.setattr(hub, "DEFAULT_BUNDLE", path)
    first = make_home("default", hub="default")
    assert [i.sha256 for i in first.db.hub_imports()] == [hub.hashlib.sha256(path.read_bytes()).hexdigest()]
    assert hub.ensure_hub(first.db, "default") is None  # once
    monkeypatch.setattr(hub, "DEFAULT_BUNDLE", path.with_name("none-shipped.parquet"))
    assert make_home("unshipped", hub="default").db.hub_imports() == []  # an installation without one
    named = make_home("named", hub=str(path))
    assert len(named.db.hub_imports()) == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_export_and_import_through_s3(bundle: Any, make_home: Any, seaweedfs: Any) -> None:
    from tunefleet.testing.seaweedfs import unique_bucket_name

    src, path = bundle
    s3 = dict(store="s3", s3_endpoint=seaweedfs.endpoint, s3_access_key=seaweedfs.access_key,
              s3_secret_key=seaweedfs.secret_key, s3_bucket=unique_bucket_name("hub"))
    ctx = make_home("s3", **s3)
    _ = ctx.store  # creates the bucket
    uri = ctx.store.uri("hub/mlp.parquet")
    assert uri.startswith("s3://")
    exported = hub.write_bundle(src.db, ctx.store, uri, top_k=3)
    assert exported.records == _table(path).num_rows
    done = api.hub_import(ctx, uri)
    assert done.new and done.counts["records_new"] == exported.records


def test_export_refuses_a_bad_top_k_and_an_unknown_class(make_home: Any) -> None:
    from tunefleet.errors import NotFoundError

    ctx = make_home()
    with pytest.raises(ParameterError, match="--top-k"):
        hub.export_bundle(ctx.db, top_k=0)
    with pytest.raises(NotFoundError, match="unknown hardware class 'nope'"):
        hub.export_bundle(ctx.db, hardware=["nope"])
    data, summary = hub.export_bundle(ctx.db)  # nothing measured: an empty, valid bundle
    assert summary == {"classes": []}
    import pyarrow.parquet as pq

    assert pq.read_table(io.BytesIO(data)).num_rows == 0


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_the_hub_commands(bundle: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                          capsys: pytest.CaptureFixture[str]) -> None:
    from tunefleet.cli.app import main

    src, path = bundle
    monkeypatch.setenv("TUNEFLEET_HOME", str(tmp_path / "cli"))
    monkeypatch.setenv("TUNEFLEET_HUB", "off")
    assert main(["hub", "import", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"imported {path}: {_table(path).num_rows} new records (0 present) of 3 workloads under 1 hub")
    assert main(["hub", "import", str(path)]) == 0
    assert "imported before" in capsys.readouterr().out
    assert main(["hub", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [i["sha256"] for i in listed["imports"]] == [hub.hashlib.sha256(path.read_bytes()).hexdigest()]
    assert listed["classes"][0]["class"] == "x86" and listed["classes"][0]["records"] == _table(path).num_rows
    assert main(["hub", "export", str(tmp_path / "empty.parquet")]) == 0  # nothing measured here: no class
    assert "0 records of 0 workloads on no class" in capsys.readouterr().out
    assert main(["hub", "import", str(tmp_path / "nothing.parquet")]) == 2
    err = capsys.readouterr().err
    assert "no hub bundle at" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # a merge opens no database
def test_merge_keeps_the_best_of_each_workload_class_and_cpu(bundle: Any, make_home: Any, tmp_path: Path,
                                                             mlp_workloads: list[Any], monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    _, path = bundle
    ctx = make_home("merge")
    rows = _table(path).num_rows
    # the same records measured on another CPU (another mcpu): another class in the merged bundle
    other_cpu = {"id": "GenuineIntel family 6 model 143", "isa": ["avx2", "fma"], "model": "Other CPU"}
    other = _rewrite(path, tmp_path / "cpu.parquet", column=("cpu", lambda i, v: json.dumps(other_cpu, sort_keys=True)))
    other = _rewrite(other, tmp_path / "other.parquet",
                     column=("target", lambda i, v: json.dumps({**json.loads(v), "mcpu": "haswell"}, sort_keys=True)))
    other = _rewrite(other, tmp_path / "older.parquet",  # tuned on another day than the bundle was made
                     column=("measured_at", lambda i, v: v.replace(year=2025, month=3, day=1 + i)))
    merged = api.hub_merge(ctx, tmp_path / "merged.parquet", [path, path, other], top_k=3)
    assert (merged.records, merged.dropped, merged.excluded) == (2 * rows, rows, 0)  # the second copy adds nothing
    assert merged.workloads == len(mlp_workloads) and len(merged.classes) == 2
    assert any(c == "x86 on Other CPU (family 6 model 143)" for c in merged.classes)
    assert f"{2 * rows} records of {len(mlp_workloads)} workloads from 3 bundle(s), 2 class(es)" in merged.line()
    # the same sources, the same bytes: importing it twice does nothing
    assert api.hub_merge(ctx, tmp_path / "again.parquet", [path, path, other], top_k=3).sha256 == merged.sha256
    table = _table(tmp_path / "merged.parquet")
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    assert meta["created_at"] == {k.decode(): v.decode() for k, v in _table(path).schema.metadata.items()}["created_at"]
    assert len(json.loads(meta["summary"])["merged_from"]) == 3
    dst = make_home("dst")
    done = api.hub_import(dst, tmp_path / "merged.parquet")
    assert done.counts["records_new"] == 2 * rows and len(done.classes) == 2
    # two CPUs of one bundle are told apart in what run, best and build say
    said = {hub.describe_hub_class(hw.name, hw.capabilities) for hw in dst.db.hub_classes()}
    assert len(said) == 2 and any(s.startswith("x86 on Other CPU (family 6 model 143), ") for s in said)
    # each said with the date of its newest record, not the merged bundle's
    assert f"x86 on Other CPU (family 6 model 143), 2025-03-{rows:02d}" in said
    # one schedule measured faster in another bundle: the faster measurement is kept, once
    faster = _rewrite(path, tmp_path / "faster.parquet", column=("mean_run_s", lambda i, v: v / 10))
    faster = _rewrite(faster, tmp_path / "faster2.parquet", column=("run_secs", lambda i, v: [x / 10 for x in v]))
    quick = api.hub_merge(ctx, tmp_path / "quick.parquet", [path, faster], top_k=3)
    assert (quick.records, quick.dropped) == (rows, rows)
    assert sorted(r["mean_run_s"] for r in _table(tmp_path / "quick.parquet").to_pylist()) == sorted(
        _table(faster).column("mean_run_s").to_pylist())
    # top-k 1: each workload's fastest, ranked again
    api.hub_merge(ctx, tmp_path / "one.parquet", [path, other], top_k=1)
    one = _table(tmp_path / "one.parquet").to_pylist()
    assert len(one) == 2 * len(mlp_workloads) and {r["rank"] for r in one} == {0}
    assert {r["trace_json"] for r in one} == {w.traces[-1] for w in mlp_workloads}  # the last is the fastest
    # records known to be wrong, left out by workload name
    name = mlp_workloads[0].name
    mine = sum(1 for r in _table(path).to_pylist() if r["workload_name"] == name)
    ex = api.hub_merge(ctx, tmp_path / "ex.parquet", [path], exclude=[name])
    assert ex.excluded == mine > 0 and ex.records == rows - mine
    assert name not in {r["workload_name"] for r in _table(tmp_path / "ex.parquet").to_pylist()}
    # refused in one line: everything excluded, two TVM versions, not a bundle, nothing named
    with pytest.raises(ParameterError, match=rf"nothing to merge: all {rows} records were excluded"):
        api.hub_merge(ctx, tmp_path / "x.parquet", [path], exclude=["*"])
    foreign = _rewrite(path, tmp_path / "tvm.parquet", meta={"tvm": "0.8.0"})
    with pytest.raises(NotSupportedError, match=r"^not supported: merging bundles of TVM .* and 0\.8\.0"):
        api.hub_merge(ctx, tmp_path / "x.parquet", [path, foreign])
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(ParameterError, match="^not a hub bundle: .*junk.parquet"):
        api.hub_merge(ctx, tmp_path / "x.parquet", [path, tmp_path / "junk.parquet"])
    with pytest.raises(ParameterError, match="nothing to merge: name at least one bundle"):
        api.hub_merge(ctx, tmp_path / "x.parquet", [])
    assert not (tmp_path / "x.parquet").exists()
    # the command
    from tunefleet.cli.app import main

    monkeypatch.setenv("TUNEFLEET_HOME", str(tmp_path / "cli"))
    assert main(["hub", "merge", str(tmp_path / "cli.parquet"), str(path), str(other), "--exclude-workload", name]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {tmp_path / 'cli.parquet'}: ") and f"{2 * mine} excluded by name" in out
    assert not (tmp_path / "cli").exists()  # no database was made
