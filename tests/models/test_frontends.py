"""ONNX and torch.export (.pt2) frontends: round trips against PyTorch, and broken files."""

from __future__ import annotations

import io
import os
import sys
import zipfile
from typing import Any

import numpy as np
import pytest

from tunefleet.errors import NotSupportedError, TunefleetError
from tunefleet.models.frontends import (
    LoadedModel,
    MissingDependencyError,
    ModelFormatError,
    detect_format,
    load_exported_program,
    load_onnx,
    random_inputs,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import onnx  # noqa: E402, F401  (installed by the test extras; missing means a failure, not a skip)
import torch  # noqa: E402


def _run(loaded: LoadedModel, inputs: list[np.ndarray]) -> np.ndarray:
    """Compile for 2-core LLVM and run ``main`` on the Relax VM."""
    import tvm
    from tvm import relax

    target = tvm.target.Target({"kind": "llvm", "num-cores": 2})
    exe = tvm.compile(loaded.mod, target=target)
    vm = relax.VirtualMachine(exe, tvm.cpu())
    args = [tvm.runtime.tensor(a) for a in inputs]
    if loaded.params is not None:
        args += [tvm.runtime.tensor(p) for p in loaded.params.values()]
    out = vm["main"](*args)
    return out.numpy()


class TinyNet(torch.nn.Module):  # type: ignore[misc]
    """Conv + BatchNorm + ReLU + pooling + Linear: the usual CNN operators, small."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8, 5)

    def forward(self, x: Any) -> Any:
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)
        return self.fc(y)


class TinyText(torch.nn.Module):  # type: ignore[misc]
    """Embedding lookup on int64 ids + Linear (checks integer inputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(100, 16)
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, ids: Any) -> Any:
        return self.fc(self.emb(ids)).mean(dim=1)


def _tiny_net() -> Any:
    torch.manual_seed(0)
    net = TinyNet()
    with torch.no_grad():  # non-trivial BatchNorm statistics
        net.bn.running_mean.uniform_(-0.5, 0.5)
        net.bn.running_var.uniform_(0.5, 1.5)
    return net.eval()


def _onnx_bytes(
    model: Any, example: Any, *, dynamic_batch: bool = False, name: str = "input.1"
) -> bytes:
    buf = io.BytesIO()
    kwargs: dict[str, Any] = {}
    if dynamic_batch:
        kwargs["dynamic_axes"] = {name: {0: "batch"}}
    torch.onnx.export(
        model, (example,), buf, dynamo=False, input_names=[name], output_names=["out"], **kwargs
    )
    return buf.getvalue()


def _pt2_bytes(model: Any, example: Any) -> bytes:
    with torch.no_grad():
        ep = torch.export.export(model, (example,))
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    return buf.getvalue()


@pytest.fixture(scope="module")
def tiny_onnx() -> bytes:
    return _onnx_bytes(_tiny_net(), torch.randn(2, 3, 16, 16))


@pytest.fixture(scope="module")
def tiny_pt2() -> bytes:
    return _pt2_bytes(_tiny_net(), torch.randn(2, 3, 16, 16))


def _assert_one_line(exc: BaseException, filename: str) -> None:
    msg = str(exc)
    assert "\n" not in msg, msg
    assert msg.startswith(f"{filename}: "), msg
    assert len(msg) < 600, msg


# ---------------------------------------------------------------------------- round trips


def test_onnx_round_trip_matches_torch(tiny_onnx: bytes) -> None:
    loaded = load_onnx(tiny_onnx, "tiny.onnx")
    assert loaded.params is None
    assert loaded.torch_module is None
    assert loaded.input_info == [("input.1", (2, 3, 16, 16), "float32")]
    x = loaded.random_inputs(seed=1)[0]
    got = _run(loaded, [x])
    with torch.no_grad():
        want = _tiny_net()(torch.from_numpy(x)).numpy()
    assert got.shape == (2, 5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_onnx_detached_params_match_bound(tiny_onnx: bytes) -> None:
    bound = load_onnx(tiny_onnx, "tiny.onnx")
    detached = load_onnx(tiny_onnx, "tiny.onnx", keep_params_as_input=True)
    assert detached.params, "expected the weights in params"
    assert all(isinstance(v, np.ndarray) for v in detached.params.values())
    assert detached.input_info == bound.input_info
    x = random_inputs(bound.input_info, seed=2)
    np.testing.assert_allclose(_run(detached, x), _run(bound, x), rtol=1e-5, atol=1e-6)


def test_onnx_dynamic_batch_needs_input_shapes() -> None:
    data = _onnx_bytes(_tiny_net(), torch.randn(2, 3, 16, 16), dynamic_batch=True)
    with pytest.raises(ModelFormatError, match="input_shapes") as info:
        load_onnx(data, "dyn.onnx")
    _assert_one_line(info.value, "dyn.onnx")

    loaded = load_onnx(data, "dyn.onnx", input_shapes={"input.1": (3, 3, 16, 16)})
    assert loaded.input_info == [("input.1", (3, 3, 16, 16), "float32")]
    x = loaded.random_inputs()[0]
    with torch.no_grad():
        want = _tiny_net()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(_run(loaded, [x]), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        ({"nope": (1, 3, 16, 16)}, "unknown inputs"),
        ({"input.1": (3, 16, 16)}, "rank"),
        ({"input.1": (2, 4, 16, 16)}, "does not fit"),
        ({"input.1": ("a", 3, 16, 16)}, "sequence of integers"),
        ({"input.1": 5}, "sequence of integers"),
    ],
)
def test_onnx_bad_input_shapes(tiny_onnx: bytes, shapes: dict[str, Any], match: str) -> None:
    with pytest.raises(ModelFormatError, match=match) as info:
        load_onnx(tiny_onnx, "tiny.onnx", input_shapes=shapes)
    _assert_one_line(info.value, "tiny.onnx")


def test_onnx_integer_input_keeps_dtype() -> None:
    torch.manual_seed(0)
    model = TinyText().eval()
    ids = torch.randint(0, 100, (2, 7))
    loaded = load_onnx(_onnx_bytes(model, ids, name="ids"), "text.onnx")
    assert loaded.input_info == [("ids", (2, 7), "int64")]
    x = loaded.random_inputs()[0]
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(_run(loaded, [x]), want, rtol=1e-5, atol=1e-6)


def test_pt2_round_trip_matches_torch(tiny_pt2: bytes) -> None:
    loaded = load_exported_program(tiny_pt2, "tiny.pt2")
    assert loaded.params is None
    assert loaded.input_info == [("x", (2, 3, 16, 16), "float32")]
    x = loaded.random_inputs(seed=3)[0]
    with torch.no_grad():
        want = _tiny_net()(torch.from_numpy(x)).numpy()
        eager = loaded.torch_module(torch.from_numpy(x))  # type: ignore[misc,operator]
    np.testing.assert_allclose(eager.numpy(), want, rtol=1e-6, atol=1e-6)
    got = _run(loaded, [x])
    assert got.shape == (2, 5)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_pt2_dynamic_shape_rejected() -> None:
    batch = torch.export.Dim("batch", min=2, max=64)
    with torch.no_grad():
        ep = torch.export.export(
            _tiny_net(), (torch.randn(4, 3, 16, 16),), dynamic_shapes={"x": {0: batch}}
        )
    buf = io.BytesIO()
    torch.export.save(ep, buf)
    with pytest.raises(ModelFormatError, match="dynamic shape") as info:
        load_exported_program(buf.getvalue(), "dyn.pt2")
    _assert_one_line(info.value, "dyn.pt2")


def test_pt2_detached_params(tiny_pt2: bytes) -> None:
    loaded = load_exported_program(tiny_pt2, "tiny.pt2", keep_params_as_input=True)
    assert loaded.params is not None and len(loaded.params) >= 4
    x = loaded.random_inputs(seed=4)[0]
    with torch.no_grad():
        want = _tiny_net()(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(_run(loaded, [x]), want, rtol=1e-4, atol=1e-5)


def test_pt2_integer_input() -> None:
    torch.manual_seed(0)
    model = TinyText().eval()
    loaded = load_exported_program(_pt2_bytes(model, torch.randint(0, 100, (2, 7))), "text.pt2")
    assert loaded.input_info == [("ids", (2, 7), "int64")]
    x = loaded.random_inputs()[0]
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(_run(loaded, [x]), want, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- broken files


def test_onnx_random_bytes() -> None:
    data = np.random.default_rng(0).bytes(4096)
    with pytest.raises(ModelFormatError, match="not a valid ONNX") as info:
        load_onnx(data, "model.onnx")
    _assert_one_line(info.value, "model.onnx")
    assert isinstance(info.value, TunefleetError)


@pytest.mark.parametrize("fraction", [0.5, 0.9])
def test_onnx_truncated(tiny_onnx: bytes, fraction: float) -> None:
    data = tiny_onnx[: int(len(tiny_onnx) * fraction)]
    with pytest.raises(ModelFormatError) as info:
        load_onnx(data, "cut.onnx")
    _assert_one_line(info.value, "cut.onnx")


def test_onnx_empty() -> None:
    with pytest.raises(ModelFormatError, match="empty") as info:
        load_onnx(b"", "empty.onnx")
    _assert_one_line(info.value, "empty.onnx")


def test_onnx_operator_tvm_cannot_import() -> None:
    from onnx import TensorProto, helper

    node = helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.example")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.example", 1)],
    )
    with pytest.raises(ModelFormatError) as info:
        load_onnx(model.SerializeToString(), "custom.onnx")
    _assert_one_line(info.value, "custom.onnx")
    assert "NoSuchOp" in str(info.value)


def test_pt2_random_bytes() -> None:
    data = np.random.default_rng(0).bytes(4096)
    with pytest.raises(ModelFormatError, match="not a zip archive") as info:
        load_exported_program(data, "model.pt2")
    _assert_one_line(info.value, "model.pt2")


@pytest.mark.parametrize("fraction", [0.5, 0.99])
def test_pt2_truncated(tiny_pt2: bytes, fraction: float) -> None:
    data = tiny_pt2[: int(len(tiny_pt2) * fraction)]
    with pytest.raises(ModelFormatError) as info:
        load_exported_program(data, "cut.pt2")
    _assert_one_line(info.value, "cut.pt2")


def test_pt2_rejects_torch_save_checkpoint() -> None:
    buf = io.BytesIO()
    torch.save(_tiny_net().state_dict(), buf)
    with pytest.raises(ModelFormatError, match="torch.export.save") as info:
        load_exported_program(buf.getvalue(), "weights.pt2")
    _assert_one_line(info.value, "weights.pt2")


def test_pt2_damaged_member(tiny_pt2: bytes) -> None:
    """A well-formed zip whose program JSON is garbage still gives a one-line error."""
    src = zipfile.ZipFile(io.BytesIO(tiny_pt2))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            if item.filename.endswith("models/model.json"):
                data = b"{not json"
            dst.writestr(item, data)
    with pytest.raises(ModelFormatError, match="not a loadable") as info:
        load_exported_program(out.getvalue(), "bad.pt2")
    _assert_one_line(info.value, "bad.pt2")


# ---------------------------------------------------------------------------- detection


def test_detect_format(tiny_onnx: bytes, tiny_pt2: bytes) -> None:
    assert detect_format(tiny_onnx, "m.onnx") == "onnx"
    assert detect_format(tiny_onnx, "m.bin") == "onnx"  # sniffed
    assert detect_format(tiny_pt2, "m.pt2") == "pt2"
    assert detect_format(tiny_pt2, "whatever") == "pt2"


def test_detect_format_errors(tiny_pt2: bytes) -> None:
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, buf)
    cases = [
        (buf.getvalue(), "ckpt.pt", "not a torch.export program"),
        (np.random.default_rng(0).bytes(512), "model.bin", "unrecognised model format"),
        (b"not a zip", "model.pt2", "not a zip archive"),
        (b"", "model.onnx", "empty"),
        (tiny_pt2[:100], "cut.pt2", "truncated"),
    ]
    for data, filename, match in cases:
        with pytest.raises(ModelFormatError, match=match) as info:
            detect_format(data, filename)
        _assert_one_line(info.value, filename)


# ---------------------------------------------------------------------------- misc


def test_missing_onnx_dependency(monkeypatch: pytest.MonkeyPatch, tiny_onnx: bytes) -> None:
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'tunefleet\[onnx\]'"):
        load_onnx(tiny_onnx, "tiny.onnx")


def test_missing_torch_dependency(monkeypatch: pytest.MonkeyPatch, tiny_pt2: bytes) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'tunefleet\[torch\]'") as info:
        load_exported_program(tiny_pt2, "tiny.pt2")
    assert isinstance(info.value, NotSupportedError)


def test_random_inputs_dtypes() -> None:
    info = [("a", (2, 3), "float32"), ("b", (4,), "int64"), ("c", (1,), "bool")]
    a, b, c = random_inputs(info, seed=5)
    assert a.shape == (2, 3) and a.dtype == np.float32
    assert b.dtype == np.int64 and b.min() >= 0 and b.max() < 100
    assert c.dtype == np.bool_
    again = random_inputs(info, seed=5)
    np.testing.assert_array_equal(a, again[0])
    with pytest.raises(NotSupportedError):
        random_inputs([("s", (1,), "complex64")])
