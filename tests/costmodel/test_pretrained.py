"""The cost model shipped with tunefleet: version 0 of every class without one of its own.

It loads from the package with no network, says what it was trained on and what it scored on
held-out shape families; the warm start and zero-shot fall back on it unless it is turned off,
and a broken installation's model is one line, not a crash. (A class's own promoted model wins:
tests/costmodel/test_zeroshot.py::test_warm_start_uses_current_model.)
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import on_backend
from tunefleet.delivery.zeroshot import require_model
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.worker import Tuner
from tunefleet.errors import NotSupportedError
from tunefleet.learning import costmodel, pretrained
from tunefleet.learning.costmodel import CostModelError
from tunefleet.learning.hub import DEFAULT_BUNDLE

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", [pretrained.SHIPPED_MODEL, pretrained.SHIPPED_AVX2_MODEL], ids=lambda p: p.name)
def test_the_shipped_model_loads_and_says_what_it_was_trained_on(path: Path) -> None:
    model = pretrained.shipped_model(path)
    assert model.version == pretrained.SHIPPED_VERSION == 0 and model.cost_model_id is None
    assert model.objective in costmodel.OBJECTIVES
    on, held = model.meta["trained_on"], model.meta["heldout"]
    assert on["rows"] > 1000 and on["workloads"] > 50 and on["cpus"] and on["sources"]
    # trained on its own kind of vector code only (bench/pretrain.py picks the file by it)
    assert on["vector_code"] == ["avx2" if path == pretrained.SHIPPED_AVX2_MODEL else "default"]
    assert held["dims"] and held["workloads"] > 0
    # the guard held when it was written: it ranks the held-out families better than both baselines
    assert held["pairwise_accuracy"] > max(b["pairwise_accuracy"] for b in held["baselines"].values())
    scores = model.predict_features(costmodel.store_features([np.ones((3, 164), dtype=np.float32),
                                                              np.zeros((1, 164), dtype=np.float32)]))
    assert scores.shape == (2,) and np.isfinite(scores).all()
    assert pretrained.shipped_summary(path)["trained_on"] == on


def test_x86_avx2_code_gets_the_shipped_model_trained_on_avx2_code() -> None:
    """Which shipped model serves a class follows its target's vector code, not the host's CPU."""
    x86 = {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "num-cores": 2}
    for mcpu in ("haswell", "znver3"):  # the x86-avx2 class; an AVX2-only CPU's native class
        assert pretrained.vector_code({**x86, "mcpu": mcpu}) == "avx2"
        assert pretrained.shipped_path({**x86, "mcpu": mcpu}) == pretrained.SHIPPED_AVX2_MODEL
    for mcpu in ("znver4", "skylake-avx512"):
        assert pretrained.vector_code({**x86, "mcpu": mcpu}) == "default"
        assert pretrained.shipped_path({**x86, "mcpu": mcpu}) == pretrained.SHIPPED_MODEL
    for other in ({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mcpu": "neoverse-n1", "num-cores": 2},
                  {"kind": "cuda", "arch": "sm_80"}):
        assert pretrained.shipped_path(other) == pretrained.SHIPPED_MODEL
    assert pretrained.shipped_path(None) == pretrained.SHIPPED_MODEL
    assert pretrained.shipped_model(target={**x86, "mcpu": "haswell"}) is pretrained.shipped_model(
        pretrained.SHIPPED_AVX2_MODEL) is not pretrained.shipped_model()


def test_a_broken_shipped_model_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "default.json"
    bad.write_bytes(b"{not json")
    with pytest.raises(CostModelError, match=r"shipped with tunefleet is unusable .*reinstall tunefleet"):
        pretrained.shipped_model(bad)
    with pytest.raises(CostModelError, match=r"cannot be read \(No such file or directory"):
        pretrained.shipped_model(tmp_path / "gone.json")


@on_backend("sqlite")
def test_a_class_without_its_own_model_uses_the_shipped_one(engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    _, db, store = engine
    assert db.current_cost_model(db.hardware_class("x86").id) is None
    shipped = pretrained.shipped_model(target=db.hardware_class("x86").target)
    for st in (store, None):  # without an artifact store too: the shipped model needs none
        assert Tuner(db, "x86", store=st).cost_model(db) is shipped
    # each class gets the shipped model of its vector code, whatever this host's CPU
    for name, mcpu, path in (("zen4", "znver4", pretrained.SHIPPED_MODEL),
                             ("haswell", "haswell", pretrained.SHIPPED_AVX2_MODEL)):
        db.upsert_hardware_class(name, {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": mcpu, "num-cores": 2},
                                 "x86")
        assert require_model(db, store, name) is pretrained.shipped_model(path)
    # (a Tuner refuses a class whose code this CPU cannot run: the AVX2 one runs on every x86 host here)
    assert Tuner(db, "haswell", store=store).cost_model(db) is pretrained.shipped_model(pretrained.SHIPPED_AVX2_MODEL)
    assert Tuner(db, "x86", TuneOptions(pretrained_cost_model=False), store=store).cost_model(db) is None
    assert Tuner(db, "x86", TuneOptions(warm_start=False), store=store).cost_model(db) is None
    assert require_model(db, store, "x86") is shipped
    with pytest.raises(NotSupportedError, match="without a current cost model .*PRETRAINED_COST_MODEL=false"):
        require_model(db, store, "x86", pretrained=False)

    # a broken installation: said once, then the shards tune without a model
    monkeypatch.setattr(pretrained, "SHIPPED_MODEL", tmp_path / "gone.json")
    monkeypatch.setattr(pretrained, "SHIPPED_AVX2_MODEL", tmp_path / "gone.json")
    tuner = Tuner(db, "x86", store=store)
    with caplog.at_level(logging.WARNING, logger="tunefleet.engine"):
        assert tuner.cost_model(db) is None
        assert tuner.cost_model(db) is None
    assert caplog.text.count("tuning x86 without a cost model: the cost model shipped with tunefleet cannot be "
                             "read") == 1


def test_shape_families_are_held_out_whole() -> None:
    info = [[["TENSOR", "float32", [1, 384, 768]], ["TENSOR", "float32", [768, 768]]],
            [["TENSOR", "float32", [1, 128, 768]]], [["TENSOR", "float32", [1, 64, 56, 56]]]]
    table = pa.table({"workload_hash": ["a", "a", "b", "c"],
                      "args_info": [json.dumps(info[0]), json.dumps(info[0]), json.dumps(info[1]), json.dumps(info[2])]})
    assert costmodel.tensor_dims(json.dumps(info[0])) == {1, 384, 768}
    assert costmodel.tensor_dims(None) == set()
    assert costmodel.shape_holdout(table, {384}) == {"a"}
    assert costmodel.shape_holdout(table, {768}) == {"a", "b"}
    assert costmodel.shape_holdout(table, {7}) == set()
    # a workload whose rows name different shapes (a packed weight) is held out by any of them, in any order
    packed = [[["TENSOR", "float32", [1, 256]], ["TENSOR", "float32", [256, 64]]],
              [["TENSOR", "float32", [1, 256]], ["TENSOR", "float32", [8, 64, 32]]]]
    for rows in (packed, packed[::-1]):
        t = pa.table({"workload_hash": ["d", "d"], "args_info": [json.dumps(r) for r in rows]})
        assert costmodel.shape_holdout(t, {32}) == {"d"}


@pytest.mark.slow
def test_pretrain_trains_on_a_bundle_and_holds_out_a_shape_family(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """bench/pretrain.py on one CPU's records of the default hub bundle (Zen 5's: fewer to
    featurise than the whole bundle, and enough for a model that beats the baselines): bert-base's
    width held out, the model written with its metadata."""
    import pyarrow.parquet as pq

    sys.path.insert(0, str(REPO / "bench"))
    import pretrain

    bundle = pq.read_table(DEFAULT_BUNDLE)
    zen5 = bundle.filter(pa.array([json.loads(t).get("mcpu") == "znver5" for t in bundle["target"].to_pylist()]))
    assert 0 < zen5.num_rows < bundle.num_rows
    source = tmp_path / "zen5.parquet"
    pq.write_table(zen5, source)  # the bundle's format mark travels in the schema's metadata
    out, report = tmp_path / "m.json", tmp_path / "r.json"
    assert pretrain.main([str(source), "--output", str(out), "--holdout-dims", "768", "--json", str(report),
                          "--work-dir", str(tmp_path / "home"), "--diagnose", "--mlp", "2",
                          "--score", f"shipped={pretrained.SHIPPED_MODEL}", "--by-name", "conv2d"]) == 0
    printed = capsys.readouterr().out
    assert "held out: " in printed and "with a dimension in [768]" in printed and "random ranking" in printed
    # an existing model scored on the same rows: all of them, the held-out side, each split by name
    scored = json.loads(report.read_text())["heldout"]["scored"]["shipped"]
    every, conv, rest = (scored[k] for k in ("every row", "every row, conv2d", "every row, not conv2d"))
    assert every["n_rows"] == conv["n_rows"] + rest["n_rows"] and conv["n_workloads"] > 0 and rest["n_workloads"] > 0
    assert scored["held out"]["n_rows"] < every["n_rows"] and 0.0 <= every["pairwise_accuracy"] <= 1.0
    assert "shipped: every row, conv2d (" in printed
    diagnosed = json.loads(report.read_text())["heldout"]["diagnose"]
    fitted, pairs = diagnosed["every row, scored on itself"], diagnosed["identical_features"]
    assert fitted["pairwise_accuracy"] > 0.5 and fitted["n_rows"] > 0 and pairs["pairs"] > pairs["identical"] >= 0
    mlp = json.loads(report.read_text())["heldout"]["mlp"]  # the neural model's arm ran and scored the split
    assert mlp["epochs"] == 2 and 0.0 <= mlp["2"]["heldout"]["pairwise_accuracy"] <= 1.0 and "MLP 256x3, epoch 2" in printed
    model = costmodel.TrainedModel.from_bytes(out.read_bytes())
    # the default bundle holds AVX2 (Zen 3) and AVX-512 records: refused without --output, before featurising
    assert pretrain.main([str(DEFAULT_BUNDLE), "--work-dir", str(tmp_path / "mixed")]) == 2
    assert "pretrain: the sources mix vector codes (avx2, default)" in capsys.readouterr().err
    assert model.meta["trained_on"]["vector_code"] == ["default"]
    held = json.loads(report.read_text())["heldout"]
    assert model.meta["heldout"]["dims"] == [768] and held["workloads"] == model.meta["heldout"]["workloads"] > 0
    assert model.meta["trained_on"]["rows"] == held["rows"] + held["train_rows"]
    assert model.meta["trained_on"]["sources"][0]["file"] == source.name


def test_pretrain_refuses_a_model_to_score_that_is_not_one_before_featurising(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """--score with a file that is not a cost model: one line and exit 2, before minutes of featurising
    (the work directory is never made); a bad LABEL=FILE, or --by-name alone, is a usage error."""
    sys.path.insert(0, str(REPO / "bench"))
    import pretrain

    junk = tmp_path / "junk.json"
    junk.write_text("{}")
    assert pretrain.main([str(DEFAULT_BUNDLE), "--evaluate-only", "--score", f"old={junk}",
                          "--work-dir", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"pretrain: --score {junk}: not a tunefleet cost model") and "\n" not in err
    assert not (tmp_path / "never").exists()
    for argv in (["--score", "old"], ["--score", f"old={tmp_path / 'missing.json'}"], ["--by-name", "winograd"]):
        with pytest.raises(SystemExit) as stop:
            pretrain.main([str(DEFAULT_BUNDLE), *argv])
        assert stop.value.code == 2


def test_pretrain_counts_pairs_by_their_run_time_gap() -> None:
    """bench/pretrain.py's diagnostic: each pair once, in the bucket of its gap, credited as the metric credits it."""
    sys.path.insert(0, str(REPO / "bench"))
    import pretrain

    labels = [1.0, 1 / 1.01, 1 / 1.3, 1.0, 1 / 1.07]  # a: gaps 1 %, 30 %, 28.7 %; b: 7 %
    t = pa.table({"workload_hash": ["a", "a", "a", "b", "b"], "hardware": ["x86"] * 5, "label": labels,
                  "error_kind": pa.array([None] * 5, pa.string())})
    gaps = {name: (n, acc) for name, n, acc in pretrain.by_gap(np.array([0.0, 1.0, 0.5, 2.0, 2.0]), t)}
    assert gaps["< 2%"] == (1, 0.0)  # 1.0 vs 1/1.01 scored the wrong way round
    assert gaps[">= 25%"] == (2, 0.5)  # 1.0 vs 1/1.3 wrong; 1/1.01 vs 1/1.3 right
    assert gaps["5%-10%"] == (1, 0.5)  # a tie in the scores counts half
    assert gaps["2%-5%"] == (0, None) and gaps["10%-25%"] == (0, None)
