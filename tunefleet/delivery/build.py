"""Building a model with the best stored schedules, and its latency report against the untuned
build and what the user would run instead.

:func:`build_model` runs six steps, each usable on its own: :func:`resolve` (load the model,
find its workloads, count what the database holds for them), :func:`compile_tuned` (build with
the database's schedules under the class's recipe), :func:`compile_others` (the same schedules
under the other recipes: the frontend's layout, with and without prepacked weights),
:func:`check` (every build against the untuned one), :func:`time_builds` (the builds alternating
with the alternatives, as the bench times them) and :func:`deliver` (export the fastest; never a
tuned build slower than the untuned one).
"""

from __future__ import annotations

import logging
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunefleet.delivery import placement
from tunefleet.delivery.best import transfer_lookup
from tunefleet.delivery.timing import ROUNDS, estimate_s, time_alternating
from tunefleet.errors import CorrectnessError, DatabaseUnavailableError, NotFoundError
from tunefleet.tvm.threads import class_threads
from tunefleet.vocab import STAGE_LOG_KEY, UNTUNED_TIMING_S

if TYPE_CHECKING:
    from tunefleet.budget import Budget
    from tunefleet.db import Database
    from tunefleet.db.tables import HardwareClass, Model
    from tunefleet.delivery.zeroshot import ZeroShotResult
    from tunefleet.models.frontends import LoadedModel
    from tunefleet.recipes import Recipe
    from tunefleet.store import ArtifactStore
    from tunefleet.tvm.extract import ExtractedWorkload

log = logging.getLogger(__name__)

SCREEN_FACTOR = 3.0
"""A build under another recipe is timed only if its first call took at most this many times the
fastest build's first call (:func:`time_builds`)."""


@dataclass
class BuildReport:
    model: str
    hardware: str
    workloads: int
    tuned_workloads: int
    default_workloads: int
    untuned_ms: float | None = None
    tuned_ms: float | None = None
    torch_ms: float | None = None
    """PyTorch eager on the same threads (None: not measured; ``notes`` says why)."""
    onnxruntime_ms: float | None = None
    """onnxruntime (every graph optimisation) on the same threads: the model as ingested (ONNX) or
    its PyTorch module exported to ONNX (None: not measured; ``notes`` says why)."""
    max_abs_diff: float | None = None
    output: str | None = None
    library_uri: str | None = None
    """Where the delivered library is in the artifact store (:func:`store_library`: the ``build``
    flow's, so that a build on a cluster node comes back); None when it was not stored."""
    threads: int = 0
    predicted_workloads: int = 0
    """Workloads built with a cost-model prediction (zero-shot), never measured on the class."""
    transferred_workloads: int = 0
    """Workloads built with a schedule measured on another, compatible class (``transfer``)."""
    hub_workloads: int = 0
    """Of ``tuned_workloads``, those whose best schedule on the class came from a hub bundle (and
    was measured on the class: a hub record alone is never built in)."""
    hub: str = ""
    """What the model's tuning on the class took from the hub, in one line
    (:meth:`tunefleet.learning.hub.HubReport.line`: ``run`` prints it)."""
    zero_shot_s_per_task: float | None = None
    verified: int = 0
    """Schedules measured here by the zero-shot verification: default schedules, borrowed ones,
    proposals and refining searches' schedules (the build takes each workload's best measured one)."""
    verified_borrowed: int = 0
    """Of ``verified``, schedules borrowed from other shapes or classes
    (:func:`tunefleet.delivery.zeroshot.borrowed_schedules`)."""
    verified_refined: int = 0
    """Of ``verified``, schedules of the searches that refine the measured best with the budget left
    after the proposals."""
    verify_budget: str | None = None
    """The zero-shot verification budget (``40`` candidates, ``1m``); None: pure prediction."""
    verify_s: float = 0.0
    """Wall time the verification took."""
    propose_s: float = 0.0
    """Wall time the proposals' searches took before the verification (a wall-time ``verify_budget``
    covers both)."""
    recipe: str = ""
    """The extraction recipe of the class's build (e.g. ``nhwc+prepack+fastmath+fold``)."""
    delivered: str = ""
    """What :func:`deliver` kept: a recipe's name, or ``"untuned"`` when every tuned build was
    slower than the untuned one. ``tuned_ms`` is its latency."""
    builds_ms: dict[str, float] = field(default_factory=dict)
    """Every build timed, by recipe name (and ``"untuned"``), in ms."""
    database_hits: int = 0
    """Fused functions built with a schedule from the database (the rest: default schedules)."""
    prepacked_weights: int = 0
    """Weight repackings moved out of the tuned kernels and run once at build time."""
    placement: dict[str, Any] = field(default_factory=dict)
    """The alternating timing's rounds split by where the threads' two CPUs sat, near or far apart
    (:func:`tunefleet.delivery.placement.by_placement`: blocks, round trip and each runtime's ms
    per placement); empty when not measured (one thread, or the probe could not run)."""
    placement_line: str = ""
    """:attr:`placement` in one line (:func:`tunefleet.delivery.placement.placement_line`)."""
    confirmed: dict[str, Any] | None = None
    """What re-timing the fastest schedules before the build did
    (:class:`tunefleet.delivery.confirm.Confirmation`; None: not re-timed)."""
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def _host_can_run(target: Any, hw: HardwareClass) -> bool:
    if target.kind.name != "llvm":
        return False
    mtriple = str(target.attrs.get("mtriple", "") or "")
    machine = platform.machine()
    if not (not mtriple or mtriple.startswith(machine) or (machine == "x86_64" and mtriple.startswith("x86_64"))):
        return False
    from tunefleet.errors import NotSupportedError
    from tunefleet.hardware import check_runs_here

    try:
        check_runs_here(hw.name, dict(hw.target))  # its code's vector features: an illegal instruction here
    except NotSupportedError:
        return False
    return True


def _cpu_note(hw: HardwareClass) -> str | None:
    """A note when the class was set up on another CPU than this one: the timings are this CPU's."""
    from tunefleet.hardware import describe_cpu, host_cpu, same_cpu

    there, here = (hw.capabilities or {}).get("cpu"), host_cpu()
    if there is None or str(hw.target.get("kind")) != "llvm" or same_cpu(there, here):
        return None
    return (f"timed on {describe_cpu(here, there)}; the class's schedules were measured on {describe_cpu(there, here)}, "
            "so they may be slower here than tuned ones would be")


def _stage(message: str, stage: str) -> None:
    """Log the build's step, naming it for ``tunefleet run``'s live line (:mod:`tunefleet.cli.progress`)."""
    log.info("%s", message, extra={STAGE_LOG_KEY: stage})


def _time_untuned(vm: Any, inputs: list[Any], one_call_s: float, rounds: int) -> float:
    """Seconds per call of the untuned build's ``main``, timed apart from the tuned build and the
    alternatives.

    The untuned build is naive loops: a call can take seconds, and its figure is only the
    reference of the speed-up. Timed with the tuned build, its calls would make every round of
    the alternating timing long. When its alternating timing (warm-up and ``rounds`` rounds,
    :func:`tunefleet.delivery.timing.estimate_s` of ``one_call_s``, its first call's time) fits in
    :data:`~tunefleet.vocab.UNTUNED_TIMING_S`, it is timed alone with
    :func:`~tunefleet.delivery.timing.time_alternating`, the tuned build's measure; else with as
    many plain calls as fit in ``UNTUNED_TIMING_S`` (the first call in :func:`check` warmed it
    up), the median of their wall times: the same measure, a wall clock around one call from
    Python, in fewer calls. When not one call fits, the first call is the figure: a second would
    cost the run more than the whole allowance (a large model's untuned call can take most of a
    short budget: docs/performance.md), and a first call's own costs (allocating the VM's
    storage) are small against the seconds of its loops.
    """
    main = vm["main"]
    if estimate_s({"untuned": one_call_s}, rounds) <= UNTUNED_TIMING_S:
        return float(time_alternating({"untuned": lambda: main(*inputs)}, rounds)["untuned"]["ms"]) / 1e3
    if one_call_s > UNTUNED_TIMING_S:
        return one_call_s
    times = []
    for _ in range(int(UNTUNED_TIMING_S / one_call_s)):
        t0 = time.perf_counter()
        main(*inputs)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@dataclass
class Resolved:
    """What :func:`resolve` found: everything the later steps of a build need.

    Attributes
    ----------
    model : tunefleet.db.tables.Model
        The stored model.
    hardware : tunefleet.db.tables.HardwareClass
        The hardware class built for.
    target : tvm.target.Target
        The class's target.
    recipe : tunefleet.recipes.Recipe
        The class's extraction recipe; the tuned build looks its records up under it.
    loaded : tunefleet.models.frontends.LoadedModel
        The model imported into Relax (module, weights, inputs, PyTorch module if any).
    found : list of tunefleet.tvm.extract.ExtractedWorkload
        The model's workloads under ``recipe``.
    tuned : int
        Workloads of ``found`` with a measurement on the class.
    predicted : int
        Workloads built from a cost-model prediction (zero-shot; 0 otherwise).
    zero_shot : tunefleet.delivery.zeroshot.ZeroShotResult or None
        What zero-shot did, or None when the build is not zero-shot.
    report : BuildReport
        The report the later steps fill in.
    workload_ids : frozenset of int
        The stored ids of ``found``'s workloads.
    load_s : float
        Seconds spent loading and extracting the model (about 0 when a pipeline kept it:
        :mod:`tunefleet.models.kept`).
    """

    model: Model
    hardware: HardwareClass
    target: Any
    recipe: Recipe
    loaded: LoadedModel
    found: list[ExtractedWorkload]
    tuned: int
    predicted: int
    zero_shot: ZeroShotResult | None
    report: BuildReport
    workload_ids: frozenset[int] = frozenset()
    load_s: float = 0.0


@dataclass
class Checked:
    """The two builds :func:`check` ran, loaded and ready for :func:`time_builds`.

    Attributes
    ----------
    dev : tvm.runtime.Device
        The device both run on (the host CPU).
    inputs_np : list of numpy.ndarray
        The random inputs (seed 0), as numpy arrays (what the alternatives are timed on).
    inputs : list of tvm.runtime.Tensor
        The same inputs on ``dev``.
    vms : dict of str to relax.VirtualMachine
        ``"tuned"`` (the class's recipe), ``"untuned"``, and one per other recipe built
        (:func:`compile_others`), keyed by the recipe's name.
    first_call_s : dict of str to float
        Seconds of each VM's first call, by the same keys.
    executables : dict of str to tvm.relax.VMExecutable
        The builds, by the same keys (what :func:`deliver` exports).
    """

    dev: Any
    inputs_np: list[Any]
    inputs: list[Any]
    vms: dict[str, Any]
    first_call_s: dict[str, float]
    executables: dict[str, Any] = field(default_factory=dict)


def resolve(
    db: Database,
    store: ArtifactStore,
    model: Model,
    hardware: str,
    *,
    zero_shot: bool = False,
    top_k: int = 5,
    verify: Budget | int | None = None,
    tuner: Any = None,
    pretrained: bool = True,
    confirm_top: int = 0,
) -> Resolved:
    """Load a stored model, find its workloads under the class's recipe and count what the
    database holds for them; start the build's report.

    Parameters
    ----------
    db : tunefleet.db.Database
        The database.
    store : tunefleet.store.ArtifactStore
        The artifact store holding the model (and the cost model, with ``zero_shot``).
    model : tunefleet.db.tables.Model
        The stored model.
    hardware : str
        The hardware class to build for.
    zero_shot : bool
        Store the workloads and predict schedules for those never measured on the class
        (:func:`tunefleet.delivery.zeroshot.predict_workloads`).
    top_k : int
        Predictions stored per workload (``zero_shot``).
    verify : Budget, int or None
        Predictions measured on this node, in all: candidates or wall time, heaviest workloads'
        best-scored first (``zero_shot``; an int is a candidate count, None or 0 none).
    tuner : object, optional
        Passed to ``predict_workloads`` (``zero_shot``).
    pretrained : bool
        Without a promoted cost model of the class, predict with the shipped one (``zero_shot``).
    confirm_top : int
        Before the bests are counted, re-time each workload's this many fastest schedules side by
        side on this node, so the build takes the fastest re-timed one
        (:func:`tunefleet.delivery.confirm.confirm_bests`; below 2, or a class this host cannot
        run: nothing re-timed).

    Returns
    -------
    Resolved

    Raises
    ------
    tunefleet.errors.NotSupportedError
        ``zero_shot`` and the class has no current cost model (before any other work).
    """
    from tunefleet.models.kept import extracted
    from tunefleet.models.workloads import class_recipe
    from tunefleet.tvm.targets import make_target

    hw = db.hardware_class(hardware)
    target = make_target(hw.target)
    recipe = class_recipe(hw)
    _stage(f"building {model.name} for {hardware} with the best schedules", "building the tuned model")
    if zero_shot:
        from tunefleet.delivery.zeroshot import predict_workloads, require_model

        cost_model = require_model(db, store, hardware, pretrained=pretrained)  # before any work: one line if none
    loading = time.perf_counter()
    loaded, found = extracted(db, store, model, target, recipe)  # a pipeline's extract step's, when it kept them
    load_s = time.perf_counter() - loading
    zs = None
    if zero_shot:
        weights: dict[int, int] = {}
        flops: dict[int, float] = {}
        for w in found:  # a model never extracted for this class gets its workloads stored first
            row, _ = db.add_workload(structural_hash=w.structural_hash, name=w.name, op_kind=w.op_kind,
                                     flops=float(w.flops), tir_json=w.tir_json)
            weights[row.id] = weights.get(row.id, 0) + int(w.weight)
            flops[row.id] = float(w.flops)
        db.set_model_workloads(model.id, hw.id, recipe.name, weights)
        heaviest = sorted(weights, key=lambda i: -flops[i] * weights[i])  # verification's budget goes there first
        zs = predict_workloads(db, store, hardware, heaviest, top_k=top_k, verify=verify, tuner=tuner,
                               model=cost_model, weights=weights)
    calls: dict[int, int] = {}
    for w in found:
        try:
            wl_id = db.workload(w.structural_hash).id
        except NotFoundError:
            continue
        calls[wl_id] = calls.get(wl_id, 0) + int(w.weight)
    confirmation = None
    if confirm_top >= 2 and _host_can_run(target, hw):
        from tunefleet.delivery.confirm import confirm_bests

        _stage(f"re-timing the {confirm_top} fastest schedules of each workload side by side",
               "re-timing the fastest schedules")
        confirmation = confirm_bests(db, hw, calls, top=confirm_top)
    from tunefleet.db.measurements import PAIRED_MODE
    from tunefleet.tvm.partition import PREFER_DEPTH, PREFER_WITHIN, ordered_for_build, splits_by_tile

    paired = 0
    if _host_can_run(target, hw):
        from tunefleet.delivery.confirm import confirm_by_tile

        paired = confirm_by_tile(db, hw, calls)

    tuned, bests, ids, threads = 0, set(), list(calls), class_threads(hw.target)
    winograd = by_tile = won = preferred = 0
    for wl_id in ids:
        order = ordered_for_build(db, wl_id, hw.id, threads, PREFER_DEPTH)
        if order:
            chosen = order[0]
            tuned += 1
            bests.add((wl_id, chosen.trace_sha256))
            split = splits_by_tile(chosen.trace_json)
            winograd, by_tile = winograd + (split is not None), by_tile + bool(split)
            if split and (chosen.measure_mode or "").startswith(f"{PAIRED_MODE}:"):
                won += 1
            elif split and chosen.mean_run_s > min(r.mean_run_s for r in order):
                preferred += 1
    predicted = 0 if zs is None else sum(w.status in ("predicted", "cached") and w.proposals > 0 for w in zs.workloads)
    report = BuildReport(model.name, hardware, len(found), tuned, len(found) - tuned - predicted,
                         threads=threads,
                         predicted_workloads=predicted, recipe=recipe.name)
    if winograd:
        report.notes.append(f"{by_tile} of {winograd} Winograd workloads run a schedule whose threads keep their own "
                            f"tiles ({won} of them at most {PREFER_WITHIN:.0%} slower than the fastest record that "
                            f"hands data between the threads, the two timed side by side; {preferred} within "
                            f"{PREFER_WITHIN:.0%} of it as tuned)"
                            + (f"; {paired} such pair(s) timed just now" if paired else ""))
    if confirmation is not None:
        report.confirmed = confirmation.as_dict()
        report.notes.append(confirmation.summary())
    if zs is not None:
        report.zero_shot_s_per_task = zs.seconds_per_task
        report.verified = sum(w.verified for w in zs.workloads)
        report.verified_borrowed = sum(w.borrowed for w in zs.workloads)
        report.verified_refined = sum(w.refined for w in zs.workloads)
        report.verify_budget, report.verify_s = zs.verify_budget, zs.verify_seconds
        report.propose_s = zs.search_seconds
    _hub_provenance(db, report, bests, ids, hw.id)
    return Resolved(model, hw, target, recipe, loaded, found, tuned, predicted, zs, report, frozenset(calls), load_s)


def _hub_provenance(db: Database, report: BuildReport, bests: set[tuple[int, str]], workload_ids: list[int],
                    hardware_class_id: int) -> None:
    """What tuning took from the hub, and the workloads whose best schedule here came from a hub
    bundle (measured here too)."""
    from tunefleet.learning.hub import describe_hub_class, hub_report

    report.hub = hub_report(db, workload_ids, hardware_class_id).line()

    origins = db.hub_origins({wl_id for wl_id, _ in bests})
    mine = [origins[key] for key in bests if key in origins]
    report.hub_workloads = len(mine)
    if mine:
        sources = sorted({describe_hub_class(name, caps) for name, caps in mine})
        report.notes.append(f"{len(mine)} of {report.tuned_workloads} tuned workloads run a schedule from the hub "
                            f"(tuned as {'; '.join(sources)}), measured on this class before it was chosen")


def compile_tuned(db: Database, resolved: Resolved, *, output: str | Path | None = None,
                  transfer: bool = False) -> Any:
    """Build the model with the database's schedules for its class; export it to ``output``.

    A zero-shot build (``resolved.zero_shot`` set) also takes the cost model's predictions. The
    report gets the database hits, the weights prepacked at build time, the transferred
    workloads, and a note when fewer workloads found a schedule than the database holds.

    Parameters
    ----------
    db : tunefleet.db.Database
        The database.
    resolved : Resolved
        What :func:`resolve` found; its ``report`` is filled in.
    output : str or pathlib.Path, optional
        Where to export the built library (its folder is created).
    transfer : bool
        Workloads without a measurement (or prediction) take the best schedule of the most
        compatible class that builds for this one (:mod:`tunefleet.planning.transfer`).

    Returns
    -------
    tvm.relax.VMExecutable
        The tuned build.
    """
    report, hardware = resolved.report, resolved.hardware.name
    t0 = time.perf_counter()
    built, fleet_db = _build_under(db, resolved, resolved.recipe, transfer=transfer)
    report.database_hits, report.prepacked_weights = len(built.hits), built.prepacked
    if built.preproc_left:
        report.notes.append(f"{built.preproc_left} weight repacking(s) left in main: they run on every call")
    report.transferred_workloads = sum(v is not None for v in fleet_db.transferred.values())
    report.default_workloads -= report.transferred_workloads
    for wl_id, found_t in fleet_db.transferred.items():
        if found_t is not None:
            log.info("workload %d on %s: schedule transferred from %s", wl_id, hardware, found_t.source_hardware)
    expected = resolved.tuned + resolved.predicted + report.transferred_workloads
    if report.database_hits < expected:
        # A measured workload the build did not find is a key mismatch, not a tuning result: say it.
        report.notes.append(f"{expected - report.database_hits} workload(s) with schedules in the database were "
                            "built with the default schedule (no record matched at build time)")
        log.warning("build of %s for %s: %d database hits for %d workloads with schedules", resolved.model.name,
                    hardware, report.database_hits, expected)
    log.info("tuned build of %s for %s in %.1fs (%d database hits)", resolved.model.name, hardware,
             time.perf_counter() - t0, report.database_hits)
    if output is not None:
        _export(built.executable, output, report)
    return built.executable


def _build_under(db: Database, resolved: Resolved, recipe: Recipe, *, transfer: bool = False,
                 unless_only: frozenset[int] | None = None) -> tuple[Any, Any]:
    """The model built under ``recipe`` with the class's stored schedules: (BuildResult, the
    FleetDatabase it looked them up in). With ``unless_only`` (workload ids), the BuildResult is
    None, and nothing compiled, when the stored schedules found are all for those workloads."""
    from tunefleet.tvm.bridge import FleetDatabase
    from tunefleet.tvm.compile import build_with_database

    hardware, loaded = resolved.hardware.name, resolved.loaded
    fleet_db = FleetDatabase(db, hardware, with_predictions=resolved.zero_shot is not None,
                             transfer=transfer_lookup(db, hardware) if transfer else None)
    build_if = None if unless_only is None else (lambda _hits: bool(fleet_db.answered - unless_only))
    return build_with_database(loaded.mod, resolved.target, fleet_db, params=loaded.params, recipe=recipe,
                               build_if=build_if), fleet_db


def _export(executable: Any, output: str | Path, report: BuildReport) -> None:
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    executable.export_library(str(out))
    report.output = str(out)


def other_recipes(resolved: Resolved) -> list[Recipe]:
    """The recipes the build compares with the class's: direct convolutions when the class's are
    Winograd (schedules from a hub or from before the class turned Winograd on are for direct
    ones), the frontend's layout with the class's prepacking, and without prepacking — those the
    class's recipe is not already. Both layout-dependent ones are left out for a model without a
    2-D convolution (they change nothing there), the direct one for a model without a convolution
    Winograd applies to (its workloads are the class's own)."""
    from dataclasses import replace

    from tunefleet.tvm.extract import conv2d_calls, has_winograd_convolution

    recipe = resolved.recipe
    out = []
    layout_matters = recipe.layout is not None and bool(conv2d_calls(resolved.loaded.mod))
    if recipe.winograd and layout_matters and has_winograd_convolution(resolved.loaded.mod):
        out.append(replace(recipe, winograd=False))
    if layout_matters:
        out.append(replace(recipe, layout=None, winograd=False))
    if recipe.prepack:
        out.append(replace(out[-1] if layout_matters else recipe, prepack=False))
    return out


def compile_others(db: Database, resolved: Resolved, *, transfer: bool = False) -> dict[str, Any]:
    """Build the model under :func:`other_recipes` with the schedules already stored (nothing is
    tuned for them: a workload without a record keeps its default schedule).

    A recipe the class did not tune for can still win on a model: a single convolution whose
    input and output transposes cost more than the NHWC kernel saves, or weights whose packing
    was never tuned. :func:`deliver` keeps the fastest. A recipe with no stored schedule of its
    own — none, or only for workloads it shares with the class's recipe (a classifier's matmul) —
    is not compiled (one note names them): it would run its layout's kernels on default
    schedules, which the untuned build :func:`check` always makes stands for. That is the usual
    case (a class tunes under its own recipe only), and code generation is one of a build's
    largest steps.

    Returns
    -------
    dict of str to tvm.relax.VMExecutable
        The builds by recipe name.
    """
    out, skipped = {}, []
    for recipe in other_recipes(resolved):
        t0 = time.perf_counter()
        built, _ = _build_under(db, resolved, recipe, transfer=transfer, unless_only=resolved.workload_ids)
        if built is None:
            skipped.append(recipe.name)
            log.info("build of %s under %s not made (%.1fs): no stored schedule of its own", resolved.model.name,
                     recipe.name, time.perf_counter() - t0)
            continue
        log.info("build of %s under %s in %.1fs (%d database hits)", resolved.model.name, recipe.name,
                 time.perf_counter() - t0, len(built.hits))
        out[recipe.name] = built.executable
    if skipped:
        resolved.report.notes.append(f"not built under recipe {', '.join(skipped)}: no stored schedule of its own "
                                     "(its kernels would run default schedules, which the untuned build stands for)")
    return out


def check(resolved: Resolved, tuned_exec: Any, others: dict[str, Any] | None = None) -> Checked:
    """Build the untuned reference, run it, the tuned build and the ``others``
    (:func:`compile_others`) once on the same random inputs, and compare their outputs.

    The reference is the model as given (no layout conversion, no prepacking), so the recipe's
    rewrites are checked too. The report gets the largest absolute difference.

    Parameters
    ----------
    resolved : Resolved
        What :func:`resolve` found; its ``report`` is filled in.
    tuned_exec : tvm.relax.VMExecutable
        The tuned build (:func:`compile_tuned`), for the host CPU.
    others : dict of str to tvm.relax.VMExecutable, optional
        The builds under other recipes, by recipe name.

    Returns
    -------
    Checked
        Both builds loaded, their inputs and first-call times, for :func:`time_builds`.

    Raises
    ------
    tunefleet.errors.CorrectnessError
        An output of a tuned build is not close to the untuned one's.
    """
    import numpy as np
    import tvm
    from tvm import relax

    from tunefleet.tvm.extract import prepare_for_build
    from tunefleet.tvm.threads import use_threads

    model, loaded, target, report = resolved.model, resolved.loaded, resolved.target, resolved.report
    _stage(f"checking {model.name}'s tuned build against the untuned one and timing both",
           "checking and timing the tuned model")
    report.threads = use_threads(report.threads)  # the class's cores, as the alternatives get them
    untuned_exec = tvm.compile(prepare_for_build(loaded.mod, target, loaded.params), target=target)
    dev = tvm.cpu()
    inputs_np = loaded.random_inputs(seed=0)
    inputs = [tvm.runtime.tensor(x, dev) for x in inputs_np]
    executables = {"tuned": tuned_exec, **(others or {}), "untuned": untuned_exec}
    vms = {k: relax.VirtualMachine(exe, dev) for k, exe in executables.items()}
    outs, first_call_s = {}, {}
    for k, vm in vms.items():
        t0 = time.perf_counter()
        outs[k] = _to_numpy(vm["main"](*inputs))
        first_call_s[k] = time.perf_counter() - t0
    for k in executables:
        if k == "untuned":
            continue
        diffs = [float(np.max(np.abs(a - b))) if a.size else 0.0 for a, b in zip(outs[k], outs["untuned"], strict=True)]
        max_diff = max(diffs) if diffs else 0.0
        report.max_abs_diff = max(report.max_abs_diff or 0.0, max_diff)
        for a, b in zip(outs[k], outs["untuned"], strict=True):
            scale = max(1.0, float(np.max(np.abs(b)))) if b.size else 1.0
            if not np.allclose(a, b, rtol=1e-3, atol=1e-3 * scale):
                which = "tuned build" if k == "tuned" else f"build under recipe {k}"
                raise CorrectnessError(
                    f"{which} of {model.name} disagrees with the untuned build (max abs diff {max_diff:.3g}); "
                    "a stored schedule is wrong for this model — report it"
                )
    return Checked(dev, inputs_np, inputs, vms, first_call_s, executables)


def time_builds(store: ArtifactStore, resolved: Resolved, checked: Checked, *, rounds: int = ROUNDS,
                compare_torch: bool = True) -> None:
    """Time the builds and, with ``compare_torch``, what the user would run instead on the same
    threads, in one alternating timing; the untuned build with them, or apart when its calls are
    slow. The figures (ms) and notes go to ``resolved.report``.

    The builds (``vm["main"](*inputs)``), PyTorch eager and onnxruntime (the calls of
    :func:`tunefleet.delivery.alternatives.calls`) are timed together by
    :func:`tunefleet.delivery.timing.time_alternating`, the function ``bench/versus_alternatives.py``
    times them with: ``rounds`` rounds whose order rotates, a wall clock around each call from
    Python; on two threads or more, where the threads' CPUs sat is read after each block
    (:mod:`tunefleet.delivery.placement`) and ``report.placement`` / ``report.placement_line``
    split the rounds by it. The untuned build joins them when its timing would fit in
    :data:`~tunefleet.vocab.UNTUNED_TIMING_S`; else it is timed afterwards, alone
    (:func:`_time_untuned`: its calls can take seconds; it is only the speed-up's reference).
    A build under another recipe whose first call (in :func:`check`) took more than
    :data:`SCREEN_FACTOR` times the fastest build's cannot win and is not timed (its stored
    schedules did not cover it: default schedules run seconds where tuned ones run milliseconds);
    a note gives its first call.

    Parameters
    ----------
    store : tunefleet.store.ArtifactStore
        The artifact store (the model's ONNX bytes, for a model ingested as ONNX).
    resolved : Resolved
        What :func:`resolve` found; its ``report`` is filled in.
    checked : Checked
        The builds :func:`check` ran.
    rounds : int
        Rounds of the alternating timing (:data:`tunefleet.delivery.timing.ROUNDS`, the bench's
        default, by default).
    compare_torch : bool
        Also time PyTorch eager and onnxruntime.
    """
    report, vms, inputs, first = resolved.report, checked.vms, checked.inputs, checked.first_call_s
    untuned_alone = estimate_s({"untuned": first["untuned"]}, rounds) > UNTUNED_TIMING_S
    fastest = min(first.values())
    screened = [k for k in vms if k not in ("tuned", "untuned") and first[k] > SCREEN_FACTOR * fastest]
    for k in screened:
        report.notes.append(f"the build under recipe {k} was not timed: its first call took {first[k] * 1e3:.3f} ms, "
                            f"{first[k] / fastest:.0f}x the fastest build's")
    timed: dict[str, Any] = {k: _call(vm, inputs) for k, vm in vms.items()
                             if k not in screened and (k != "untuned" or not untuned_alone)}
    if compare_torch:
        from tunefleet.delivery import alternatives

        model = resolved.model
        _stage(f"timing {model.name} against what the user would run instead",
               "timing PyTorch eager and onnxruntime")
        onnx_bytes = store.get_bytes(store.key_from_uri(model.artifact_uri)) if model.format == "onnx" else None
        sandboxed = model.source != "zoo" and model.format != "onnx" and resolved.loaded.torch_module is None
        alt_calls, notes = alternatives.calls(
            checked.inputs_np, report.threads, torch_module=resolved.loaded.torch_module, onnx_bytes=onnx_bytes,
            no_module=("a .pt2 file is untrusted input, parsed only in a child process that holds no secrets; its "
                       "PyTorch module is not loaded into this one" if sandboxed else None))
        timed.update(alt_calls)
        report.notes += notes
    probe = placement.probe_for(report.threads)
    latency = time_alternating(timed, rounds, between=probe)
    report.placement, report.placement_line = placement.split_timing(
        latency, probe, [("tuned", "tuned"), ("torch", "eager"), ("onnxruntime", "onnxruntime")])
    report.tuned_ms = latency["tuned"]["ms"]
    report.torch_ms = latency.get("torch", {}).get("ms")
    report.onnxruntime_ms = latency.get("onnxruntime", {}).get("ms")
    report.untuned_ms = (_time_untuned(vms["untuned"], inputs, checked.first_call_s["untuned"], rounds) * 1e3
                         if untuned_alone else latency["untuned"]["ms"])
    report.builds_ms = {(resolved.recipe.name if k == "tuned" else k): latency[k]["ms"] for k in vms
                        if k != "untuned" and k not in screened}
    report.builds_ms["untuned"] = report.untuned_ms


def _call(vm: Any, inputs: list[Any]) -> Any:
    main = vm["main"]
    return lambda: main(*inputs)


def deliver(resolved: Resolved, checked: Checked, *, output: str | Path | None = None) -> str:
    """Keep the fastest build :func:`time_builds` timed and export it to ``output``; say which and
    why. A tuned build slower than the untuned one is never delivered: when every tuned build
    is, the untuned build is, and the report says so.

    Returns
    -------
    str
        What was delivered: a recipe's name, or ``"untuned"`` (also ``report.delivered``).
    """
    report = resolved.report
    by_key = {(resolved.recipe.name if k == "tuned" else k): k for k in checked.executables}
    tuned = {name: ms for name, ms in report.builds_ms.items() if name != "untuned"}
    best = min(tuned, key=tuned.__getitem__)
    untuned_ms = report.builds_ms["untuned"]
    chosen = "untuned" if untuned_ms < tuned[best] else best
    report.delivered, report.tuned_ms = chosen, report.builds_ms[chosen]
    side_by_side = ", ".join(f"{name} {ms:.3f} ms" for name, ms in sorted(report.builds_ms.items(), key=lambda kv: kv[1]))
    if chosen == "untuned":
        report.notes.append(f"delivered the UNTUNED build: every tuned build was slower ({side_by_side}, timed "
                            "side by side); tune longer, or the model's layout conversion costs more than it saves")
        log.warning("build of %s for %s: every tuned build slower than the untuned one (%s)", resolved.model.name,
                    resolved.hardware.name, side_by_side)
    elif chosen != resolved.recipe.name:
        report.notes.append(f"delivered the build under recipe {chosen}, not the class's {resolved.recipe.name}: "
                            f"it was the fastest ({side_by_side}, timed side by side)")
    if output is not None:
        _export(checked.executables[by_key[chosen]], output, report)
    return chosen


def build_model(
    db: Database,
    store: ArtifactStore,
    model: Model,
    hardware: str,
    *,
    output: str | Path | None = None,
    rounds: int = ROUNDS,
    compare_torch: bool = True,
    zero_shot: bool = False,
    top_k: int = 5,
    verify: Budget | int | None = None,
    tuner: Any = None,
    transfer: bool = False,
    pretrained: bool = True,
    confirm_top: int = 0,
) -> BuildReport:
    """Compile a model with the best stored schedules, under the class's recipe and the others
    (:func:`other_recipes`); check them against the untuned build; time them and, with
    ``compare_torch``, what the user would run instead (PyTorch eager, onnxruntime:
    :mod:`tunefleet.delivery.alternatives`) side by side on the same threads; deliver the fastest
    (never a tuned build slower than the untuned one).

    Workloads without a measurement keep the default schedule; the report says how many. With
    ``zero_shot``, they get the current cost model's best prediction instead
    (:func:`tunefleet.delivery.zeroshot.predict_workloads`, which stores ``top_k`` each and measures
    them on this node within the ``verify`` budget, heaviest workloads first: a workload measured
    so is built with its best measured schedule). With ``transfer``, the remaining ones get the best schedule
    of the most compatible class that builds for this one (:mod:`tunefleet.planning.transfer`).

    The steps: :func:`resolve`, :func:`compile_tuned`, :func:`compile_others`, :func:`check`,
    :func:`time_builds`, :func:`deliver`; for a target this host cannot run, the class's recipe is
    built (and exported) only. A build that compared the alternatives notes how long it took on
    the model, loading and extracting it left out (``Database.note_step_seconds``: the next
    ``run`` keeps that much time for it; its build takes the model its extract step kept).

    Parameters
    ----------
    db : tunefleet.db.Database
        The database.
    store : tunefleet.store.ArtifactStore
        The artifact store.
    model : tunefleet.db.tables.Model
        The stored model.
    hardware : str
        The hardware class to build for.
    output : str or pathlib.Path, optional
        Where to export the delivered library.
    rounds : int
        Rounds of the alternating timing (see :func:`time_builds`).
    compare_torch : bool
        Also time PyTorch eager and onnxruntime.
    zero_shot, top_k, verify, tuner, pretrained :
        Zero-shot predictions (see :func:`resolve`).
    transfer : bool
        Borrow schedules from compatible classes (see :func:`compile_tuned`).
    confirm_top : int
        Re-time each workload's this many fastest schedules first (see :func:`resolve`).

    Returns
    -------
    BuildReport

    Raises
    ------
    tunefleet.errors.CorrectnessError
        The tuned build's outputs disagree with the untuned build's.
    """
    from tunefleet.tvm.extract import reusing_folded_weights

    started = time.perf_counter()
    with reusing_folded_weights():  # the extraction and every recipe's compile fold the weights once
        resolved = resolve(db, store, model, hardware, zero_shot=zero_shot, top_k=top_k, verify=verify, tuner=tuner,
                           pretrained=pretrained, confirm_top=confirm_top)
        report = resolved.report
        if not _host_can_run(resolved.target, resolved.hardware):
            compile_tuned(db, resolved, output=output, transfer=transfer)
            report.delivered = resolved.recipe.name
            report.notes.append(f"not run: target {resolved.target.kind.name} {resolved.hardware.target} "
                                "cannot run on this host (the class's recipe was built, not compared with others)")
            return report
        tuned_exec = compile_tuned(db, resolved, transfer=transfer)
        others = compile_others(db, resolved, transfer=transfer)
    checked = check(resolved, tuned_exec, others)
    time_builds(store, resolved, checked, rounds=rounds, compare_torch=compare_torch)
    note = _cpu_note(resolved.hardware)
    if note is not None:
        report.notes.append(note)
    deliver(resolved, checked, output=output)
    if compare_torch and not zero_shot:  # the build `run` makes: the next run's planner keeps this much time for it
        # less loading and extracting the model, which the build of a run takes from its extract step
        took = time.perf_counter() - started - resolved.load_s
        try:
            db.note_step_seconds(model.id, resolved.hardware.id, "build", took)
        except DatabaseUnavailableError as exc:  # a bookkeeping note fails no delivered build
            log.warning("build of %s for %s took %.0f s; not noted for the next run's planning: %s", model.name,
                        resolved.hardware.name, took, exc)
    return report


def store_library(store: ArtifactStore, path: str | Path, model: str, hardware: str) -> str:
    """Put a built library into the artifact store, once per content
    (``builds/<model>-<class>/<sha256[:2]>/<sha256>.so``); its URI. ``tunefleet gc`` never deletes it."""
    import re

    prefix = "builds/" + re.sub(r"[^a-z0-9._-]+", "-", f"{model}-{hardware}".lower())
    with open(path, "rb") as f:
        key, _ = store.put_content_addressed(f, prefix=prefix, suffix=".so", content_type="application/octet-stream")
    return store.uri(key)


def _to_numpy(out: Any) -> list[Any]:
    import numpy as np

    if hasattr(out, "numpy"):
        return [out.numpy()]
    if isinstance(out, (list, tuple)) or hasattr(out, "__len__"):
        flat: list[Any] = []
        for item in out:
            flat += _to_numpy(item)
        return flat
    return [np.asarray(out)]
