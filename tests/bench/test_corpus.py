"""The campaign's corpus (bench/corpus.py) and the campaign itself (bench/campaign.py): the corpus is
deterministic, valid ONNX, selectable and free of the held-out models' shapes; its files ingest and
extract through tunefleet; a campaign run again on its home resumes instead of starting over."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # bench/ is scripts, not a package: campaign.py imports corpus.py the same way

import campaign
import corpus

EXPECTED = {  # (files, variants) per family: docs/campaign.md's table
    "conv1x1": (23, 23), "conv3x3": (18, 18), "depthwise": (18, 18), "strided": (14, 14), "dense": (12, 48),
    "batch_matmul": (18, 18), "softmax": (8, 8), "layernorm": (16, 16), "pooling": (18, 18), "elementwise": (18, 18),
}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return corpus.write_corpus(tmp_path_factory.mktemp("corpus"))


def _load(path: Path):  # type: ignore[no-untyped-def]
    import onnx

    return onnx.load(str(path))


# -- the corpus -----------------------------------------------------------------------------------
def test_the_corpus_is_the_same_bytes_every_time(written: list[Path], tmp_path: Path) -> None:
    again = corpus.write_corpus(tmp_path)
    assert [p.name for p in again] == [p.name for p in written]
    assert all(a.read_bytes() == b.read_bytes() for a, b in zip(again, written, strict=True))
    mtimes = [p.stat().st_mtime_ns for p in again]
    assert corpus.write_corpus(tmp_path) == again  # idempotent: nothing rewritten
    assert [p.stat().st_mtime_ns for p in again] == mtimes


def test_every_file_is_valid_onnx_float32_batch_1(written: list[Path]) -> None:
    import onnx

    for path in written:
        model = _load(path)
        onnx.checker.check_model(model, full_check=True)  # with shape inference against the declared outputs
        assert [o.version for o in model.opset_import if o.domain == ""] == [corpus.OPSET]
        for value in [*model.graph.input, *model.graph.output]:
            assert value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT, (path.name, value.name)
            assert value.type.tensor_type.shape.dim[0].dim_value == 1, (path.name, value.name)


def test_the_families_and_their_counts() -> None:
    counts = corpus.corpus_counts()
    assert counts == EXPECTED
    assert 150 <= sum(v for _, v in counts.values()) <= 300  # what a campaign can cover
    files = corpus.corpus_files()
    assert len({f.name for f in files}) == len(files)
    assert all(f.name.startswith(f.family) for f in files)


def test_a_selection_takes_families_and_a_limit_per_family() -> None:
    files = corpus.corpus_files("softmax, dense", limit=2)
    assert [f.family for f in files] == ["dense", "dense", "softmax", "softmax"]  # corpus order
    assert [f.name for f in files] == [f.name for f in corpus.corpus_files("dense")][:2] + \
        [f.name for f in corpus.corpus_files(["softmax"])][:2]
    assert [f.name for f in corpus.corpus_files(None)] == [f.name for f in corpus.corpus_files()]
    with pytest.raises(ValueError, match="unknown corpus family conv5x5; valid: conv1x1, "):
        corpus.corpus_files("conv5x5")
    with pytest.raises(ValueError, match="limit"):
        corpus.corpus_files(limit=0)


def test_a_file_has_the_same_bytes_whatever_the_selection(written: list[Path], tmp_path: Path) -> None:
    alone = corpus.write_corpus(tmp_path, families="layernorm", limit=1)
    assert len(alone) == 1
    assert alone[0].read_bytes() == next(p for p in written if p.name == alone[0].name).read_bytes()


def test_the_corpus_holds_no_shape_of_the_held_out_models(written: list[Path]) -> None:
    from onnx import numpy_helper

    convs = 0
    for path in written:
        model = _load(path)
        for node in model.graph.node:
            if node.op_type != "Conv":
                continue
            attrs = {a.name: a for a in node.attribute}
            weights = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
            cout, cin_per_group, k, _ = weights[node.input[1]].shape
            size = model.graph.input[0].type.tensor_type.shape.dim[2].dim_value
            if attrs["group"].i == 1:
                convs += 1
                assert (k, cin_per_group, cout, size, attrs["strides"].ints[0]) not in corpus.RESNET50_CONVS, path.name
            assert (k, attrs["strides"].ints[0]) != (16, 16), path.name  # vit-base's patch embedding
        for value in [*model.graph.input, *model.graph.output]:
            assert 197 not in [d.dim_value for d in value.type.tensor_type.shape.dim], (path.name, "vit-base's seq")
    assert convs > 40


def test_the_held_out_models_are_not_in_the_campaign() -> None:
    models = campaign.default_models()
    assert not set(campaign.HELD_OUT) & set(models)
    assert set(campaign.HELD_OUT) == {"resnet50", "vit-base"}
    assert models[-1] == campaign.CORPUS
    assert {"mlp", "small-cnn", "resnet18", "mobilenet_v2", "bert-base"} <= set(models)
    with pytest.raises(SystemExit):
        campaign.parse_args(["--models", "mlp,resnet50"])


def test_rungs_double_up_to_the_target() -> None:
    assert campaign.rungs(512) == [64, 128, 256, 512]
    assert campaign.rungs(100) == [64, 100]
    assert campaign.rungs(64) == [64]
    assert campaign.rungs(4) == [4]


def test_the_session_log_keeps_every_invocation(tmp_path: Path) -> None:
    campaign.write_session(tmp_path, {"started": "2026-01-02T00:00:00+00:00", "hours": 1.0})
    campaign.write_session(tmp_path, {"started": "2026-01-01T00:00:00+00:00", "hours": 0.5})
    campaign.write_session(tmp_path, {"started": "2026-01-02T00:00:00+00:00", "hours": 2.0})  # updated, not added
    assert [s["hours"] for s in campaign.read_sessions(tmp_path)] == [0.5, 2.0]


# -- through tunefleet ----------------------------------------------------------------------------
def test_corpus_files_ingest_and_extract(written: list[Path], tunefleet_home: Path) -> None:
    from tunefleet import api
    from tunefleet.config import load_settings

    by_name = {p.stem: p for p in written}
    ctx = api.connect(load_settings(home=tunefleet_home))
    try:
        kinds = {}
        for name, variants in (("conv3x3-c32-h56-bias-relu", 1), ("dense-proj-256x256", 4)):
            model = api.ingest(ctx, str(by_name[name])).model
            found = api.extract(ctx, model, "x86")
            hw = ctx.db.hardware_class("x86")
            kinds[name] = sorted(wl.op_kind for wl, _ in ctx.db.workloads(model_id=model.id, hardware_class_id=hw.id))
            assert found.workloads >= variants
        assert "conv2d" in kinds["conv3x3-c32-h56-bias-relu"]
        assert kinds["dense-proj-256x256"].count("dense/matmul") == 4  # one per sequence length
    finally:
        ctx.close()


def _campaign(home: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, str(BENCH / "campaign.py"), "--home", str(home), "--models", "corpus",
            "--corpus-families", "softmax", "--corpus-limit", "1", "--trials-per-workload", "4", "--hours", "0.2",
            *extra]
    return subprocess.run(args, check=False, capture_output=True, text=True, timeout=600, env=os.environ.copy())


@pytest.mark.slow
def test_a_campaign_run_again_resumes(tunefleet_home: Path, tmp_path: Path) -> None:
    home = tmp_path / "campaign"
    first = _campaign(home)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "1 to ingest or extract" in first.stdout and "1/1 converged at 4 trials" in first.stdout
    assert "hub bundle" not in first.stdout and "hub export not available" not in first.stdout  # no --export
    second = _campaign(home, "--export", str(tmp_path / "bundle"))
    assert second.returncode == 0, second.stdout + second.stderr
    assert "models: 1 (1 stored and extracted already, 0 to ingest or extract)" in second.stdout
    assert "0 candidates added, 0 shards" in second.stdout
    assert "stopped: done: every workload converged" in second.stdout
    # the bundle, or the line saying that this tunefleet has no hub export yet
    assert "hub bundle: wrote" in second.stdout or "hub export not available" in second.stdout
    sessions = json.loads((home / campaign.SESSIONS_FILE).read_text())["sessions"]
    assert [s["candidates_added"] for s in sessions] == [4, 0]
    assert all(s["ended"] and s["cpu"] == campaign.cpu_model() for s in sessions)
    assert "2 run(s)" in second.stdout


def test_a_campaign_on_an_outdated_database_says_so_in_one_line(tmp_path: Path) -> None:
    from tunefleet.config import load_settings
    from tunefleet.db import Database
    from tunefleet.db.connection import downgrade

    home = tmp_path / "campaign"
    home.mkdir()
    db = Database.from_settings(load_settings(home=home))
    downgrade(db.engine, "0013")  # a home left by an older tunefleet
    db.close()
    result = _campaign(home)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "campaign: error: database schema is at revision 0013" in result.stderr
    assert "Traceback" not in result.stderr  # the session log is not written for a database that did not open
    assert not (home / campaign.SESSIONS_FILE).exists()
