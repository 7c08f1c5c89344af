"""Build a Relax model with the schedules a MetaSchedule database holds, whatever the recipe.

TVM's ``ms.relax_integration.compile_relax`` goes from ``FuseTIR`` straight to
``MetaScheduleApplyDatabase``. It cannot build the records of a recipe with weight prepacking
(:class:`tunefleet.tvm.extract.Recipe`): those workloads carry the ``layout_free_buffers``
attribute, so they must be looked up after ``AttachAttrLayoutFreeBuffers``, and their schedules
repack weights inside the kernel until ``SplitLayoutRewritePreproc`` moves the repacking into
``main``. :func:`build_with_database` runs the one pipeline that finds every record tunefleet
stores:

1. :func:`tunefleet.tvm.extract.prepare_for_tuning` (bind weights, decompose, the recipe's
   layout conversion, legalize, fuse, mark layout-free buffers) - the workloads as extracted;
2. ``MetaScheduleApplyDatabase`` - a fused PrimFunc with a record gets its best schedule;
3. with prepacking, ``SplitLayoutRewritePreproc`` then ``FoldConstant``: weights are bound
   constants, so the repacking runs once, at build time (``LiftTransformParams`` is not needed,
   and the built library takes the model's inputs only);
4. on GPU targets, DLight's default schedules for what the database did not cover;
5. the target's dataflow-lowering and finalizing passes (as ``relax.build`` runs them).

TVM users can call it with any database (``ms.database.JSONDatabase`` from
``tunefleet export-db``, or :func:`tunefleet.delivery.best.metaschedule_database`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import relax
from tvm.ir import IRModule
from tvm.target import Target

from tunefleet.tvm.extract import Recipe, prepare_for_tuning, recipe_for
from tunefleet.tvm.targets import make_target

log = logging.getLogger(__name__)

__all__ = ["BuildResult", "build_with_database", "scheduled_functions"]

_SCHEDULED = "tirx.is_scheduled"


@dataclass
class BuildResult:
    """A built model and what the database gave it."""

    executable: Any
    """The ``relax.VMExecutable`` (``export_library``, ``relax.VirtualMachine``)."""
    recipe: Recipe
    functions: int
    """Fused PrimFuncs the model calls (workloads, counted once each)."""
    hits: list[str]
    """Names of the PrimFuncs built with a schedule from the database."""
    prepacked: int
    """Weight repackings ``SplitLayoutRewritePreproc`` moved out of tuned kernels."""
    preproc_left: int
    """Weight-repacking calls left in ``main`` after ``FoldConstant`` (0: every repacking ran
    once, at build time; else weights would be repacked on every call)."""

    @property
    def misses(self) -> int:
        return self.functions - len(self.hits)


def scheduled_functions(mod: IRModule) -> list[str]:
    """Names of the PrimFuncs ``MetaScheduleApplyDatabase`` gave a schedule (sorted)."""
    return sorted(gv.name_hint for gv, f in mod.functions.items()
                  if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and int(f.attrs.get(_SCHEDULED, 0)) == 1)


def _prim_funcs(mod: IRModule) -> list[str]:
    return [gv.name_hint for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]


def _preproc_calls(mod: IRModule) -> int:
    """call_tir's in Relax functions whose callee is a layout-rewrite preprocessing PrimFunc."""
    # SplitLayoutRewritePreproc names each split-out repacking "<kernel>_weight_prepack".
    preproc = {gv for gv in mod.get_global_vars() if gv.name_hint.endswith("_weight_prepack")}
    count = 0

    def visit(expr: Any) -> None:
        nonlocal count
        if isinstance(expr, relax.Call) and expr.args and isinstance(expr.args[0], tvm.ir.GlobalVar):
            count += expr.args[0] in preproc

    for f in mod.functions.values():
        if isinstance(f, relax.Function):
            relax.analysis.post_order_visit(f, visit)
    return count


def _lowering_passes(target: Target) -> list[Any]:
    """The target's dataflow-lowering and finalizing passes, with compile_relax's fallback: TVM
    0.27's ``relax.pipeline.dataflow_lower_passes`` raises AttributeError for CPU targets."""
    try:
        return [*relax.pipeline.dataflow_lower_passes(target), *relax.pipeline.finalize_passes(target)]
    except (ValueError, AttributeError):
        t = relax.transform
        return [t.RewriteDataflowReshape(), t.ToNonDataflow(), t.RemovePurityChecking(), t.CallTIRRewrite(),
                t.StaticPlanBlockMemory(), t.LowerAllocTensor(), t.KillAfterLastUse(), t.LowerRuntimeBuiltin(),
                t.ComputePrimValue(), t.VMShapeLower(), t.AttachGlobalSymbol()]


def build_with_database(
    mod: IRModule,
    target: Target | Mapping[str, Any] | str,
    database: Any,
    *,
    params: Mapping[str, Any] | None = None,
    recipe: Recipe | None = None,
    func_name: str | None = None,
    build_if: Callable[[list[str]], bool] | None = None,
) -> BuildResult | None:
    """Build a Relax model with a database's schedules (see the module docstring).

    Parameters
    ----------
    mod : tvm.ir.IRModule
        The model as the frontend gave it (weights bound or given as ``params``).
    target : tvm.target.Target or dict or str
        The target; the database must hold records for this target's hardware class.
    database : tvm.s_tir.meta_schedule.Database
        Any MetaSchedule database.
    params : mapping of str to array, optional
        Weights to bind as constants, by parameter name.
    recipe : Recipe, optional
        The recipe the records were extracted under (default: :func:`recipe_for` the target).
    func_name : str, optional
        The Relax function ``params`` belong to.
    build_if : callable, optional
        Asked, once the database's schedules are applied and before the costly code generation,
        with the names of the functions the database scheduled: False returns None, no build.

    Returns
    -------
    BuildResult or None
        None only when ``build_if`` said no.
    """
    target = make_target(target) if not isinstance(target, Target) else target
    recipe = recipe_for(target) if recipe is None else recipe
    fused = prepare_for_tuning(mod, target, params, func_name=func_name, recipe=recipe)
    functions = len(_prim_funcs(fused))
    is_gpu = relax.pipeline.BackendDispatcher.is_gpu_target(target)
    with target, database, tvm.transform.PassContext(opt_level=3):
        applied = relax.transform.MetaScheduleApplyDatabase()(fused)
        hits = scheduled_functions(applied)
        if build_if is not None and not build_if(hits):
            return None
        prepacked = 0
        if recipe.prepack:
            applied = relax.transform.SplitLayoutRewritePreproc()(applied)
            prepacked = _preproc_calls(applied)
            applied = relax.transform.FoldConstant()(applied)
        preproc_left = _preproc_calls(applied)
        if is_gpu:
            from tvm.s_tir import dlight as dl

            applied = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                              dl.gpu.GeneralReduction(), dl.gpu.Fallback())(applied)
        lower = _lowering_passes(target)
        executable = relax.build(applied, target=target, relax_pipeline=tvm.transform.Sequential(lower))
    log.info("built with %d of %d functions from the database (recipe %s)", len(hits), functions, recipe.name)
    return BuildResult(executable, recipe, functions, hits, prepacked, preproc_left)
