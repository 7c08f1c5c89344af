"""Energy-aware trial budget: spend the next trials where they buy the most latency per joule.

For each (workload, hardware class) the :func:`outlooks` are read from its measurements:

    expected gain per joule = weight x recent improvement rate / energy per trial

* *weight*: the workload's call count over all models (a faster kernel called 12 times saves
  12 times as much model latency);
* *recent improvement rate*: seconds the best-so-far latency dropped per trial over its last
  ``window`` trials (filtered candidates excluded);
* *energy per trial*: the mean joules of its measured candidates (the class mean for a workload
  measured without energy figures).

A workload never measured successfully has no rate yet: it is *unexplored* and ranks above every
explored one (by weight), because its first trials (the default schedule, the first search
round) are where most of the gain is. :func:`reprioritise` writes these ranks into the pending
shards' priorities, so workers lease the shard with the best expected gain per joule next;
:func:`reallocate` hands the trials a preempted shard did not use to the workloads still
improving, in proportion to their expected gain per joule (into their pending shards where they
have one). No TVM and no Prefect here.

A model-level budget (``tunefleet run --budget``) is spent in rounds planned by
:func:`plan_round`: it reads the model's workloads from the database, asks the allocator
(:func:`tunefleet.allocation.allocate`) for the round and creates its shards, whose priorities are
the allocator's (per joule when energy-aware). Which rule is used when: shards of a budget's round
are leased in the allocator's order (:func:`reprioritise` is for flat plans, ``--trials``), and the
trials a preempted shard of a round did not use go back to the budget for the next round instead of
to :func:`reallocate`'s recipients.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tunefleet.allocation import DEFAULT_MIN_TRIALS, Budget, RoundPlan, WorkloadHistory, allocate, build_reserve_s
from tunefleet.db import Database, TrialGrant
from tunefleet.db.models import utcnow
from tunefleet.errors import ParameterError

if TYPE_CHECKING:
    from tunefleet.db.models import Shard

log = logging.getLogger(__name__)

DEFAULT_WINDOW = 16
_UNEXPLORED_PRIORITY = 1e12  # above any finite gain per joule (seconds per joule are tiny)


@dataclass(frozen=True)
class Outlook:
    """What one more trial of a workload is expected to buy on a hardware class."""

    workload_id: int
    weight: int
    trials: int
    best_s: float | None
    rate_s_per_trial: float
    joules_per_trial: float | None
    preempted: bool

    @property
    def unexplored(self) -> bool:
        return self.best_s is None

    @property
    def gain_per_joule(self) -> float:
        """Weighted model-latency seconds expected per joule (inf while unexplored)."""
        if self.unexplored:
            return math.inf
        return self.weight * self.rate_s_per_trial / (self.joules_per_trial or 1.0)

    @property
    def improving(self) -> bool:
        return not self.preempted and (self.unexplored or self.rate_s_per_trial > 0)

    @property
    def priority(self) -> float:
        """A shard priority (higher leases first) that orders by expected gain per joule."""
        return _UNEXPLORED_PRIORITY + self.weight if self.unexplored else self.gain_per_joule


def outlooks(db: Database, hardware: str, workload_ids: list[int] | None = None, *,
             window: int = DEFAULT_WINDOW) -> dict[int, Outlook]:
    """The outlook of every workload that has shards on the class (or of the ones given)."""
    hw = db.hardware_class(hardware)
    inputs = db.outlook_inputs(hw.id, workload_ids)
    if not inputs.workload_ids:
        return {}
    workload_ids, weights, preempted = inputs.workload_ids, inputs.weights, inputs.preempted
    curves: dict[int, list[float | None]] = defaultdict(list)  # best so far after each trial
    joules: dict[int, list[float]] = defaultdict(list)
    for wl, mean, energy in inputs.trials:
        curve = curves[wl]
        prev = curve[-1] if curve else None
        curve.append(mean if mean is not None and (prev is None or mean < prev) else prev)
        if energy is not None:
            joules[wl].append(float(energy))
    all_j = [j for js in joules.values() for j in js]
    class_j = sum(all_j) / len(all_j) if all_j else None
    out: dict[int, Outlook] = {}
    for wl in workload_ids:
        curve = curves.get(wl, [])
        best = curve[-1] if curve else None
        rate = 0.0
        if best is not None:
            k = min(window, len(curve) - 1)
            then = curve[-1 - k] if k > 0 else None
            # The window starts before the first success: count the first success as the gain.
            rate = ((then - best) / k) if (then is not None and k > 0) else (best / max(1, len(curve)))
        js = joules.get(wl)
        out[wl] = Outlook(wl, weights.get(wl, 1) or 1, len(curve), best, max(rate, 0.0),
                          (sum(js) / len(js)) if js else class_j, wl in preempted)
    return out


def reprioritise(db: Database, hardware: str) -> int:
    """Set every pending shard's priority to its workload's expected gain per joule; returns how many."""
    hw = db.hardware_class(hardware)
    pending = db.pending_shards(hw.id)
    if not pending:
        return 0
    views = outlooks(db, hardware, sorted({wl for _, wl in pending}))
    db.set_shard_priorities({shard_id: views[wl].priority for shard_id, wl in pending})
    return len(pending)


@dataclass(frozen=True)
class Grant:
    """Trials a preempted workload gave up, handed to one improving workload."""

    shard_id: int
    workload_id: int
    trials: int
    extended: bool
    """True: added to a pending shard of the workload; False: a new pending shard."""


def reallocate(db: Database, hardware: str, trials: int, *, from_workload_id: int, from_shard_id: int | None = None,
               min_chunk: int = 8, max_leases: int = 3) -> list[Grant]:
    """Give ``trials`` a preempted workload did not use to the workloads still improving.

    Recipients are the class's other workloads with shards that are not preempted and are either
    unexplored or improved within their recent window, in proportion to their expected gain per
    joule (at least ``min_chunk`` trials each, best first). A recipient with a pending shard gets
    the trials added to it (a shard costs seconds to start: its search space, its search's first
    population); one without gets a new pending shard. With no workload improving, the trials are
    not spent at all (that is energy saved); the freed count is kept on the preempted workload's
    state either way.
    """
    hw = db.hardware_class(hardware)
    db.add_freed_trials(from_workload_id, hw.id, trials)
    if trials <= 0:
        return []
    if from_shard_id is not None and (db.shard(from_shard_id).history or [{}])[0].get("round") is not None:
        log.info("%d trial(s) freed by workload %d on %s go back to its budget's next round", trials,
                 from_workload_id, hardware)
        return []
    views = [o for o in outlooks(db, hardware).values() if o.workload_id != from_workload_id and o.improving]
    if not views:
        log.info("%d trial(s) freed by workload %d on %s: no workload is still improving, none spent",
                 trials, from_workload_id, hardware)
        return []
    views.sort(key=lambda o: (-o.priority, o.workload_id))
    recipients = views[: max(1, trials // max(1, min_chunk))]
    finite = [o.gain_per_joule for o in recipients if not o.unexplored]
    top = max(finite) if finite and max(finite) > 0 else 1.0
    scores = [top if o.unexplored else max(o.gain_per_joule, 1e-30) for o in recipients]
    total = sum(scores)
    shares = [int(trials * sc / total) for sc in scores]
    shares[0] += trials - sum(shares)
    now = utcnow()
    grants = [
        TrialGrant(view.workload_id, n, view.priority,
                   {"at": now.isoformat(timespec="seconds"), "event": "reallocated", "trials": n,
                    "from_workload": from_workload_id, "from_shard": from_shard_id,
                    "gain_per_joule": None if view.unexplored else view.gain_per_joule})
        for view, n in zip(recipients, shares, strict=True) if n > 0
    ]
    granted = [Grant(shard_id, grant.workload_id, grant.trials, extended=extended)
               for shard_id, grant, extended in db.grant_trials(hw.id, grants, max_leases=max_leases, now=now)]
    log.info("%d trial(s) freed by workload %d on %s reallocated to %s", trials, from_workload_id, hardware,
             ", ".join(f"workload {g.workload_id} (+{g.trials}{'' if g.extended else ', new shard'})"
                       for g in granted))
    return granted


# -- model-level budgets, in rounds -----------------------------------------------------------
@dataclass(frozen=True)
class RoundResult:
    """One round of a model's budget as :func:`plan_round` planned it."""

    round: int
    """The round's number (1 for the first); the last round planned when nothing was."""
    shards: list[Shard]
    plan: RoundPlan
    workloads: list[WorkloadHistory]
    spent: int
    """Trials committed on the model's workloads since the budget started."""
    outstanding: int
    """Trials planned and not committed yet (this round's included)."""
    build_reserve_s: float
    """Seconds to keep for building the model afterwards (:func:`tunefleet.allocation.build_reserve_s`)."""
    open_round_shards: list[int]

    @property
    def stop(self) -> str | None:
        return None if self.shards else self.plan.stop


def plan_round(db: Database, hardware: str, model_ids: Sequence[int], budget: Budget, since: dt.datetime, *,
               min_trials: int = DEFAULT_MIN_TRIALS, batch: int = 64, energy_aware: bool = False,
               rounds: bool = True, shard_trials: int | None = None, max_leases: int = 3,
               dry: bool = False, time_left_s: float | None = None) -> RoundResult:
    """Plan the next round of ``budget`` over the workloads of ``model_ids`` on a class: the shards.

    The trials a budget has left are its trials minus those committed on the models' workloads
    since ``since`` (errors and filtered candidates count) minus those planned and not committed
    yet — counted in the database, so they hold across worker processes: planners of a class take
    turns (:meth:`~tunefleet.db.shards.ShardsMixin.planning`), so two workers that refill at the
    same instant never plan the same trials twice. A duration budget has no trial count; the engine stops its
    rounds at the deadline. ``rounds=False`` plans the whole budget at once (``tunefleet plan
    --budget``). Each grant is one shard (cut in pieces of at most ``shard_trials``); its
    ``planned`` event records the round and the budget. ``dry``: plan nothing, only say what the
    round would be (or why there is none). ``time_left_s`` (a wall-time budget's time to its
    deadline) caps the round at the trials that fit at the pace so far (wall seconds per trial
    committed since the first one, shard starts included), so that the time left is split by the
    allocator rather than taken by whichever shards lease first.
    """
    hw = db.hardware_class(hardware)
    with db.planning(hw.id):  # a concurrent planner of the class waits, then counts these shards
        view = db.budget_view(hw.id, list(model_ids), since)
        workloads = [WorkloadHistory(r.workload_id, r.weight, tuple(r.run_s), r.committed, r.outstanding, r.default_s,
                                     r.flops, r.exhausted, r.preempted, r.joules_per_trial) for r in view.rows]
        spent = sum(r.committed_since for r in view.rows)
        outstanding = sum(r.outstanding for r in view.rows)
        left = None if budget.trials is None else budget.trials - spent - outstanding
        fit = _trials_that_fit(view.first_since, spent, time_left_s)
        cap = left if fit is None else fit if left is None else min(left, fit)
        plan = allocate(workloads, cap, min_trials=min_trials, batch=batch, rounds=rounds, energy_aware=energy_aware)
        if fit is not None and not plan.grants and allocate(workloads, left, min_trials=min_trials, batch=batch,
                                                            rounds=rounds).grants:
            plan = RoundPlan((), f"deadline: about {fit} trial(s) fit in the {time_left_s:.0f}s left, "
                                 "not enough for another round")
        builds = [r.build_s for r in view.rows if r.build_s is not None]
        reserve = build_reserve_s(workloads, compile_s=sum(builds) / len(builds) if builds else None)
        number = view.rounds + 1
        created: list[Shard] = []
        if plan.grants and not dry:
            piece = shard_trials or max(g.trials for g in plan.grants)
            cuts = [(g.workload_id, min(piece, g.trials - start), g.priority) for g in plan.grants
                    for start in range(0, g.trials, piece)]
            created = db.add_shards(hw.id, cuts, max_leases=max_leases, info={"round": number, "budget": str(budget)})
    if created:
        log.info("budget %s on %s, round %d: %d trial(s) over %d workload(s) (%s)", budget, hardware, number,
                 plan.trials, len(created), ", ".join(f"{g.workload_id}: {g.trials} {g.why}" for g in plan.grants))
    elif not dry:
        log.info("budget %s on %s: no round %d: %s", budget, hardware, number, plan.stop)
    return RoundResult(number if created else view.rounds, created, plan, workloads, spent,
                       outstanding + sum(s.trials for s in created), reserve,
                       view.open_round_shards + [s.id for s in created])


def _trials_that_fit(first: dt.datetime | None, spent: int, time_left_s: float | None) -> int | None:
    """Trials that fit in ``time_left_s`` at the pace since ``first`` (None: no deadline or no pace yet)."""
    if time_left_s is None or first is None or spent < 1:
        return None
    elapsed = (utcnow() - first).total_seconds()
    if elapsed <= 0:
        return None
    return max(0, int(time_left_s * spent / elapsed))


def plan_once(db: Database, hardware: str, budget: str | int | Budget, model_ids: Sequence[int] | None = None, *,
              shard_trials: int = 64, batch: int = 64, min_trials: int = DEFAULT_MIN_TRIALS,
              energy_aware: bool = False, max_leases: int = 3) -> RoundResult:
    """Split a trial budget over the workloads of ``model_ids`` (default: every model) at once,
    before anything is tuned (``tunefleet plan --budget``): every workload its minimum, the rest by
    the allocator's score, estimated from FLOPs for workloads never measured. Trials already
    planned and not tuned count against it, so planning twice in a row plans nothing new."""
    parsed = Budget.parse(budget, name="budget")
    if parsed.trials is None:
        raise ParameterError(f"invalid budget: {str(parsed)!r} is a duration; a plan takes a number of trials "
                             "(e.g. 2000) — a duration is spent by `tunefleet run --budget` or `tunefleet tune --budget`")
    ids = list(model_ids) if model_ids else [m.id for m in db.models()]
    return plan_round(db, hardware, ids, parsed, utcnow(), min_trials=min_trials, batch=batch,
                      energy_aware=energy_aware, rounds=False, shard_trials=shard_trials, max_leases=max_leases)


def end_rounds(db: Database, hardware: str, model_ids: Sequence[int], since: dt.datetime) -> list[int]:
    """Cancel the pending shards a budget's rounds planned since ``since`` (the budget ended: at
    its deadline a round may be left half done); their ids."""
    hw = db.hardware_class(hardware)
    pending = db.budget_view(hw.id, list(model_ids), since).open_round_shards
    cancelled = db.cancel_shards(pending) if pending else []
    if cancelled:
        log.info("budget over: %d pending shard(s) of its last round cancelled", len(cancelled))
    return cancelled
