"""Turn model files (ONNX, ``torch.export`` ``.pt2``) into TVM Relax IRModules.

Every loader returns a :class:`LoadedModel` whose ``mod`` has one entry function, ``main``,
with static input shapes, ready for ``tvm.compile`` (or ``tvm.relax.build``) and for
MetaSchedule task extraction.

Weights
-------
By default the weights are **kept bound** in the module as Relax constants and
``LoadedModel.params`` is ``None``: ``mod["main"]`` then takes exactly the inputs listed in
``input_info``, so ``vm["main"](*inputs)`` runs the model. Pass ``keep_params_as_input=True``
to get them **detached** instead (via ``tvm.relax.frontend.detach_params``): ``main`` then
takes the inputs followed by the weights, and ``params`` maps each weight parameter name to a
numpy array in signature order, so ``vm["main"](*inputs, *params.values())`` runs it. Either
form yields the same tuning tasks: ``FuseOps``/``FuseTIR`` pass weights to the fused kernels
as arguments in both cases.

Errors
------
A file that cannot be turned into a module raises :class:`ModelFormatError` with one line
that names the file and the reason; a missing optional dependency raises
:class:`MissingDependencyError` naming the extra to install. Heavy imports (tvm, torch,
onnx) happen inside the functions, never at module import time.
"""

from __future__ import annotations

import io
import logging
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tunefleet.errors import NotSupportedError, TunefleetError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import numpy as np
    import tvm

__all__ = [
    "InputInfo",
    "LoadedModel",
    "MissingDependencyError",
    "ModelFormatError",
    "detect_format",
    "import_exported_program",
    "load_exported_program",
    "load_onnx",
    "random_inputs",
]

logger = logging.getLogger(__name__)

#: One model input: (name, static shape, dtype string such as ``"float32"`` or ``"int64"``).
InputInfo = tuple[str, tuple[int, ...], str]

_ZIP_MAGIC = b"PK\x03\x04"
_MAX_REASON_CHARS = 300


class ModelFormatError(TunefleetError):
    """A model file is corrupt, of an unknown format, or cannot be imported into TVM Relax.

    The message is one line: ``"<file name>: <reason>"``.
    """


class MissingDependencyError(NotSupportedError):
    """An optional dependency (torch, transformers, onnx) is not installed."""


@dataclass
class LoadedModel:
    """A model imported into TVM Relax.

    Attributes
    ----------
    mod : tvm.IRModule
        The Relax module; its entry function is ``main`` and all input shapes are static.
    params : dict[str, numpy.ndarray] or None
        ``None`` when the weights are bound into ``mod`` as constants (the default). Otherwise
        the detached weights, keyed by their parameter name in ``main`` and ordered as the
        trailing parameters of ``main`` (after the inputs).
    input_info : list[tuple[str, tuple[int, ...], str]]
        The model inputs in the positional order of ``main``: name, shape, dtype. Names are
        those of the source model (ONNX graph input names; the exported program's
        placeholder names).
    torch_module : object or None
        A runnable ``torch.nn.Module`` for the same computation (PyTorch-eager baseline), when
        one is at hand: the original module for zoo models, ``ExportedProgram.module()`` for
        ``.pt2`` files; ``None`` for ONNX and ``relax.frontend.nn`` models.
    """

    mod: tvm.IRModule
    params: dict[str, np.ndarray] | None
    input_info: list[InputInfo]
    torch_module: object | None = None

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Random inputs matching :attr:`input_info`; see :func:`random_inputs`."""
        return random_inputs(self.input_info, seed=seed)


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def _one_line(text: object, limit: int = _MAX_REASON_CHARS) -> str:
    """Collapse an exception message into one bounded line."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = lines[0] if lines else ""
    # TVM errors often start with a traceback header; prefer the last meaningful line then.
    if line.lower().startswith("traceback") and len(lines) > 1:
        line = lines[-1]
    if len(line) > limit:
        line = line[: limit - 3] + "..."
    return line


def _reason(exc: BaseException) -> str:
    """``"ExcType: first line of message"`` for an error message."""
    msg = _one_line(exc)
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def _require(module: str, label: str, extra: str, what: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{what} needs {label}, which is not installed: pip install 'tunefleet[{extra}]'"
        ) from exc


def _require_torch(what: str) -> Any:
    return _require("torch", "PyTorch", "torch", what)


def _require_onnx(what: str) -> Any:
    return _require("onnx", "the onnx package", "onnx", what)


def _var_name(var: Any) -> str:
    """Name of a Relax ``Var`` across TVM API generations (``name`` / ``name_hint``)."""
    for attr in ("name", "name_hint"):
        value = getattr(var, attr, None)
        if isinstance(value, str):
            return value
    return str(getattr(getattr(var, "vid", None), "name_hint", var))


def _var_type(var: Any) -> Any:
    """Type / struct info of a Relax ``Var`` (``ty`` in TVM 0.27, ``struct_info`` before)."""
    ty = getattr(var, "ty", None)
    return ty if ty is not None else getattr(var, "struct_info", None)


def _tensor_signature(var: Any) -> tuple[list[Any], str] | None:
    """(shape values, dtype) of a tensor-typed Relax parameter, ``None`` if not a tensor."""
    ty = _var_type(var)
    shape = getattr(ty, "shape", None)
    dtype = getattr(ty, "dtype", None)
    values = getattr(shape, "values", None)
    if ty is None or dtype is None or values is None:
        return None
    return list(values), str(dtype)


def _static_dims(values: Sequence[Any]) -> tuple[int, ...] | None:
    dims: list[int] = []
    for v in values:
        if type(v).__name__ != "IntImm" and not isinstance(v, int):
            return None
        dims.append(int(v))
    return tuple(dims)


def _num_inputs(func: Any) -> int:
    attrs = getattr(func, "attrs", None)
    if attrs is not None and "num_input" in attrs:
        return int(attrs["num_input"])
    return len(func.params)


def _finish(
    mod: tvm.IRModule,
    name: str,
    *,
    keep_params_as_input: bool,
    input_names: Sequence[str] | None = None,
    torch_module: object | None = None,
) -> LoadedModel:
    """Check the imported module, detach weights if asked, and build its input info."""
    from tvm import relax

    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise ModelFormatError(f"{name}: the imported Relax module has no 'main' function")

    params: dict[str, np.ndarray] | None = None
    if keep_params_as_input:
        mod, detached = relax.frontend.detach_params(mod)
        func = mod["main"]
        n_in = _num_inputs(func)
        weight_vars = list(func.params)[n_in:]
        values = detached.get("main", [])
        if len(values) != len(weight_vars):
            raise ModelFormatError(
                f"{name}: {len(values)} detached weights for {len(weight_vars)} weight "
                "parameters of main"
            )
        params = {_var_name(v): t.numpy() for v, t in zip(weight_vars, values)}

    func = mod["main"]
    n_in = _num_inputs(func)
    in_vars = list(func.params)[:n_in]
    if input_names is not None and len(input_names) != len(in_vars):
        input_names = None
    info: list[InputInfo] = []
    for i, var in enumerate(in_vars):
        vname = input_names[i] if input_names is not None else _var_name(var)
        sig = _tensor_signature(var)
        if sig is None:
            raise ModelFormatError(
                f"{name}: input {vname!r} is not a tensor ({_var_type(var)}); only tensor "
                "inputs are supported"
            )
        dims = _static_dims(sig[0])
        if dims is None:
            shape_txt = ", ".join(
                str(int(v)) if type(v).__name__ == "IntImm" else str(v) for v in sig[0]
            )
            raise ModelFormatError(
                f"{name}: input {vname!r} has a dynamic shape ({shape_txt}); tuning needs "
                "static shapes (ONNX: pass input_shapes; torch.export: export without "
                "dynamic_shapes)"
            )
        info.append((vname, dims, sig[1]))
    return LoadedModel(mod=mod, params=params, input_info=info, torch_module=torch_module)


def random_inputs(input_info: Sequence[InputInfo], seed: int = 0) -> list[np.ndarray]:
    """Deterministic random arrays for ``input_info``.

    Parameters
    ----------
    input_info : sequence of (name, shape, dtype)
        As in :attr:`LoadedModel.input_info`.
    seed : int
        Seed of ``numpy.random.default_rng``.

    Returns
    -------
    list of numpy.ndarray
        Floats from a standard normal; integers uniform in ``[0, 100)`` (valid token ids for
        any vocabulary of 100 or more); booleans uniform.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays: list[np.ndarray] = []
    for _name, shape, dtype in input_info:
        kind = np.dtype(dtype).kind
        if kind == "f":
            arrays.append(rng.standard_normal(shape).astype(dtype))
        elif kind in "iu":
            arrays.append(rng.integers(0, 100, size=shape).astype(dtype))
        elif kind == "b":
            arrays.append(rng.integers(0, 2, size=shape).astype(bool))
        else:
            raise NotSupportedError(f"no random input generator for dtype {dtype!r}")
    return arrays


# --------------------------------------------------------------------------------------------
# format detection
# --------------------------------------------------------------------------------------------


def _zip_names(data: bytes) -> list[str] | None:
    """Member names if ``data`` is a readable zip archive, else ``None``."""
    if not data.startswith(_ZIP_MAGIC):
        return None
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            return zf.namelist()
    except (zipfile.BadZipFile, ValueError, OSError):
        return None


def _is_pt2_archive(names: Sequence[str]) -> bool:
    return any(n == "archive_format" or n.endswith("/archive_format") for n in names)


def detect_format(data: bytes, filename: str) -> str:
    """Tell which frontend a model file needs.

    Parameters
    ----------
    data : bytes
        The file contents.
    filename : str
        The file name (used for its extension and in error messages).

    Returns
    -------
    str
        ``"pt2"`` for a ``torch.export.save`` archive, ``"onnx"`` for an ONNX model.

    Raises
    ------
    ModelFormatError
        The contents are neither (e.g. a ``torch.save`` checkpoint or a TorchScript file,
        which are zip archives too, or bytes that parse as no ONNX graph).
    """
    lower = filename.lower()
    if not data:
        raise ModelFormatError(f"{filename}: the file is empty")
    if data.startswith(_ZIP_MAGIC):
        names = _zip_names(data)
        if names is None:
            raise ModelFormatError(
                f"{filename}: a damaged or truncated zip archive (expected a torch.export "
                ".pt2 file)"
            )
        if _is_pt2_archive(names):
            return "pt2"
        raise ModelFormatError(
            f"{filename}: a zip archive but not a torch.export program (no archive_format "
            "entry; torch.save checkpoints and TorchScript files are not supported, write the "
            "model with torch.export.save)"
        )
    if lower.endswith((".pt2", ".pt", ".pth", ".ep")):
        raise ModelFormatError(
            f"{filename}: not a torch.export .pt2 file (not a zip archive); expected the output "
            "of torch.export.save"
        )
    if lower.endswith(".onnx"):
        return "onnx"
    try:
        onnx = _require_onnx("ONNX format detection")
        proto = onnx.load_model_from_string(data)
        if len(proto.graph.node) > 0 and proto.ir_version > 0:
            return "onnx"
    except MissingDependencyError:
        pass
    except Exception:  # noqa: BLE001 - any parse failure means "not ONNX"
        pass
    raise ModelFormatError(
        f"{filename}: unrecognised model format (expected an ONNX model or a torch.export "
        ".pt2 archive)"
    )


# --------------------------------------------------------------------------------------------
# ONNX
# --------------------------------------------------------------------------------------------


def _onnx_input_specs(
    onnx: Any,
    graph: Any,
    name: str,
    input_shapes: Mapping[str, Sequence[int]] | None,
) -> tuple[list[str], dict[str, list[int]], dict[str, str]]:
    """Graph inputs (minus initializers) with static shapes and dtypes."""
    initializers = {init.name for init in graph.initializer}
    overrides = dict(input_shapes or {})
    names: list[str] = []
    shapes: dict[str, list[int]] = {}
    dtypes: dict[str, str] = {}
    for inp in graph.input:
        if inp.name in initializers:
            continue
        ttype = inp.type.tensor_type if inp.type.HasField("tensor_type") else None
        if ttype is None:
            raise ModelFormatError(
                f"{name}: input {inp.name!r} is not a tensor; only tensor inputs are supported"
            )
        try:
            dtype = str(onnx.helper.tensor_dtype_to_np_dtype(ttype.elem_type))
        except Exception as exc:  # noqa: BLE001
            raise ModelFormatError(
                f"{name}: input {inp.name!r} has an unsupported element type "
                f"{ttype.elem_type} ({_reason(exc)})"
            ) from exc
        dims: list[int | str] = []
        for d in ttype.shape.dim:
            if d.HasField("dim_value") and d.dim_value > 0:
                dims.append(int(d.dim_value))
            else:
                dims.append(d.dim_param or "?")
        if inp.name in overrides:
            raw = overrides.pop(inp.name)
            try:
                given = [int(v) for v in raw]
            except (TypeError, ValueError):
                raise ModelFormatError(
                    f"{name}: input_shapes[{inp.name!r}] must be a sequence of integers, "
                    f"got {raw!r}"
                ) from None
            if ttype.HasField("shape") and len(given) != len(dims):
                raise ModelFormatError(
                    f"{name}: input_shapes[{inp.name!r}] has rank {len(given)} but the "
                    f"model's input has rank {len(dims)} ({_fmt_dims(dims)})"
                )
            for g, d in zip(given, dims):
                if g < 1 or (isinstance(d, int) and g != d):
                    raise ModelFormatError(
                        f"{name}: input_shapes[{inp.name!r}] = {tuple(given)} does not fit "
                        f"the model's input shape ({_fmt_dims(dims)})"
                    )
            shapes[inp.name] = given
        else:
            if not ttype.HasField("shape") or any(not isinstance(d, int) for d in dims):
                raise ModelFormatError(
                    f"{name}: input {inp.name!r} has a dynamic shape ({_fmt_dims(dims)}); pass "
                    f"input_shapes={{{inp.name!r}: (...)}} with static sizes"
                )
            shapes[inp.name] = [int(d) for d in dims]
        names.append(inp.name)
        dtypes[inp.name] = dtype
    if overrides:
        raise ModelFormatError(
            f"{name}: input_shapes names unknown inputs {sorted(overrides)}; the model's inputs "
            f"are {names}"
        )
    if not names:
        raise ModelFormatError(f"{name}: the ONNX graph has no inputs")
    return names, shapes, dtypes


def _fmt_dims(dims: Sequence[object]) -> str:
    return ", ".join(str(d) for d in dims)


def load_onnx(
    data: bytes,
    name: str,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
    *,
    keep_params_as_input: bool = False,
) -> LoadedModel:
    """Import an ONNX model into TVM Relax.

    Parameters
    ----------
    data : bytes
        The ``.onnx`` file contents (a single file; external-data models are rejected).
    name : str
        The file name, used in error messages.
    input_shapes : dict[str, tuple[int, ...]], optional
        Static shapes by ONNX input name; needed for every input with a symbolic dimension
        (e.g. a dynamic batch axis), optional otherwise.
    keep_params_as_input : bool
        Detach the weights into :attr:`LoadedModel.params` instead of keeping them bound as
        constants (see the module docstring).

    Returns
    -------
    LoadedModel
        ``input_info`` uses the ONNX input names and dtypes; ``torch_module`` is ``None``.

    Raises
    ------
    ModelFormatError
        Not a valid ONNX file, missing static shapes, or an operator TVM cannot import.
    MissingDependencyError
        The ``onnx`` package is not installed.
    """
    onnx = _require_onnx(f"{name}: loading ONNX")
    from google.protobuf.message import DecodeError

    if not data:
        raise ModelFormatError(f"{name}: not a valid ONNX file (the file is empty)")
    try:
        model = onnx.load_model_from_string(data)
    except DecodeError as exc:
        raise ModelFormatError(
            f"{name}: not a valid ONNX file (protobuf parse error: {_one_line(exc)})"
        ) from exc
    except Exception as exc:  # noqa: BLE001
        raise ModelFormatError(f"{name}: not a valid ONNX file ({_reason(exc)})") from exc
    try:
        onnx.checker.check_model(model)
    except Exception as exc:  # noqa: BLE001 - onnx raises ValidationError and friends
        raise ModelFormatError(
            f"{name}: not a valid ONNX model (checker: {_one_line(exc)})"
        ) from exc
    external = [
        t.name
        for t in model.graph.initializer
        if t.data_location == onnx.TensorProto.EXTERNAL
    ]
    if external:
        raise ModelFormatError(
            f"{name}: weights are stored in external data files ({len(external)} tensors, e.g. "
            f"{external[0]!r}); re-save it as one file with "
            "onnx.save_model(model, path, save_as_external_data=False)"
        )

    input_names, shapes, dtypes = _onnx_input_specs(onnx, model.graph, name, input_shapes)
    from tvm.relax.frontend.onnx import from_onnx

    try:
        mod = from_onnx(
            model,
            shape_dict=shapes,
            dtype_dict=dtypes,
            keep_params_in_input=keep_params_as_input,
        )
    except Exception as exc:  # noqa: BLE001 - TVM raises many kinds; all mean "cannot import"
        raise ModelFormatError(
            f"{name}: cannot import the ONNX model into TVM Relax ({_reason(exc)})"
        ) from exc
    loaded = _finish(
        mod, name, keep_params_as_input=keep_params_as_input, input_names=input_names
    )
    logger.info(
        "imported ONNX model %s: %d inputs, %d Relax functions",
        name,
        len(loaded.input_info),
        len(loaded.mod.get_global_vars()),
    )
    return loaded


# --------------------------------------------------------------------------------------------
# torch.export
# --------------------------------------------------------------------------------------------


def import_exported_program(
    exported_program: Any,
    name: str,
    *,
    keep_params_as_input: bool = False,
    torch_module: object | None = None,
) -> LoadedModel:
    """Import an in-memory ``torch.export.ExportedProgram`` into TVM Relax.

    Parameters
    ----------
    exported_program : torch.export.ExportedProgram
        The program; its inputs must have static shapes.
    name : str
        Name used in error messages.
    keep_params_as_input : bool
        Detach the weights (see the module docstring).
    torch_module : object, optional
        Stored as :attr:`LoadedModel.torch_module`.

    Returns
    -------
    LoadedModel
        A single-tensor output is returned as a tensor, not a 1-tuple.

    Raises
    ------
    ModelFormatError
        TVM cannot import the program (e.g. an unsupported aten operator) or an input is
        dynamic.
    """
    from tvm.relax.frontend.torch import from_exported_program

    try:
        mod = from_exported_program(
            exported_program,
            keep_params_as_input=keep_params_as_input,
            unwrap_unit_return_tuple=True,
        )
    except Exception as exc:  # noqa: BLE001 - TVM raises many kinds; all mean "cannot import"
        raise ModelFormatError(
            f"{name}: cannot import the exported program into TVM Relax ({_reason(exc)})"
        ) from exc
    return _finish(
        mod, name, keep_params_as_input=keep_params_as_input, torch_module=torch_module
    )


def load_exported_program(
    data: bytes,
    name: str,
    *,
    keep_params_as_input: bool = False,
) -> LoadedModel:
    """Import a ``.pt2`` file written by ``torch.export.save`` into TVM Relax.

    Parameters
    ----------
    data : bytes
        The ``.pt2`` file contents.
    name : str
        The file name, used in error messages.
    keep_params_as_input : bool
        Detach the weights (see the module docstring).

    Returns
    -------
    LoadedModel
        ``input_info`` uses the program's placeholder names; ``torch_module`` is
        ``ExportedProgram.module()`` (runnable in PyTorch eager mode).

    Raises
    ------
    ModelFormatError
        Not a ``torch.export`` archive, a damaged one, or a program TVM cannot import.
    MissingDependencyError
        PyTorch is not installed.
    """
    torch = _require_torch(f"{name}: loading a .pt2 exported program")
    names = _zip_names(data)
    if names is None:
        what = "the file is empty" if not data else (
            "a damaged or truncated zip archive" if data.startswith(_ZIP_MAGIC)
            else "not a zip archive"
        )
        raise ModelFormatError(f"{name}: not a valid torch.export .pt2 file ({what})")
    if not _is_pt2_archive(names):
        raise ModelFormatError(
            f"{name}: not a valid torch.export .pt2 file (a zip archive without an "
            "archive_format entry: torch.save checkpoints and TorchScript files are not "
            "supported, write the model with torch.export.save)"
        )
    try:
        ep = torch.export.load(io.BytesIO(data))
    except Exception as exc:  # noqa: BLE001 - torch raises RuntimeError, KeyError, ...
        raise ModelFormatError(
            f"{name}: not a loadable torch.export .pt2 file ({_reason(exc)})"
        ) from exc
    try:
        eager = ep.module()
    except Exception as exc:  # noqa: BLE001 - the eager module is a convenience only
        logger.warning("%s: no eager module for the exported program (%s)", name, _reason(exc))
        eager = None
    loaded = import_exported_program(
        ep, name, keep_params_as_input=keep_params_as_input, torch_module=eager
    )
    logger.info("imported exported program %s: inputs %s", name, loaded.input_info)
    return loaded
