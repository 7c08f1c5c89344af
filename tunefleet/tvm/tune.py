"""Tuning one shard with MetaSchedule, plugged into its own extension points.

* :class:`FleetDatabase` (bridge.py) is the ``Database``: the search warm-starts from the best
  measurements already stored for (workload, hardware class).
* :class:`CommitCallback` is a ``MeasureCallback``: every candidate — successes and build/run
  errors — is committed with its run times, build time and shard id as soon as its batch is
  measured, so a killed worker loses at most the batch in flight.
* :class:`ResumingSearch` is a ``SearchStrategy`` wrapping the evolutionary search: candidates
  whose trace was already committed are never measured again (a resumed shard measures only new
  ones), and the workload's default (unscheduled) program is measured first, so the best stored
  schedule is never slower than the untuned build. It also carries the cost-efficiency levers
  (Trimmer): with a ready cost model it measures only the best-scored fraction of each round and
  records the rest as ``filtered``; it stops when the shard's plateau policy says so
  (:mod:`tunefleet.preemption`), and the trials left go to workloads still improving
  (:mod:`tunefleet.budget`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from tunefleet import shards
from tunefleet.db import Database, NewMeasurement
from tunefleet.db.database import FILTERED
from tunefleet.db.models import Shard
from tunefleet.errors import DatabaseError, TransientError
from tunefleet.filter_audit import DEFAULT_MIN_AGREEMENT, FilterAudit, mean_run_s
from tunefleet.shards import LeaseLostError
from tunefleet.tvm.bridge import FleetDatabase

if TYPE_CHECKING:
    import numpy as np

    from tunefleet.accounting import RoundEnergy, ShardAccountant
    from tunefleet.costmodel import TrainedModel
    from tunefleet.preemption import PreemptionPolicy

log = logging.getLogger(__name__)

# A callback seeing each batch as (shard id, [(trace sha256, mean run seconds or None)]).
CandidateHook = Callable[[int | None, list[tuple[str, float | None]]], None]
# Scores candidates before they are measured (higher = predicted faster): (TuneContext, candidates).
Scorer = Callable[[Any, list[Any]], "np.ndarray"]


def trace_json_of(sch: Any) -> str:
    """The JSON text tunefleet stores for a candidate's trace (as TuningRecord.as_json writes it)."""
    return json.dumps(to_python(sch.trace.as_json()), separators=(",", ":"))


def to_python(obj: Any) -> Any:
    """Plain JSON values from what TVM's ``as_json`` returns (FFI arrays, maps, IntImm, ...)."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, "value") and type(obj).__name__ in {"IntImm", "FloatImm", "StringImm"}:
        return obj.value
    if hasattr(obj, "items"):
        return {str(k): to_python(v) for k, v in obj.items()}
    if hasattr(obj, "__iter__"):
        return [to_python(x) for x in obj]
    raise TypeError(f"cannot turn {type(obj).__name__} into JSON")


def trace_sha256_of(sch: Any) -> str:
    return hashlib.sha256(trace_json_of(sch).encode()).hexdigest()


@dataclass
class ShardProgress:
    """What a shard's tuning did, as the callback saw it."""

    measured: int = 0
    errors: int = 0
    skipped_known: int = 0
    filtered: int = 0
    stop_reason: str | None = None
    filter_stopped: str | None = None
    warm_start_dropped: str | None = None
    best_s: float | None = None
    first_best_s: float | None = None
    batches: int = 0
    commit_s: float = 0.0
    started: float = field(default_factory=time.monotonic)


class Heartbeat:
    """Extends a shard's lease from a background thread; notes when the lease is lost."""

    def __init__(self, db: Database, shard_id: int, owner: str, lease_s: float) -> None:
        self.db, self.shard_id, self.owner, self.lease_s = db, shard_id, owner, lease_s
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{shard_id}", daemon=True)

    def _run(self) -> None:
        interval = max(1.0, self.lease_s / 3)
        while not self._stop.wait(interval):
            try:
                shards.heartbeat(self.db, self.shard_id, self.owner, lease_s=self.lease_s)
            except LeaseLostError as exc:
                self.lost = str(exc)
                log.error("%s", exc)
                return
            except DatabaseError as exc:  # transient: the lease may still hold; try next tick
                log.warning("heartbeat for shard %d failed: %s", self.shard_id, exc)

    def check(self) -> None:
        if self.lost:
            raise LeaseLostError(self.lost)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@derived_object
class CommitCallback(ms.measure_callback.PyMeasureCallback):
    """Commit every measured candidate of a shard to the tunefleet database."""

    def __init__(
        self,
        db: Database,
        workload_id: int,
        hardware_class_id: int,
        shard_id: int | None,
        *,
        target: str,
        attempt: int = 0,
        build_seconds: Callable[[str], float | None] | None = None,
        heartbeat: Heartbeat | None = None,
        on_batch: CandidateHook | None = None,
        progress: ShardProgress | None = None,
        accountant: ShardAccountant | None = None,
        on_round: Callable[[list[NewMeasurement], RoundEnergy | None], None] | None = None,
        measure_info: Callable[[str], dict[str, Any] | None] | None = None,
    ) -> None:
        self.db = db
        self.on_round = on_round
        self.measure_info = measure_info
        self.accountant = accountant
        self.workload_id, self.hardware_class_id, self.shard_id = workload_id, hardware_class_id, shard_id
        self.target, self.attempt = target, attempt
        self.build_seconds = build_seconds
        self.heartbeat = heartbeat
        self.on_batch = on_batch
        self.progress = progress or ShardProgress()
        self.failure: BaseException | None = None

    def apply(self, task_scheduler: Any, task_id: int, measure_candidates: list[Any],
              builder_results: list[Any], runner_results: list[Any]) -> None:
        try:
            self._apply(measure_candidates, builder_results, runner_results)
        except BaseException as exc:
            # MetaSchedule calls this through its C++ FFI, which may re-wrap what we raise; keep
            # the original so tune_shard can tell a lost connection from a crashed search.
            self.failure = exc
            raise

    def _apply(self, measure_candidates: list[Any], builder_results: list[Any], runner_results: list[Any]) -> None:
        records = []
        for cand, built, ran in zip(measure_candidates, builder_results, runner_results, strict=True):
            build_err = built.error_msg
            run_err = None if build_err else ran.error_msg
            run_secs = None if (build_err or run_err) else [float(x) for x in ran.run_secs]
            build_s = self.build_seconds(built.artifact_path) if (self.build_seconds and built.artifact_path) else None
            info = self.measure_info(built.artifact_path) if (self.measure_info and built.artifact_path) else None
            records.append(NewMeasurement(
                self.workload_id, self.hardware_class_id, trace_json_of(cand.sch), run_secs,
                build_s=build_s,
                error_kind="build" if build_err else ("run" if run_err else None),
                error_msg=(build_err or run_err or None) and str(build_err or run_err)[:8000],
                args_info=[a.as_json() for a in cand.args_info],
                shard_id=self.shard_id, attempt=self.attempt,
                measure_mode=_measure_mode(info) if run_secs is not None else None,
                tvm_version=tvm.__version__, target=self.target,
            ))
        round_energy = self.accountant.annotate(records) if self.accountant is not None else None
        t0 = time.perf_counter()
        self.db.commit_measurements(records)
        p = self.progress
        p.commit_s += time.perf_counter() - t0
        p.batches += 1
        for rec in records:
            p.measured += 1
            mean = rec.mean_run_s
            if mean is None:
                p.errors += 1
            elif p.best_s is None or mean < p.best_s:
                p.best_s = mean
                if p.first_best_s is None:
                    p.first_best_s = mean
        log.info("shard %s: batch %d committed %d candidates (%d errors so far), best %.3g ms",
                 self.shard_id, p.batches, len(records), p.errors, (p.best_s or float("nan")) * 1e3)
        if self.on_batch:
            self.on_batch(self.shard_id, [(r.trace_sha256, r.mean_run_s) for r in records])
        if self.on_round:
            self.on_round(records, round_energy)
        if self.heartbeat:
            self.heartbeat.check()  # stop tuning at once if another worker took the shard


def _measure_mode(info: dict[str, Any] | None) -> str | None:
    if not info or info.get("mode") in (None, "serial"):
        return "serial" if info else None
    return f"parallel:{int(info.get('degree') or 0)}"


@derived_object
class ResumingSearch(ms.search_strategy.PySearchStrategy):
    """Evolutionary search that skips candidates already committed and measures the default first.

    Parameters
    ----------
    known:
        sha256 of every trace already committed for (workload, hardware class).
    include_default:
        Measure the unscheduled program (an empty trace) if it was never measured.
    seeds:
        Trace JSON of schedules to measure in the first batch too (e.g. one transferred from a
        compatible hardware class); once measured they seed the evolutionary search like any
        stored measurement.
    budget:
        Candidates this search may still hand out, measured or filtered (None: MetaSchedule's
        ``max_trials`` alone bounds it). A filtered candidate spends a trial without measuring.
    scorer, filter_fraction:
        With a scorer (the class's trained cost model) and a fraction below
        1, each round's new candidates are scored and only the best ``ceil(fraction x n)`` are
        measured; the default schedule and seeds are always measured. The others are passed to
        ``on_filtered`` (which records them) and never reach the builder or runner.
    audit:
        Checks the scorer against the measured candidates: rounds are measured in full until the
        scorer ranks them (probation), and filtering stops when it no longer does
        (:class:`tunefleet.filter_audit.FilterAudit`). None: filtering from the first round, never stopped.
    should_stop:
        Asked before every round; a reason (text) ends the search (plateau preemption).
    """

    def __init__(self, inner: Any, known: set[str], *, include_default: bool = True,
                 progress: ShardProgress | None = None, seeds: list[str] | None = None,
                 budget: int | None = None, scorer: Scorer | None = None, filter_fraction: float = 1.0,
                 on_filtered: Callable[[list[Any]], None] | None = None,
                 should_stop: Callable[[], str | None] | None = None, audit: FilterAudit | None = None) -> None:
        if not 0.0 < filter_fraction <= 1.0:
            raise ValueError(f"filter_fraction must be in (0, 1], not {filter_fraction}")
        self.inner = inner
        self.known = set(known)
        self.include_default = include_default
        self.seeds = list(seeds or [])
        self.progress = progress or ShardProgress()
        self.budget = budget
        self.scorer, self.filter_fraction, self.on_filtered = scorer, filter_fraction, on_filtered
        self.should_stop = should_stop
        self.audit = audit
        self.handed_out = 0
        self._forced_now = self._filtered_now = 0
        self._mod: Any = None
        self._context: Any = None

    def _initialize_with_tune_context(self, context: Any) -> None:
        self._mod = context.mod
        self._context = context
        self.inner._initialize_with_tune_context(context)

    def pre_tuning(self, max_trials: int, num_trials_per_iter: int, design_spaces: list[Any],
                   database: Any = None, cost_model: Any = None) -> None:
        self.inner.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database, cost_model)

    def post_tuning(self) -> None:
        self.inner.post_tuning()

    def _default_candidate(self) -> Any | None:
        cand = _candidate(self._mod)
        return None if trace_sha256_of(cand.sch) in self.known else cand

    def generate_measure_candidates(self) -> list[Any] | None:
        reason = self.should_stop() if self.should_stop else None
        if reason:
            self.progress.stop_reason = reason
            return None
        left = None if self.budget is None else self.budget - self.handed_out
        if left is not None and left <= 0:
            return None
        out = self._generate()
        if out is None:
            return None
        if left is not None and len(out) > left:
            out = out[:left]
        out = self._filter(out)
        self.handed_out += len(out) + self._filtered_now
        return out or self.generate_measure_candidates()

    def _filter(self, out: list[Any]) -> list[Any]:
        """Keep the best-scored fraction of the round's search candidates; record the rest."""
        self._filtered_now = 0
        forced, searched = out[: self._forced_now], out[self._forced_now:]
        if self.scorer is None or self.filter_fraction >= 1.0 or len(searched) < 2:
            return out
        if self.audit is not None and self.audit.stopped:
            return out
        import math

        import numpy as np

        scores = np.asarray(self.scorer(self._context, searched), dtype=np.float64)
        if self.audit is not None and not self.audit.trusted:  # probation: measured in full, to judge the model
            self.audit.kept([trace_sha256_of(c.sch) for c in searched], [float(x) for x in scores])
            return out
        keep_n = max(1, math.ceil(self.filter_fraction * len(searched)))
        order = np.argsort(-np.nan_to_num(scores, nan=-np.inf), kind="stable")
        kept_at = sorted(order[:keep_n])
        kept = [searched[i] for i in kept_at]
        dropped = [searched[i] for i in sorted(order[keep_n:])]
        if self.audit is not None:
            self.audit.kept([trace_sha256_of(c.sch) for c in kept], [float(scores[i]) for i in kept_at])
        if dropped and self.on_filtered is not None:
            self.on_filtered(dropped)
        self._filtered_now = len(dropped)
        self.progress.filtered += len(dropped)
        return forced + kept

    def _generate(self) -> list[Any] | None:
        out: list[Any] = []
        if self.include_default:
            self.include_default = False
            default = self._default_candidate()
            if default is not None:
                out.append(default)
        seeds, self.seeds = self.seeds, []
        for trace in seeds:
            cand = _candidate(self._mod, trace)
            key = trace_sha256_of(cand.sch)
            if key not in self.known:
                self.known.add(key)
                out.append(cand)
        self._forced_now = len(out)
        for _ in range(8):  # a batch made only of known candidates: ask again
            batch = self.inner.generate_measure_candidates()
            if batch is None:
                return out or None
            fresh = []
            for cand in batch:
                key = trace_sha256_of(cand.sch)
                if key in self.known:
                    self.progress.skipped_known += 1
                    continue
                self.known.add(key)
                fresh.append(cand)
            out += fresh
            if out:
                return out
            self.inner.notify_runner_results([], [])
        return out or None

    def notify_runner_results(self, measure_candidates: list[Any], results: list[Any]) -> None:
        if self.audit is not None and not self.audit.stopped and measure_candidates:
            for cand, res in zip(measure_candidates, results, strict=True):
                self.audit.measured(trace_sha256_of(cand.sch), mean_run_s(res))
            self._check_audit(self._context)
        self.inner.notify_runner_results(measure_candidates, results)

    def audit_past(self, context: Any, cands: list[Any], means: list[float]) -> None:
        """Judge the filter's model on measurements committed before this search (a resumed
        shard, or a workload tuned before; :func:`past_candidates`): its first round is then
        filtered only if the model ranks them."""
        if self.audit is None or self.scorer is None or self.filter_fraction >= 1.0 or len(cands) < 2:
            return
        self.audit.observe([float(x) for x in self.scorer(context, cands)], means)
        self._check_audit(context)

    def _check_audit(self, context: Any) -> None:
        if self.audit is None:
            return
        was_trusted = self.audit.trusted
        reason = self.audit.check()
        if self.audit.trusted and not was_trusted:
            log.info("filtering starts for %s: %s", getattr(context, "task_name", None) or "this workload",
                     self.audit.passed)
        if reason:
            self.progress.filter_stopped = reason
            log.info("filtering stops for %s: %s; every later candidate is measured",
                     getattr(context, "task_name", None) or "this workload", reason)

    def clone(self) -> Any:
        return ResumingSearch(self.inner.clone(), self.known, include_default=self.include_default,
                              progress=self.progress, seeds=self.seeds, budget=self.budget, scorer=self.scorer,
                              filter_fraction=self.filter_fraction, on_filtered=self.on_filtered,
                              should_stop=self.should_stop, audit=self.audit)


_AUDIT_PAST = 64
"""Committed measurements (the fastest) the filter's and the warm start's models are judged on
when a shard of a workload measured here before starts."""


def new_online_model(threads: int) -> Any:
    """MetaSchedule's XGBModel as stock ``tune_tasks`` creates it for ``cost_model="xgb"``."""
    return ms.cost_model.XGBModel(num_tuning_cores=threads, tree_method="auto")


def past_candidates(mod: Any, rows: list[Any]) -> tuple[list[Any], list[float]]:
    """Committed measurements (``trace_json``, ``mean_run_s``) as MeasureCandidates of ``mod``
    with their mean run times, to judge a cost model on; a trace that does not apply (e.g. one
    another TVM version wrote) is left out."""
    cands, means = [], []
    for row in rows:
        try:
            cands.append(_candidate(mod, row.trace_json))
        except Exception:  # noqa: BLE001 - not judged
            continue
        means.append(float(row.mean_run_s))
    return cands, means


def _entry_func(mod: Any) -> Any:
    names = [gv.name_hint for gv in mod.get_global_vars()]
    return mod["main"] if "main" in names else mod[mod.get_global_vars()[0]]


def _candidate(mod: Any, trace_json: str | None = None) -> Any:
    """A MeasureCandidate of ``mod`` scheduled by a trace (its JSON text; None: unscheduled)."""
    sch = tvm.s_tir.Schedule(mod)
    if trace_json is not None:
        tvm.s_tir.Trace.apply_json_to_schedule(json.loads(trace_json), sch)
    return ms.MeasureCandidate(sch, ms.arg_info.ArgInfo.from_prim_func(_entry_func(sch.mod)))


@dataclass
class ShardResult:
    shard_id: int
    state: str
    measured: int
    errors: int
    skipped_known: int
    best_s: float | None
    seconds: float
    commit_s: float = 0.0
    """Of ``seconds``, the time spent committing measurements and marking the shard done."""
    lease_s: float = 0.0
    """Time spent leasing the shard (set by the caller that leased it)."""
    filtered: int = 0
    """Candidates scored out by the cost model (recorded, never measured)."""
    preempted: str | None = None
    """Why the shard stopped before its budget (plateau preemption), or None."""
    unused_trials: int = 0
    filter_stopped: str | None = None
    """Why filtering stopped in this shard (:class:`tunefleet.filter_audit.FilterAudit`), or None."""
    warm_start_dropped: str | None = None
    """Why the class's trained model stopped guiding this shard's search (it misranked its
    measurements: :class:`tunefleet.tvm.learned.FleetCostModel`), or None."""


def tune_shard(
    db: Database,
    shard: Shard,
    owner: str,
    *,
    builder: Any = None,
    runner: Any = None,
    lease_s: float = shards.DEFAULT_LEASE_S,
    num_trials_per_iter: int = 64,
    seed: int | None = None,
    num_threads: int | None = None,
    on_batch: CandidateHook | None = None,
    work_dir: str | None = None,
    pushgateway: str | None = None,
    cost_model: TrainedModel | None = None,
    warm_start_min_agreement: float = DEFAULT_MIN_AGREEMENT,
    online_model: Any = None,
    transfer: bool = True,
    policy: PreemptionPolicy | None = None,
    filter_fraction: float = 1.0,
    filter_model: TrainedModel | None = None,
    filter_min_agreement: float = DEFAULT_MIN_AGREEMENT,
) -> ShardResult:
    """Tune a leased shard to its trial budget, committing as it goes; mark it done or failed.

    A shard leased again after its worker died resumes: its budget is reduced by what it already
    committed, and no committed candidate is measured again. Every candidate is committed with
    its share of the round's energy and its useful flag, and the attempt's energy, node time and
    money are added to the shard (:mod:`tunefleet.accounting`); with ``pushgateway`` its metrics
    are pushed there as it goes. With ``cost_model`` (the class's current trained model) the
    search is warm-started: guided by it from the first round and refined online
    (:class:`tunefleet.tvm.learned.FleetCostModel`); without, MetaSchedule's own XGBModel guides
    it. The warm start is judged after every round (and, for a workload already measured here,
    first on those measurements): once the trained model orders fewer than
    ``warm_start_min_agreement`` of the pairs of the measured candidates right, it is dropped
    and the online model alone guides the rest of the shard (0: never dropped;
    ``ShardResult.warm_start_dropped`` says why).
    ``online_model`` is that XGBModel when the caller keeps one across shards (a fresh one
    otherwise): like stock ``tune_tasks`` over many tasks, it then learns from every shard tuned
    before this one instead of starting each from nothing. With ``transfer``, a workload this
    class never measured first measures the best schedule of the most compatible class that
    builds here (:mod:`tunefleet.transfer`), which then seeds the search.

    Cost efficiency (Trimmer): every round updates the (workload, class)'s persisted plateau
    state; with ``policy`` enabled the shard stops when it says so, is marked done with a
    ``preempted`` event, and the trials it did not use are reallocated to the workloads still
    improving (:func:`tunefleet.budget.reallocate`); a shard of an already preempted workload
    ends at once the same way. With ``filter_fraction`` < 1 and a ``filter_model`` (the class's
    current trained model), that model scores each round's search candidates and only that
    fraction of them is measured; the rest are committed as ``filtered`` (no run time, no
    energy) and spend the budget without being built or run. Filtering starts only once that
    model orders at least ``filter_min_agreement`` of the pairs of this workload's measured
    candidates right (until then rounds are scored and measured in full; a shard whose workload
    already has measurements here is judged on them first), and stops for the rest of the shard
    when it falls below (:mod:`tunefleet.filter_audit`; 0: filtering from the first round, never stopped).
    Without a trained model nothing is filtered: the online model that guides the search is not
    used as a filter, since ranking its own picks again only removes the search's exploration.
    """
    from tunefleet.accounting import ShardAccountant, add_shard_energy
    from tunefleet.preemption import PreemptionPolicy, new_state, observe_round, stop_reason
    from tunefleet.tvm.targets import make_target, target_fingerprint

    policy = policy or PreemptionPolicy(enabled=False)

    started = time.monotonic()
    hw = db.hardware_class(shard.hardware_class_id)
    wl = db.workload(shard.workload_id)
    target = make_target(hw.target)
    done_before = db.count_measurements(shard_id=shard.id)
    remaining = shard.trials - done_before
    progress = ShardProgress()
    if remaining <= 0:
        t0 = time.perf_counter()
        shards.complete(db, shard.id, owner)
        return ShardResult(shard.id, "done", 0, 0, 0, None, time.monotonic() - started,
                           commit_s=time.perf_counter() - t0)
    if done_before:
        log.info("shard %d resumes: %d of %d trials already committed", shard.id, done_before, shard.trials)
    state = db.tuning_state(wl.id, hw.id)
    if state is None:
        best = db.best_measurements(wl.id, hw.id, 1)
        state = new_state(wl.id, hw.id, float(best[0].mean_run_s) if best else None)
    if policy.enabled and state.preempted:
        log.info("shard %d: workload %s is preempted on %s (%s); its %d trial(s) go elsewhere", shard.id,
                 wl.structural_hash[:12], hw.name, state.reason, remaining)
        return _end_preempted(db, shard, owner, hw.name, state.reason or "preempted", remaining, progress, started)
    weight = db.workload_weight(wl.id)

    def on_round(records: list[NewMeasurement], energy: RoundEnergy | None) -> None:
        means = [r.mean_run_s for r in records if r.mean_run_s is not None]
        observe_round(state, min(means) if means else None, energy.joules if energy else 0.0, weight, policy)
        reason = stop_reason(state, policy)
        if reason:
            state.preempted, state.reason = True, reason
        db.save_tuning_state(state)

    def should_stop() -> str | None:
        return state.reason if state.preempted else None

    def on_filtered(cands: list[Any]) -> None:
        db.commit_measurements([NewMeasurement(
            wl.id, hw.id, trace_json_of(c.sch), None, error_kind=FILTERED, error_msg="scored out by the cost model",
            args_info=[a.as_json() for a in c.args_info], shard_id=shard.id, attempt=0, energy_j=0.0,
            useful=False, tvm_version=tvm.__version__, target=target_fingerprint(target)) for c in cands])

    from tunefleet.tvm.builder import import_tensor_intrinsics

    import_tensor_intrinsics()  # the fast way; TuneContext would otherwise import them slowly
    mod = tvm.ir.load_json(wl.tir_json)
    known = db.measured_trace_hashes(wl.id, hw.id)
    is_cpu = target.kind.name == "llvm"
    seeds: list[str] = []
    if transfer and not known:
        from tunefleet.transfer import transfer_best

        borrowed = transfer_best(db, wl.id, hw.name)
        if borrowed is not None:
            seeds.append(borrowed.trace_json)
            log.info("shard %d is seeded with the best schedule of %s (%.3g ms there)", shard.id,
                     borrowed.source_hardware, borrowed.source_mean_run_s * 1e3)
    search = ResumingSearch(ms.search_strategy.EvolutionarySearch(), known, include_default=is_cpu, progress=progress,
                            seeds=seeds, budget=remaining, filter_fraction=filter_fraction, on_filtered=on_filtered,
                            should_stop=should_stop if policy.enabled else None)
    threads = num_threads or int(hw.target.get("num-cores") or len(os.sched_getaffinity(0)))
    ctx = ms.TuneContext(mod, target=target, space_generator="post-order-apply", search_strategy=search,
                         task_name=wl.name, rand_state=seed if seed is not None else -1, num_threads=threads)
    own_builder = builder is None
    if builder is None:
        from tunefleet.tvm.builder import PersistentBuilder

        builder = PersistentBuilder(max_workers=threads)
    if runner is None:
        from tunefleet.tvm.runner import make_runner

        runner = make_runner(target)
    callback: CommitCallback | None = None
    online = online_model if online_model is not None else new_online_model(threads)
    model: Any = online
    past: tuple[list[Any], list[float]] | None = None
    if known and (cost_model is not None or (filter_fraction < 1.0 and filter_model is not None)):
        past = past_candidates(ctx.mod, db.best_measurements(wl.id, hw.id, _AUDIT_PAST))
    if cost_model is not None:
        from tunefleet.tvm.learned import FleetCostModel

        model = FleetCostModel(cost_model, online=online, audit=FilterAudit(warm_start_min_agreement))
        log.info("shard %d warm-starts with cost model v%s", shard.id, cost_model.version)
        if past is not None:
            model.judge_past(ctx, *past)
    if filter_fraction < 1.0 and filter_model is not None:
        from tunefleet.tvm.learned import FleetCostModel

        search.scorer = FleetCostModel(filter_model).prior
        search.audit = FilterAudit(filter_min_agreement)
        if past is not None:
            search.audit_past(ctx, *past)
    accountant = ShardAccountant(db, hw, wl, pushgateway=pushgateway, shard_id=shard.id, attempt=shard.attempts)
    if accountant.metrics is not None and hasattr(runner, "on_degree"):  # the adaptive parallel runner
        from functools import partial

        runner.on_degree = partial(accountant.metrics.set_measure_parallelism, hw.name)
        accountant.metrics.set_measure_parallelism(hw.name, runner.degree)
    try:
        with Heartbeat(db, shard.id, owner, lease_s) as hb, tempfile.TemporaryDirectory(dir=work_dir) as tmp:
            callback = CommitCallback(
                db, wl.id, hw.id, shard.id, target=target_fingerprint(target), attempt=0,
                build_seconds=getattr(builder, "pop_build_time", None), heartbeat=hb, on_batch=on_batch,
                progress=progress, accountant=accountant, on_round=on_round,
                measure_info=getattr(runner, "pop_measure_info", None),
            )
            ms.tune_tasks(
                tasks=[ctx], task_weights=[1.0], work_dir=tmp,
                max_trials_global=remaining, num_trials_per_iter=min(num_trials_per_iter, remaining),
                builder=builder, runner=runner, database=FleetDatabase(db, hw.name), cost_model=model,
                measure_callbacks=[callback, ms.measure_callback.RemoveBuildArtifact(),
                                   ms.measure_callback.UpdateCostModel()],
                task_scheduler="round-robin",
            )
    except (LeaseLostError, DatabaseError):
        raise  # not this shard's fault: the caller (or Prefect's retry) decides
    except Exception as exc:  # a crashed tuning attempt: record it on the shard, keep what was committed
        cause = callback.failure if callback is not None else None
        if isinstance(cause, (TransientError, DatabaseError)):
            raise cause from None
        log.debug("shard %d traceback", shard.id, exc_info=True)
        add_shard_energy(db, shard.id, accountant.finish())
        state = shards.fail(db, shard.id, owner, f"{type(exc).__name__}: {exc}")
        log.error("shard %d failed: %s", shard.id, exc)
        return ShardResult(shard.id, state, progress.measured, progress.errors, progress.skipped_known,
                           progress.best_s, time.monotonic() - started, commit_s=progress.commit_s)
    finally:
        progress.warm_start_dropped = getattr(model, "dropped", None)
        if own_builder and hasattr(builder, "shutdown"):
            builder.shutdown()
    t0 = time.perf_counter()
    add_shard_energy(db, shard.id, accountant.finish())
    unused = max(0, shard.trials - db.count_measurements(shard_id=shard.id))
    if policy.enabled and state.preempted and unused > 0:  # (a plateau on the last round: simply done)
        log.info("shard %d preempted after %d round(s): %s; %d trial(s) unused", shard.id, state.rounds,
                 state.reason, unused)
        result = _end_preempted(db, shard, owner, hw.name, state.reason or "preempted", unused, progress, started)
        result.commit_s += progress.commit_s + time.perf_counter() - t0
        return result
    shards.complete(db, shard.id, owner)
    progress.commit_s += time.perf_counter() - t0
    return ShardResult(shard.id, "done", progress.measured, progress.errors, progress.skipped_known,
                       progress.best_s, time.monotonic() - started, commit_s=progress.commit_s,
                       filtered=progress.filtered, filter_stopped=progress.filter_stopped,
                       warm_start_dropped=progress.warm_start_dropped)


def _end_preempted(db: Database, shard: Shard, owner: str, hardware: str, reason: str, unused: int,
                   progress: ShardProgress, started: float) -> ShardResult:
    """Mark a preempted shard done and hand its unused trials to the workloads still improving."""
    from tunefleet.budget import reallocate

    shards.complete(db, shard.id, owner, event="preempted", reason=reason, unused_trials=unused)
    reallocate(db, hardware, unused, from_workload_id=shard.workload_id, from_shard_id=shard.id,
               max_attempts=shard.max_attempts)
    return ShardResult(shard.id, "done", progress.measured, progress.errors, progress.skipped_known,
                       progress.best_s, time.monotonic() - started, filtered=progress.filtered,
                       preempted=reason, unused_trials=unused, filter_stopped=progress.filter_stopped,
                       warm_start_dropped=progress.warm_start_dropped)
