"""The built-in zoo: catalogue, options, tiny relax.frontend.nn models, transformers models."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from tunefleet.errors import NotSupportedError, TunefleetError
from tunefleet.models.frontends import LoadedModel, MissingDependencyError, load_exported_program
from tunefleet.models.zoo import (
    ZOO_SEED,
    InvalidOptionError,
    ZooModel,
    build_zoo_model,
    get_zoo_entry,
    list_zoo,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ALL_NAMES = ["mlp", "small-cnn", "resnet18", "resnet50", "mobilenet_v2", "vit-base", "bert-base"]


def _target() -> Any:
    import tvm

    return tvm.target.Target({"kind": "llvm", "num-cores": 2})


def _run(loaded: LoadedModel, inputs: list[np.ndarray]) -> np.ndarray:
    """Compile with ``tvm.compile`` for 2-core LLVM and run ``main`` on the Relax VM."""
    import tvm
    from tvm import relax

    exe = tvm.compile(loaded.mod, target=_target())
    vm = relax.VirtualMachine(exe, tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in inputs])
    return out.numpy()


def _extract_tasks(mod: Any) -> list[Any]:
    """Tuning tasks as the extract step will see them (the passes compile_relax runs)."""
    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    target = _target()
    seq = tvm.transform.Sequential(
        [
            relax.transform.DecomposeOpsForInference(),
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )
    with target:
        fused = seq(mod)
    return list(ms.relax_integration.extract_tasks(fused, target))


def _output_shape(mod: Any) -> tuple[int, ...]:
    func = mod["main"]
    # TVM 0.27 calls it ret_ty; older releases ret_struct_info.
    ret = getattr(func, "ret_ty", None) or getattr(func, "ret_struct_info", None)
    return tuple(int(v) for v in ret.shape.values)


# ---------------------------------------------------------------------------- catalogue


def test_list_zoo() -> None:
    entries = list_zoo()
    assert [e.name for e in entries] == ALL_NAMES
    for e in entries:
        assert e.requires in ("tvm", "torch")
        assert e.description
        assert e.default_options["batch_size"] == 1
    assert get_zoo_entry("mlp").requires == "tvm"
    assert get_zoo_entry("resnet18").requires == "torch"
    assert get_zoo_entry("bert-base").default_options == {"batch_size": 1, "seq_len": 128}
    assert get_zoo_entry("vit-base").default_options == {"batch_size": 1, "image_size": 224}


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(NotSupportedError) as info:
        build_zoo_model("resnet1000")
    msg = str(info.value)
    assert "resnet1000" in msg
    for name in ALL_NAMES:
        assert name in msg


@pytest.mark.parametrize(
    ("name", "kwargs", "match"),
    [
        ("mlp", {"batch_size": 0}, "batch_size must be between 1"),
        ("mlp", {"batch_size": -3}, "batch_size must be between 1"),
        ("mlp", {"batch_size": True}, "batch_size must be an integer"),
        ("mlp", {"batch_size": 2.0}, "batch_size must be an integer"),
        ("mlp", {"image_size": 32}, "mlp has no option 'image_size'"),
        ("mlp", {"seq_len": 8}, "no option 'seq_len'"),
        ("resnet18", {"seq_len": 8}, "no option 'seq_len'"),
        ("bert-base", {"image_size": 224}, "no option 'image_size'"),
        ("bert-base", {"seq_len": 0}, "seq_len must be between 1 and 512"),
        ("bert-base", {"seq_len": 513}, "seq_len must be between 1 and 512"),
        ("small-cnn", {"image_size": 30}, "multiple of 4"),
        ("vit-base", {"image_size": 200}, "multiple of the patch size 16"),
        ("resnet50", {"image_size": 16}, "at least 32"),
        ("mobilenet_v2", {"image_size": "224"}, "image_size must be an integer"),
    ],
)
def test_invalid_options(name: str, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidOptionError, match=match) as info:
        build_zoo_model(name, **kwargs)
    assert isinstance(info.value, TunefleetError)
    assert "\n" not in str(info.value)


def test_torch_entry_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'tunefleet\[torch\]'") as info:
        build_zoo_model("resnet18")
    assert isinstance(info.value, NotSupportedError)
    assert "resnet18" in str(info.value)


# ---------------------------------------------------------------------------- relax.frontend.nn


@pytest.mark.parametrize(
    ("name", "kwargs", "in_shape"),
    [
        ("mlp", {}, (1, 64)),
        ("mlp", {"batch_size": 4}, (4, 64)),
        ("small-cnn", {}, (1, 3, 32, 32)),
        ("small-cnn", {"batch_size": 2, "image_size": 16}, (2, 3, 16, 16)),
    ],
)
def test_nn_model_compiles_and_runs(
    name: str, kwargs: dict[str, Any], in_shape: tuple[int, ...]
) -> None:
    model = build_zoo_model(name, **kwargs)
    assert isinstance(model, ZooModel)
    assert model.format == "relax-nn"
    assert model.torch_module is None
    assert model.loaded.params is None
    assert model.input_info == [("x", in_shape, "float32")]
    assert [gv.name_hint for gv in model.mod.get_global_vars()] == ["main"]
    out = _run(model.loaded, model.loaded.random_inputs())
    assert out.shape == (in_shape[0], 10)
    assert np.isfinite(out).all()
    assert float(np.abs(out).max()) > 0


def test_mlp_weights_follow_the_documented_rule() -> None:
    """source_bytes describe the weights fully: recompute the MLP in numpy from the rule."""
    model = build_zoo_model("mlp", batch_size=3)
    header = json.loads(model.source_bytes.decode().splitlines()[0][2:])
    assert header["seed"] == ZOO_SEED and header["options"] == {"batch_size": 3}

    rng = np.random.default_rng(ZOO_SEED)
    weights = []
    for out_f, in_f in [(128, 64), (128, 128), (10, 128)]:
        w = (rng.standard_normal((out_f, in_f)) * np.sqrt(2.0 / in_f)).astype("float32")
        b = (rng.standard_normal((out_f,)) * 0.01).astype("float32")
        weights.append((w, b))
    x = model.loaded.random_inputs(seed=7)[0]
    h = x
    for i, (w, b) in enumerate(weights):
        h = h @ w.T + b
        if i < 2:
            h = np.maximum(h, 0)
    np.testing.assert_allclose(_run(model.loaded, [x]), h, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("name", "max_tasks"), [("mlp", 3), ("small-cnn", 6)])
def test_nn_model_has_few_tasks(name: str, max_tasks: int) -> None:
    tasks = _extract_tasks(build_zoo_model(name).mod)
    assert 1 <= len(tasks) <= max_tasks, [t.task_name for t in tasks]


def test_nn_source_bytes_deterministic() -> None:
    a = build_zoo_model("small-cnn")
    b = build_zoo_model("small-cnn")
    assert a.source_bytes == b.source_bytes
    assert a.sha256 == hashlib.sha256(a.source_bytes).hexdigest()
    c = build_zoo_model("small-cnn", batch_size=2)
    assert c.sha256 != a.sha256
    assert b"def main(" in a.source_bytes
    meta = json.loads(json.dumps(a.metadata))  # JSON-serialisable
    assert meta["name"] == "small-cnn"
    assert meta["format"] == "relax-nn"
    assert meta["options"] == {"batch_size": 1, "image_size": 32}
    assert meta["inputs"] == [{"name": "x", "shape": [1, 3, 32, 32], "dtype": "float32"}]
    assert "tvm" in meta["versions"]


# ---------------------------------------------------------------------------- transformers


@pytest.fixture(scope="module")
def resnet18_small() -> ZooModel:
    return build_zoo_model("resnet18", image_size=64)


def test_resnet18_small_imports_and_matches_torch(resnet18_small: ZooModel) -> None:
    import torch

    model = resnet18_small
    assert model.format == "pt2"
    assert model.input_info == [("pixel_values", (1, 3, 64, 64), "float32")]
    assert _output_shape(model.mod) == (1, 1000)
    meta = json.loads(json.dumps(model.metadata))
    assert meta["options"] == {"batch_size": 1, "image_size": 64}
    assert {"tvm", "torch", "transformers"} <= set(meta["versions"])
    x = model.loaded.random_inputs()[0]
    with torch.no_grad():
        want = model.torch_module(torch.from_numpy(x)).numpy()  # type: ignore[misc,operator]
    got = _run(model.loaded, [x])
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_resnet18_source_bytes_deterministic(resnet18_small: ZooModel) -> None:
    import torch

    state = torch.random.get_rng_state()
    again = build_zoo_model("resnet18", image_size=64)
    assert again.sha256 == resnet18_small.sha256
    assert again.source_bytes == resnet18_small.source_bytes
    # the caller's RNG is left alone
    assert torch.equal(state, torch.random.get_rng_state())
    # no absolute paths (stack traces) in the archive
    assert os.path.dirname(os.path.abspath(__file__)).encode() not in again.source_bytes
    assert b"site-packages" not in again.source_bytes


def test_resnet18_source_bytes_reimport(resnet18_small: ZooModel) -> None:
    """Ingesting the stored bytes gives the same Relax module as the zoo build."""
    import tvm_ffi

    reloaded = load_exported_program(resnet18_small.source_bytes, "resnet18.pt2")
    assert reloaded.input_info == resnet18_small.input_info
    assert tvm_ffi.structural_equal(reloaded.mod, resnet18_small.mod)


@pytest.mark.slow
def test_resnet18_default_tasks_and_cross_process_determinism() -> None:
    """Full-size ResNet-18: compiles, has the expected tasks, same sha256 in a fresh process."""
    model = build_zoo_model("resnet18")
    assert model.input_info == [("pixel_values", (1, 3, 224, 224), "float32")]
    out = _run(model.loaded, model.loaded.random_inputs())
    assert out.shape == (1, 1000)
    # With DecomposeOpsForInference BatchNorm fuses into the convolutions: 24 tasks
    # (apache-tvm 0.27.0.post1, torch 2.13.0, transformers 5.x). Without that pass BatchNorm
    # stays separate and the count is 27, the figure RECIPES.md quotes.
    tasks = _extract_tasks(model.mod)
    assert len(tasks) == 24, [t.task_name for t in tasks]
    assert sum(t.weight for t in tasks) > len(tasks)  # repeated blocks share workloads
    code = (
        "from tunefleet.models.zoo import build_zoo_model; "
        "print(build_zoo_model('resnet18').sha256)"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True,
        timeout=300,
    )
    assert out.stdout.strip().splitlines()[-1] == model.sha256


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "kwargs", "in_info", "out_shape"),
    [
        ("resnet50", {"image_size": 64}, ("pixel_values", (1, 3, 64, 64), "float32"), (1, 1000)),
        (
            "mobilenet_v2",
            {"image_size": 64, "batch_size": 2},
            ("pixel_values", (2, 3, 64, 64), "float32"),
            (2, 1000),
        ),
        ("vit-base", {"image_size": 32}, ("pixel_values", (1, 3, 32, 32), "float32"), (1, 1000)),
        ("bert-base", {"seq_len": 16}, ("input_ids", (1, 16), "int64"), (1, 16, 768)),
    ],
)
def test_torch_zoo_model_matches_torch(
    name: str, kwargs: dict[str, Any], in_info: tuple[Any, ...], out_shape: tuple[int, ...]
) -> None:
    import torch

    model = build_zoo_model(name, **kwargs)
    assert model.format == "pt2"
    assert model.input_info == [in_info]
    assert _output_shape(model.mod) == out_shape
    x = model.loaded.random_inputs()[0]
    with torch.no_grad():
        want = model.torch_module(torch.from_numpy(x)).numpy()  # type: ignore[misc,operator]
    got = _run(model.loaded, [x])
    assert got.shape == out_shape
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
