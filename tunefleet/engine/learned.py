"""The fleet's trained cost model inside MetaSchedule, and measuring chosen schedules.

* :class:`FleetCostModel` is a MetaSchedule ``CostModel`` scoring candidates with a tunefleet
  :class:`~tunefleet.learning.costmodel.TrainedModel` (the current model of a hardware class). Handed to
  ``ms.tune_tasks`` it *warm-starts* a shard: the evolutionary search is guided by everything
  the fleet measured from its first round, instead of random picks until MetaSchedule's own
  XGBModel has its 100 warm-up samples. It also refines itself online: a stock ``XGBModel``
  learns the measurements as they arrive, and once past its warm-up the two scores are blended
  (see :meth:`FleetCostModel.predict`).
* :func:`measure_traces` measures chosen schedules (``--verify K``) through the ordinary builder,
  runner and commit path (:class:`~tunefleet.tvm.search.FixedCandidates` hands them over).
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np
import tvm
import tvm_ffi
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from tunefleet.tvm.ffi_errors import keeps_failure
from tunefleet.tvm.threads import class_threads
from tunefleet.tvm.traces import candidate, mean_run_s, trace_sha256_of

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.db.tables import HardwareClass, Workload
    from tunefleet.learning.costmodel import TrainedModel
    from tunefleet.learning.filter_audit import FilterAudit

log = logging.getLogger(__name__)

#: Feature matrices a :class:`FleetCostModel` keeps, by the scheduled module's structural hash.
#: The evolutionary search scores its whole population in every generation, and a generation
#: carries many schedules over unchanged (those it does not mutate, and failed mutations); a
#: round also starts from the measured best again. 2048 holds more than a round of the largest
#: population (512 schedules scored in 5 generations) and its carry-over; at 164 floats per store
#: and a few stores a schedule, about 10 MB.
FEATURE_CACHE_SIZE = 2048


def _normalised(scores: np.ndarray) -> np.ndarray:
    """Non-negative scores scaled to [0, 1] (the evolutionary search samples in proportion to them)."""
    scores = np.nan_to_num(np.asarray(scores, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    if scores.size == 0:
        return scores
    lo, hi = float(scores.min()), float(scores.max())
    if hi <= lo:
        return np.full_like(scores, 0.5)
    return (scores - lo) / (hi - lo)


@derived_object
class FleetCostModel(ms.cost_model.PyCostModel):
    """A MetaSchedule cost model backed by the fleet's trained XGBoost model, refined online.

    Parameters
    ----------
    model:
        The trained model (``tunefleet.learning.costmodel.load_cost_model``).
    online:
        A MetaSchedule ``XGBModel`` that learns the measurements as they arrive (a worker's
        :class:`~tunefleet.engine.worker.Tuner` shares one across its shards, as stock ``tune_tasks``
        shares one across tasks). Once past its warm-up (``num_warmup_samples``; it predicts
        random numbers before) it is blended in: score = (prior + online) / 2, each scaled to
        [0, 1] within the batch. None (zero-shot) scores with the fleet model alone.
    audit:
        Judges the fleet model on this workload's measurements
        (:class:`tunefleet.learning.filter_audit.FilterAudit`): every measured candidate's fleet score is
        checked against its run time after each round, and once the model orders fewer than
        ``audit.min_agreement`` of their pairs right it is dropped and the online model alone
        scores, as in stock MetaSchedule (:attr:`dropped` says why). The trained model has usually
        never seen this workload; one that misranks it would otherwise steer half of every score
        for the whole shard. None (or an online model of None): never dropped.
    """

    def __init__(self, model: TrainedModel, *, online: Any = None, audit: FilterAudit | None = None) -> None:
        self.model = model
        self.extractor = ms.feature_extractor.PerStoreFeature()
        self.online = online
        self.audit = audit if online is not None else None
        # a stock XGBModel with the same extractor scores the matrices extracted for the prior
        self._online_shares_features = _same_features(online, self.extractor)
        self._features_of: OrderedDict[int, np.ndarray] = OrderedDict()
        self.feature_hits = self.feature_misses = 0
        self.predict_seconds = 0.0
        self.predicted = 0

    @keeps_failure
    def load(self, path: str) -> None:
        if self.online is not None:
            self.online.load(path)

    @keeps_failure
    def save(self, path: str) -> None:
        if self.online is not None:
            self.online.save(path)

    @property
    def dropped(self) -> str | None:
        """Why the fleet model no longer scores (None while it does)."""
        return self.audit.stopped if self.audit is not None else None

    @keeps_failure
    def update(self, context: Any, candidates: list[Any], results: list[Any]) -> None:
        if self.online is not None:
            self.online.update(context, candidates, results)
        if candidates:
            self._judge(context, candidates, [mean_run_s(r) for r in results])

    def judge_past(self, context: Any, candidates: list[Any], means: list[float]) -> None:
        """Judge the fleet model on measurements committed before this shard (a resumed shard,
        or a workload measured here before: :func:`tunefleet.tvm.traces.past_candidates`), so one
        that misranks them is dropped before the first round instead of after it."""
        if len(candidates) >= 2:
            self._judge(context, candidates, means)

    def _judge(self, context: Any, candidates: list[Any], means: list[float | None]) -> None:
        """Check the fleet model's scores of measured candidates against their run times."""
        if self.audit is None or self.dropped is not None:
            return
        self.audit.observe([float(x) for x in self.prior(context, candidates)], means)
        reason = self.audit.check()
        if reason:
            log.info("warm start ends for %s: %s; the search goes on with MetaSchedule's online model",
                     getattr(context, "task_name", None) or "this workload", reason)

    def prior(self, context: Any, candidates: list[Any]) -> np.ndarray:
        """The fleet model's raw scores (higher = faster)."""
        if not candidates:
            return np.zeros(0)
        return self._prior_of(self._features(context, candidates))

    def _features(self, context: Any, candidates: list[Any]) -> list[np.ndarray]:
        """Each candidate's PerStoreFeature matrix; only schedules not scored before are extracted
        (extraction lowers every candidate: most of what scoring costs)."""
        cache = self._features_of
        keys = [tvm_ffi.structural_hash(c.sch.mod) for c in candidates]
        new: dict[int, Any] = {}
        for key, cand in zip(keys, candidates):
            if key in cache:
                cache.move_to_end(key)
            elif key not in new:
                new[key] = cand
        if new:
            extracted = self.extractor.extract_from(context, list(new.values()))
            cache.update((key, np.asarray(t.numpy(), dtype=np.float32)) for key, t in zip(new, extracted))
        out = [cache[key] for key in keys]
        while len(cache) > FEATURE_CACHE_SIZE:
            cache.popitem(last=False)
        self.feature_misses += len(new)
        self.feature_hits += len(keys) - len(new)
        return out

    def _prior_of(self, matrices: list[np.ndarray]) -> np.ndarray:
        from tunefleet.learning.costmodel import store_features

        return self.model.predict_features(store_features(matrices))

    @keeps_failure
    def predict(self, context: Any, candidates: list[Any]) -> np.ndarray:
        t0 = time.perf_counter()
        if not candidates:
            return np.zeros(0)
        if self.dropped is not None:  # the fleet model misranks this workload: the online model alone
            scores = self._online_scores(context, candidates)
            if scores is None:  # before its warm-up: random, as stock MetaSchedule's
                scores = np.asarray(self.online.predict(context, candidates), dtype=np.float64)
        else:
            scores = self._blend(context, candidates)
        self.predict_seconds += time.perf_counter() - t0
        self.predicted += len(candidates)
        return scores

    def _blend(self, context: Any, candidates: list[Any]) -> np.ndarray:
        """The fleet model's scores, blended with the online model's once it is past its warm-up."""
        matrices = self._features(context, candidates)
        scores = _normalised(self._prior_of(matrices))
        theirs = self._online_scores(context, candidates, matrices)
        return scores if theirs is None else 0.5 * scores + 0.5 * _normalised(theirs)

    def _online_scores(self, context: Any, candidates: list[Any],
                       matrices: list[np.ndarray] | None = None) -> np.ndarray | None:
        """The online model's scores, None before its warm-up. The evolutionary search asks for
        thousands of scores a round, and extracting the features is most of their cost: a stock
        XGBModel with the same extractor scores the matrices extracted (and kept) here."""
        online = self.online
        if online is None or online.data_size < online.num_warmup_samples or online.booster is None:
            return None
        if self._online_shares_features:
            xs = matrices if matrices is not None else self._features(context, candidates)
            return np.asarray(online._predict(xs=xs), dtype=np.float64)
        return np.asarray(online.predict(context, candidates), dtype=np.float64)


def _same_features(online: Any, extractor: Any) -> bool:
    """Whether ``online`` is a stock XGBModel whose extractor gives exactly ``extractor``'s features."""
    if not isinstance(online, ms.cost_model.XGBModel):
        return False
    theirs = getattr(online, "extractor", None)
    per_store = ms.feature_extractor.PerStoreFeature
    fields = ("buffers_per_store", "arith_intensity_curve_num_samples", "cache_line_bytes", "extract_workload")
    return (isinstance(theirs, per_store) and isinstance(extractor, per_store)
            and all(getattr(theirs, f) == getattr(extractor, f) for f in fields))


def measure_traces(
    db: Database,
    wl: Workload,
    hw: HardwareClass,
    traces: list[tuple[str, list[Any] | None]],
    *,
    builder: Any,
    runner: Any,
    sent: list[int] | None = None,
    limit: int | None = None,
) -> int:
    """Build, run and commit the given schedules of a workload as measurements (no shard), as one
    batch (the builder compiles them in parallel).

    ``traces`` are (trace JSON, args_info) pairs, e.g. stored predictions. Schedules already
    measured on this class, or twice in ``traces``, are measured once, and do not count towards
    ``limit`` (at most that many new schedules, the first ones in ``traces``). Returns how many were
    measured; ``sent``, when given, receives the indices in ``traces`` of those sent to be measured.
    """
    import tempfile

    from tunefleet.energy.accounting import ShardAccountant
    from tunefleet.tvm.bridge import FleetDatabase
    from tunefleet.tvm.commit import CandidateCommitter, CommitCallback
    from tunefleet.tvm.search import FixedCandidates
    from tunefleet.tvm.targets import make_target, target_fingerprint

    seen = db.measured_trace_hashes(wl.id, hw.id)  # a new set: the batch's own hashes join it
    mod = tvm.ir.load_json(wl.tir_json)
    target = make_target(hw.target)
    cands = []
    for i, (trace_json, args_info) in enumerate(traces):
        if limit is not None and len(cands) >= limit:
            break
        c = candidate(mod, trace_json, args_info)
        sha = trace_sha256_of(c.sch)
        if sha in seen:
            continue
        seen.add(sha)
        cands.append(c)
        if sent is not None:
            sent.append(i)
    if not cands:
        return 0
    ctx = ms.TuneContext(mod, target=target, space_generator="post-order-apply",
                         search_strategy=FixedCandidates(cands), task_name=wl.name,
                         num_threads=class_threads(hw.target))
    callback = CommitCallback(CandidateCommitter(db, wl.id, hw.id, target=target_fingerprint(target)),
                              build_seconds=getattr(builder, "pop_build_time", None),
                              annotate=ShardAccountant(db, hw, wl).annotate)
    with tempfile.TemporaryDirectory() as tmp:
        ms.tune_tasks(tasks=[ctx], task_weights=[1.0], work_dir=tmp, max_trials_global=len(cands),
                      num_trials_per_iter=len(cands), builder=builder, runner=runner,
                      database=FleetDatabase(db, hw.name), cost_model="random",
                      measure_callbacks=[callback, ms.measure_callback.RemoveBuildArtifact()],
                      task_scheduler="round-robin")
    if callback.failure is not None:
        raise callback.failure
    return callback.progress.measured


__all__ = ["FleetCostModel", "measure_traces"]

