"""Zero-shot schedules: the current cost model proposes schedules for workloads never measured.

For every workload of a hardware class with no measurement there, :func:`predict_workloads`
runs the evolutionary search guided by the class's current cost model alone
(:func:`tunefleet.tvm.learned.propose`) and stores its ``top_k`` proposals in the
``predictions`` table — never among the measurements, so ``best``, the MetaSchedule
``Database`` and the datasets never see them as measured. With ``verify=K`` the top K proposals
of each such workload are then built and measured on this node and committed as ordinary
measurements (no shard), after which the workload is measured like any other.

Re-running is idempotent: a workload the current model already predicted is not searched again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tunefleet.errors import NotSupportedError, TunefleetError

if TYPE_CHECKING:
    from tunefleet.costmodel import TrainedModel
    from tunefleet.db import Database
    from tunefleet.pipeline import Tuner
    from tunefleet.store import ArtifactStore

log = logging.getLogger(__name__)

DEFAULT_TOP_K = 5


@dataclass
class WorkloadPrediction:
    """What zero-shot did for one workload."""

    workload: str
    name: str
    status: str
    """``measured`` (had measurements: nothing predicted), ``predicted`` (searched now),
    ``cached`` (already predicted by this model) or ``verified`` (predicted, then measured)."""
    proposals: int = 0
    candidates_scored: int = 0
    seconds: float = 0.0
    verified: int = 0
    best_score: float | None = None


@dataclass
class ZeroShotResult:
    hardware: str
    cost_model_version: int | None
    workloads: list[WorkloadPrediction] = field(default_factory=list)

    @property
    def searched(self) -> list[WorkloadPrediction]:
        return [w for w in self.workloads if w.status in ("predicted", "verified") and w.candidates_scored]

    @property
    def seconds_per_task(self) -> float | None:
        """Mean search seconds of the workloads searched in this call (excluding measuring)."""
        done = self.searched
        return sum(w.seconds for w in done) / len(done) if done else None

    def count(self, status: str) -> int:
        return sum(w.status == status for w in self.workloads)

    def as_dict(self) -> dict[str, Any]:
        return {"hardware": self.hardware, "cost_model_version": self.cost_model_version,
                "seconds_per_task": self.seconds_per_task, "workloads": [asdict(w) for w in self.workloads]}


def require_model(db: Database, store: ArtifactStore, hardware: str) -> TrainedModel:
    """The current cost model of a class, or a one-line error saying how to get one."""
    from tunefleet.costmodel import load_model

    model = load_model(db, store, hardware)
    if model is None:
        raise NotSupportedError(
            f"not supported: zero-shot on {hardware} without a current cost model; run "
            f"`tunefleet dataset export` and `tunefleet costmodel retrain --hardware {hardware}` first"
        )
    return model


def predict_workloads(
    db: Database,
    store: ArtifactStore,
    hardware: str,
    workload_ids: Iterable[int],
    *,
    top_k: int = DEFAULT_TOP_K,
    verify: int = 0,
    tuner: Tuner | None = None,
    model: TrainedModel | None = None,
    seed: int = 0,
    on_workload: Callable[[WorkloadPrediction], None] | None = None,
) -> ZeroShotResult:
    """Store the current model's ``top_k`` proposals for every unmeasured workload; verify the top ``verify``.

    ``tuner`` (its builder and runner) measures the verified proposals; one is created for the
    class when ``verify`` is set and none is given (which refuses a class this node cannot run).
    """
    from tunefleet.tvm.learned import measure_traces, propose

    if top_k < 1:
        raise TunefleetError(f"top_k must be >= 1, got {top_k}")
    if not 0 <= verify <= top_k:
        raise TunefleetError(f"verify must be between 0 and top_k ({top_k}), got {verify}")
    hw = db.hardware_class(hardware)
    model = model or require_model(db, store, hardware)
    own_tuner = None
    if verify and tuner is None:
        from tunefleet.pipeline import Tuner

        tuner = own_tuner = Tuner(db, hardware)
    result = ZeroShotResult(hw.name, model.version)
    try:
        for wl_id in workload_ids:
            wl = db.workload(wl_id)
            item = WorkloadPrediction(wl.structural_hash, wl.name, "measured")
            if not db.best_measurements(wl.id, hw.id, 1):
                if db.has_predictions(wl.id, hw.id, model.cost_model_id):
                    item.status = "cached"
                else:
                    found = propose(wl, hw, model, top_k=top_k, seed=seed)
                    db.add_predictions(wl.id, hw.id, [(p.trace_json, p.score, p.args_info) for p in found.proposals],
                                       cost_model_id=model.cost_model_id)
                    item.status, item.seconds = "predicted", found.seconds
                    item.candidates_scored = found.candidates_scored
                    log.info("zero-shot %s (%s) on %s: %d proposals from %d candidates in %.1fs",
                             wl.name, wl.structural_hash[:12], hw.name, len(found.proposals),
                             found.candidates_scored, found.seconds)
                preds = db.best_predictions(wl.id, hw.id, top_k)
                item.proposals = len(preds)
                item.best_score = preds[0].score if preds else None
                if verify and tuner is not None and preds:
                    item.verified = measure_traces(db, wl, hw, [(p.trace_json, p.args_info) for p in preds[:verify]],
                                                   builder=tuner.builder, runner=tuner.runner)
                    item.status = "verified"
            result.workloads.append(item)
            if on_workload is not None:
                on_workload(item)
    finally:
        if own_tuner is not None:
            own_tuner.close()
    return result


def model_workload_ids(db: Database, model_id: int) -> list[int]:
    """The ids of a model's extracted workloads."""
    return [wl.id for wl, _ in db.workloads(model_id=model_id)]


__all__ = ["DEFAULT_TOP_K", "WorkloadPrediction", "ZeroShotResult", "model_workload_ids", "predict_workloads",
           "require_model"]
