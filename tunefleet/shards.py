"""Shards: planning tuning work, and the lease state machine that hands it to workers.

A shard is ``trials`` candidates to measure for one (workload, hardware class)::

    pending --lease--> leased --complete--> done
                         | \\--fail / lease expired--> pending   (attempts < max_attempts)
                         |                    \\-----> failed    (attempts exhausted, error kept)
    pending|leased|failed --cancel--> cancelled;   failed|cancelled --retry--> pending

A lease carries an owner and an expiry that heartbeats push forward (Optuna's heartbeat idea):
a worker that dies stops heartbeating, its lease expires, and the next :func:`lease` call
requeues the shard, whose new owner warm-starts from the measurements already committed.
Every transition is a conditional UPDATE (compare-and-set on state and owner), so two workers
can never both hold one shard, on SQLite or PostgreSQL. No Prefect here: the orchestration
layer wraps these functions.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, update

from tunefleet.db import Database
from tunefleet.db.models import Measurement, ModelWorkload, Shard, TuningState, Workload, utcnow
from tunefleet.errors import NotFoundError, TransientError, TunefleetError
from tunefleet.vocab import CANCELLED, DEFAULT_LEASE_S, DONE, FAILED, LEASED, PENDING, STATES

log = logging.getLogger(__name__)



class LeaseLostError(TransientError):
    """The worker no longer holds the shard's lease (expired and taken, cancelled, or done)."""


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


def _event(shard: Shard, event: str, **info: object) -> list[object]:
    entry = {"at": utcnow().isoformat(timespec="seconds"), "event": event, **info}
    return [*(shard.history or []), entry]


# -- planning -------------------------------------------------------------------------------
def plan(
    db: Database,
    hardware: str,
    *,
    target_trials: int,
    shard_trials: int = 64,
    model: int | str | None = None,
    max_attempts: int = 3,
) -> tuple[list[Shard], list[PlannedWork]]:
    """Cut the untuned shortfall of every workload into pending shards for one hardware class.

    The shortfall of a (workload, hardware class) is ``target_trials`` minus the trials already
    spent (measurements committed, or the budget of shards already done, whichever is more — a
    search space can run out of new candidates) minus the budget of shards pending or leased.
    So planning twice plans nothing new, and raising the target tops up. Larger weights (call
    counts) get higher priority; ties go to the workload with more FLOPs. A workload preempted
    on this class (its tuning plateaued, :mod:`tunefleet.preemption`) gets nothing until its
    plateau is reset (``Database.reset_plateaus``).

    Returns
    -------
    (shards created, per-workload view of the plan)
    """
    if target_trials < 1 or shard_trials < 1:
        raise TunefleetError("target_trials and shard_trials must be positive")
    hw = db.hardware_class(hardware)
    model_id = db.model(model).id if model is not None else None
    with db.session() as s:
        weight = func.coalesce(func.sum(ModelWorkload.weight), 1)
        wl_stmt = (
            select(Workload.id, Workload.structural_hash, Workload.flops, weight)
            .outerjoin(ModelWorkload, ModelWorkload.workload_id == Workload.id)
            .group_by(Workload.id)
            .order_by(Workload.id)
        )
        if model_id is not None:
            wl_stmt = wl_stmt.where(ModelWorkload.model_id == model_id)
        workloads = list(s.execute(wl_stmt))
        measured = dict(
            s.execute(
                select(Measurement.workload_id, func.count())
                .where(Measurement.hardware_class_id == hw.id)
                .group_by(Measurement.workload_id)
            ).all()
        )
        budgets: dict[tuple[int, str], int] = {
            (wl, state): int(total)
            for wl, state, total in s.execute(
                select(Shard.workload_id, Shard.state, func.sum(Shard.trials))
                .where(Shard.hardware_class_id == hw.id)
                .group_by(Shard.workload_id, Shard.state)
            )
        }
        preempted = set(s.scalars(select(TuningState.workload_id).where(
            TuningState.hardware_class_id == hw.id, TuningState.preempted.is_(True))))
        created: list[Shard] = []
        view: list[PlannedWork] = []
        for wl_id, shash, flops, w in workloads:
            spent = max(int(measured.get(wl_id, 0)), budgets.get((wl_id, DONE), 0))
            outstanding = budgets.get((wl_id, PENDING), 0) + budgets.get((wl_id, LEASED), 0)
            shortfall = 0 if wl_id in preempted else max(0, target_trials - spent - outstanding)
            view.append(PlannedWork(wl_id, shash, int(w), spent, outstanding, shortfall, wl_id in preempted))
            while shortfall > 0:
                trials = min(shard_trials, shortfall)
                shard = Shard(
                    workload_id=wl_id,
                    hardware_class_id=hw.id,
                    trials=trials,
                    priority=float(w) + min(float(flops or 0.0), 1e15) * 1e-16,
                    state=PENDING,
                    max_attempts=max_attempts,
                    history=[{"at": utcnow().isoformat(timespec="seconds"), "event": "planned"}],
                )
                s.add(shard)
                created.append(shard)
                shortfall -= trials
        s.flush()
    log.info("planned %d new shard(s) for %s over %d workload(s)", len(created), hardware, len(view))
    return created, view


# -- leases ---------------------------------------------------------------------------------
def requeue_expired(db: Database, *, now: dt.datetime | None = None) -> list[int]:
    """Requeue (or fail, once attempts are exhausted) every leased shard whose lease expired."""
    now = now or utcnow()
    changed: list[int] = []
    with db.session() as s:
        expired = list(s.scalars(select(Shard).where(Shard.state == LEASED, Shard.lease_expires_at < now)))
        for shard in expired:
            exhausted = shard.attempts >= shard.max_attempts
            new_state = FAILED if exhausted else PENDING
            error = (
                f"lease of {shard.lease_owner} expired at {shard.lease_expires_at:%Y-%m-%d %H:%M:%S} UTC "
                f"(attempt {shard.attempts}/{shard.max_attempts})"
            )
            res = s.execute(
                update(Shard)
                .where(Shard.id == shard.id, Shard.state == LEASED, Shard.lease_owner == shard.lease_owner)
                .values(
                    state=new_state,
                    lease_owner=None,
                    lease_expires_at=None,
                    error=error,
                    history=_event(shard, "lease-expired", owner=shard.lease_owner, to=new_state),
                    updated_at=now,
                )
            )
            if res.rowcount:
                changed.append(shard.id)
                log.warning("shard %d: %s -> %s", shard.id, error, new_state)
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
) -> Shard | None:
    """Lease the highest-priority pending shard of a hardware class (or a given one); None if none.

    With ``reclaim``, a shard still leased by ``owner`` itself comes first: an owner that retries
    after a lost connection (a Prefect task retry keeps its owner string) takes its own shard
    back at once, with its attempt count unchanged, instead of waiting for the lease to expire.
    """
    hw = db.hardware_class(hardware)
    if reclaim:
        reclaimed = _reclaim(db, hw.id, owner, lease_s=lease_s, shard_id=shard_id, now=now)
        if reclaimed is not None:
            return reclaimed
    requeue_expired(db, now=now)
    for _ in range(20):  # lost races retry with the next candidate
        now_ = now or utcnow()
        with db.session() as s:
            stmt = select(Shard).where(Shard.hardware_class_id == hw.id, Shard.state == PENDING)
            if shard_id is not None:
                stmt = stmt.where(Shard.id == shard_id)
            candidate = s.scalars(stmt.order_by(Shard.priority.desc(), Shard.id).limit(1)).first()
            if candidate is None:
                return None
            res = s.execute(
                update(Shard)
                .where(Shard.id == candidate.id, Shard.state == PENDING)
                .values(
                    state=LEASED,
                    lease_owner=owner,
                    lease_expires_at=now_ + dt.timedelta(seconds=lease_s),
                    heartbeat_at=now_,
                    attempts=Shard.attempts + 1,
                    history=_event(candidate, "leased", owner=owner, attempt=candidate.attempts + 1),
                    updated_at=now_,
                )
            )
            if res.rowcount == 1:
                s.expire(candidate)
                shard = s.get(Shard, candidate.id)
                assert shard is not None
                log.info("shard %d leased by %s (attempt %d)", shard.id, owner, shard.attempts)
                return shard
    return None


def _reclaim(db: Database, hardware_class_id: int, owner: str, *, lease_s: float, shard_id: int | None,
             now: dt.datetime | None) -> Shard | None:
    now_ = now or utcnow()
    with db.session() as s:
        stmt = select(Shard).where(Shard.hardware_class_id == hardware_class_id, Shard.state == LEASED,
                                   Shard.lease_owner == owner)
        if shard_id is not None:
            stmt = stmt.where(Shard.id == shard_id)
        own = s.scalars(stmt.order_by(Shard.id).limit(1)).first()
        if own is None:
            return None
        res = s.execute(
            update(Shard)
            .where(Shard.id == own.id, Shard.state == LEASED, Shard.lease_owner == owner)
            .values(lease_expires_at=now_ + dt.timedelta(seconds=lease_s), heartbeat_at=now_,
                    history=_event(own, "reclaimed", owner=owner, attempt=own.attempts), updated_at=now_)
        )
        if res.rowcount != 1:
            return None
        s.expire(own)
        shard = s.get(Shard, own.id)
        log.info("shard %d reclaimed by its owner %s (attempt %d)", own.id, owner, own.attempts)
        return shard


def _owned_update(db: Database, shard_id: int, owner: str, **values: object) -> None:
    with db.session() as s:
        shard = s.get(Shard, shard_id)
        if shard is None:
            raise NotFoundError(f"no shard {shard_id}")
        event = str(values.pop("_event"))
        info = dict(values.pop("_info", None) or {})  # type: ignore[call-overload]
        res = s.execute(
            update(Shard)
            .where(Shard.id == shard_id, Shard.state == LEASED, Shard.lease_owner == owner)
            .values(history=_event(shard, event, owner=owner, **info), updated_at=utcnow(), **values)
        )
        if res.rowcount != 1:
            raise LeaseLostError(
                f"shard {shard_id} is no longer leased by {owner} (state {shard.state}, owner {shard.lease_owner})"
            )


def heartbeat(db: Database, shard_id: int, owner: str, *, lease_s: float = DEFAULT_LEASE_S) -> None:
    """Extend the lease; raises :class:`LeaseLostError` if the worker lost it."""
    now = utcnow()
    with db.session() as s:
        res = s.execute(
            update(Shard)
            .where(Shard.id == shard_id, Shard.state == LEASED, Shard.lease_owner == owner)
            .values(heartbeat_at=now, lease_expires_at=now + dt.timedelta(seconds=lease_s))
        )
        if res.rowcount != 1:
            raise LeaseLostError(f"shard {shard_id} is no longer leased by {owner}")


def complete(db: Database, shard_id: int, owner: str, *, event: str = "done", **info: object) -> None:
    """Mark a leased shard done (``event`` names why in its history, e.g. ``preempted``, with ``info``)."""
    _owned_update(db, shard_id, owner, state=DONE, lease_owner=None, lease_expires_at=None, error=None,
                  _event=event, _info=info)


def fail(db: Database, shard_id: int, owner: str, error: str) -> str:
    """Record a failed attempt: back to pending while attempts remain, else failed. Returns the new state."""
    with db.session() as s:
        shard = s.get(Shard, shard_id)
        if shard is None:
            raise NotFoundError(f"no shard {shard_id}")
        new_state = FAILED if shard.attempts >= shard.max_attempts else PENDING
    _owned_update(db, shard_id, owner, state=new_state, lease_owner=None, lease_expires_at=None,
                  error=error[:4000], _event=f"attempt-failed->{new_state}")
    log.warning("shard %d attempt failed (%s) -> %s", shard_id, error.splitlines()[0][:200], new_state)
    return new_state


def _select(db: Database, states: Sequence[str] | None, shard_ids: Sequence[int] | None,
            hardware: str | None) -> Any:
    stmt = select(Shard).order_by(Shard.id)
    if states is not None:
        stmt = stmt.where(Shard.state.in_(list(states)))
    if shard_ids:
        stmt = stmt.where(Shard.id.in_(list(shard_ids)))
    if hardware is not None:
        stmt = stmt.where(Shard.hardware_class_id == db.hardware_class(hardware).id)
    return stmt


def retry(db: Database, shard_ids: Sequence[int] | None = None, *, hardware: str | None = None) -> list[int]:
    """Put failed or cancelled shards back to pending with a fresh attempt budget."""
    stmt = _select(db, [FAILED, CANCELLED], shard_ids, hardware)
    with db.session() as s:
        shards = list(s.scalars(stmt))
        for shard in shards:
            shard.history = _event(shard, "retry", previous=shard.state)
            shard.state, shard.attempts, shard.error = PENDING, 0, None
        return [sh.id for sh in shards]


def cancel(db: Database, shard_ids: Sequence[int] | None = None, *, hardware: str | None = None) -> list[int]:
    """Cancel pending, leased or failed shards (a leased worker loses its lease at next heartbeat)."""
    stmt = _select(db, [PENDING, LEASED, FAILED], shard_ids, hardware)
    with db.session() as s:
        shards = list(s.scalars(stmt))
        for shard in shards:
            shard.history = _event(shard, "cancel", previous=shard.state)
            shard.state, shard.lease_owner, shard.lease_expires_at = CANCELLED, None, None
        return [sh.id for sh in shards]


def list_shards(db: Database, *, hardware: str | None = None, state: str | None = None) -> list[Shard]:
    if state is not None and state not in STATES:
        raise TunefleetError(f"unknown shard state {state!r}; one of {', '.join(STATES)}")
    stmt = _select(db, [state] if state is not None else None, None, hardware)
    with db.session() as s:
        return list(s.scalars(stmt))


def get_shard(db: Database, shard_id: int) -> Shard:
    with db.session() as s:
        shard = s.get(Shard, shard_id)
        if shard is None:
            raise NotFoundError(f"no shard {shard_id}")
        return shard
