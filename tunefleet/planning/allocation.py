"""How each round of a model-level budget (:class:`tunefleet.budget.Budget`) is split across a
model's workloads.

The allocator is the task scheduler of Ansor (OSDI'20) and of MetaSchedule's gradient task
scheduler, on tunefleet's shards: a model's latency is Σ weight × run time over its workloads,
so the next trials go where they are expected to take the most off that sum. Each round,

1. every workload gets its **minimum** first (``min_trials`` over all its trials on the class):
   its default schedule is single-threaded and unvectorised, so even a small workload needs one
   real search round before it is worth comparing; those whose default schedule is not measured
   yet come first (a shard's first trial measures it);
2. the rest is handed out in whole search batches, each to the workload whose next batch is
   expected to take the most off the model's latency (per joule when energy-aware): weight × the
   drop of its best run time that batch buys, where a workload's best is taken to fall as a power
   of its trials, ``best(t) ∝ t^-α``, ``α`` fitted over its last ``window`` trials. A search's
   gains shrink as it goes on, so each further batch of a workload in the same plan is worth less
   than the one before it (the greedy split is exact for such diminishing returns), and a young
   workload's fast first steps buy it a batch or two, not the whole round. The window never
   reaches back to the default schedule: that step (single-threaded and unvectorised to the first
   tuned candidate) is not the search's pace. A workload that stopped improving gets nothing while
   others still improve; one whose best improved by at most ``epsilon`` over a full window has
   *plateaued* and leaves the run, like one whose search space ran out or that plateau preemption
   stopped. One whose search has not beaten its default schedule yet, in less than a window, or
   has run less than a search batch (a first round's hub schedules and few candidates), gets the
   median exponent of those that showed a pace (it has not shown what its search can do); when
   none has, the round is split by latency share alone.

A duration budget has no trial count: its rounds go on until the deadline
(:mod:`tunefleet.planning.rounds`). Pure Python — no TVM, no database:
:func:`tunefleet.planning.rounds.plan_round` reads the workloads' histories from the database and
creates the round's shards.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from tunefleet.vocab import CONFIRM_ROUNDS, TIMING_ROUND_S, TIMING_ROUNDS, UNTUNED_TIMING_S

DEFAULT_MIN_TRIALS = 8
"""The default schedule plus one search round of 7 candidates. At the old flat default of 8
trials per workload every resnet18 workload came out multi-threaded and vectorised, 12-15x
faster than untuned (docs/performance.md): the minimum buys that big first step for each."""

DEFAULT_EPSILON = 0.01
"""A workload whose best improved by at most this fraction over its last window has plateaued."""

MAX_BATCHES_PER_ROUND = 4
"""Most search batches one workload gets in one round, so that a round (the time between two
re-plannings) stays a few batches long even when one workload's score dominates."""

# Tier offsets of shard priorities (higher leases first): a round's shards lease before any flat
# plan's (priority = call count) and the minimums before the shares.
_TIER_DEFAULT, _TIER_MINIMUM, _TIER_SHARE = 3e12, 2e12, 1e12



@dataclass(frozen=True)
class WorkloadHistory:
    """What the allocator knows of one workload of the model on the hardware class."""

    workload_id: int
    weight: int
    """Calls per inference in the model(s) of the run."""
    run_s: tuple[float | None, ...] = ()
    """Mean run time of every candidate committed on the class, in commit order (None: a build or
    run error); candidates filtered out unmeasured are left out."""
    committed: int | None = None
    """Trials committed on the class, filtered ones included (None: ``len(run_s)``)."""
    outstanding: int = 0
    """Trials of its open (pending or leased) shards not committed yet."""
    default_s: float | None = None
    """Its default schedule's run time, once measured."""
    flops: float = 0.0
    exhausted: bool = False
    """A shard of it ended short because its search produced no new candidate."""
    preempted: bool = False
    """Plateau preemption stopped it on this class (:mod:`tunefleet.planning.preemption`)."""
    joules_per_trial: float | None = None

    @property
    def spent(self) -> int:
        return len(self.run_s) if self.committed is None else self.committed

    @property
    def planned(self) -> int:
        return self.spent + self.outstanding

    @property
    def best_s(self) -> float | None:
        measured = [x for x in self.run_s if x is not None]
        return min(measured) if measured else None

    @property
    def unmeasured(self) -> bool:
        """Nothing measured successfully yet, its default schedule included."""
        return self.best_s is None

    def best_so_far(self) -> list[float | None]:
        """Its best run time after each of its trials (None before its first success)."""
        best: list[float | None] = []
        cur: float | None = None
        for x in self.run_s:
            if x is not None and (cur is None or x < cur):
                cur = x
            best.append(cur)
        return best

    def recent_gain(self, window: int) -> tuple[float, int] | None:
        """(relative improvement of the best, trials it took) over the last ``window`` trials: what
        :meth:`plateaued` judges. A window reaching back before the first success starts at the
        first success (usually the default schedule). None before any success."""
        best = self.best_so_far()
        cur = best[-1] if best else None
        if cur is None:
            return None
        k = min(window, len(best) - 1)
        ref = best[len(best) - 1 - k] if k > 0 else None
        if ref is None:
            first = next(i for i, b in enumerate(best) if b is not None)
            ref, k = best[first], len(best) - 1 - first
        assert ref is not None
        return (ref - cur) / ref, k

    def plateaued(self, window: int, epsilon: float = DEFAULT_EPSILON) -> bool:
        """Its best improved by at most ``epsilon`` over a full window of trials (or preemption said so)."""
        if self.preempted:
            return True
        gain = self.recent_gain(window)
        return gain is not None and gain[1] >= window and gain[0] <= epsilon

    def exponent(self, window: int) -> float | None:
        """``α`` of the power law ``best(t) ∝ t^-α`` (t: its trials) fitted over its last ``window``
        trials, from its first searched candidate on: the step from the trial before it, usually
        the default schedule, is not the search's pace. None when fewer than half a window (a
        search batch) of trials ran since its first searched candidate, or nothing in the window
        beat what came before it: its search has not shown a pace (:func:`_outlooks`). A first
        round's few trials are the hub's or another class's schedules adapted to it, or one small
        search batch: their order says little of the search's pace, and an exponent fitted to
        them starved a workload at half the sgemm peak while those around it ran at the peak."""
        best = self.best_so_far()
        n = len(best)
        searched = next((i for i in range(1, n) if self.run_s[i] is not None), None)
        if searched is None or n - searched < window // 2:
            return None
        start = max(n - 1 - window, searched)
        ref, cur = best[start], best[-1]
        if ref is None or cur is None or start == n - 1 or cur >= ref:
            return None
        return math.log(ref / cur) / math.log(n / (start + 1))


@dataclass(frozen=True)
class Grant:
    """Trials for one workload in one round (one shard)."""

    workload_id: int
    trials: int
    priority: float
    why: str
    """``default`` (its default schedule is not measured yet), ``minimum`` or ``share``."""


@dataclass(frozen=True)
class RoundPlan:
    grants: tuple[Grant, ...]
    stop: str | None = None
    """Why nothing (more) can be planned, when ``grants`` is empty; else None."""

    @property
    def trials(self) -> int:
        return sum(g.trials for g in self.grants)


def allocate(
    workloads: Sequence[WorkloadHistory],
    trials: int | None,
    *,
    min_trials: int = DEFAULT_MIN_TRIALS,
    batch: int = 64,
    window: int | None = None,
    epsilon: float = DEFAULT_EPSILON,
    rounds: bool = True,
    max_batches: int = MAX_BATCHES_PER_ROUND,
    energy_aware: bool = False,
) -> RoundPlan:
    """Split the next round of a model's budget across its workloads (see the module docstring).

    Parameters
    ----------
    workloads:
        Every workload of the model(s) on the hardware class.
    trials:
        Trials left in the budget (None: no trial count, a duration budget).
    min_trials:
        Trials every workload gets in total before any gets a share of the rest.
    batch:
        Trials of one search batch: the unit of the shares (a shard of k batches runs k rounds of
        MetaSchedule's search).
    window:
        Trials over which recent improvement is judged (default two batches).
    rounds:
        True: one round — each workload in play at most ``max_batches`` batches, the round at
        most one batch per workload in play; a workload with open shards waits for their results.
        False: the whole of ``trials`` at once (``plan --budget``), workloads never measured
        estimated from FLOPs.
    """
    if min_trials < 1 or batch < 1 or (trials is None and not rounds):
        raise ValueError("min_trials and batch must be positive; a one-shot allocation needs a trial count")
    window = window or 2 * batch
    left = math.inf if trials is None else max(0, trials)
    if left <= 0:
        return RoundPlan((), "trial budget spent")
    in_play = [w for w in workloads if not w.exhausted and not w.preempted]
    if not in_play:
        return RoundPlan((), _gone(workloads))
    grants: list[Grant] = []

    # 1. minimums: untouched workloads first (their default schedule), then by latency share.
    below = [w for w in in_play if w.planned < min_trials]
    below.sort(key=lambda w: (not w.unmeasured, -_share_proxy(w), w.workload_id))
    short_of_minimum = 0
    for rank, w in enumerate(below):
        need = min_trials - w.planned
        if need > left:
            short_of_minimum += 1
            continue
        tier = _TIER_DEFAULT if w.unmeasured else _TIER_MINIMUM
        grants.append(Grant(w.workload_id, need, tier + len(below) - rank, "default" if w.unmeasured else "minimum"))
        left -= need
    granted = {g.workload_id for g in grants}

    # 2. shares of the rest, batch by batch to the largest expected gain. In rounds, a workload
    # given its minimum now or with open shards waits for their results before it competes.
    candidates = [w for w in in_play if not w.plateaued(window, epsilon) and (
        not rounds or (w.planned >= min_trials and w.workload_id not in granted and not w.outstanding))]
    minimums = {g.workload_id: g.trials for g in grants}
    outlooks = _outlooks(candidates, window, epsilon, minimums, estimate=not rounds)
    candidates = [w for w in candidates if w.workload_id in outlooks]

    def value(w: WorkloadHistory, k: int) -> float:
        """Model-latency seconds its k-th batch of this plan is expected to take off (per joule)."""
        o = outlooks[w.workload_id]
        v = w.weight * _drop(o.best_s, o.alpha, o.start, k, batch)
        return v / w.joules_per_trial if energy_aware and w.joules_per_trial else v

    size = min(left, len(candidates) * batch) if rounds else left
    steps: dict[int, int] = {w.workload_id: 0 for w in candidates}
    given: dict[int, int] = {w.workload_id: 0 for w in candidates}
    while size > 0:
        open_ = [w for w in candidates if not rounds or steps[w.workload_id] < max_batches]
        if not open_:
            break
        pick = max(open_, key=lambda w: (value(w, steps[w.workload_id] + 1), -w.workload_id))
        n = int(min(batch, size))
        given[pick.workload_id] += n
        steps[pick.workload_id] += 1
        size -= n
        left -= n
    ranked = sorted((w for w in candidates if given[w.workload_id]), key=lambda w: (-value(w, 1), w.workload_id))
    for i, w in enumerate(ranked):
        n, earlier = given[w.workload_id], next((g for g in grants if g.workload_id == w.workload_id), None)
        if earlier is None:
            grants.append(Grant(w.workload_id, n, _TIER_SHARE + len(ranked) - i, "share"))
        else:  # one-shot: its minimum and its share in one grant
            grants[grants.index(earlier)] = Grant(w.workload_id, earlier.trials + n, earlier.priority, earlier.why)
    if grants:
        return RoundPlan(tuple(grants))
    if short_of_minimum:
        return RoundPlan((), f"the {int(left)} trial(s) left cannot give {short_of_minimum} more workload(s) "
                             f"their minimum of {min_trials}")
    if rounds and any(w.outstanding for w in in_play):
        return RoundPlan((), "waiting for open shards")
    return RoundPlan((), _gone(workloads, window, epsilon))


def _gone(workloads: Sequence[WorkloadHistory], window: int | None = None, epsilon: float = DEFAULT_EPSILON) -> str:
    """Why no workload can use more trials."""
    exhausted = sum(w.exhausted for w in workloads)
    if exhausted == len(workloads):
        return "no workload can use more trials: every search space ran out of new candidates"
    how = f"best improved by <= {epsilon:.0%} over its last {window} trials" if window else "preempted"
    return (f"no workload can use more trials: every workload plateaued ({how})"
            + (f" or ran out of candidates ({exhausted})" if exhausted else ""))


def _share_proxy(w: WorkloadHistory) -> float:
    """Its share of the model's latency where measured, else weight × FLOPs (the minimums sort
    measured and unmeasured workloads apart, so the two units are never compared)."""
    best = w.best_s
    return w.weight * best if best is not None else w.weight * max(w.flops, 0.0)


@dataclass(frozen=True)
class _Outlook:
    """What the allocator expects of a workload's next batches: its best run time, which falls as
    ``(t / start)^-alpha`` from its ``start`` trials on (``start`` ≥ 1)."""

    best_s: float
    alpha: float
    start: int


def _drop(best_s: float, alpha: float, start: int, k: int, batch: int) -> float:
    """Seconds the ``k``-th batch (k ≥ 1) from ``start`` trials takes off a best of ``best_s`` that
    falls as ``(t / start)^-alpha``."""
    return best_s * ((start / (start + (k - 1) * batch)) ** alpha - (start / (start + k * batch)) ** alpha)


def _floor(start: int, window: int, epsilon: float) -> float:
    """The exponent at which a best falls by ``epsilon`` over the window after ``start`` trials:
    the least a workload not plateaued yet is expected to gain, so it keeps a small share."""
    return -math.log1p(-epsilon) / math.log1p(window / start)


def _outlooks(candidates: Sequence[WorkloadHistory], window: int, epsilon: float, minimums: dict[int, int], *,
              estimate: bool) -> dict[int, _Outlook]:
    """Each candidate's :class:`_Outlook`; those with nothing measured are left out, unless
    ``estimate`` (a one-shot plan).

    A workload whose search has not shown its pace — less than a search batch of it, or nothing
    better than its first searched candidate (or than its default schedule) in less than a full
    window — gets the median exponent
    of the workloads that improved, not 0: its first random candidates can all lose to the default
    (mobilenet_v2's depthwise convolutions on AVX2 did), and at the floor it would never get another
    batch while the others make their big first steps; a full window with nothing better still
    makes it plateau. No exponent is below :func:`_floor`'s. With ``estimate``, a workload never measured gets a run time estimated from
    its FLOPs at the measured workloads' median seconds per FLOP (weight × FLOPs when nothing is
    measured) and the median exponent too.
    """
    alphas = {w.workload_id: w.exponent(window) for w in candidates}
    shown = [a for a in alphas.values() if a is not None]
    median = statistics.median(shown) if shown else 0.0
    measured = [w for w in candidates if w.best_s is not None and w.flops > 0]
    s_per_flop = statistics.median([w.best_s / w.flops for w in measured]) if measured else 1.0  # type: ignore[operator]
    out: dict[int, _Outlook] = {}
    for w in candidates:
        best = w.best_s
        if best is None:
            if not estimate:
                continue
            best = max(w.flops, 1.0) * s_per_flop
        alpha, start = alphas[w.workload_id], max(1, w.planned + minimums.get(w.workload_id, 0))
        out[w.workload_id] = _Outlook(best, max(median if alpha is None else alpha, _floor(start, window, epsilon)), start)
    return out


RUNNER_CALL_S = 0.1
"""The local runner's overhead per measurement beyond the kernel's own runs (sending it to the
runner process, allocating its arguments): what a build's re-timing pays per schedule and round."""


def build_reserve_s(workloads: Sequence[WorkloadHistory], *, compile_s: float | None = None,
                    confirm_top: int = 0, extract_s: float | None = None,
                    last_build_s: float | None = None, kept: bool = False) -> float:
    """Seconds to keep for building the model after tuning (``tunefleet run``'s last step).

    The build loads and re-extracts the model (unless ``kept``), re-times ``confirm_top`` schedules of each workload
    side by side (each compiled, then :data:`~tunefleet.vocab.CONFIRM_ROUNDS` measurements of five
    runs and the runner's overhead; about 70 % as many again in a second pass:
    :mod:`tunefleet.delivery.confirm`), compiles it twice (the class's recipe, untuned; the other
    recipes it is compared with only with stored schedules of their own, which a class that tunes
    its own recipe seldom has), checks the outputs, exports it for onnxruntime and times the tuned
    build, PyTorch eager and onnxruntime side by side (:data:`~tunefleet.vocab.TIMING_ROUNDS` rounds of
    about :data:`~tunefleet.vocab.TIMING_ROUND_S` s each, at least 5 calls a round, after a
    warm-up; the untuned build alone for about :data:`~tunefleet.vocab.UNTUNED_TIMING_S`, not
    at all when its check call alone took longer: that call is its figure).

    Once the model has been built on the class on this machine, that build's time
    (``last_build_s``) with a fifth more and 5 s is the reserve (the re-timing's on top): a
    measured build is the best forecast of the next one. Before that, the reserve is estimated,
    measured where the database knows it — the model's untuned (Σ weight × default run time) and
    tuned (Σ weight × best) latencies, the mean build time of one candidate (``compile_s``), how
    long loading and extracting the model took here (``extract_s``, the run's own extract step)
    — and guessed where not (a workload whose default is not measured yet
    counts like the measured ones on average; 0.5 s per compile; 5 s and a quarter second per
    workload to load and extract). Each compile takes the longer of half the extraction's time
    (the Relax passes again, less the weights' folding, which the build does once) and one
    candidate build per workload; exporting the model for onnxruntime and the runtimes' first
    calls, as long as loading and extracting it. With ``kept`` (the planner's reserve is for the
    build of a pipeline, which takes the model its extract step kept: :mod:`tunefleet.models.kept`),
    loading and extracting are not counted; a measured ``last_build_s`` leaves them out too. A
    fifth more and 5 s on top keep a build that a shared machine slows within its reserve (the
    figures this was sized on: docs/performance.md, "Figures that used to live in docstrings").
    """
    n = len(workloads)
    if n == 0:
        return 0.0
    defaults = [w.weight * w.default_s for w in workloads if w.default_s is not None]
    bests = [w.weight * w.best_s for w in workloads if w.best_s is not None]  # type: ignore[operator]
    untuned = sum(defaults) * n / len(defaults) if defaults else 0.0
    tuned = sum(bests) * n / len(bests) if bests else untuned
    per_compile = compile_s if compile_s is not None else 0.5
    confirm = 0.0
    if confirm_top >= 2:  # compiled on two builder processes; then each round's runner call
        per_schedule = per_compile / 2 + CONFIRM_ROUNDS * (RUNNER_CALL_S + 5 * tuned / n)
        confirm = 10.0 + 1.7 * confirm_top * n * per_schedule  # 10 s: the builder processes' start
    if last_build_s is not None:
        return _with_margin(last_build_s + confirm)
    load = extract_s if extract_s is not None else 5.0 + 0.25 * n  # import + extraction, which grows with the workloads
    compile_ = 2 * max(n * per_compile, 0.5 * load)
    setup = load  # the ONNX export, onnxruntime's session, every runtime's first calls
    # The untuned build: its output check, then about UNTUNED_TIMING_S of timing (none when the
    # check's call took longer); three runtimes alternating (the alternatives taken as fast as the
    # tuned build), each warmed up for about 3 calls.
    per_runtime = TIMING_ROUNDS * max(TIMING_ROUND_S, 5 * tuned) + max(0.2, 3 * tuned)
    untuned_timing = 0.0 if untuned > UNTUNED_TIMING_S else max(untuned, min(16 * untuned, UNTUNED_TIMING_S))
    timing = untuned + untuned_timing + 3 * per_runtime + tuned
    return _with_margin((0.0 if kept else load) + compile_ + setup + confirm + timing)


def _with_margin(seconds: float) -> float:
    """A fifth more and 5 s: a build that a shared machine slows stays within its reserve."""
    return 1.2 * seconds + 5.0
