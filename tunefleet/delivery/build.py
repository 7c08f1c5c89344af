"""Building a model with the best stored schedules, and its latency report against the untuned
build and what the user would run instead.
"""

from __future__ import annotations

import logging
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunefleet.delivery.best import transfer_lookup
from tunefleet.errors import CorrectnessError, NotFoundError
from tunefleet.vocab import STAGE_LOG_KEY, UNTUNED_TIMING_S

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.db.tables import Model
    from tunefleet.store import ArtifactStore

log = logging.getLogger(__name__)


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
    threads: int = 0
    predicted_workloads: int = 0
    """Workloads built with a cost-model prediction (zero-shot), never measured on the class."""
    transferred_workloads: int = 0
    """Workloads built with a schedule measured on another, compatible class (``transfer``)."""
    zero_shot_s_per_task: float | None = None
    verified: int = 0
    recipe: str = ""
    """The extraction recipe of the build (e.g. ``nhwc+prepack``)."""
    database_hits: int = 0
    """Fused functions built with a schedule from the database (the rest: default schedules)."""
    prepacked_weights: int = 0
    """Weight repackings moved out of the tuned kernels and run once at build time."""
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def _host_can_run(target: Any) -> bool:
    if target.kind.name != "llvm":
        return False
    mtriple = str(target.attrs.get("mtriple", "") or "")
    machine = platform.machine()
    return not mtriple or mtriple.startswith(machine) or (machine == "x86_64" and mtriple.startswith("x86_64"))


def _stage(message: str, stage: str) -> None:
    """Log the build's step, naming it for ``tunefleet run``'s live line (:mod:`tunefleet.cli.progress`)."""
    log.info("%s", message, extra={STAGE_LOG_KEY: stage})


def _time_vm(vm: Any, dev: Any, inputs: list[Any], repeat: int, *, one_call_s: float | None = None) -> float:
    """Seconds per call of ``main``: the median of 3 repeats of ``repeat`` calls (``time_evaluator``,
    which warms up with one more call).

    A build whose calls are slow (``one_call_s``, its first call's time, says so) is timed with
    as many plain calls as fit in :data:`~tunefleet.vocab.UNTUNED_TIMING_S`, at least one, and
    their median: the first call already warmed it up.
    """
    if one_call_s is not None and one_call_s * (3 * max(1, repeat) + 1) > UNTUNED_TIMING_S:
        times = []
        for _ in range(max(1, int(UNTUNED_TIMING_S / one_call_s))):
            t0 = time.perf_counter()
            vm["main"](*inputs)
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
    timer = vm.time_evaluator("main", dev, number=max(1, repeat), repeat=3, min_repeat_ms=100)
    return float(statistics.median(timer(*inputs).results))


def build_model(
    db: Database,
    store: ArtifactStore,
    model: Model,
    hardware: str,
    *,
    output: str | Path | None = None,
    repeat: int = 5,
    compare_torch: bool = True,
    zero_shot: bool = False,
    top_k: int = 5,
    verify: int = 0,
    tuner: Any = None,
    transfer: bool = False,
) -> BuildReport:
    """Compile a model with the best stored schedules; check it against the untuned build; time both
    and, with ``compare_torch``, what the user would run instead (PyTorch eager, onnxruntime:
    :mod:`tunefleet.delivery.alternatives`) on the same threads.

    Workloads without a measurement keep the default schedule; the report says how many. With
    ``zero_shot``, they get the current cost model's best prediction instead
    (:func:`tunefleet.delivery.zeroshot.predict_workloads`, which stores ``top_k`` and measures the top
    ``verify`` of each on this node). With ``transfer``, the remaining ones get the best schedule
    of the most compatible class that builds for this one (:mod:`tunefleet.planning.transfer`).
    """
    import numpy as np
    import tvm
    from tvm import relax

    from tunefleet.models.ingest import load_model
    from tunefleet.models.workloads import class_recipe
    from tunefleet.tvm.bridge import FleetDatabase
    from tunefleet.tvm.compile import build_with_database
    from tunefleet.tvm.extract import extract_workloads, prepare_for_build
    from tunefleet.tvm.targets import make_target

    hw = db.hardware_class(hardware)
    target = make_target(hw.target)
    recipe = class_recipe(hw)
    _stage(f"building {model.name} for {hardware} with the best schedules", "building the tuned model")
    if zero_shot:
        from tunefleet.delivery.zeroshot import predict_workloads, require_model

        cost_model = require_model(db, store, hardware)  # before any work: one line if there is none
    loaded = load_model(db, store, model)
    found = extract_workloads(loaded.mod, target, params=loaded.params, recipe=recipe)
    zs = None
    if zero_shot:
        weights: dict[int, int] = {}
        for w in found:  # a model never extracted for this class gets its workloads stored first
            row, _ = db.add_workload(structural_hash=w.structural_hash, name=w.name, op_kind=w.op_kind,
                                     flops=float(w.flops), tir_json=w.tir_json)
            weights[row.id] = weights.get(row.id, 0) + int(w.weight)
        db.set_model_workloads(model.id, hw.id, recipe.name, weights)
        zs = predict_workloads(db, store, hardware, list(weights), top_k=top_k, verify=verify, tuner=tuner,
                               model=cost_model)
    measured_names: list[str] = []
    for w in found:
        try:
            if db.best_measurements(db.workload(w.structural_hash).id, hw.id, 1):
                measured_names.append(w.name)
        except NotFoundError:
            pass
    tuned = len(measured_names)
    predicted = 0 if zs is None else sum(w.status in ("predicted", "cached") and w.proposals > 0 for w in zs.workloads)
    report = BuildReport(model.name, hardware, len(found), tuned, len(found) - tuned - predicted,
                         threads=int(hw.target.get("num-cores") or len(os.sched_getaffinity(0))),
                         predicted_workloads=predicted, recipe=recipe.name)
    if zs is not None:
        report.zero_shot_s_per_task = zs.seconds_per_task
        report.verified = sum(w.verified for w in zs.workloads)
    t0 = time.perf_counter()
    fleet_db = FleetDatabase(db, hardware, with_predictions=zero_shot,
                             transfer=transfer_lookup(db, hardware) if transfer else None)
    built = build_with_database(loaded.mod, target, fleet_db, params=loaded.params, recipe=recipe)
    tuned_exec = built.executable
    report.database_hits, report.prepacked_weights = len(built.hits), built.prepacked
    if built.preproc_left:
        report.notes.append(f"{built.preproc_left} weight repacking(s) left in main: they run on every call")
    report.transferred_workloads = sum(v is not None for v in fleet_db.transferred.values())
    report.default_workloads -= report.transferred_workloads
    for wl_id, found_t in fleet_db.transferred.items():
        if found_t is not None:
            log.info("workload %d on %s: schedule transferred from %s", wl_id, hardware, found_t.source_hardware)
    expected = tuned + predicted + report.transferred_workloads
    if report.database_hits < expected:
        # A measured workload the build did not find is a key mismatch, not a tuning result: say it.
        report.notes.append(f"{expected - report.database_hits} workload(s) with schedules in the database were "
                            "built with the default schedule (no record matched at build time)")
        log.warning("build of %s for %s: %d database hits for %d workloads with schedules", model.name, hardware,
                    report.database_hits, expected)
    log.info("tuned build of %s for %s in %.1fs (%d database hits)", model.name, hardware,
             time.perf_counter() - t0, report.database_hits)
    if output is not None:
        out = Path(output)
        out.parent.mkdir(parents=True, exist_ok=True)
        tuned_exec.export_library(str(out))
        report.output = str(out)
    if not _host_can_run(target):
        report.notes.append(f"not run: target {target.kind.name} {hw.target} cannot run on this host")
        return report
    # The untuned reference is the model as given (not converted): layout conversion and
    # prepacking are checked against the unconverted model's outputs.
    _stage(f"checking {model.name}'s tuned build against the untuned one and timing both",
           "checking and timing the tuned model")
    untuned_exec = tvm.compile(prepare_for_build(loaded.mod, target, loaded.params), target=target)
    dev = tvm.cpu()
    inputs_np = loaded.random_inputs(seed=0)
    inputs = [tvm.runtime.tensor(x, dev) for x in inputs_np]
    vms = {"tuned": relax.VirtualMachine(tuned_exec, dev), "untuned": relax.VirtualMachine(untuned_exec, dev)}
    outs, first_call_s = {}, {}
    for k, vm in vms.items():
        t0 = time.perf_counter()
        outs[k] = _to_numpy(vm["main"](*inputs))
        first_call_s[k] = time.perf_counter() - t0
    diffs = [float(np.max(np.abs(a - b))) if a.size else 0.0 for a, b in zip(outs["tuned"], outs["untuned"], strict=True)]
    report.max_abs_diff = max(diffs) if diffs else 0.0
    for a, b in zip(outs["tuned"], outs["untuned"], strict=True):
        scale = max(1.0, float(np.max(np.abs(b)))) if b.size else 1.0
        if not np.allclose(a, b, rtol=1e-3, atol=1e-3 * scale):
            raise CorrectnessError(
                f"tuned build of {model.name} disagrees with the untuned build (max abs diff {report.max_abs_diff:.3g}); "
                "a stored schedule is wrong for this model — report it"
            )
    report.tuned_ms = _time_vm(vms["tuned"], dev, inputs, repeat) * 1e3
    report.untuned_ms = _time_vm(vms["untuned"], dev, inputs, repeat, one_call_s=first_call_s["untuned"]) * 1e3
    if compare_torch:
        from tunefleet.delivery import alternatives

        _stage(f"timing what the user would run instead of {model.name}", "timing PyTorch eager and onnxruntime")
        onnx_bytes = store.get_bytes(store.key_from_uri(model.artifact_uri)) if model.format == "onnx" else None
        latencies, notes = alternatives.measure(inputs_np, report.threads, torch_module=loaded.torch_module,
                                                onnx_bytes=onnx_bytes)
        report.torch_ms, report.onnxruntime_ms = latencies.get("torch"), latencies.get("onnxruntime")
        report.notes += notes
    return report


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
