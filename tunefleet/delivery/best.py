"""The best schedule for (workload, hardware class), a MetaSchedule database over the fleet's
measurements for TVM users, and an export as MetaSchedule JSON files.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from tunefleet.errors import NotFoundError
from tunefleet.vocab import DEFAULT_TRACE_SHA256

if TYPE_CHECKING:
    from tunefleet.db import Database


@dataclass
class BestSchedule:
    workload: str
    hardware: str
    mean_run_s: float
    run_secs: list[float]
    measurement_id: int
    trace_json: str
    measured_at: str
    tvm_version: str
    untuned_s: float | None = None
    origin: str = "tuned here"
    """Where the schedule came from: ``"tuned here"``, or ``"hub: <class> on <CPU>, <date>"`` when a
    hub bundle brought it (measured on this class all the same)."""

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def best(db: Database, workload: str, hardware: str, n: int = 1) -> list[BestSchedule]:
    """The ``n`` best measured schedules of a workload on a hardware class (measurements only)."""
    wl = db.workload(workload)
    hw = db.hardware_class(hardware)
    rows = db.best_measurements(wl.id, hw.id, n)
    if not rows:
        raise NotFoundError(f"no measurement of workload {wl.structural_hash} on {hardware} yet; plan and tune it")
    untuned = _untuned_time(db, wl.id, hw.id)
    origins = db.hub_origins([wl.id])
    return [
        BestSchedule(wl.structural_hash, hardware, float(r.mean_run_s or 0.0), list(r.run_secs or []), r.id,
                     r.trace_json, r.created_at.isoformat(timespec="seconds"), r.tvm_version, untuned,
                     _origin(origins.get((wl.id, r.trace_sha256))))
        for r in rows
    ]


@dataclass
class WorkloadBest:
    """One workload of a model or module, and its best measured schedules on a class."""

    workload: str
    """The workload's structural hash (under the class's recipe)."""
    name: str
    weight: int
    """Calls per inference."""
    schedules: list[BestSchedule]
    """Best first; empty when the class never measured the workload."""

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "schedules": [b.as_dict() for b in self.schedules]}


def best_for_workloads(db: Database, workloads: list[tuple[str, str, int]], hardware: str,
                       n: int = 1) -> list[WorkloadBest]:
    """:func:`best` of each ``(structural hash, name, weight)``; a workload never measured on the
    class (or unknown to the database) gets no schedule rather than an error."""
    out = []
    for structural_hash, name, weight in workloads:
        try:
            found = best(db, structural_hash, hardware, n=n)
        except NotFoundError:
            found = []
        out.append(WorkloadBest(structural_hash, name, weight, found))
    return out


def _origin(hub: tuple[str, dict[str, Any]] | None) -> str:
    if hub is None:
        return "tuned here"
    from tunefleet.learning.hub import describe_hub_class

    return f"hub: {describe_hub_class(*hub)}"


def _untuned_time(db: Database, workload_id: int, hardware_class_id: int) -> float | None:
    """Mean run time of the default (empty-trace) candidate, if it was measured."""
    return db.trace_run_s(workload_id, hardware_class_id, DEFAULT_TRACE_SHA256)


def transfer_lookup(db: Database, hardware: str) -> Callable[[int], Any]:
    """Workload id -> the best schedule a compatible class has for it (the bridge's transfer answer)."""
    from tunefleet.planning.transfer import transfer_best

    return lambda workload_id: transfer_best(db, workload_id, hardware)


def metaschedule_database(db: Database, hardware: str, *, transfer: bool = False) -> Any:
    """A MetaSchedule ``Database`` over the fleet's measurements of one hardware class.

    Build with it through :func:`tunefleet.tvm.compile.build_with_database` (``mod`` as the
    frontend gives it, the class's recipe): its workloads are keyed under the class's extraction
    recipe, which stock ``compile_relax`` cannot reproduce when weights are prepacked (CPU
    classes); for a class with the ``native`` layout and no prepacking (GPU), ``compile_relax``
    finds them too. With ``transfer``,
    a workload the class never measured gets the best schedule of the most compatible class
    that builds for it (:mod:`tunefleet.planning.transfer`); the database's ``transferred`` maps
    workload ids to what was borrowed.
    """
    from tunefleet.tvm.bridge import FleetDatabase

    return FleetDatabase(db, hardware, transfer=transfer_lookup(db, hardware) if transfer else None)


#: The file ``export-db`` writes beside MetaSchedule's two: the class, target and recipe the records need.
EXPORT_MANIFEST = "tunefleet.json"


class ExportedDatabase(NamedTuple):
    """What :func:`export_json_database` wrote."""

    workloads: int
    records: int
    from_hub: int
    """Records whose schedule a hub bundle brought (measured on the class all the same)."""
    recipe: str = ""
    """The extraction recipe the records need (in :data:`EXPORT_MANIFEST` too)."""


def export_json_database(db: Database, hardware: str, directory: str | Path, *, top_k: int = 1,
                         workload_ids: set[int] | None = None) -> ExportedDatabase:
    """Write the best ``top_k`` records per workload (of every workload, or of ``workload_ids``:
    a model's) as MetaSchedule JSON database files.

    Returns (workloads, records, records from the hub, recipe). Beside the two MetaSchedule files
    it writes :data:`EXPORT_MANIFEST` (the class, its target and the extraction recipe the records
    need, the TVM version): :func:`build_exported` builds a Relax module with the directory alone,
    no database (or load the files with ``ms.database.JSONDatabase(work_dir=directory)`` and build
    with :func:`tunefleet.tvm.compile.build_with_database` under that recipe).
    """
    import json

    from tunefleet.models.workloads import class_recipe
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tunefleet.tvm.bridge import record_from_row

    hw = db.hardware_class(hardware)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    out = ms.database.JSONDatabase(path_workload=str(directory / "database_workload.json"),
                                   path_tuning_record=str(directory / "database_tuning_record.json"),
                                   allow_missing=True)
    n_wl = n_rec = n_hub = 0
    workloads = [(wl, w) for wl, w in db.workloads() if workload_ids is None or wl.id in workload_ids]
    origins = db.hub_origins(wl.id for wl, _ in workloads)
    for wl, _ in workloads:
        rows = db.best_measurements(wl.id, hw.id, top_k)
        if not rows:
            continue
        mod = tvm.ir.load_json(wl.tir_json)
        workload = out.commit_workload(mod)
        for r in rows:
            out.commit_tuning_record(record_from_row(r.trace_json, r.run_secs, r.target, r.args_info, workload))
            n_rec += 1
            n_hub += (wl.id, r.trace_sha256) in origins
        n_wl += 1
    recipe = class_recipe(hw).name
    manifest = {"format": 1, "hardware": hw.name, "target": dict(hw.target), "recipe": recipe,
                "tvm_version": tvm.__version__, "workloads": n_wl, "records": n_rec}
    (directory / EXPORT_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return ExportedDatabase(n_wl, n_rec, n_hub, recipe)


def build_exported(mod: Any, directory: str | Path, *, params: Mapping[str, Any] | None = None,
                   func_name: str | None = None) -> Any:
    """Build a Relax module with the records ``export-db`` wrote to ``directory``, under the
    recipe and for the target its :data:`EXPORT_MANIFEST` names: what a compile pipeline with
    tunefleet installed but no database runs. Returns a
    :class:`~tunefleet.tvm.compile.BuildResult` (``executable``, ``hits``: the functions built from
    the records).

    Raises
    ------
    NotFoundError
        No manifest in ``directory`` (not written by ``export-db``, or by one before manifests).
    """
    import json

    from tvm.s_tir import meta_schedule as ms

    from tunefleet.recipes import Recipe
    from tunefleet.tvm.compile import build_with_database

    directory = Path(directory)
    path = directory / EXPORT_MANIFEST
    if not path.is_file():
        raise NotFoundError(f"{directory}: no {EXPORT_MANIFEST} (write the directory with `tunefleet export-db`)")
    manifest = json.loads(path.read_text())
    database = ms.database.JSONDatabase(work_dir=str(directory), allow_missing=False)
    return build_with_database(mod, manifest["target"], database, params=params,
                               recipe=Recipe.from_name(manifest["recipe"]), func_name=func_name)
