"""Ingestion: content addressing, idempotence, corrupt files, unknown classes."""

from __future__ import annotations

import pytest

from tunefleet.db import Database
from tunefleet.errors import NotFoundError, NotSupportedError
from tunefleet.models.frontends import ModelFormatError
from tunefleet.models.ingest import ingest, load_model
from tunefleet.models.workloads import extract


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_ingest_zoo_model_twice_is_a_noop(engine) -> None:  # type: ignore[no-untyped-def]
    _, db, store = engine
    first = ingest(db, store, "mlp")
    again = ingest(db, store, "mlp")
    assert first.created and not again.created and first.model.id == again.model.id
    assert store.exists(store.key_from_uri(first.model.artifact_uri))
    assert [m.name for m in db.models()] == ["mlp"]
    other = ingest(db, store, "mlp", batch_size=2)
    assert other.created and other.model.sha256 != first.model.sha256
    assert load_model(db, store, first.model).input_info == first.loaded.input_info


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_corrupt_onnx_is_one_clear_line_and_stores_nothing(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, db, store = engine
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not protobuf" * 10)
    with pytest.raises(ModelFormatError) as exc:
        ingest(db, store, str(bad))
    assert "broken.onnx" in str(exc.value) and "\n" not in str(exc.value)
    assert db.models() == [] and list(store.list()) == []


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_onnx_file_round_trip(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import torch
    _, db, store = engine
    path = tmp_path / "tiny.onnx"
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())
    torch.onnx.export(model, (torch.zeros(1, 8),), str(path), dynamo=False, input_names=["x"])
    res = ingest(db, store, str(path))
    assert res.created and res.model.format == "onnx" and res.model.input_info == [["x", [1, 8], "float32"]]
    assert not ingest(db, store, str(path)).created


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_bad_sources(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, db, store = engine
    with pytest.raises(Exception, match="no such file, and not a zoo model"):
        ingest(db, store, str(tmp_path / "missing.onnx"))
    with pytest.raises(NotSupportedError, match="not supported"):
        ingest(db, store, "http://example.invalid/model.onnx")
    with pytest.raises(NotFoundError, match="unknown hardware class 'tpu'"):
        db.hardware_class("tpu")


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_builtin_hardware_classes_are_seeded(engine) -> None:  # type: ignore[no-untyped-def]
    _, db, _ = engine
    classes = {h.name: h for h in db.hardware_classes()}
    assert set(classes) >= {"x86", "x86-avx2", "arm", "gpu"}
    assert classes["x86"].target["kind"] == "llvm" and classes["x86"].target["num-cores"] >= 1
    assert classes["arm"].target["mtriple"].startswith("aarch64")
    assert classes["gpu"].target["kind"] == "cuda"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_class_layout_setting_chooses_its_recipe(engine_settings) -> None:  # type: ignore[no-untyped-def]
    from tunefleet.config import load_settings
    from tunefleet.errors import ConfigError
    from tunefleet.hardware import configured_classes, seed_hardware_classes
    from tunefleet.models.workloads import class_recipe

    db = Database.from_settings(engine_settings)
    seed_hardware_classes(db, engine_settings)
    recipes = {h.name: class_recipe(h).name for h in db.hardware_classes()}
    assert recipes.pop("x86-avx2") == recipes["x86"]  # the fixed AVX2 class gets the CPU recipe
    # Winograd by default on the x86 classes (measured faster on every x86 CPU and class), not on arm
    assert recipes == {"x86": "nhwc+prepack+fastmath+fold+winograd", "arm": "nhwc+prepack+fastmath+fold",
                       "gpu": "native+fold"}
    # another layout turns the default Winograd off (NHWC only) instead of refusing
    for layout, name in (("native", "native+prepack+fastmath+fold"), ("NCHWc", "nchwc+prepack+fastmath+fold")):
        other = load_settings(home=engine_settings.home, database_url=engine_settings.database_url,
                              hardware={"x86": {"layout": layout}})
        seed_hardware_classes(db, other)
        assert not db.hardware_class("x86").winograd and class_recipe(db.hardware_class("x86")).name == name
    direct = load_settings(home=engine_settings.home, database_url=engine_settings.database_url,
                           hardware={"x86-avx2": {"winograd": False}})
    seed_hardware_classes(db, direct)
    assert class_recipe(db.hardware_class("x86-avx2")).name == "nhwc+prepack+fastmath+fold"
    bad = load_settings(home=engine_settings.home, hardware={"x86": {"layout": "NCHW"}})
    with pytest.raises(ConfigError, match="layout 'NCHW'; one of NHWC, NCHWc, native"):
        configured_classes(bad)
    # Winograd: a setting of its own, stored with the class; NHWC CPU classes only
    winograd = load_settings(home=engine_settings.home, database_url=engine_settings.database_url,
                             hardware={"x86": {"layout": "NHWC", "winograd": True}})
    seed_hardware_classes(db, winograd)
    assert db.hardware_class("x86").winograd and not db.hardware_class("arm").winograd
    assert class_recipe(db.hardware_class("x86")).name == "nhwc+prepack+fastmath+fold+winograd"
    for spec, error in (({"gpu": {"winograd": True}}, "class 'gpu': not supported: Winograd convolutions on a GPU"),
                        ({"x86": {"layout": "native", "winograd": True}},
                         "class 'x86': not supported: Winograd convolutions in the native layout"),
                        ({"x86": {"winograd": "yes"}}, "class 'x86' has winograd 'yes'; true or false")):
        with pytest.raises(ConfigError, match=error):
            configured_classes(load_settings(home=engine_settings.home, hardware=spec))
    db.close()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_onnx_model_build_report_times_onnxruntime_on_it(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A model ingested as ONNX is timed in onnxruntime as ingested, next to the (here untuned) build."""
    import torch

    from tunefleet.delivery.build import build_model

    _, db, store = engine
    path = tmp_path / "tiny.onnx"
    torch.onnx.export(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()), (torch.zeros(1, 8),), str(path),
                      dynamo=False, input_names=["x"])
    model = ingest(db, store, str(path)).model
    extract(db, store, model, "x86")
    report = build_model(db, store, model, "x86")
    assert report.tuned_ms is not None and report.onnxruntime_ms is not None and report.onnxruntime_ms > 0
    assert report.torch_ms is None
    # how long extracting and this build (the one `run` makes) took: the next run's planner keeps that for them
    took = db.step_seconds([model.id], db.hardware_class("x86").id)
    assert set(took) == {"extract", "build"} and min(took.values()) > 0
    assert "no PyTorch module for this model: eager latency not measured" in report.notes
