"""Energy-aware priorities: spend the next trials where they buy the most latency per joule.

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
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from dataclasses import dataclass

from tunefleet.db import Database, TrialGrant
from tunefleet.db.tables import utcnow

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
