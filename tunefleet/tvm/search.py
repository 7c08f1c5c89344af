"""Search strategies: MetaSchedule's evolutionary search made resumable, and a fixed list.

:class:`ResumingSearch` wraps the evolutionary search so that a shard resumes instead of
repeating itself: candidates whose trace was already committed are never measured again, the
workload's default (unscheduled) program is measured first (so the best stored schedule is never
slower than the untuned build), and given seed schedules join the first round. Everything else a
round may be subjected to — a stop before it, a selection of what is measured, a look at the
results — comes through hooks the engine's policies provide; this module knows no policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from tunefleet.tvm.commit import ShardProgress
from tunefleet.tvm.ffi_errors import keeps_failure
from tunefleet.tvm.traces import candidate, trace_sha256_of

# (tune context, the round's search candidates) -> (kept, dropped): what is measured, what is not.
Selector = Callable[[Any, list[Any]], tuple[list[Any], list[Any]]]
# (tune context, measured candidates, their runner results), after every measured round.
ResultsHook = Callable[[Any, list[Any], list[Any]], None]


@derived_object
class ResumingSearch(ms.search_strategy.PySearchStrategy):
    """Evolutionary search that skips candidates already committed and measures the default first.

    Parameters
    ----------
    inner:
        The search that proposes candidates (``ms.search_strategy.EvolutionarySearch()``).
    known:
        sha256 of every trace already committed for (workload, hardware class).
    include_default:
        Measure the unscheduled program (an empty trace) if it was never measured.
    seeds:
        Trace JSON of schedules to measure in the first round too (e.g. one transferred from a
        compatible hardware class); once measured they seed the evolutionary search like any
        stored measurement.
    budget:
        Candidates this search may still hand out, measured or dropped (None: MetaSchedule's
        ``max_trials`` alone bounds it). A dropped candidate spends a trial without measuring.
    suspects:
        ``(trace JSON, args info)`` of candidates that were in flight when a worker of the shard died: handed out
        first, ONE per batch, so a worker that dies again is pinned on the one candidate it built.

    Hooks (attributes, None by default; the engine's policies set them)
    -------------------------------------------------------------------
    should_stop:
        Asked before every round; a reason (text) ends the search.
    select:
        Given each round's search candidates (never the default or the seeds), returns those to
        measure and those to drop; the dropped go to ``on_dropped`` and never reach the builder.
    on_results:
        Sees every measured round's candidates and runner results.
    on_proposed:
        Sees every batch handed to the builder, before it is built (to record what is in flight).
    """

    def __init__(self, inner: Any, known: set[str], *, include_default: bool = True,
                 progress: ShardProgress | None = None, seeds: list[str] | None = None,
                 budget: int | None = None, suspects: list[tuple[str, list[Any] | None]] | None = None) -> None:
        self.inner = inner
        self.known = set(known)
        self.suspects = list(suspects or [])
        self.include_default = include_default
        self.seeds = list(seeds or [])
        self.progress = progress or ShardProgress()
        self.budget = budget
        self.should_stop: Callable[[], str | None] | None = None
        self.select: Selector | None = None
        self.on_dropped: Callable[[list[Any]], None] | None = None
        self.on_results: ResultsHook | None = None
        self.on_proposed: Callable[[list[Any]], None] | None = None
        self.handed_out = 0
        self._forced_now = self._dropped_now = 0
        self._mod: Any = None
        self._context: Any = None

    @keeps_failure
    def _initialize_with_tune_context(self, context: Any) -> None:
        self._mod = context.mod
        self._context = context
        # Suspects are handed out on their own: the search must not propose them in a batch too.
        self.known |= {trace_sha256_of(candidate(self._mod, trace).sch) for trace, _ in self.suspects}
        self.inner._initialize_with_tune_context(context)

    @keeps_failure
    def pre_tuning(self, max_trials: int, num_trials_per_iter: int, design_spaces: list[Any],
                   database: Any = None, cost_model: Any = None) -> None:
        self.inner.pre_tuning(max_trials, num_trials_per_iter, design_spaces, database, cost_model)

    @keeps_failure
    def post_tuning(self) -> None:
        self.inner.post_tuning()

    @keeps_failure
    def generate_measure_candidates(self) -> list[Any] | None:
        t0 = time.monotonic()
        try:
            return self._generate_measure_candidates()
        finally:
            self.progress.proposed_at = now = time.monotonic()
            self.progress.search_s += now - t0

    def _generate_measure_candidates(self) -> list[Any] | None:
        reason = self.should_stop() if self.should_stop else None
        if reason:
            self.progress.stop_reason = reason
            return None
        left = None if self.budget is None else self.budget - self.handed_out
        if left is not None and left <= 0:
            return None
        if self.suspects:
            return self._hand_out(self._next_suspect())
        out = self._generate(left)
        if out is None:
            return None
        if left is not None and len(out) > left:
            out = out[:left]
        out = self._select(out)
        self.handed_out += self._dropped_now
        return self._hand_out(out) if out else self._generate_measure_candidates()

    def _hand_out(self, out: list[Any]) -> list[Any]:
        self.handed_out += len(out)
        if self.on_proposed is not None:
            self.on_proposed(out)
        return out

    def _next_suspect(self) -> list[Any]:
        """The next suspect alone (never filtered: it may be the one that kills workers)."""
        cand = candidate(self._mod, *self.suspects.pop(0))
        self.known.add(trace_sha256_of(cand.sch))
        return [cand]

    def _select(self, out: list[Any]) -> list[Any]:
        """The round's forced candidates (default, seeds) and the search's that ``select`` keeps."""
        self._dropped_now = 0
        forced, searched = out[: self._forced_now], out[self._forced_now:]
        if self.select is None or len(searched) < 2:
            return out
        kept, dropped = self.select(self._context, searched)
        if dropped and self.on_dropped is not None:
            self.on_dropped(dropped)
        self._dropped_now = len(dropped)
        self.progress.filtered += len(dropped)
        return forced + kept

    def _generate(self, left: int | None = None) -> list[Any] | None:
        out: list[Any] = []
        if self.include_default:
            self.include_default = False
            default = candidate(self._mod)
            key = trace_sha256_of(default.sch)
            if key not in self.known:
                self.known.add(key)  # a seed may be the default schedule too (a hub's best often is)
                out.append(default)
        seeds, self.seeds = self.seeds, []
        for trace in seeds:
            cand = candidate(self._mod, trace)
            key = trace_sha256_of(cand.sch)
            if key not in self.known:
                self.known.add(key)
                out.append(cand)
        self._forced_now = len(out)
        if left is not None and len(out) >= left:
            # The default and the seeds fill what the budget leaves (a replay round's shard): the
            # evolutionary search's population would be sampled, evolved and scored, then cut.
            return out
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

    @keeps_failure
    def notify_runner_results(self, measure_candidates: list[Any], results: list[Any]) -> None:
        if self.on_results is not None and measure_candidates:
            self.on_results(self._context, measure_candidates, results)
        self.inner.notify_runner_results(measure_candidates, results)

    @keeps_failure
    def clone(self) -> Any:
        twin = ResumingSearch(self.inner.clone(), self.known, include_default=self.include_default,
                              progress=self.progress, seeds=self.seeds, budget=self.budget, suspects=self.suspects)
        twin.should_stop, twin.select, twin.on_dropped, twin.on_results, twin.on_proposed = (
            self.should_stop, self.select, self.on_dropped, self.on_results, self.on_proposed)
        return twin


@derived_object
class FixedCandidates(ms.search_strategy.PySearchStrategy):
    """A search strategy that proposes a fixed list of candidates once, then stops."""

    def __init__(self, candidates: list[Any]) -> None:
        self.candidates = list(candidates)
        self._done = False

    def _initialize_with_tune_context(self, context: Any) -> None:
        pass

    def pre_tuning(self, max_trials: int, num_trials_per_iter: int, design_spaces: list[Any],
                   database: Any = None, cost_model: Any = None) -> None:
        self._done = False

    def post_tuning(self) -> None:
        pass

    def generate_measure_candidates(self) -> list[Any] | None:
        if self._done or not self.candidates:
            return None
        self._done = True
        return self.candidates

    def notify_runner_results(self, measure_candidates: list[Any], results: list[Any]) -> None:
        pass

    def clone(self) -> Any:
        return FixedCandidates(self.candidates)
