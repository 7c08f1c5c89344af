"""Shards: planning tuning work, and the lease state machine that hands it to workers.

A shard is ``trials`` candidates to measure for one (workload, hardware class)::

    pending --lease--> leased --complete--> done
                         | \\--fail------------> pending   (attempts < max_leases)
                         |  \\                -> failed    (attempts exhausted, error kept)
                         \\--lease lost (expired)--> pending after a backoff (lost < max_lost_leases)
                                               \\-> failed  (lost leases exhausted)
    pending|leased|failed --cancel--> cancelled;   failed|cancelled --retry--> pending

A lease carries an owner, an expiry that heartbeats push forward (Optuna's heartbeat idea) and a
*generation*, the fencing token: every lease and reclaim bumps it, and every commit, heartbeat and
end of a lease is checked against it in its own transaction, so a worker whose lease was taken
over cannot store anything more (:class:`~tunefleet.errors.StaleLeaseError`). Expiry is set and
judged on the database's clock, never a worker's. A worker that dies stops heartbeating, its
lease expires, and the next :func:`lease` call requeues the shard, whose new owner warm-starts
from the measurements already committed.

Losing a worker is not the shard's fault: a lost lease counts in ``lost_leases``, apart from the
attempts that ended in an error (``leases``, at most ``max_leases``); lost leases are retried
after a backoff (:func:`lost_lease_backoff`) up to ``max_lost_leases``. The candidates in flight
at a death become suspects, re-measured one per batch when the shard resumes; one in flight alone
at a second death is recorded as a crash (:data:`~tunefleet.vocab.CRASH`) and never proposed again.

Every transition is a conditional UPDATE (compare-and-set on state, owner and generation) made by
the database (:mod:`tunefleet.db.shards`), so two workers can never both hold one shard, on
SQLite or PostgreSQL; this module decides which transition to ask for. No Prefect here: the
orchestration layer wraps these functions.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass

from tunefleet.db import Database
from tunefleet.db.tables import Shard
from tunefleet.errors import LeaseLostError, TunefleetError
from tunefleet.vocab import (
    CRASH_AFTER_DEATHS,
    DEFAULT_LEASE_S,
    DEFAULT_MAX_LOST_LEASES,
    DONE,
    FAILED,
    LEASED,
    PENDING,
    RETRY_BACKOFF_S,
    RETRY_JITTER,
    STATES,
)

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class PlannedWork:
    """One (workload, hardware class) pair as the planner saw it."""

    workload_id: int
    structural_hash: str
    weight: int
    measured: int
    outstanding: int
    new_trials: int
    preempted: bool = False


# -- planning -------------------------------------------------------------------------------
def plan(
    db: Database,
    hardware: str,
    *,
    target_trials: int,
    shard_trials: int = 64,
    model: int | str | None = None,
    max_leases: int = 3,
) -> tuple[list[Shard], list[PlannedWork]]:
    """Cut the untuned shortfall of every workload into pending shards for one hardware class.

    The shortfall of a (workload, hardware class) is ``target_trials`` minus the trials already
    spent (measurements committed, or the budget of shards already done, whichever is more — a
    search space can run out of new candidates) minus the budget of shards pending or leased.
    So planning twice plans nothing new — also at the same time: planners of a class take turns
    (:meth:`~tunefleet.db.shards.ShardsMixin.planning`) — and raising the target tops up. Larger weights (call
    counts) get higher priority; ties go to the workload with more FLOPs. A workload preempted
    on this class (its tuning plateaued, :mod:`tunefleet.planning.preemption`) gets nothing until its
    plateau is reset (``Database.reset_plateaus``).

    Returns
    -------
    (shards created, per-workload view of the plan)
    """
    if target_trials < 1 or shard_trials < 1:
        raise TunefleetError("target_trials and shard_trials must be positive")
    hw = db.hardware_class(hardware)
    model_id = db.model(model).id if model is not None else None
    cuts: list[tuple[int, int, float]] = []
    view: list[PlannedWork] = []
    with db.planning(hw.id):  # a concurrent plan of the class waits, then sees these shards
        for row in db.planning_view(hw.id, model_id):
            budgets = row.trials_by_state
            spent = max(row.measured, budgets.get(DONE, 0))
            outstanding = budgets.get(PENDING, 0) + budgets.get(LEASED, 0)
            shortfall = 0 if row.preempted else max(0, target_trials - spent - outstanding)
            view.append(PlannedWork(row.workload_id, row.structural_hash, row.weight, spent, outstanding, shortfall,
                                    row.preempted))
            priority = float(row.weight) + min(float(row.flops or 0.0), 1e15) * 1e-16
            while shortfall > 0:
                trials = min(shard_trials, shortfall)
                cuts.append((row.workload_id, trials, priority))
                shortfall -= trials
        created = db.add_shards(hw.id, cuts, max_leases=max_leases) if cuts else []
    log.info("planned %d new shard(s) for %s over %d workload(s)", len(created), hardware, len(view))
    return created, view


# -- leases ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Backoff:
    """Seconds to wait before retry ``n`` (1, 2, ...): ``factor * 2**(n-1)`` up to ``cap``, with
    ``jitter`` (a fraction) spread randomly over it — Prefect's ``exponential_backoff`` with its
    jitter, which the Prefect tasks use (:data:`~tunefleet.vocab.RETRY_BACKOFF_S`). ``factor=0``:
    no waiting (tests)."""

    factor: float = RETRY_BACKOFF_S
    cap: float = 60.0
    jitter: float = RETRY_JITTER

    def delay(self, n: int) -> float:
        base = min(self.cap, self.factor * 2 ** (n - 1))
        return base * (1 + self.jitter * (2 * random.random() - 1))


_LOST_LEASE_BACKOFF = Backoff(cap=300.0, jitter=0.0)


def lost_lease_backoff(lost: int) -> float:
    """Seconds before a shard that lost its ``lost``-th lease may be leased again.

    The first loss is ordinary churn (a preempted node): at once. From the second on, a shard that
    keeps losing its workers waits 5 s, 10 s, 20 s ... at most 5 minutes.
    """
    return 0.0 if lost <= 1 else _LOST_LEASE_BACKOFF.delay(lost - 1)


def requeue_expired(db: Database, *, now: dt.datetime | None = None,
                    max_lost_leases: int = DEFAULT_MAX_LOST_LEASES) -> list[int]:
    """Requeue every leased shard whose lease expired on the database's clock, as a lost lease
    (or fail it, once ``max_lost_leases`` were lost). ``now`` replaces that clock (tests only).

    A heartbeat that extends the lease before the requeue's compare-and-set wins: the shard stays.
    """
    changed: list[int] = []
    for shard in db.expired_leases(now):
        lost = shard.lost_leases + 1
        new_state = FAILED if lost >= max_lost_leases else PENDING
        backoff = lost_lease_backoff(lost)
        error = (f"lease of {shard.lease_owner} (generation {shard.lease_generation}) expired at "
                 f"{shard.lease_expires_at:%Y-%m-%d %H:%M:%S} UTC: its worker stopped heartbeating "
                 f"(lost lease {lost}/{max_lost_leases})")
        if new_state == FAILED:
            error += f"; it lost {lost} leases, the most allowed (max_lost_leases): its workers keep dying"
        elif backoff:
            error += f"; leased again after {backoff:.0f} s"
        done = db.lose_lease(shard, state=new_state, error=error, backoff_s=backoff, crash_after=CRASH_AFTER_DEATHS,
                             now=now)
        if done is None:
            continue  # a heartbeat extended it meanwhile, or another worker requeued it first
        changed.append(shard.id)
        log.warning("shard %d: %s -> %s", shard.id, error, new_state)
        if done.crashed:
            log.warning("shard %d: candidate %s crashed its worker twice; recorded as a crash, never proposed "
                        "again", shard.id, done.crashed[:12])
    return changed


def lease(
    db: Database,
    hardware: str,
    owner: str,
    *,
    lease_s: float = DEFAULT_LEASE_S,
    shard_id: int | None = None,
    now: dt.datetime | None = None,
    reclaim: bool = False,
    max_lost_leases: int = DEFAULT_MAX_LOST_LEASES,
) -> Shard | None:
    """Lease the highest-priority pending shard of a hardware class (or a given one); None if none.

    With ``reclaim``, a shard still leased by ``owner`` itself comes first: an owner that retries
    after a lost connection (a Prefect task retry keeps its owner string) takes its own shard
    back at once, with its attempt count unchanged and a new generation, instead of waiting for
    the lease to expire. Expired leases are requeued first (:func:`requeue_expired`, up to
    ``max_lost_leases``). The returned shard's ``lease_generation`` is the fencing token of every
    write under the lease.
    """
    hw = db.hardware_class(hardware)
    if reclaim:
        reclaimed = db.reclaim_lease(hw.id, owner, lease_s=lease_s, shard_id=shard_id, now=now)
        if reclaimed is not None:
            log.info("shard %d reclaimed by its owner %s (attempt %d)", reclaimed.id, owner, reclaimed.leases)
            return reclaimed
    requeue_expired(db, now=now, max_lost_leases=max_lost_leases)
    shard = db.lease_shard(hw.id, owner, lease_s=lease_s, shard_id=shard_id, now=now)
    if shard is not None:
        log.info("shard %d leased by %s (attempt %d)", shard.id, owner, shard.leases)
    return shard


def _end_owned(db: Database, shard_id: int, owner: str, *, state: str, error: str | None, event: str,
               info: dict[str, object] | None = None, generation: int | None = None) -> None:
    if not db.end_lease(shard_id, owner, state=state, error=error, event=event, info=info, generation=generation):
        shard = db.shard(shard_id)
        raise LeaseLostError(
            f"shard {shard_id} is no longer leased by {owner}"
            + (f" (generation {generation})" if generation is not None else "")
            + f" (state {shard.state}, owner {shard.lease_owner}, generation {shard.lease_generation})"
        )


def heartbeat(db: Database, shard_id: int, owner: str, *, lease_s: float = DEFAULT_LEASE_S,
              generation: int | None = None) -> None:
    """Extend the lease (of that ``generation``: the fencing token); raises :class:`LeaseLostError`
    if the worker lost it."""
    if not db.heartbeat_lease(shard_id, owner, lease_s=lease_s, generation=generation):
        raise LeaseLostError(f"shard {shard_id} is no longer leased by {owner}"
                             + (f" (generation {generation})" if generation is not None else ""))


def complete(db: Database, shard_id: int, owner: str, *, event: str = "done", generation: int | None = None,
             **info: object) -> None:
    """Mark a leased shard done (``event`` names why in its history, e.g. ``preempted``, with ``info``)."""
    _end_owned(db, shard_id, owner, state=DONE, error=None, event=event, info=info, generation=generation)


def fail(db: Database, shard_id: int, owner: str, error: str, *, generation: int | None = None) -> str:
    """Record a failed attempt: back to pending while attempts remain, else failed. Returns the new state."""
    shard = db.shard(shard_id)
    new_state = FAILED if shard.leases >= shard.max_leases else PENDING
    _end_owned(db, shard_id, owner, state=new_state, error=error[:4000], event=f"attempt-failed->{new_state}",
               generation=generation)
    log.warning("shard %d attempt failed (%s) -> %s", shard_id, error.splitlines()[0][:200], new_state)
    return new_state


def give_back(db: Database, shard_id: int, owner: str, *, reason: str | None = None) -> bool:
    """Give a leased shard back unmeasured (its worker's builder or runner could not start, or its
    node cannot build or run code: ``reason``, kept in its history): pending again, no attempt
    spent. A lease already lost is left alone; whether ``owner`` still held it."""
    if db.give_back_lease(shard_id, owner, reason):
        log.warning("shard %d given back by %s: no attempt spent", shard_id, owner)
        return True
    return False


def _hardware_id(db: Database, hardware: str | None) -> int | None:
    return db.hardware_class(hardware).id if hardware is not None else None


def retry(db: Database, shard_ids: Sequence[int] | None = None, *, hardware: str | None = None) -> list[int]:
    """Put failed or cancelled shards back to pending with a fresh attempt budget."""
    return db.retry_shards(shard_ids, hardware_class_id=_hardware_id(db, hardware))


def cancel(db: Database, shard_ids: Sequence[int] | None = None, *, hardware: str | None = None) -> list[int]:
    """Cancel pending, leased or failed shards (a leased worker loses its lease at next heartbeat)."""
    return db.cancel_shards(shard_ids, hardware_class_id=_hardware_id(db, hardware))


def list_shards(db: Database, *, hardware: str | None = None, state: str | None = None) -> list[Shard]:
    if state is not None and state not in STATES:
        raise TunefleetError(f"unknown shard state {state!r}; one of {', '.join(STATES)}")
    return db.shards(states=[state] if state is not None else None, hardware_class_id=_hardware_id(db, hardware))


def get_shard(db: Database, shard_id: int) -> Shard:
    return db.shard(shard_id)
