"""A stored model's tuning tasks for one hardware class, stored once as workloads."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tunefleet.recipes import Recipe, recipe_for

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.db.catalog import LinkChange
    from tunefleet.db.tables import HardwareClass, Model
    from tunefleet.store import ArtifactStore

log = logging.getLogger(__name__)


@dataclass
class ExtractResult:
    model_id: int
    hardware: str
    workloads: int
    new_workloads: int
    total_weight: int
    recipe: str = ""
    unlinked: int = 0
    """Workloads the model had on the class under an earlier recipe, now unlinked."""
    unlinked_measured: int = 0
    """Their measurements on the class: tuning that no longer applies to this model's build."""


def class_recipe(hw: HardwareClass) -> Recipe:
    """The extraction recipe of a hardware class (its ``layout`` setting, else the target's default,
    and its ``winograd`` setting)."""
    return recipe_for(hw.target, hw.layout, hw.winograd)


def extract(db: Database, store: ArtifactStore, model: Model, hardware: str) -> ExtractResult:
    """Extract the tuning tasks of a model for one hardware class under the class's recipe and
    store the workloads once; the model's links to workloads of an earlier recipe are removed.
    How long loading and extracting took is noted on the model (``Database.note_step_seconds``)."""
    from tunefleet.models.kept import extracted, extraction_seconds
    from tunefleet.tvm.targets import make_target

    started = time.perf_counter()
    hw = db.hardware_class(hardware)
    recipe, target = class_recipe(hw), make_target(hw.target)
    _, found = extracted(db, store, model, target, recipe)
    # The extraction's own time, not this step's wait for it (a pipeline's head start may have
    # made it meanwhile, tunefleet.models.kept): the planner sizes the build on it.
    waited = time.perf_counter() - started
    made = extraction_seconds(model, target, recipe)
    new = 0
    weights: dict[int, int] = {}
    for w in found:
        row, created = db.add_workload(structural_hash=w.structural_hash, name=w.name, op_kind=w.op_kind,
                                       flops=float(w.flops), tir_json=w.tir_json)
        new += int(created)
        weights[row.id] = weights.get(row.id, 0) + int(w.weight)
    change = db.set_model_workloads(model.id, hw.id, recipe.name, weights)
    # the planner sizes the build's compiles and set-up on it (tunefleet.planning.allocation.build_reserve_s)
    db.note_step_seconds(model.id, hw.id, "extract",
                         time.perf_counter() - started - waited + (waited if made is None else made))
    log.info("model %s on %s: %d workloads (%d new), recipe %s", model.name, hardware, len(found), new, recipe.name)
    if change.unlinked:
        log.warning("%s", unlink_warning(model.name, hardware, recipe.name, change))
    return ExtractResult(model.id, hardware, len(found), new, sum(int(w.weight) for w in found), recipe.name,
                         len(change.unlinked), change.unlinked_measured)


def unlink_warning(model: str, hardware: str, recipe: str, change: LinkChange) -> str:
    """The line ``extract`` logs when a model's links to earlier workloads on a class are removed."""
    head = f"model {model} on {hardware}: {len(change.unlinked)} workload(s)"
    if change.previous_recipes:
        return (f"{head} of recipe {', '.join(change.previous_recipes)} unlinked: recipe {recipe} does not tune them; "
                f"their {change.unlinked_measured} measurement(s) stay stored, and the build's comparison of recipes "
                "still uses them")
    # the same recipe, other workloads: this version of tunefleet computes some operators differently
    return (f"{head} unlinked: this tunefleet extracts them differently under the same recipe {recipe}, as new "
            f"workloads tuned from the start (CHANGELOG.md says which); their {change.unlinked_measured} "
            "measurement(s) stay stored, unused")


def recipe_warning(db: Database, model_id: int, hardware: str) -> str | None:
    """One line when a model's workloads on a class were extracted under another recipe than the
    class's current one (its earlier tuning no longer applies to what ``build`` compiles), else None."""
    hw = db.hardware_class(hardware)
    have = db.model_recipes(model_id, hw.id)
    want = class_recipe(hw).name
    model = db.model(model_id)
    if not have:
        return (f"model {model.name} has no workloads on {hardware} yet: extract it first "
                f"(`tunefleet extract {model.name} --hardware {hardware}`)")
    if have == [want]:
        return None
    return (f"model {model.name} was extracted for {hardware} under recipe {', '.join(have)}, but the class now "
            f"uses {want}: its earlier tuning no longer applies to the build; re-extract it "
            f"(`tunefleet extract {model.name} --hardware {hardware}`, or `tunefleet run`)")
