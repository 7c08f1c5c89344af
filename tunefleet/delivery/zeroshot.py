"""Zero-shot schedules: the current cost model proposes schedules for workloads never measured.

For every workload of a hardware class with no measurement there, :func:`predict_workloads`
runs the evolutionary search guided by the class's current cost model alone
(:func:`propose`) and stores its ``top_k`` proposals in the
``predictions`` table — never among the measurements, so ``best``, the MetaSchedule
``Database`` and the datasets never see them as measured. With a ``verify`` budget (candidates
or wall time, in all) the proposals are then built and measured on this node by rank — every
workload's best-scored first, then every second — and committed as ordinary measurements (no
shard), each workload's default schedule first, then the schedules it can borrow
(:func:`borrowed_schedules`: its own records on compatible classes, a hub bundle's among them, and
the same operator's best at the closest other shapes, fitted to its shape), then the proposals.
A budget left once all of those are measured goes to *refining*: the model searches again from
each workload's best measured schedules and its new proposals are measured, the workloads that
cost the model most first. After that the workload is measured like any other: a build takes its
best measured schedule.

Re-running is idempotent: a workload the current model already predicted is not searched again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from tunefleet.errors import NotSupportedError, TunefleetError
from tunefleet.tvm.threads import class_threads

if TYPE_CHECKING:
    from tunefleet.budget import Budget
    from tunefleet.db import Database
    from tunefleet.db.tables import HardwareClass, Workload
    from tunefleet.engine.worker import Tuner
    from tunefleet.learning.costmodel import TrainedModel
    from tunefleet.store import ArtifactStore

log = logging.getLogger(__name__)

DEFAULT_TOP_K = 5
DEFAULT_VERIFY = "90s"
"""What ``build --zero-shot`` spends unless told (``--verify``): 90 s of wall time for the proposals'
searches and their verification together (a tenth of the default 15-minute tuning), heaviest
workloads first."""
BORROWED = 3
"""Borrowed schedules (:func:`borrowed_schedules`) verification measures per workload, after its
default schedule and before the model's proposals."""
REFINED = 4
"""New schedules one refining step measures for a workload (a search seeded with its best
measured schedules), once its default, borrowed and proposed schedules are measured."""
VERIFY_BATCH = 4
"""New schedules of one workload verification measures together after its default (and a refining
step's): the builder compiles a batch in parallel, and a batch pays the measurement's set-up once."""


def parse_verify(value: str | int | Budget, *, name: str = "verify") -> Budget | int:
    """A verification budget from user text: ``0`` (pure prediction), a candidate count or a wall
    time (``90s``, ``2m``); anything else is one :class:`~tunefleet.errors.ParameterError` line
    naming ``name``."""
    from tunefleet.budget import Budget
    from tunefleet.errors import ParameterError

    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.lstrip("-").isdigit():
        if int(text) < 0:
            raise ParameterError(f"invalid {name}: {int(text)} (must be >= 0)")
        return int(text)
    return Budget.parse(text, name=name)


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
    borrowed: int = 0
    """Of ``verified``, the schedules borrowed from other shapes or classes (:func:`borrowed_schedules`)."""
    refined: int = 0
    """Of ``verified``, the schedules of the refining searches (the budget left after the proposals)."""
    best_score: float | None = None


@dataclass
class ZeroShotResult:
    hardware: str
    cost_model_version: int | None
    workloads: list[WorkloadPrediction] = field(default_factory=list)
    verify_budget: str | None = None
    """The verification budget as given (``40``, ``1m``); None: pure prediction."""
    verify_candidates: int = 0
    """Schedules verification measured (defaults, borrowed schedules and proposals)."""
    verify_seconds: float = 0.0
    """Wall time of the verification (measuring, and the refining searches)."""
    search_seconds: float = 0.0
    """Wall time of the proposals' searches before the verification (a wall-time budget counts it)."""

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
                "seconds_per_task": self.seconds_per_task, "verify_budget": self.verify_budget,
                "verify_candidates": self.verify_candidates, "verify_seconds": self.verify_seconds,
                "search_seconds": self.search_seconds, "workloads": [asdict(w) for w in self.workloads]}


def require_model(db: Database, store: ArtifactStore, hardware: str, *, pretrained: bool = True) -> TrainedModel:
    """The current cost model of a class, else (``pretrained``) the one shipped with tunefleet, or a
    one-line error saying how to get one."""
    from tunefleet.learning.pretrained import current_or_shipped

    model = current_or_shipped(db, store, hardware, pretrained=pretrained)
    if model is None:
        raise NotSupportedError(
            f"not supported: zero-shot on {hardware} without a current cost model (the shipped one is off: "
            f"TUNEFLEET_PRETRAINED_COST_MODEL=false); run `tunefleet dataset export` and "
            f"`tunefleet costmodel retrain --hardware {hardware}` first"
        )
    return model


def predict_workloads(
    db: Database,
    store: ArtifactStore,
    hardware: str,
    workload_ids: Iterable[int],
    *,
    top_k: int = DEFAULT_TOP_K,
    verify: Budget | int | None = None,
    tuner: Tuner | None = None,
    model: TrainedModel | None = None,
    seed: int = 0,
    on_workload: Callable[[WorkloadPrediction], None] | None = None,
    pretrained: bool = True,
    weights: dict[int, int] | None = None,
) -> ZeroShotResult:
    """Store the current model's ``top_k`` proposals for every unmeasured workload, then verify
    them by measurement within the ``verify`` budget.

    ``verify`` is a total: a :class:`~tunefleet.budget.Budget` of candidates or of wall time (an
    int is a candidate count; None or 0 measures nothing: pure prediction). A wall time counts from
    the start of this call: the proposals' searches and their verification together (the searches
    are never cut: a workload without proposals would keep its default schedule, so a model whose
    searches alone take longer than the budget verifies nothing). It is spent in the order of
    ``workload_ids`` (a build gives the heaviest first): every workload's default (unscheduled)
    program, as a tuning round measures it, then the schedules each can borrow
    (:func:`borrowed_schedules`, up to :data:`BORROWED`) and its proposals, by rank,
    :data:`VERIFY_BATCH` at a time: every workload's first batch, then every second, and so on up
    to ``top_k`` proposals each. A budget left after all of them refines: the model searches each
    workload again from its best measured schedules and :data:`REFINED` new ones are measured, the
    workloads whose best measured time times their ``weights`` (calls in the model, default 1) is
    largest first, round after round until the budget is spent or no search finds a schedule not
    measured yet. A wall time is checked before each batch, with the time the last batch took
    still ahead. ``tuner`` (its builder and runner) measures them; one is created for the class
    when there is a budget and none is given (which refuses a class this node cannot run). A class
    without a promoted model of its own predicts with the shipped one (version 0) unless
    ``pretrained`` is off (:func:`require_model`).
    """
    from tunefleet.budget import Budget

    if top_k < 1:
        raise TunefleetError(f"top_k must be >= 1, got {top_k}")
    if isinstance(verify, int) and not isinstance(verify, bool):
        if verify < 0:
            raise TunefleetError(f"verify must be >= 0 candidates, got {verify}")
        verify = Budget(trials=verify) if verify else None
    hw = db.hardware_class(hardware)
    model = model or require_model(db, store, hardware, pretrained=pretrained)
    started = time.monotonic()
    result = ZeroShotResult(hw.name, model.version, verify_budget=None if verify is None else str(verify))
    to_verify: list[tuple[Workload, WorkloadPrediction, list[Any]]] = []
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
            if preds:
                to_verify.append((wl, item, preds))
        result.workloads.append(item)
        if on_workload is not None and verify is None:
            on_workload(item)
    result.search_seconds = time.monotonic() - started
    if verify is not None and to_verify:
        _verify(db, hw, to_verify, verify, tuner, result, model=model, seed=seed, weights=weights or {},
                started=started)
        for _, item, _ in to_verify:
            if on_workload is not None:
                on_workload(item)
    return result


def borrowed_schedules(db: Database, wl: Workload, hw: HardwareClass, limit: int = BORROWED) -> list[str]:
    """Up to ``limit`` schedules (trace JSON) a workload the class never measured can borrow, best
    bets first: its own best records on the most compatible classes (a hub bundle's, replayed on it:
    :func:`~tunefleet.planning.transfer.transfer_seeds`), then the same operator's best at the
    closest other shapes measured on this class, then on the compatible classes, fitted to its
    shape (:func:`~tunefleet.planning.warm_shapes.shape_seeds_near`)."""
    from tunefleet.planning.transfer import transfer_seeds
    from tunefleet.planning.warm_shapes import shape_seeds_near

    traces = transfer_seeds(db, wl, hw, limit).traces
    if len(traces) < limit:
        traces += [t for t in shape_seeds_near(db, wl, hw, limit=limit - len(traces)).traces if t not in traces]
    return traces[:limit]


def _verify(db: Database, hw: HardwareClass, items: list[tuple[Workload, WorkloadPrediction, list[Any]]],
            budget: Budget, tuner: Tuner | None, result: ZeroShotResult, *, model: TrainedModel, seed: int,
            weights: dict[int, int], started: float | None = None) -> None:
    """Measure every workload's default schedule, then the schedules it borrows and its proposals
    by rank, :data:`VERIFY_BATCH` at a time (every workload's first batch, then every second, ...)
    within ``budget``, then refine with what is left (:func:`_refine`). A wall-time budget counts
    from ``started`` (``time.monotonic``; default now): the proposals' searches before it count too."""
    from tunefleet.engine.learned import measure_traces

    own_tuner = None
    if tuner is None:
        from tunefleet.engine.worker import Tuner

        tuner = own_tuner = Tuner(db, hw.name)
    t0 = time.monotonic()
    since = t0 if started is None else started
    last_batch_s = [0.0]

    def spent() -> bool:
        if budget.trials is not None:
            return result.verify_candidates >= budget.trials
        # The next batch is expected to take what the last one took: one that cannot end within
        # the budget does not start (checking only that time is left let the last batch overrun).
        return time.monotonic() - since + last_batch_s[0] >= float(budget.seconds or 0.0)

    def measure(wl: Workload, item: WorkloadPrediction, batch: list[tuple[str | None, Any, bool]],
                most: int | None = None) -> tuple[int, int]:
        """Measure up to ``most`` new schedules of a workload from ``batch`` (trace JSON or None for
        the default, args_info, borrowed), in order, cut to what a candidate budget has left.
        Returns (measured, how many of ``batch`` were used up). A schedule measured already (a
        proposal that is the default schedule, or one borrowed and proposed) is skipped by
        measure_traces before the cut: it costs nothing and counts nothing, so a budget of N
        candidates measures N new schedules."""
        left = None if budget.trials is None else max(0, budget.trials - result.verify_candidates)
        limit = left if most is None else most if left is None else min(left, most)
        if not batch or limit == 0:
            return 0, 0
        sent: list[int] = []
        began = time.monotonic()
        n = measure_traces(db, wl, hw, [(t, a) for t, a, _ in batch], builder=tuner.builder, runner=tuner.runner,
                           sent=sent, limit=limit)
        last_batch_s[0] = time.monotonic() - began
        item.verified += n
        item.borrowed += sum(batch[i][2] for i in sent)
        result.verify_candidates += n
        return n, sent[-1] + 1 if limit is not None and len(sent) >= limit else len(batch)

    try:
        # Each workload's default schedule first, as a tuning round measures it: a workload whose
        # other schedules are all slower than its default is then built with the default. What it
        # can borrow is looked up before: only a workload never measured here borrows.
        queues: list[tuple[Workload, WorkloadPrediction, list[tuple[str, Any, bool]]]] = []
        for wl, item, preds in items:
            if spent():
                return
            borrowed = borrowed_schedules(db, wl, hw, BORROWED)  # read now: the bench sets BORROWED = 0
            queues.append((wl, item, [(t, None, True) for t in borrowed]
                           + [(p.trace_json, p.args_info, False) for p in preds]))
            measure(wl, item, [(None, None, False)])
        used = [0] * len(queues)  # how far each workload's queue is measured or skipped
        while any(u < len(queue) for u, (_, _, queue) in zip(used, queues)):
            for i, (wl, item, queue) in enumerate(queues):
                if used[i] >= len(queue):
                    continue
                if spent():
                    return
                used[i] += measure(wl, item, queue[used[i]:], VERIFY_BATCH)[1]
                item.status = "verified"
        _refine(db, hw, [(wl, item) for wl, item, _ in queues], model, seed=seed, weights=weights,
                measure=measure, spent=spent)
    finally:
        result.verify_seconds = time.monotonic() - t0
        log.info("zero-shot on %s: %d schedule(s) of %d workload(s) verified in %.0fs (budget %s), %d of them "
                 "borrowed from other shapes or classes, %d from refining searches", hw.name,
                 result.verify_candidates, sum(item.verified > 0 for _, item, _ in items), result.verify_seconds,
                 budget, sum(item.borrowed for _, item, _ in items), sum(item.refined for _, item, _ in items))
        if own_tuner is not None:
            own_tuner.close()


def _refine(db: Database, hw: HardwareClass, items: list[tuple[Workload, WorkloadPrediction]], model: TrainedModel,
            *, seed: int, weights: dict[int, int], measure: Callable[..., int], spent: Callable[[], bool]) -> None:
    """Spend what the budget has left on searches that start from each workload's best measured
    schedules (the model still their only fitness: nothing retrains here) and measure
    :data:`REFINED` new schedules of each, round after round; each round takes the workloads in
    the order of what they cost the model now (best measured time x calls), and drops a workload
    whose search found nothing new."""
    from tunefleet.tvm.bridge import FleetDatabase

    database = FleetDatabase(db, hw.name)  # the search's first population takes the measured best

    def cost(wl: Workload) -> float:
        top = db.best_measurements(wl.id, hw.id, 1)
        return (top[0].mean_run_s if top else 0.0) * weights.get(wl.id, 1)

    active = [(wl, item) for wl, item in items if item.verified]
    step = 0
    while active and not spent():
        step += 1
        for wl, item in sorted(active, key=lambda pair: -cost(pair[0])):
            if spent():
                return
            known = db.measured_trace_hashes(wl.id, hw.id)
            found = propose(wl, hw, model, top_k=REFINED + len(known), seed=seed + step, database=database)
            fresh = [p for p in found.proposals if p.trace_sha256 not in known][:REFINED]
            if spent():
                return
            measured, _ = measure(wl, item, [(p.trace_json, p.args_info, False) for p in fresh])
            item.refined += measured
            if not measured:
                active.remove((wl, item))


def model_workload_ids(db: Database, model_id: int) -> list[int]:
    """The ids of a model's extracted workloads."""
    return [wl.id for wl, _ in db.workloads(model_id=model_id)]


__all__ = ["BORROWED", "DEFAULT_TOP_K", "DEFAULT_VERIFY", "REFINED", "VERIFY_BATCH", "WorkloadPrediction",
           "ZeroShotResult", "borrowed_schedules", "model_workload_ids", "parse_verify", "predict_workloads",
           "require_model"]


@dataclass
class Proposal:
    """A schedule the cost model proposes for a workload (not measured)."""

    trace_json: str
    trace_sha256: str
    score: float
    args_info: list[Any]


@dataclass
class ProposeResult:
    proposals: list[Proposal]
    candidates_scored: int
    seconds: float


def _context(wl: Workload, hw: HardwareClass, *, population: int, generations: int, seed: int,
             num_threads: int | None) -> Any:
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tunefleet.tvm.builder import import_tensor_intrinsics
    from tunefleet.tvm.targets import make_target

    import_tensor_intrinsics()
    threads = num_threads or class_threads(hw.target)
    return ms.TuneContext(
        tvm.ir.load_json(wl.tir_json), target=make_target(hw.target), space_generator="post-order-apply",
        search_strategy=ms.search_strategy.EvolutionarySearch(
            population_size=population, init_min_unmeasured=min(50, population), genetic_num_iters=generations),
        task_name=wl.name, rand_state=seed, num_threads=threads,
    )


def propose(
    wl: Workload,
    hw: HardwareClass,
    model: TrainedModel,
    *,
    top_k: int = 5,
    candidates: int = 32,
    population: int = 64,
    generations: int = 2,
    seed: int = 0,
    num_threads: int | None = None,
    database: Any = None,
) -> ProposeResult:
    """Search one workload guided by ``model`` alone and return its ``top_k`` best-scored schedules.

    One round of MetaSchedule's evolutionary search (``population`` random schedules evolved for
    ``generations`` generations of mutation with the model as fitness) yields ``candidates``
    schedules; they and the default (unscheduled) program are scored again and the ``top_k``
    distinct ones returned, best first. Nothing is built or measured. ``database`` (a MetaSchedule
    database, e.g. :class:`~tunefleet.tvm.bridge.FleetDatabase`) seeds part of the first population
    with the workload's best measured schedules, as a tuning round's search does; None starts from
    random schedules only.

    The cost is dominated by MetaSchedule's ``PerStoreFeature`` extraction, paid for every
    schedule of every generation; the defaults are sized for seconds per task, smaller than a
    tuning round's 512 x 4 (``docs/performance.md`` has the measured figures).
    """
    import numpy as np
    from tvm.s_tir import meta_schedule as ms

    from tunefleet.engine.learned import FleetCostModel
    from tunefleet.tvm.traces import candidate, trace_json_of, trace_sha256_of

    t0 = time.perf_counter()
    ctx = _context(wl, hw, population=population, generations=generations, seed=seed, num_threads=num_threads)
    cost = FleetCostModel(model)
    spaces = ctx.generate_design_space()
    ctx.pre_tuning(max_trials=candidates, num_trials_per_iter=candidates, design_spaces=spaces,
                   database=database if database is not None else ms.database.MemoryDatabase(), cost_model=cost)
    try:
        found = list(ctx.generate_measure_candidates() or [])
    finally:
        ctx.post_tuning()
    mod = ctx.mod
    if ctx.target.kind.name == "llvm":  # the default schedule is a valid candidate on CPU only
        found.append(candidate(mod))
    scores = cost.prior(ctx, found)
    seen: set[str] = set()
    out: list[Proposal] = []
    for i in np.argsort(-scores, kind="stable"):
        cand = found[int(i)]
        key = trace_sha256_of(cand.sch)
        if key in seen:
            continue
        seen.add(key)
        out.append(Proposal(trace_json_of(cand.sch), key, float(scores[i]), [a.as_json() for a in cand.args_info]))
        if len(out) >= top_k:
            break
    return ProposeResult(out, len(found), time.perf_counter() - t0)
