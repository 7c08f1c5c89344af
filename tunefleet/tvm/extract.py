"""Extract tuning workloads from a Relax model, keyed exactly as MetaSchedule keys them.

Pass order
----------
``ms.relax_integration.extract_tasks`` only collects ``call_tir`` targets, so on a raw Relax
graph it silently returns ``[]``. :func:`prepare_for_tuning` first runs what TVM 0.27 runs
before looking tuned schedules up at build time (``ms.relax_integration.compile_relax``, and
the ``static_shape_tuning`` pipeline in ``python/tvm/relax/pipeline.py``), under
``with target, PassContext(opt_level=3)`` as ``compile_relax`` does:

1. ``BindParams`` (when weights are given) - ``compile_relax`` binds ``params`` first;
2. ``DecomposeOpsForInference`` - from ``static_shape_tuning_pipeline``; without it BatchNorm
   and friends stay composite and become separate tasks;
3. the target's library-dispatch passes (``DispatchSampling``, ``DispatchSortScan`` on CPU and
   CUDA) - ``compile_relax`` runs ``relax.pipeline.library_dispatch_passes(target)`` first;
4. ``LegalizeOps``, ``AnnotateTIROpPattern``, ``FoldConstant``, ``FuseOps``, ``FuseTIR``.

``compile_relax`` itself does not run ``DecomposeOpsForInference``, and it must NOT be given the
output of :func:`prepare_for_tuning`: the passes are not idempotent (a second
``AnnotateTIROpPattern`` adds an ``op_pattern`` attribute to the fused PrimFuncs, which changes
their structural hash, so no tuned record would match). To build with tuned schedules, hand
``compile_relax(database, prepare_for_build(mod, target, params), target, None)`` the module
from :func:`prepare_for_build` (weights bound + ``DecomposeOpsForInference`` only); it then
runs steps 3-4 itself and its fused PrimFuncs hash like the tuned ones.

Workload identity
-----------------
:attr:`ExtractedWorkload.structural_hash` is the 16-digit hex form of
``tvm_ffi.structural_hash(task.dispatched[0])``. ``task.dispatched[0]`` is the module
``extracted_tasks_to_tune_contexts`` hands to ``TuneContext`` (already normalised: one PrimFunc
named ``main`` with ``global_symbol`` and ``tirx.noalias``), which is what the task scheduler
commits to the database; ``Workload(mod)`` in C++ (``database.cc``) stores
``ModuleEquality::Create("structural")->Hash(mod)``, i.e. the same structural hash, printed in
decimal in ``Workload.as_json()[0]``. ``MetaScheduleApplyDatabase`` looks PrimFuncs up at build
time after the same normalisation. So our key and MetaSchedule's are one number.

Recipes
-------
Which passes run between the frontend's graph and the fused TIR is the *extraction recipe*
(:class:`Recipe`), a hardware-class setting, and part of every workload's identity:

* ``layout="NHWC"`` runs Relax ``ConvertLayout`` (conv2d to NHWC data and OHWI weights) right
  after ``DecomposeOpsForInference``. The ops around each conv2d follow it; layout transforms
  stay only at the model's boundary and on constants, where ``FoldConstant`` folds them. Two
  ops it cannot convert, ``clip`` and a zero ``pad`` before a conv2d, are rewritten first
  (``_ready_for_layout_conversion``). CPU
  classes use it: TVM's NHWC conv2d schedules vectorise over channels (NCHW[x]c is out of reach:
  ``LegalizeOps`` refuses channel-chunked conv2d in TVM 0.27).
* ``prepack`` runs ``AttachAttrLayoutFreeBuffers`` after ``FuseTIR`` (TVM's own CPU recipe,
  ``static_shape_tuning_pipeline(cpu_weight_prepack=True)``): it marks the weight arguments of
  every fused PrimFunc layout-free, so MetaSchedule's ``RewriteLayout`` postprocessor may pick a
  packed weight layout. The attribute changes the workload's hash, so it belongs to extraction;
  measuring such a schedule needs the packed argument shapes
  (``ArgInfo.from_entry_func(mod, remove_preproc=True)``, see :mod:`tunefleet.tvm.traces`).

* ``fast_math`` (CPU classes) runs ``FastMathTransform`` (softmax, exp, erf, tanh) and
  legalises ``nn.gelu`` / ``nn.gelu_tanh`` with ``fast_erf`` / ``fast_tanh`` (float32 only):
  polynomial approximations that vectorise, where LLVM otherwise calls libm once per element.
  The build checks its outputs against the exact, unconverted model.

Stock ``compile_relax`` cannot build prepacked records (it goes from ``FuseTIR`` straight to
``MetaScheduleApplyDatabase``): :func:`tunefleet.tvm.compile.build_with_database` runs this
module's passes, applies the database, then ``SplitLayoutRewritePreproc`` + ``FoldConstant``
pack the bound weights once at build time.

Weights
-------
``nn.Module.export_tvm`` gives parameter *specs*; the weights are extra function inputs. We bind
weights (:func:`random_params` makes random ones) as constants, as a deployed model has them:
``FoldConstant`` then folds weight-only ops (e.g. the transpose of a Linear's weight), which
would otherwise become their own (useless) tuning tasks. Weight *values* never reach the TIR
(constants are ``call_tir`` arguments), so workload hashes do not depend on them.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, te, tirx, topi
from tvm.topi.nn.utils import get_pad_tuple
from tvm.topi.nn.winograd_util import _cook_toom_convolution, _interpolation_points, winograd_transform_matrices
from tvm.relax import pipeline as relax_pipeline
from tvm.ir import IRModule
from tvm.s_tir import meta_schedule as ms
from tvm.target import Target

from tunefleet.errors import TunefleetError
from tunefleet.recipes import WINOGRAD_MIN_CHANNELS, WINOGRAD_MIN_TILES, WINOGRAD_TILE, Recipe, recipe_for
from tunefleet.tvm.targets import make_target
from tunefleet.vocab import task_name_key

logger = logging.getLogger(__name__)

__all__ = [
    "ExtractedWorkload",
    "ExtractionError",
    "Recipe",
    "classify_op_kind",
    "extract_workloads",
    "conv2d_calls",
    "has_winograd_convolution",
    "prepare_for_build",
    "prepare_for_tuning",
    "random_params",
    "recipe_for",
    "reusing_folded_weights",
    "workload_hash",
]

_HASH_MASK = (1 << 64) - 1

# relax.transform.AnnotateTIROpPattern values (tvm/relax/op_attr_types.h OpPatternKind)
_OP_PATTERN_KIND = {
    0: "elemwise",
    1: "broadcast",
    2: "injective",
    3: "reduce",
    4: "complex",  # kOutEWiseFusable: e.g. conv2d/matmul followed by elementwise ops
    7: "tuple",
    8: "opaque",
}

# Name-based classification, first match wins; matched on the task name with "fused_" and
# the numeric suffixes TVM adds to repeated ops ("matmul1", "add2") removed.
_NAME_RULES: list[tuple[str, str]] = [
    (r"conv\dd_transpose", "conv_transpose"),
    (r"conv1d", "conv1d"),
    (r"conv2d", "conv2d"),
    (r"conv3d", "conv3d"),
    (r"(^|_)(batch_)?(matmul|dense|linear|einsum)(_|$)", "dense/matmul"),
    (r"pool\dd", "pool"),
    (r"(^|_)(log_)?softmax(_|$)", "softmax"),
    (r"(^|_)(layer|group|batch|rms|instance)_norm(_|$)", "norm"),
    (r"(^|_)(attention|flash_attn)", "attention"),
    (r"(^|_)(sum|mean|prod|variance|std|argmax|argmin|max|min|cumsum|cumprod)(_|$)", "reduce"),
    (
        r"(^|_)(take|gather|gather_nd|scatter|scatter_nd|strided_slice|dynamic_strided_slice|"
        r"reshape|transpose|permute_dims|concatenate|split|broadcast_to|expand_dims|squeeze|"
        r"flatten|resize\dd|image_resize\dd|pad|tile|repeat|flip|layout_transform)(_|$)",
        "injective",
    ),
]


class ExtractionError(TunefleetError):
    """The model cannot be turned into tuning workloads."""


@dataclass(frozen=True)
class ExtractedWorkload:
    """One tuning task: a TIR function and where it comes from.

    Attributes
    ----------
    structural_hash : str
        16 hex digits of the structural hash MetaSchedule's database uses for this workload
        (see the module docstring); stable across processes and machines.
    name : str
        The task name, e.g. ``"fused_matmul_add_relu"`` (not unique across models).
    op_kind : str
        A coarse kind: ``"conv2d"``, ``"dense/matmul"``, ``"pool"``, ``"softmax"``, ``"norm"``,
        ``"reduce"``, ``"injective"``, ``"elemwise"``, ``"complex"``, ``"opaque"``, ...
    flops : float
        Floating-point operations of one call (``tvm.s_tir.analysis.estimate_tir_flops``);
        0.0 when TVM cannot estimate them (e.g. symbolic shapes).
    weight : int
        How many times the model calls it (MetaSchedule's task weight).
    mod : tvm.ir.IRModule
        The module to tune (``task.dispatched[0]``).
    tir_json : str
        ``tvm.ir.save_json(mod)``; ``tvm.ir.load_json`` restores an equal module.
    task : ExtractedTask
        The MetaSchedule task, for ``extracted_tasks_to_tune_contexts``.
    """

    structural_hash: str
    name: str
    op_kind: str
    flops: float
    weight: int
    mod: IRModule = field(repr=False, compare=False)
    tir_json: str = field(repr=False)
    task: Any = field(default=None, repr=False, compare=False)


def workload_hash(mod: IRModule) -> str:
    """The 16-hex-digit workload key of a (normalised) TIR module.

    Equal to MetaSchedule's ``Workload(mod)`` hash (its JSON prints it in decimal).

    Parameters
    ----------
    mod : tvm.ir.IRModule
        A module as MetaSchedule tunes it (one PrimFunc named ``main``).

    Returns
    -------
    str
        ``format(tvm_ffi.structural_hash(mod), "016x")``.
    """
    return format(int(tvm_ffi.structural_hash(mod)) & _HASH_MASK, "016x")


def _relax_function_name(mod: IRModule, func_name: str | None) -> str:
    names = [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, relax.Function)]
    if func_name is not None:
        if func_name not in names:
            raise ExtractionError(
                f"The module has no Relax function {func_name!r}; it has {sorted(names)}."
            )
        return func_name
    if "main" in names:
        return "main"
    if len(names) == 1:
        return names[0]
    if not names:
        raise ExtractionError("The module has no Relax function to extract workloads from.")
    raise ExtractionError(
        f"The module has several Relax functions {sorted(names)}; name the one to bind "
        "weights to with func_name=."
    )


def _param_name(var: Any) -> str:
    # TVM 0.27 unified Var: ``.name``; older relax.Var: ``.name_hint``.
    return str(getattr(var, "name", None) or var.name_hint)


def random_params(
    mod: IRModule, func_name: str | None = None, seed: int = 0, scale: float = 0.1
) -> dict[str, np.ndarray]:
    """Random weights for every weight parameter of a Relax function.

    The first ``num_input`` parameters (the ``num_input`` function attribute that
    ``nn.Module.export_tvm`` sets; 1 when absent) are model inputs and get no value.

    Parameters
    ----------
    mod : tvm.ir.IRModule
        The Relax module (e.g. from ``export_tvm``).
    func_name : str, optional
        The function; ``"main"`` or the only Relax function by default.
    seed : int
        Seed of the numpy generator.
    scale : float
        Standard deviation of the normal distribution for float weights.

    Returns
    -------
    dict of str to numpy.ndarray
        Parameter name to value, ready for :func:`prepare_for_tuning`.
    """
    name = _relax_function_name(mod, func_name)
    func = mod[name]
    attrs = dict(func.attrs) if func.attrs is not None else {}
    num_input = int(attrs.get("num_input", 1))
    rng = np.random.default_rng(seed)
    params: dict[str, np.ndarray] = {}
    for var in list(func.params)[num_input:]:
        ty = var.ty
        shape = getattr(ty, "shape", None)
        dtype = str(getattr(ty, "dtype", ""))
        if shape is None or not dtype:
            raise ExtractionError(
                f"Parameter {_param_name(var)!r} of {name!r} is not a tensor with a known "
                "shape and dtype; bind it yourself."
            )
        try:
            dims = [int(d) for d in shape]
        except (TypeError, ValueError):
            raise ExtractionError(
                f"Parameter {_param_name(var)!r} of {name!r} has a symbolic shape {shape}; "
                "bind it yourself."
            ) from None
        if dtype.startswith(("float", "bfloat")):
            value = (rng.standard_normal(dims) * scale).astype(dtype)
        elif dtype == "bool":
            value = rng.integers(0, 2, size=dims).astype(dtype)
        else:
            value = rng.integers(0, 8, size=dims).astype(dtype)
        params[_param_name(var)] = value
    return params


def _bind_params(
    mod: IRModule, params: Mapping[str, Any], func_name: str | None
) -> IRModule:
    name = _relax_function_name(mod, func_name)
    known = {_param_name(v) for v in mod[name].params}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ExtractionError(
            f"Weights {unknown} are not parameters of {name!r} (it has {sorted(known)})."
        )
    values = {
        k: (v if isinstance(v, tvm.runtime.Tensor) else tvm.runtime.tensor(np.asarray(v)))
        for k, v in params.items()
    }
    return relax.transform.BindParams(name, values)(mod)


def _library_dispatch_passes(target: Target) -> list[Any]:
    # Same fallback as ms.relax_integration.compile_relax.
    try:
        return list(relax_pipeline.library_dispatch_passes(target))
    except (ValueError, AttributeError):
        return []


def prepare_for_build(
    mod: IRModule,
    target: Target | Mapping[str, Any] | str,
    params: Mapping[str, Any] | None = None,
    *,
    func_name: str | None = None,
    recipe: Recipe | None = None,
) -> IRModule:
    """The module to give ``ms.relax_integration.compile_relax`` so tuned records apply.

    Binds ``params``, runs ``DecomposeOpsForInference`` and the recipe's layout conversion -
    the steps of :func:`prepare_for_tuning` that ``compile_relax`` does not run itself. Pass
    ``params=None`` to ``compile_relax`` afterwards. Only for recipes without ``prepack``
    (``compile_relax`` cannot build prepacked records; use
    :func:`tunefleet.tvm.compile.build_with_database`). The default recipe here is
    ``Recipe()`` (the frontend's layout, no prepacking), as stock TVM builds.

    Parameters
    ----------
    mod : tvm.ir.IRModule
        The Relax module.
    target : tvm.target.Target or dict or str
        The target.
    params : mapping of str to array, optional
        Weights to bind as constants, by parameter name.
    func_name : str, optional
        The Relax function to bind ``params`` to.

    Returns
    -------
    tvm.ir.IRModule
        The bound, decomposed (still unfused) Relax module.
    """
    target = make_target(target) if not isinstance(target, Target) else target
    recipe = recipe or Recipe()
    mod = _bound_and_decomposed(mod, target, params, func_name, recipe.fold)
    with target, tvm.transform.PassContext(opt_level=3):
        if recipe.layout == "NHWC":
            mod = _ready_for_layout_conversion(mod)
            mod = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(mod)
        elif recipe.layout == "NCHWc":
            block = channel_block(target)
            mod = _ready_for_layout_conversion(mod)
            mod = relax.transform.ConvertLayout({"relax.nn.conv2d": [f"NCHW{block}c", f"OIHW{block}i{block}o"]})(mod)
            # A tensor read by two blocked convolutions is transformed once, not once per reader.
            mod = relax.transform.EliminateCommonSubexpr()(mod)
        return mod


_REUSE: ContextVar[list[tuple[Any, ...]] | None] = ContextVar("tunefleet_reuse_folded", default=None)


@contextmanager
def reusing_folded_weights() -> Iterator[None]:
    """Within this block, :func:`prepare_for_build` binds, folds and decomposes each module once
    and reuses the result for the next recipe of the same module (same object, same weights).

    Folding BatchNorm into the weights evaluates every folded constant with TVM's
    ``FoldConstant``, which compiles a small function for each: on a CNN it is most of a
    recipe's preparation, and a build prepares one model under up to four recipes (its
    extraction, the class's and the other recipes). Outside a block nothing is kept, so no
    process holds a second copy of a model's weights for longer than one build (or one pipeline
    run: :mod:`tunefleet.models.kept`). A block inside another uses the outer one's.
    """
    if _REUSE.get() is not None:
        yield
        return
    token = _REUSE.set([])
    try:
        yield
    finally:
        _REUSE.reset(token)


def _bound_and_decomposed(mod: IRModule, target: Target, params: Mapping[str, Any] | None, func_name: str | None,
                          fold: bool) -> IRModule:
    """``mod`` with ``params`` bound, BatchNorm folded (``fold``) and ``DecomposeOpsForInference``
    run: the part of :func:`prepare_for_build` every recipe with the same ``fold`` shares."""
    memo = _REUSE.get()
    key = (func_name, str(target), fold)
    if memo is not None:
        for seen_mod, seen_params, seen_key, result in memo:
            if seen_mod.same_as(mod) and seen_params is params and seen_key == key:
                return result
    source = mod
    if params:
        mod = _bind_params(mod, params, func_name)
    with target, tvm.transform.PassContext(opt_level=3):
        if fold:  # BatchNorm's constants become the convolution's weights and a bias
            mod = relax.transform.FoldBatchnormToConv2D()(mod)
            mod = relax.transform.FoldConstant()(mod)
        mod = relax.transform.DecomposeOpsForInference()(mod)
        if fold:
            # A decomposed BatchNorm not after a convolution leaves a tuple and a get-item between
            # its output and the next op, and FuseOps does not fuse across them.
            mod = relax.transform.CanonicalizeBindings()(mod)
            mod = relax.transform.DeadCodeElimination()(mod)
    if memo is not None:  # the inputs are kept too: their identity is the key
        memo.append((source, params, key, mod))
    return mod


def channel_block(target: Target) -> int:
    """The channel block of the NCHW[x]c layout for a CPU target: the float32 lanes of its widest
    vector registers (16 with AVX-512, 8 with AVX or AVX2, 4 otherwise)."""
    from tvm.target import codegen

    if codegen.target_has_features("avx512f", target):
        return 16
    if codegen.target_has_features("avx", target):
        return 8
    return 4


def _legalize_conv2d_nchwc(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``relax.nn.conv2d`` in a blocked layout as ``topi.nn.conv2d_NCHWc`` (TVM 0.27's own
    legalisation refuses channel-chunked layouts; its Adreno pipeline legalises them the same
    way); any other conv2d as TVM legalises it."""
    attrs = call.attrs
    if str(attrs.data_layout) == "NCHW" or not str(attrs.data_layout).endswith("c"):
        return _tvm_legalization("relax.nn.conv2d")(bb, call)
    return bb.call_te(topi.nn.conv2d_NCHWc, call.args[0], call.args[1], attrs.strides, attrs.padding,
                      attrs.dilation, str(attrs.data_layout), str(attrs.out_layout), str(call.ty.dtype),
                      primfunc_name_hint="conv2d_NCHWc")


def _tiles_along(extent: int) -> int:
    """How many output tiles of :data:`WINOGRAD_TILE` cover ``extent`` outputs along one axis."""
    return -(-extent // WINOGRAD_TILE)


def _static_shape(expr: relax.Expr) -> list[int] | None:
    shape = getattr(expr.ty, "shape", None)
    try:
        return [int(d) for d in shape] if shape is not None else None
    except (TypeError, ValueError):  # a symbolic dimension
        return None


def _winograd_applies(call: relax.Call) -> bool:
    """Whether a ``relax.nn.conv2d`` is one the Winograd recipe computes as Winograd: NHWC data and
    output, OHWI weights, and :func:`_winograd_shape`."""
    attrs = call.attrs
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout or attrs.data_layout))
    return layouts == ("NHWC", "OHWI", "NHWC") and _winograd_shape(call)


def _winograd_shape(call: relax.Call) -> bool:
    """Whether a ``relax.nn.conv2d`` in any layout would be Winograd once in NHWC: 3x3, stride and
    dilation 1, no groups, float32, static shapes, at least ``WINOGRAD_MIN_CHANNELS`` channels in
    and out, and ``WINOGRAD_MIN_TILES`` output tiles."""
    attrs = call.attrs
    if int(attrs.groups) != 1:
        return False
    if [int(v) for v in attrs.strides] != [1, 1] or [int(v) for v in attrs.dilation] != [1, 1]:
        return False
    data, weight = call.args
    if {str(data.ty.dtype), str(weight.ty.dtype), str(call.ty.dtype)} != {"float32"}:
        return False
    weight_shape, out_shape = _static_shape(weight), _static_shape(call)
    data_layout, kernel_layout = str(attrs.data_layout), str(attrs.kernel_layout)
    out_layout = str(attrs.out_layout or attrs.data_layout)
    if weight_shape is None or out_shape is None or _static_shape(data) is None:
        return False
    if sorted(kernel_layout) != sorted("OIHW") or sorted(out_layout) != sorted("NCHW"):
        return False  # a blocked layout (NCHWc): not converted to NHWC, never Winograd
    kernel = dict(zip(kernel_layout, weight_shape))
    out = dict(zip(out_layout, out_shape))
    tiles = out["N"] * _tiles_along(out["H"]) * _tiles_along(out["W"])
    return ((kernel["H"], kernel["W"]) == (3, 3) and min(kernel["I"], kernel["O"]) >= WINOGRAD_MIN_CHANNELS
            and tiles >= WINOGRAD_MIN_TILES) and data_layout == out_layout


def conv2d_calls(mod: tvm.IRModule) -> list[relax.Call]:
    """The ``relax.nn.conv2d`` calls of a Relax module's functions."""
    op = tvm.ir.Op.get("relax.nn.conv2d")
    found: list[relax.Call] = []

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.Call) and expr.op.same_as(op):
            found.append(expr)

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def has_winograd_convolution(mod: tvm.IRModule) -> bool:
    """Whether a Relax module has a convolution the Winograd recipe would compute as Winograd (in
    whatever layout it is now): without one, the recipe's workloads are its direct twin's."""
    return any(_winograd_shape(call) for call in conv2d_calls(mod))


def _winograd_weight_transform(weight: te.Tensor) -> te.Tensor:
    """OHWI 3x3 weights transformed for F(4x4, 3x3), as ``[alpha, alpha, CI, CO]`` (output
    channels innermost, the vectorised axis). A call on constant weights, which ``FoldConstant``
    folds: the transform runs once at build time, not in every call."""
    co, kh, kw, ci = (int(d) for d in weight.shape)
    _, _, g = winograd_transform_matrices(WINOGRAD_TILE, kh, str(weight.dtype))
    alpha = WINOGRAD_TILE + kh - 1
    r_kh, r_kw = te.reduce_axis((0, kh), name="r_kh"), te.reduce_axis((0, kw), name="r_kw")
    return te.compute((alpha, alpha, ci, co),
                      lambda eps, nu, c, o: te.sum(weight[o, r_kh, r_kw, c] * g[eps, r_kh] * g[nu, r_kw],
                                                   axis=[r_kh, r_kw]),
                      name="kernel_pack")


def _sparse_const_matrix(matrix: np.ndarray, name: str) -> te.Tensor:
    """``matrix`` as a compute of ``Select``s nested by row, its zero entries left out.

    TVM's ``const_matrix`` chains one ``Select`` per entry (36 for ``B``, zeros included), and the
    simplifier folds that chain again wherever the scheduled Winograd kernel inlines and unrolls it:
    most of a candidate's build and trace replay. Row-nested and sparse, a chain is at most 6 + 6
    conditions deep; the kernels compile to the same machine code."""
    rows, cols = matrix.shape
    dtype = str(matrix.dtype)

    def entry(i: Any, j: Any) -> Any:
        out = tirx.const(0.0, dtype)
        for ii in range(rows):
            row = tirx.const(0.0, dtype)
            for jj in range(cols):
                if matrix[ii][jj] != 0:
                    row = tirx.Select(tirx.indexmod(j, cols) == jj, tirx.const(matrix[ii][jj], dtype), row)
            out = tirx.Select(tirx.indexmod(i, rows) == ii, row, out)
        return out

    return te.compute(matrix.shape, entry, name=name, attrs={"const_matrix": True, "schedule_rule": "None"})


def _winograd_transforms(m: int, r: int, dtype: str) -> tuple[te.Tensor, te.Tensor]:
    """The inverse (``A``) and data (``B``) transform matrices of F(m x m, r x r), TVM's points."""
    a_data, b_data, _ = _cook_toom_convolution(_interpolation_points(m + r - 2), m, r)
    return _sparse_const_matrix(a_data.astype(dtype), "A"), _sparse_const_matrix(b_data.astype(dtype), "B")


def _tile_transform(x: te.Tensor, matrix: te.Tensor, size: int, name: str, axes: list[str]) -> te.Tensor:
    """``M^T X M`` on each tile of ``x`` (``[alpha, alpha, P, C]``), ``size`` x ``size`` out: the
    data (``B``) and inverse (``A``) transforms, with TVM's block names and ``schedule_rule``
    attributes, so MetaSchedule's own CPU rules for them apply."""
    alpha = int(x.shape[0])
    r_a, r_b = te.reduce_axis((0, alpha), "r_a"), te.reduce_axis((0, alpha), "r_b")
    return te.compute((size, size, x.shape[2], x.shape[3]),
                      lambda i, j, p, c: te.sum(x[r_a, r_b, p, c] * matrix[r_a, i] * matrix[r_b, j], axis=[r_a, r_b]),
                      name=name,
                      attrs={"auto_scheduler_simplify_const_tensor_indices": [*axes, "r_a", "r_b"],
                             "schedule_rule": f"conv2d_nhwc_winograd_{name}"})


def _conv2d_winograd_nhwc(data: te.Tensor, kernel_pack: te.Tensor, padding: list[int], out_dtype: str) -> te.Tensor:
    """A 3x3 stride-1 NHWC convolution as Winograd F(4x4, 3x3) on pre-transformed weights
    (``[alpha, alpha, CI, CO]``). TVM 0.27's ``topi.nn.conv2d_winograd_nhwc`` transforms the
    weights in every call and refuses pre-transformed ones ("LEGACY-FLOW"); this follows its
    compute otherwise, with the tiles counted per axis."""
    n, h, w, channels = (int(d) for d in data.shape)
    alpha, _, _, co = (int(d) for d in kernel_pack.shape)
    m = WINOGRAD_TILE
    r = alpha - m + 1
    a_mat, b_mat = _winograd_transforms(m, r, out_dtype)
    pad_t, pad_l, pad_b, pad_r = get_pad_tuple(padding, (r, r))
    out_h, out_w = h + pad_t + pad_b - r + 1, w + pad_l + pad_r - r + 1
    n_h, n_w = _tiles_along(out_h), _tiles_along(out_w)
    tiles = n * n_h * n_w
    # padded so that every tile, the last ones included, reads alpha x alpha values
    data_pad = topi.nn.pad(data, (0, pad_t, pad_l, 0),
                           (0, (n_h - 1) * m + alpha - h - pad_t, (n_w - 1) * m + alpha - w - pad_l, 0),
                           name="data_pad", attrs={"schedule_rule": "None"})
    input_tile = te.compute((alpha, alpha, tiles, channels),
                            lambda eps, nu, p, c: data_pad[p // (n_h * n_w), (p // n_w) % n_h * m + eps,
                                                           p % n_w * m + nu, c],
                            name="input_tile", attrs={"schedule_rule": "None"})
    data_pack = _tile_transform(input_tile, b_mat, alpha, "data_pack", ["eps", "nu"])
    ci = te.reduce_axis((0, channels), name="ci")
    bgemm = te.compute((alpha, alpha, tiles, co),
                       lambda eps, nu, p, o: te.sum(data_pack[eps, nu, p, ci] * kernel_pack[eps, nu, ci, o], axis=[ci]),
                       name="bgemm")
    inverse = _tile_transform(bgemm, a_mat, m, "inverse", ["vh", "vw"])
    return te.compute((n, out_h, out_w, co),
                      lambda b, y, x, o: inverse[y % m, x % m, b * n_h * n_w + y // m * n_w + x // m, o],
                      name="conv2d_winograd")


def _legalize_conv2d_winograd(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """A conv2d that qualifies (:func:`_winograd_applies`) as two calls: the weight transform
    (folded away on constant weights) and the Winograd convolution; any other as TVM legalises
    it."""
    if not _winograd_applies(call):
        return _tvm_legalization("relax.nn.conv2d")(bb, call)
    kernel = bb.emit_te(_winograd_weight_transform, call.args[1], primfunc_name_hint="winograd_weight_transform")
    return bb.call_te(_conv2d_winograd_nhwc, call.args[0], kernel, [int(p) for p in call.attrs.padding],
                      str(call.ty.dtype), primfunc_name_hint="conv2d_winograd")


def _float_value(expr: Any) -> float | None:
    value = getattr(expr, "value", None)  # a FloatImm/IntImm, or a PrimValue around one
    value = getattr(value, "value", value)
    return float(value) if isinstance(value, (int, float)) else None


def _ready_for_layout_conversion(mod: IRModule) -> IRModule:
    """Rewrite the two ops that stop ``ConvertLayout`` into ones it converts.

    ``ConvertLayout`` has no layout rule for ``clip`` (PyTorch's ReLU6, ``hardtanh``) or
    ``nn.pad``: it puts the tensor back into NCHW for them and into NHWC again after, a pair
    of transposes per occurrence, which in transformers' MobileNetV2 (TF-style padding: a zero
    ``pad`` after each ReLU6, before the next convolution) is every block (figures in
    docs/performance.md). So, before converting:

    * ``clip(x, lo, hi)`` with constant bounds becomes ``maximum(minimum(x, hi), lo)``, what
      TOPI's ``clip`` computes, as broadcasts with scalars, which follow any layout;
    * a zero ``pad`` of H and W feeding an NCHW ``conv2d`` is added to the convolution's own
      ``padding`` (the pad stays only if something else reads it).
    """
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    x, lo, hi = wildcard(), wildcard(), wildcard()
    clip = is_op("relax.clip")(x, lo, hi)
    data, weight = wildcard(), wildcard()
    pad = is_op("relax.nn.pad")(data)
    conv = is_op("relax.nn.conv2d")(pad, weight)

    def min_max(expr: relax.Expr, matches: Any) -> relax.Expr:
        low, high = _float_value(matches[lo]), _float_value(matches[hi])
        if low is None or high is None:
            return expr
        dtype = str(matches[x].ty.dtype)
        return relax.op.maximum(relax.op.minimum(matches[x], relax.const(high, dtype)), relax.const(low, dtype))

    def padded_conv(expr: relax.Expr, matches: Any) -> relax.Expr:
        p, c = matches[pad].attrs, expr.attrs
        width = [int(v) for v in p.pad_width]  # (before, after) per axis: N, C, H, W
        if (p.pad_mode != "constant" or float(p.pad_value) != 0.0 or len(width) != 8 or any(width[:4])
                or c.data_layout != "NCHW" or len(c.padding) != 4):
            return expr
        top, left, bottom, right = (int(v) for v in c.padding)
        return relax.op.nn.conv2d(
            matches[data], matches[weight], strides=c.strides,
            padding=[top + width[4], left + width[6], bottom + width[5], right + width[7]],
            dilation=c.dilation, groups=c.groups, data_layout=c.data_layout,
            kernel_layout=c.kernel_layout, out_layout=c.out_layout, out_dtype=c.out_dtype)

    mod = mod.clone()  # the caller's module stays as it was (a build reuses it for other recipes)
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            func = rewrite_call(conv, padded_conv, rewrite_call(clip, min_max, func))
            mod[gvar] = relax.analysis.remove_all_unused(func)
    return mod


def prepare_for_tuning(
    mod: IRModule,
    target: Target | Mapping[str, Any] | str,
    params: Mapping[str, Any] | None = None,
    *,
    func_name: str | None = None,
    recipe: Recipe | None = None,
) -> IRModule:
    """Lower a Relax module to fused TIR the way ``compile_relax`` does before its DB lookup.

    Parameters
    ----------
    mod : tvm.ir.IRModule
        The Relax module, e.g. from ``nn.Module.export_tvm`` or a frontend.
    target : tvm.target.Target or dict or str
        The target (legalization may depend on it).
    params : mapping of str to array, optional
        Weights to bind as constants, by parameter name (numpy arrays or TVM tensors).
    func_name : str, optional
        The Relax function to bind ``params`` to; ``"main"`` or the only one by default.
    recipe : Recipe, optional
        Layout and prepacking (default: :func:`recipe_for` the target).

    Returns
    -------
    tvm.ir.IRModule
        The module with fused PrimFuncs called through ``call_tir``, for task extraction and
        :func:`tunefleet.tvm.compile.build_with_database` (not idempotent: never feed it to
        ``compile_relax`` or to this function again).

    Raises
    ------
    ExtractionError
        If ``params`` names parameters the function does not have.
    """
    target = make_target(target) if not isinstance(target, Target) else target
    recipe = recipe_for(target) if recipe is None else recipe
    mod = prepare_for_build(mod, target, params, func_name=func_name, recipe=recipe)
    passes = [
        *_library_dispatch_passes(target),
        *([relax.transform.FastMathTransform()] if recipe.fast_math else []),
        relax.transform.LegalizeOps(customize_legalize_map=_legalize_map(recipe)),
        relax.transform.AnnotateTIROpPattern(),
        relax.transform.FoldConstant(),
        relax.transform.FuseOps(),
        relax.transform.FuseTIR(),
        *([relax.transform.AttachAttrLayoutFreeBuffers()] if recipe.prepack else []),
    ]
    with target, tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential(passes)(mod)


def _fast_gelu(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``relax.nn.gelu`` as TVM legalises it, with ``fast_erf`` for float32.

    ``FastMathTransform`` rewrites ``relax.erf`` but not ``relax.nn.gelu``, whose own
    legalisation calls ``topi.erf``: a libm call per element."""

    def gelu(x: te.Tensor) -> te.Tensor:
        half = tirx.const(0.5, x.dtype)
        return x * (half + topi.fast_erf(x * tirx.const(0.5**0.5, x.dtype)) * half)

    if str(call.ty.dtype) != "float32":  # TVM's own (it computes float16 through float32)
        return _tvm_legalization("relax.nn.gelu")(bb, call)
    return bb.call_te(gelu, call.args[0], primfunc_name_hint="gelu")


def _fast_gelu_tanh(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """``relax.nn.gelu_tanh`` as TVM legalises it, with ``fast_tanh`` for float32."""

    def gelu_tanh(x: te.Tensor) -> te.Tensor:
        half, one = tirx.const(0.5, x.dtype), tirx.const(1.0, x.dtype)
        inner = tirx.const(math.sqrt(2.0 / math.pi), x.dtype) * x * (one + tirx.const(0.044715, x.dtype) * x * x)
        return half * x * (one + topi.fast_tanh(inner))

    if str(call.ty.dtype) != "float32":
        return _tvm_legalization("relax.nn.gelu_tanh")(bb, call)
    return bb.call_te(gelu_tanh, call.args[0], primfunc_name_hint="gelu_tanh")


def _tvm_legalization(op_name: str) -> Any:
    """TVM's registered legalisation of an op."""
    return tvm.ir.Op.get(op_name).get_attr("FLegalize")


_FAST_LEGALIZE = {"relax.nn.gelu": _fast_gelu, "relax.nn.gelu_tanh": _fast_gelu_tanh}
"""The fast-math recipe's legalisations, beside ``FastMathTransform`` (softmax, exp, erf, tanh)."""


def _legalize_map(recipe: Recipe) -> dict[str, Any] | None:
    """The recipe's own legalisations: fast math, blocked and Winograd convolutions."""
    legalize = {**(_FAST_LEGALIZE if recipe.fast_math else {}),
                **({"relax.nn.conv2d": _legalize_conv2d_nchwc} if recipe.layout == "NCHWc" else {}),
                **({"relax.nn.conv2d": _legalize_conv2d_winograd} if recipe.winograd else {})}
    return legalize or None


def classify_op_kind(task_name: str, mod: IRModule | None = None) -> str:
    """A coarse operator kind for a task, from its name, else from TVM's op pattern.

    Parameters
    ----------
    task_name : str
        The MetaSchedule task name (the fused PrimFunc's name).
    mod : tvm.ir.IRModule, optional
        The task's module; when the name says nothing, ``AnnotateTIROpPattern`` classifies its
        ``main`` (``elemwise``, ``broadcast``, ``injective``, ``reduce``, ``complex``, ...).

    Returns
    -------
    str
        The kind; ``"unknown"`` when neither gives an answer.
    """
    name = task_name_key(task_name)
    for pattern, kind in _NAME_RULES:
        if re.search(pattern, name):
            return kind
    if mod is not None:
        try:
            annotated = relax.transform.AnnotateTIROpPattern()(mod)
            pattern_id = annotated["main"].attrs.get("op_pattern")
            if pattern_id is not None:
                kind = _OP_PATTERN_KIND.get(int(pattern_id), "opaque")
                return "elemwise" if kind == "broadcast" else kind
        except Exception:  # classification is best effort
            logger.debug("op pattern analysis failed for %s", task_name, exc_info=True)
    return "unknown"


def _estimate_flops(mod: IRModule, task_name: str) -> float:
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(mod))
    except Exception:  # symbolic shapes, opaque externs
        logger.warning("cannot estimate FLOPs of %s; recording 0", task_name, exc_info=True)
        return 0.0


def extract_workloads(
    mod: IRModule,
    target: Target | Mapping[str, Any] | str,
    params: Mapping[str, Any] | None = None,
    *,
    func_name: str | None = None,
    prepared: bool = False,
    recipe: Recipe | None = None,
) -> list[ExtractedWorkload]:
    """The tuning workloads of a Relax model for a target.

    Parameters
    ----------
    mod : tvm.ir.IRModule
        The Relax module (raw, or already through :func:`prepare_for_tuning` when
        ``prepared`` is true).
    target : tvm.target.Target or dict or str
        The target the tasks are for.
    params : mapping of str to array, optional
        Weights to bind as constants (see :func:`random_params`).
    func_name : str, optional
        The Relax function to bind ``params`` to.
    prepared : bool
        Skip :func:`prepare_for_tuning` (``params`` must then be None).
    recipe : Recipe, optional
        Layout and prepacking (default: :func:`recipe_for` the target).

    Returns
    -------
    list of ExtractedWorkload
        One per distinct workload, in MetaSchedule's order, with weights summed over
        duplicates.

    Raises
    ------
    ExtractionError
        If no task is found.
    """
    target = make_target(target) if not isinstance(target, Target) else target
    if prepared:
        if params:
            raise ExtractionError("params cannot be bound to an already prepared module.")
    else:
        mod = prepare_for_tuning(mod, target, params, func_name=func_name, recipe=recipe)
    tasks = ms.relax_integration.extract_tasks(mod, target)
    if not tasks:
        raise ExtractionError(
            "No tuning tasks found: the module has no call_tir to a PrimFunc after "
            "legalization and fusion (is it empty, or already built?)."
        )
    workloads: list[ExtractedWorkload] = []
    for task in tasks:
        task_mod = task.dispatched[0]
        name = str(task.task_name)
        workloads.append(
            ExtractedWorkload(
                structural_hash=workload_hash(task_mod),
                name=name,
                op_kind=classify_op_kind(name, task_mod),
                flops=_estimate_flops(task_mod, name),
                weight=int(task.weight),
                mod=task_mod,
                tir_json=tvm.ir.save_json(task_mod),
                task=task,
            )
        )
    logger.info(
        "extracted %d workloads (%d calls) for %s",
        len(workloads),
        sum(w.weight for w in workloads),
        target.kind.name,
    )
    return workloads
