"""A built-in zoo of named architectures with random weights, built without any download.

Two kinds of entries:

* ``requires="tvm"`` — tiny models written with ``tvm.relax.frontend.nn`` (``mlp``,
  ``small-cnn``). Their weights are drawn from ``numpy.random.default_rng(ZOO_SEED)`` and
  bound into the module; their ``source_bytes`` are a text header (name, options, seed,
  weight-initialisation rule) followed by the TVMScript of the module *before* the weights are
  bound, so equal names and options give equal bytes. They have a handful of small tuning
  tasks (3 for ``mlp``, 6 for ``small-cnn``) and tune in seconds.
* ``requires="torch"`` — ``transformers`` models built from their ``Config`` classes
  (``resnet18``, ``resnet50``, ``mobilenet_v2``, ``vit-base``, ``bert-base``), initialised
  under ``torch.manual_seed(ZOO_SEED)`` (the caller's RNG state is restored afterwards), put in
  ``eval()`` mode, exported with ``torch.export.export`` and imported with
  ``tvm.relax.frontend.torch.from_exported_program``. Their ``source_bytes`` are the
  ``torch.export.save`` archive of that program, with the per-node ``stack_trace`` metadata
  removed (it holds absolute file paths and line numbers, which would make the bytes differ
  between installations); the same name and options give identical bytes on every run with
  the same torch and transformers versions (both recorded in ``metadata["versions"]``).
  Feeding those bytes to :func:`tunefleet.models.frontends.load_exported_program` gives a
  structurally equal Relax module.

All modules have their weights bound (``LoadedModel.params is None``) and one entry function
``main`` taking the inputs listed in ``input_info``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tunefleet.errors import NotSupportedError, TunefleetError
from tunefleet.models.frontends import (
    InputInfo,
    LoadedModel,
    MissingDependencyError,
    _finish,
    _var_name,
    import_exported_program,
)

__all__ = [
    "ZOO_SEED",
    "InvalidOptionError",
    "ZooEntry",
    "ZooModel",
    "build_zoo_model",
    "get_zoo_entry",
    "list_zoo",
    "torch_wrappers",
]

logger = logging.getLogger(__name__)

#: The seed every zoo model's random weights are drawn with.
ZOO_SEED = 0

_MAX_BATCH = 4096
_MAX_IMAGE = 4096


class InvalidOptionError(TunefleetError, ValueError):
    """A zoo build option is missing, of the wrong type, or out of range."""


@dataclass(frozen=True)
class ZooEntry:
    """One named architecture of the zoo.

    Attributes
    ----------
    name : str
        The name given to :func:`build_zoo_model`.
    description : str
        One line for humans.
    requires : str
        ``"tvm"`` (built with ``tvm.relax.frontend.nn``) or ``"torch"`` (needs
        ``pip install 'tunefleet[torch]'``).
    default_options : dict[str, int]
        The options this entry accepts, with their defaults (``batch_size`` always; plus
        ``image_size`` for image models, ``seq_len`` for ``bert-base``).
    """

    name: str
    description: str
    requires: str
    default_options: dict[str, int] = field(default_factory=dict)


@dataclass
class ZooModel:
    """A zoo model imported into TVM Relax, with its content-addressable source.

    Attributes
    ----------
    name : str
        The zoo name.
    loaded : LoadedModel
        The Relax module (weights bound), input info and, for torch models, the eager module.
    source_bytes : bytes
        Deterministic serialised form (a ``.pt2`` archive, or the relax-nn text described in
        the module docstring); hash it for content addressing.
    format : str
        ``"pt2"`` or ``"relax-nn"``.
    metadata : dict
        JSON-serialisable: ``name``, ``format``, ``options`` (all options, defaults filled
        in), ``inputs`` (list of ``{"name", "shape", "dtype"}``), ``seed``, ``versions``.
    """

    name: str
    loaded: LoadedModel
    source_bytes: bytes
    format: str
    metadata: dict[str, Any]

    @property
    def mod(self) -> Any:
        """The Relax ``tvm.IRModule``."""
        return self.loaded.mod

    @property
    def input_info(self) -> list[InputInfo]:
        """(name, shape, dtype) per input, in ``main``'s positional order."""
        return self.loaded.input_info

    @property
    def torch_module(self) -> object | None:
        """The ``torch.nn.Module`` (eval mode) for torch entries, else ``None``."""
        return self.loaded.torch_module

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of :attr:`source_bytes`."""
        import hashlib

        return hashlib.sha256(self.source_bytes).hexdigest()


# --------------------------------------------------------------------------------------------
# the catalogue
# --------------------------------------------------------------------------------------------

_ENTRIES: tuple[ZooEntry, ...] = (
    ZooEntry(
        "mlp",
        "3-layer MLP 64->128->128->10 with ReLU (relax.frontend.nn; 3 tuning tasks)",
        "tvm",
        {"batch_size": 1},
    ),
    ZooEntry(
        "small-cnn",
        "2x [Conv2D 3x3 + ReLU + MaxPool 2x2] + Linear on 3xHxW images, 10 classes "
        "(relax.frontend.nn; 6 tuning tasks)",
        "tvm",
        {"batch_size": 1, "image_size": 32},
    ),
    ZooEntry(
        "resnet18",
        "ResNet-18 image classifier, 1000 classes (transformers ResNetConfig, basic blocks)",
        "torch",
        {"batch_size": 1, "image_size": 224},
    ),
    ZooEntry(
        "resnet50",
        "ResNet-50 image classifier, 1000 classes (transformers ResNetConfig, bottleneck)",
        "torch",
        {"batch_size": 1, "image_size": 224},
    ),
    ZooEntry(
        "mobilenet_v2",
        "MobileNetV2 1.0 image classifier, 1000 classes (transformers MobileNetV2Config)",
        "torch",
        {"batch_size": 1, "image_size": 224},
    ),
    ZooEntry(
        "vit-base",
        "ViT-Base/16 image classifier, 1000 classes (transformers ViTConfig)",
        "torch",
        {"batch_size": 1, "image_size": 224},
    ),
    ZooEntry(
        "bert-base",
        "BERT-base encoder (12 layers, hidden 768) on int64 token ids, returns the last "
        "hidden state (transformers BertConfig)",
        "torch",
        {"batch_size": 1, "seq_len": 128},
    ),
)
_BY_NAME = {e.name: e for e in _ENTRIES}


def list_zoo() -> list[ZooEntry]:
    """All zoo entries, in a stable order (tiny models first)."""
    return list(_ENTRIES)


def get_zoo_entry(name: str) -> ZooEntry:
    """The entry called ``name``.

    Raises
    ------
    NotSupportedError
        No such entry; the message lists the valid names.
    """
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        valid = ", ".join(e.name for e in _ENTRIES)
        raise NotSupportedError(
            f"unknown zoo model {name!r}; valid names are: {valid}"
        ) from None


# --------------------------------------------------------------------------------------------
# options
# --------------------------------------------------------------------------------------------


def _check_int(label: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOptionError(f"{label} must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise InvalidOptionError(f"{label} must be between {lo} and {hi}, got {value}")
    return value


def _resolve_options(
    entry: ZooEntry,
    batch_size: object,
    image_size: object | None,
    seq_len: object | None,
) -> dict[str, int]:
    """Fill defaults, reject options the entry does not take, and range-check values."""
    given = {"image_size": image_size, "seq_len": seq_len}
    opts = dict(entry.default_options)
    for key, value in given.items():
        if value is None:
            continue
        if key not in opts:
            accepted = ", ".join(sorted(entry.default_options))
            raise InvalidOptionError(
                f"{entry.name} has no option {key!r}; its options are: {accepted}"
            )
        opts[key] = value  # type: ignore[assignment]
    opts["batch_size"] = _check_int(f"{entry.name}: batch_size", batch_size, 1, _MAX_BATCH)

    name = entry.name
    if "image_size" in opts:
        size = _check_int(f"{name}: image_size", opts["image_size"], 1, _MAX_IMAGE)
        if name == "small-cnn":
            if size < 8 or size % 4:
                raise InvalidOptionError(
                    f"{name}: image_size must be a multiple of 4 and at least 8 (two 2x2 "
                    f"poolings), got {size}"
                )
        elif name == "vit-base":
            if size < 16 or size % 16:
                raise InvalidOptionError(
                    f"{name}: image_size must be a multiple of the patch size 16, got {size}"
                )
        elif size < 32:
            raise InvalidOptionError(
                f"{name}: image_size must be at least 32 (the network downsamples 32x), "
                f"got {size}"
            )
    if "seq_len" in opts:
        _check_int(f"{name}: seq_len", opts["seq_len"], 1, 512)
    return opts


# --------------------------------------------------------------------------------------------
# relax.frontend.nn models
# --------------------------------------------------------------------------------------------


def _nn_mlp(opts: dict[str, int]) -> tuple[Any, dict[str, Any]]:
    from tvm.relax.frontend import nn

    class MLP(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            self.fc1 = nn.Linear(64, 128)
            self.fc2 = nn.Linear(128, 128)
            self.fc3 = nn.Linear(128, 10)

        def forward(self, x: nn.Tensor) -> nn.Tensor:
            x = nn.relu(self.fc1(x))
            x = nn.relu(self.fc2(x))
            return self.fc3(x)

    return MLP(), {"x": nn.spec.Tensor([opts["batch_size"], 64], "float32")}


def _nn_small_cnn(opts: dict[str, int]) -> tuple[Any, dict[str, Any]]:
    from tvm import relax
    from tvm.relax.frontend import nn

    size = opts["image_size"]
    flat = 32 * (size // 4) * (size // 4)

    def max_pool(x: nn.Tensor, name: str) -> nn.Tensor:
        # relax.frontend.nn has no pooling module: wrap the Relax operator.
        expr = relax.op.nn.max_pool2d(x._expr, pool_size=(2, 2), strides=(2, 2))
        return nn.op.wrap_nested(expr, name=name)

    class SmallCNN(nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            self.conv1 = nn.Conv2D(3, 16, 3, padding=1)
            self.conv2 = nn.Conv2D(16, 32, 3, padding=1)
            self.fc = nn.Linear(flat, 10)

        def forward(self, x: nn.Tensor) -> nn.Tensor:
            x = max_pool(nn.relu(self.conv1(x)), "pool1")
            x = max_pool(nn.relu(self.conv2(x)), "pool2")
            x = nn.op.reshape(x, (x.shape[0], flat))
            return self.fc(x)

    spec = {"x": nn.spec.Tensor([opts["batch_size"], 3, size, size], "float32")}
    return SmallCNN(), spec


_NN_BUILDERS: dict[str, Callable[[dict[str, int]], tuple[Any, dict[str, Any]]]] = {
    "mlp": _nn_mlp,
    "small-cnn": _nn_small_cnn,
}

_NN_INIT_RULE = (
    "numpy.random.default_rng(seed), parameters in signature order; tensors with ndim > 1: "
    "standard_normal * sqrt(2 / fan_in), fan_in = prod(shape[1:]); others: standard_normal * "
    "0.01; float32"
)


def _build_nn(entry: ZooEntry, opts: dict[str, int]) -> ZooModel:
    import numpy as np
    import tvm
    from tvm import relax

    module, spec = _NN_BUILDERS[entry.name](opts)
    mod, params = module.export_tvm(spec={"forward": spec})
    func = mod["forward"].with_attr("global_symbol", "main")
    unbound = tvm.IRModule({"main": func})

    rng = np.random.default_rng(ZOO_SEED)
    weight_vars = list(func.params)[1:]
    if len(weight_vars) != len(params):
        raise TunefleetError(
            f"{entry.name}: {len(params)} nn parameters for {len(weight_vars)} weight inputs"
        )
    bindings: dict[str, Any] = {}
    for var, (_pname, param) in zip(weight_vars, params):
        shape = tuple(int(s) for s in param.shape)
        if len(shape) > 1:
            std = float(np.sqrt(2.0 / int(np.prod(shape[1:]))))
        else:
            std = 0.01
        value = (rng.standard_normal(shape) * std).astype("float32")
        bindings[_var_name(var)] = tvm.runtime.tensor(value)
    bound = relax.transform.BindParams("main", bindings)(unbound)

    header = {
        "tunefleet_zoo": entry.name,
        "format": "relax-nn",
        "options": opts,
        "seed": ZOO_SEED,
        "weights": _NN_INIT_RULE,
    }
    text = "# " + json.dumps(header, sort_keys=True) + "\n" + unbound.script()
    loaded = _finish(bound, entry.name, keep_params_as_input=False)
    return _zoo_model(entry, opts, loaded, text.encode("utf-8"), "relax-nn")


# --------------------------------------------------------------------------------------------
# transformers models via torch.export
# --------------------------------------------------------------------------------------------


def _require_torch_stack(entry: ZooEntry) -> tuple[Any, Any]:
    try:
        import torch
    except ImportError as exc:
        raise MissingDependencyError(
            f"zoo model {entry.name!r} needs PyTorch, which is not installed: "
            "pip install 'tunefleet[torch]'"
        ) from exc
    # Building from a Config never downloads, but make sure nothing tries to.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError as exc:
        raise MissingDependencyError(
            f"zoo model {entry.name!r} needs transformers, which is not installed: "
            "pip install 'tunefleet[torch]'"
        ) from exc
    return torch, transformers


def torch_wrappers(torch: Any) -> tuple[type, type]:
    """nn.Module wrappers of a transformers model returning one tensor (so the Relax ``main``
    returns one tensor): (image classifier: its logits, text encoder: its last hidden state)."""

    class ImageClassifier(torch.nn.Module):  # type: ignore[misc,name-defined]
        """Return the logits of a transformers image classifier."""

        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: Any) -> Any:
            return self.model(pixel_values=pixel_values, return_dict=True).logits

    class TextEncoder(torch.nn.Module):  # type: ignore[misc,name-defined]
        """Return the last hidden state of a transformers encoder."""

        def __init__(self, model: Any) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any) -> Any:
            return self.model(input_ids=input_ids, return_dict=True).last_hidden_state

    ImageClassifier.__module__ = TextEncoder.__module__ = __name__
    ImageClassifier.__qualname__ = "ImageClassifier"
    TextEncoder.__qualname__ = "TextEncoder"
    return ImageClassifier, TextEncoder


def _make_torch_module(
    name: str, opts: dict[str, int], torch: Any, transformers: Any
) -> tuple[Any, tuple[Any, ...]]:
    """(module in eval mode, example inputs) for a torch zoo entry; weights drawn from RNG."""
    image_cls, text_cls = torch_wrappers(torch)
    batch = opts["batch_size"]
    if name in ("resnet18", "resnet50"):
        if name == "resnet18":
            cfg = transformers.ResNetConfig(
                layer_type="basic",
                depths=[2, 2, 2, 2],
                hidden_sizes=[64, 128, 256, 512],
                embedding_size=64,
                num_labels=1000,
            )
        else:
            cfg = transformers.ResNetConfig(
                layer_type="bottleneck",
                depths=[3, 4, 6, 3],
                hidden_sizes=[256, 512, 1024, 2048],
                embedding_size=64,
                num_labels=1000,
            )
        model = image_cls(transformers.ResNetForImageClassification(cfg))
    elif name == "mobilenet_v2":
        cfg = transformers.MobileNetV2Config(image_size=opts["image_size"], num_labels=1000)
        model = image_cls(transformers.MobileNetV2ForImageClassification(cfg))
    elif name == "vit-base":
        cfg = transformers.ViTConfig(image_size=opts["image_size"], num_labels=1000)
        model = image_cls(transformers.ViTForImageClassification(cfg))
    elif name == "bert-base":
        cfg = transformers.BertConfig()
        model = text_cls(transformers.BertModel(cfg, add_pooling_layer=False))
    else:  # pragma: no cover - the catalogue and this function are kept in step
        raise NotSupportedError(f"no torch builder for zoo model {name!r}")
    model.eval()
    if name == "bert-base":
        example = (torch.zeros((batch, opts["seq_len"]), dtype=torch.int64),)
    else:
        size = opts["image_size"]
        example = (torch.zeros((batch, 3, size, size), dtype=torch.float32),)
    return model, example


def _scrub_export_metadata(ep: Any) -> None:
    """Drop per-node ``stack_trace`` metadata (absolute paths + line numbers) before saving."""
    for gm in ep.graph_module.modules():
        graph = getattr(gm, "graph", None)
        if graph is None:
            continue
        for node in graph.nodes:
            node.meta.pop("stack_trace", None)


def _build_torch(entry: ZooEntry, opts: dict[str, int]) -> ZooModel:
    torch, transformers = _require_torch_stack(entry)
    t0 = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(ZOO_SEED)
        model, example = _make_torch_module(entry.name, opts, torch, transformers)
    t1 = time.perf_counter()
    with warnings.catch_warnings():
        # torch 2.13's own pytree code warns that its LeafSpec check is deprecated whenever an
        # exported program is copied or saved; it is torch's call, not ours, and would print once
        # per model build.
        warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                                category=FutureWarning)
        with torch.no_grad():
            ep = torch.export.export(model, example)
        _scrub_export_metadata(ep)
        buf = io.BytesIO()
        torch.export.save(ep, buf)
        t2 = time.perf_counter()
        loaded = import_exported_program(ep, entry.name, torch_module=model)
    t3 = time.perf_counter()
    logger.info(
        "zoo %s %s: construct %.1fs, export+save %.1fs, TVM import %.1fs",
        entry.name,
        opts,
        t1 - t0,
        t2 - t1,
        t3 - t2,
    )
    versions = {"torch": str(torch.__version__), "transformers": str(transformers.__version__)}
    return _zoo_model(entry, opts, loaded, buf.getvalue(), "pt2", versions)


# --------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------


def _zoo_model(
    entry: ZooEntry,
    opts: dict[str, int],
    loaded: LoadedModel,
    source: bytes,
    fmt: str,
    versions: dict[str, str] | None = None,
) -> ZooModel:
    import tvm

    metadata: dict[str, Any] = {
        "name": entry.name,
        "format": fmt,
        "options": dict(opts),
        "inputs": [
            {"name": n, "shape": list(shape), "dtype": dtype}
            for n, shape, dtype in loaded.input_info
        ],
        "seed": ZOO_SEED,
        "versions": {"tvm": str(tvm.__version__), **(versions or {})},
    }
    return ZooModel(
        name=entry.name, loaded=loaded, source_bytes=source, format=fmt, metadata=metadata
    )


def build_zoo_model(
    name: str,
    *,
    batch_size: int = 1,
    image_size: int | None = None,
    seq_len: int | None = None,
) -> ZooModel:
    """Build a zoo model with random weights and import it into TVM Relax.

    Parameters
    ----------
    name : str
        A name from :func:`list_zoo`.
    batch_size : int
        Leading dimension of every input (1 to 4096).
    image_size : int, optional
        Height = width of the image input, for image models only (default from the entry:
        32 for ``small-cnn``, 224 otherwise). ``small-cnn``: multiple of 4, >= 8;
        ``vit-base``: multiple of 16; ResNets and MobileNetV2: >= 32.
    seq_len : int, optional
        Token sequence length for ``bert-base`` only (1 to 512, default 128).

    Returns
    -------
    ZooModel
        The imported module (weights bound, entry ``main``), ``source_bytes``, ``format``,
        metadata, and for torch entries the eager ``torch.nn.Module``.

    Raises
    ------
    NotSupportedError
        Unknown name (the message lists the valid ones).
    InvalidOptionError
        An option the entry does not take, or a value out of range.
    MissingDependencyError
        A torch entry without torch/transformers installed.
    """
    entry = get_zoo_entry(name)
    opts = _resolve_options(entry, batch_size, image_size, seq_len)
    start = time.perf_counter()
    if entry.requires == "tvm":
        model = _build_nn(entry, opts)
    else:
        model = _build_torch(entry, opts)
    logger.info(
        "built zoo model %s %s in %.1fs (%s, %d source bytes)",
        name,
        opts,
        time.perf_counter() - start,
        model.format,
        len(model.source_bytes),
    )
    return model
