"""bench/outside_models.py: the models outside the zoo and the corpus export to valid ONNX, the same
bytes every time, that onnxruntime runs and tunefleet ingests and extracts (the tiny versions of the
same architectures: the full ones are the bench's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import outside_models


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return outside_models.write_models(tmp_path_factory.mktemp("outside"), small=True)


def test_the_catalogue_is_outside_the_zoo() -> None:
    from tunefleet.models.zoo import list_zoo

    names = [m.name for m in outside_models.MODELS]
    assert names == ["convnext-tiny", "electra-small"]
    assert not set(names) & {e.name for e in list_zoo()}
    assert [m.name for m in outside_models.select("electra-small,convnext-tiny")] == names  # catalogue order
    with pytest.raises(ValueError, match="unknown model.*resnet50.*known: convnext-tiny"):
        outside_models.select("resnet50")


def test_valid_onnx_the_same_bytes_every_time(written: list[Path]) -> None:
    import numpy as np
    import onnx
    import onnxruntime as ort

    assert [p.name for p in written] == ["convnext-tiny.onnx", "electra-small.onnx"]
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in written}
    assert outside_models.write_models(written[0].parent, small=True) == written
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in written} == before  # same bytes: not rewritten
    for path in written:
        onnx.checker.check_model(onnx.load(str(path)))
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        (inp,) = sess.get_inputs()
        rng = np.random.default_rng(0)
        x = (rng.integers(0, 100, inp.shape) if "int64" in inp.type else rng.standard_normal(inp.shape, np.float32))
        (out,) = sess.run(None, {inp.name: x})
        assert np.isfinite(out).all() and out.std() > 0  # random weights, not zeros


def test_tunefleet_ingests_and_extracts_them(written: list[Path], tmp_path: Path) -> None:
    from tunefleet import api
    from tunefleet.config import load_settings

    ctx = api.connect(load_settings(home=tmp_path / "home", hub="off"))
    kinds = {}
    for path in written:
        model = api.ingest(ctx, str(path)).model
        assert model.name == path.stem
        api.extract(ctx, model, "x86")
        kinds[path.stem] = {wl.name for wl, _ in ctx.db.workloads(model_id=model.id)}
    assert any("conv2d" in n for n in kinds["convnext-tiny"])  # the depthwise 7x7 and the patchify stem
    assert any("matmul" in n for n in kinds["electra-small"])


def test_main_lists_and_refuses_an_unknown_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert outside_models.main(["--list"]) == 0
    assert "convnext-tiny" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        outside_models.main(["--models", "nope", "--list"])
    assert "unknown model(s) nope" in capsys.readouterr().err
