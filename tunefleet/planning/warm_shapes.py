"""Search that starts warm across shapes: a workload new to a class borrows the schedules of the
same operator at other shapes.

A workload the class never measured starts cold: MetaSchedule's first round samples random
schedules. Often the class has measured the same operator at another shape (the other conv2d
of a model, the same model at another batch or image size): same operator kind, same fused-op
sequence (:func:`tunefleet.vocab.task_name_key`), other loop extents. :func:`shape_seeds` takes
the best schedules of the closest such workloads (by FLOPs ratio,
:meth:`~tunefleet.db.Database.similar_measured_workloads`), fits each to the new shape
(:func:`tunefleet.tvm.similar.adapt_trace`: tile sizes re-fitted, postprocessors run again) and
returns those that apply, for the first round to measure besides the search's own. A schedule
that cannot be made valid is skipped and counted. :func:`shape_seeds_near` looks at the compatible
classes' donors too (a hub bundle's), after the class's own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tunefleet.vocab import DEFAULT_TRACE_SHA256, task_name_key

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.db.tables import HardwareClass, Workload

log = logging.getLogger(__name__)

#: Donor workloads looked at, closest in FLOPs first.
DONORS = 3
#: Best schedules of one donor tried.
PER_DONOR = 2
#: Seeds handed to the first round, at most.
MAX_SEEDS = 4


@dataclass
class ShapeSeeds:
    """The seeds borrowed for one workload, and what became of every schedule tried."""

    traces: list[str] = field(default_factory=list)
    donors: list[str] = field(default_factory=list)
    """Names (and short hashes) of the workloads the seeds came from."""
    tried: int = 0
    as_is: int = 0
    """Seeds that apply unchanged."""
    adapted: int = 0
    """Seeds whose decisions were re-fitted to the new shape."""
    skipped: int = 0
    """Schedules that could not be made valid here (or that fit as another seed already did)."""
    reasons: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (f"{len(self.traces)} seed(s) from {', '.join(self.donors) or 'no workload'} "
                f"(tried {self.tried}: {self.as_is} as is, {self.adapted} adapted, {self.skipped} skipped)")


def shape_seeds(db: Database, wl: Workload, hw: HardwareClass, *, limit: int = MAX_SEEDS,
                per_donor: int = PER_DONOR, donors: int = DONORS, target: Any = None, seed: int = 1,
                source: HardwareClass | None = None) -> ShapeSeeds:
    """Schedules of the same operator at the closest other shapes, fitted to ``wl`` (module docstring).

    Only for a workload the class has no successful measurement of; ``target`` defaults to the
    class's. The donors are the ones measured on ``source`` (default the class itself: zero-shot
    also borrows from compatible classes, a hub bundle's among them). Deterministic for given
    measurements.
    """
    out = ShapeSeeds()
    if limit <= 0 or db.best_measurements(wl.id, hw.id, 1):
        return out
    source = source or hw
    similar = db.similar_measured_workloads(source.id, wl.op_kind, task_name_key(wl.name), exclude_id=wl.id,
                                            flops=float(wl.flops or 0.0), limit=donors)
    if not similar:
        return out
    import tvm

    from tunefleet.tvm.similar import ADAPTED, AS_IS, adapt_trace
    from tunefleet.tvm.targets import make_target

    mod = tvm.ir.load_json(wl.tir_json)
    target = target if target is not None else make_target(hw.target)
    for donor in similar:
        donor_mod = tvm.ir.load_json(db.workload(donor.id).tir_json)
        rows = [r for r in db.best_measurements(donor.id, source.id, per_donor + 1)
                if r.trace_sha256 != DEFAULT_TRACE_SHA256][:per_donor]
        used = False
        for row in rows:
            if len(out.traces) >= limit:
                break
            out.tried += 1
            got = adapt_trace(mod, row.trace_json, target, donor_mod=donor_mod, seed=seed)
            if got.trace_json is None or got.trace_json in out.traces:
                out.skipped += 1
                out.reasons.append(got.reason or "the same schedule as another seed")
                continue
            out.traces.append(got.trace_json)
            out.as_is += got.outcome == AS_IS
            out.adapted += got.outcome == ADAPTED
            used = True
        if used:
            out.donors.append(f"{donor.name} {donor.structural_hash[:8]}")
        if len(out.traces) >= limit:
            break
    for reason in out.reasons:
        log.debug("a schedule of another shape does not fit %s: %s", wl.name, reason)
    return out


def shape_seeds_near(db: Database, wl: Workload, hw: HardwareClass, *, limit: int = MAX_SEEDS,
                     other_classes: bool = True) -> ShapeSeeds:
    """:func:`shape_seeds` from the class's own donors first, then (``other_classes``) from the
    compatible classes' (most compatible first, :func:`~tunefleet.planning.transfer.compatible_classes`:
    a hub bundle's classes among them), merged up to ``limit``; a donor of another class is named
    with it."""
    from tunefleet.planning.transfer import compatible_classes

    out = ShapeSeeds()
    others = [c for _, c in compatible_classes(db, hw)] if other_classes else []
    for source in [hw, *others]:
        if len(out.traces) >= limit:
            break
        got = shape_seeds(db, wl, hw, source=source, limit=limit - len(out.traces))
        fresh = [t for t in got.traces if t not in out.traces]
        out.traces += fresh
        out.donors += got.donors if source.id == hw.id else [f"{d} on {source.name}" for d in got.donors]
        out.tried += got.tried
        out.as_is += got.as_is
        out.adapted += got.adapted
        out.skipped += got.skipped + len(got.traces) - len(fresh)
        out.reasons += got.reasons
    return out


__all__ = ["MAX_SEEDS", "ShapeSeeds", "shape_seeds", "shape_seeds_near"]
