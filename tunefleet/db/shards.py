"""Shard rows: planned inserts, the lease state machine's conditional UPDATEs, granted trials.

Every state change of a shard happens here, each a compare-and-set on its state (and owner,
for a lease), so two workers can never both hold one shard on SQLite or PostgreSQL. Which
transition to make (a lease rule, a planning cut, a reallocation choice) is decided by the
callers in :mod:`tunefleet.planning.shard_queue` and :mod:`tunefleet.planning.rounds`.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import DateTime, delete, exists, func, select, type_coerce, update
from sqlalchemy.orm import Session, aliased

from tunefleet.db.catalog import CatalogMixin, lock_hardware_classes, model_links
from tunefleet.db.tables import InFlight, Measurement, Shard, TuningState, Workload, utcnow
from tunefleet.config import MAX_LEASE_S
from tunefleet.errors import ConflictError, NotFoundError, ParameterError, StaleLeaseError
from tunefleet.vocab import CANCELLED, CRASH, DEFAULT_TRACE_SHA256, DONE, FAILED, FILTERED, LEASED, PENDING

_LEASE_RACES = 20  # a lost race retries with the next candidate, this many times at most


def check_lease_s(lease_s: float) -> float:
    """``lease_s``, or one :class:`~tunefleet.errors.ParameterError` line unless it is a positive
    number of seconds up to :data:`~tunefleet.config.MAX_LEASE_S`: the same answer on both
    backends, where ``inf`` would store no expiry on SQLite (a lease that never expires) and
    overflow on PostgreSQL. The options refuse it first (at least 3 s there); this guards every
    other caller."""
    if not (math.isfinite(lease_s) and 0 < lease_s <= MAX_LEASE_S):
        raise ParameterError(f"invalid lease_s: {lease_s!r} (a lease is a positive number of seconds, "
                             f"at most {MAX_LEASE_S:g})")
    return lease_s


def db_now(dialect: str, plus_s: float = 0.0) -> Any:
    """The database's clock (naive UTC) ``plus_s`` seconds on, as SQL: every lease is set and
    judged on this one clock, never on a worker's (which may be off)."""
    if dialect == "postgresql":
        now = func.timezone("utc", func.now())  # the transaction's start: one instant per transaction
        return now + dt.timedelta(seconds=plus_s) if plus_s else now
    # SQLite's CURRENT_TIMESTAMP has whole seconds; %f has milliseconds. Padded to the 6 fraction
    # digits SQLAlchemy stores DateTime with, so stored and computed values compare as text alike.
    return type_coerce(func.strftime("%Y-%m-%d %H:%M:%f", "now", f"{plus_s:+.3f} seconds").op("||")("000"),
                       DateTime)


@dataclass(frozen=True)
class LeaseFence:
    """The fencing token of a lease: a write under it is refused once the shard was requeued,
    taken over, reclaimed, cancelled or ended (:func:`check_fence`)."""

    shard_id: int
    owner: str
    generation: int


@dataclass(frozen=True)
class InFlightRow:
    """A candidate handed to the builder: what re-proposes it (trace, args) and what a crash row keeps."""

    trace_sha256: str
    trace_json: str
    args_info: list[Any] | None = None
    target: str = ""
    tvm_version: str = ""


@dataclass(frozen=True)
class LostLease:
    """What :meth:`ShardsMixin.lose_lease` did to an expired lease."""

    shard_id: int
    state: str
    lost_leases: int
    in_flight: list[str]
    """sha256 of the candidates that were in flight when its worker died."""
    crashed: str | None
    """sha256 of the candidate recorded as a crash, or None."""


def check_fence(s: Session, dialect: str, fence: LeaseFence, what: str = "write") -> None:
    """The first statement of a fenced transaction: raise :class:`~tunefleet.errors.StaleLeaseError`
    unless ``fence`` is the shard's current lease (the transaction then stores nothing).

    The UPDATE takes the shard's row lock (PostgreSQL) or the write lock (SQLite) until the
    transaction ends, so a concurrent requeue waits for it and then sees a new heartbeat.
    """
    res = s.execute(update(Shard).where(Shard.id == fence.shard_id, Shard.state == LEASED,
                                        Shard.lease_owner == fence.owner,
                                        Shard.lease_generation == fence.generation)
                    .values(heartbeat_at=db_now(dialect)))
    if res.rowcount != 1:
        raise StaleLeaseError(f"shard {fence.shard_id}: {what} refused, the lease of {fence.owner} "
                              f"(generation {fence.generation}) is no longer current (requeued, taken over, "
                              f"cancelled or ended); nothing was stored")


def clear_in_flight(s: Session, shard_id: int, trace_hashes: Sequence[str]) -> None:
    """Committed candidates are no longer in flight (part of a fenced commit's transaction)."""
    if trace_hashes:
        s.execute(delete(InFlight).where(InFlight.shard_id == shard_id,
                                         InFlight.trace_sha256.in_(list(set(trace_hashes)))))


@dataclass(frozen=True)
class PlanRow:
    """What planning needs to know of one workload on one hardware class."""

    workload_id: int
    structural_hash: str
    flops: float | None
    weight: int
    """Call count over the models (or in the one model asked for); 1 when no model links it."""
    measured: int
    """Measurements committed on the class, errors and filtered candidates included."""
    trials_by_state: dict[str, int]
    """Sum of the trial budgets of its shards on the class, per shard state."""
    preempted: bool


@dataclass(frozen=True)
class TrialGrant:
    """Trials to hand to one workload: into its first pending shard, or a new one."""

    workload_id: int
    trials: int
    priority: float
    """The priority of a new shard (an extended shard keeps its own)."""
    event: dict[str, Any]
    """The history entry the shard gets."""


@dataclass(frozen=True)
class BudgetRow:
    """What the budget allocator (:mod:`tunefleet.planning.allocation`) needs to know of one workload of a
    model on one hardware class."""

    workload_id: int
    weight: int
    """Calls per inference, summed over the models asked for."""
    flops: float
    run_s: list[float | None]
    """``mean_run_s`` of every measurement on the class that is not a filtered candidate, in id
    order (None for build and run errors)."""
    committed: int
    """Measurements on the class, filtered candidates included."""
    committed_since: int
    """Of those, the ones committed at or after the time asked for."""
    outstanding: int
    """Trials of its pending and leased shards on the class not committed yet."""
    default_s: float | None
    """Mean run time of its default schedule (:data:`~tunefleet.vocab.DEFAULT_TRACE_SHA256`), once measured."""
    exhausted: bool
    """A shard of it ended done-short because its search produced no new candidate."""
    preempted: bool
    joules_per_trial: float | None
    build_s: float | None
    """Mean build seconds of one of its candidates."""


@dataclass(frozen=True)
class BudgetView:
    """A model's workloads on one class as a budget's rounds see them (:meth:`ShardsMixin.budget_view`)."""

    rows: list[BudgetRow]
    rounds: int
    """The highest ``round`` in the ``planned`` events of the workloads' shards created since the
    time asked for (0: none)."""
    open_round_shards: list[int]
    """Pending shards among those (what a budget that ends leaves unspent)."""
    first_since: dt.datetime | None = None
    """When the first measurement of the workloads on the class since the time asked for was committed."""


def _event(shard: Shard, event: str, **info: object) -> list[object]:
    entry = {"at": utcnow().isoformat(timespec="seconds"), "event": event, **info}
    return [*(shard.history or []), entry]


class ShardsMixin(CatalogMixin):
    """Shards and their leases."""

    # -- planning -------------------------------------------------------------------------
    @contextmanager
    def planning(self, hardware_class_id: int) -> Iterator[None]:
        """One transaction holding the class's planning lock: the planner reads what is spent and
        outstanding, decides and inserts its shards inside it, so two planners of a class (two
        ``plan`` runs, two workers refilling a budget's round) take turns and the second sees the
        first's shards. The lock is :func:`~tunefleet.db.catalog.lock_hardware_classes` (a wait bounded
        by SQLite's busy timeout)."""
        with self.transaction() as s:
            lock_hardware_classes(s, [hardware_class_id])
            yield

    def planning_view(self, hardware_class_id: int, model_id: int | None = None) -> list[PlanRow]:
        """Every workload (of one model, or all) with what is spent and outstanding on a class, by id."""
        links = model_links(hardware_class_id)
        with self.session() as s:
            weight = func.coalesce(func.sum(links.c.weight), 1)
            wl_stmt = (
                select(Workload.id, Workload.structural_hash, Workload.flops, weight)
                .outerjoin(links, links.c.workload_id == Workload.id)
                .group_by(Workload.id)
                .order_by(Workload.id)
            )
            if model_id is not None:
                wl_stmt = wl_stmt.where(links.c.model_id == model_id)
            workloads = list(s.execute(wl_stmt))
            measured = dict(
                s.execute(
                    select(Measurement.workload_id, func.count())
                    .where(Measurement.hardware_class_id == hardware_class_id)
                    .group_by(Measurement.workload_id)
                ).all()
            )
            budgets: dict[int, dict[str, int]] = {}
            for wl, state, total in s.execute(
                select(Shard.workload_id, Shard.state, func.sum(Shard.trials))
                .where(Shard.hardware_class_id == hardware_class_id)
                .group_by(Shard.workload_id, Shard.state)
            ):
                budgets.setdefault(wl, {})[state] = int(total)
            preempted = set(s.scalars(select(TuningState.workload_id).where(
                TuningState.hardware_class_id == hardware_class_id, TuningState.preempted.is_(True))))
        return [PlanRow(wl_id, shash, flops, int(w), int(measured.get(wl_id, 0)), budgets.get(wl_id, {}),
                        wl_id in preempted)
                for wl_id, shash, flops, w in workloads]

    def add_shards(
        self, hardware_class_id: int, cuts: Sequence[tuple[int, int, float]], *, max_leases: int = 3,
        info: dict[str, Any] | None = None,
    ) -> list[Shard]:
        """Insert pending shards, one per ``(workload_id, trials, priority)``, in that order; their
        ``planned`` history entry carries ``info`` (e.g. a budget's round)."""
        created: list[Shard] = []
        with self.session() as s:
            for workload_id, trials, priority in cuts:
                shard = Shard(
                    workload_id=workload_id,
                    hardware_class_id=hardware_class_id,
                    trials=trials,
                    priority=priority,
                    state=PENDING,
                    max_leases=max_leases,
                    history=[{"at": utcnow().isoformat(timespec="seconds"), "event": "planned", **(info or {})}],
                )
                s.add(shard)
                created.append(shard)
            s.flush()
        return created

    def budget_view(self, hardware_class_id: int, model_ids: Sequence[int], since: dt.datetime) -> BudgetView:
        """The workloads of the models given on a class: their measured history, what their shards
        still hold, and the rounds a budget planned for them since ``since``, in workload id order."""
        m = Measurement.__table__
        linked = model_links(hardware_class_id)  # the workloads the models call on this class
        with self.session() as s:
            links = s.execute(
                select(linked.c.workload_id, func.sum(linked.c.weight), Workload.flops)
                .join(Workload, Workload.id == linked.c.workload_id)
                .where(linked.c.model_id.in_(list(model_ids)))
                .group_by(linked.c.workload_id, Workload.flops).order_by(linked.c.workload_id)
            ).all()
            ids = [int(wl) for wl, _, _ in links]
            rows = s.execute(
                select(m.c.workload_id, m.c.shard_id, m.c.mean_run_s, m.c.error_kind, m.c.energy_j, m.c.build_s,
                       m.c.trace_sha256, m.c.created_at)
                .where(m.c.hardware_class_id == hardware_class_id, m.c.workload_id.in_(ids),
                       m.c.attempt == 0)  # a build's re-timing is no trial (tunefleet.delivery.confirm)
                .order_by(m.c.id)
            ).all() if ids else []
            shards = s.execute(
                select(Shard.id, Shard.workload_id, Shard.state, Shard.trials, Shard.history, Shard.created_at)
                .where(Shard.hardware_class_id == hardware_class_id, Shard.workload_id.in_(ids)).order_by(Shard.id)
            ).all() if ids else []
            preempted = set(s.scalars(select(TuningState.workload_id).where(
                TuningState.hardware_class_id == hardware_class_id, TuningState.preempted.is_(True),
                TuningState.workload_id.in_(ids)))) if ids else set()
        per: dict[int, dict[str, Any]] = {wl: {"run_s": [], "n": 0, "since": 0, "default": None, "j": [], "b": []}
                                          for wl in ids}
        by_shard: dict[int, int] = {}
        first_since: dt.datetime | None = None
        for wl, shard_id, mean, error_kind, energy, build_s, sha, created in rows:
            w = per[wl]
            w["n"] += 1
            if created >= since:
                w["since"] += 1
                first_since = created if first_since is None else min(first_since, created)
            if shard_id is not None:
                by_shard[shard_id] = by_shard.get(shard_id, 0) + 1
            if error_kind != FILTERED:
                w["run_s"].append(mean)
            if sha == DEFAULT_TRACE_SHA256 and mean is not None:
                w["default"] = mean if w["default"] is None else min(w["default"], mean)
            if energy is not None:
                w["j"].append(float(energy))
            if build_s is not None:
                w["b"].append(float(build_s))
        outstanding: dict[int, int] = {}
        exhausted: set[int] = set()
        rounds, open_round = 0, []
        for shard_id, wl, state, trials, history, created in shards:
            done_rows = by_shard.get(shard_id, 0)
            if state in (PENDING, LEASED):
                outstanding[wl] = outstanding.get(wl, 0) + max(0, trials - done_rows)
            last = (history or [{}])[-1]
            if state == DONE and last.get("event") == "done-short" and last.get("cause") == "exhausted":
                exhausted.add(wl)
            planned_round = (history or [{}])[0].get("round")
            if planned_round is not None and created >= since:
                rounds = max(rounds, int(planned_round))
                if state == PENDING:
                    open_round.append(int(shard_id))
        out = []
        for wl, weight, flops in links:
            w = per[wl]
            out.append(BudgetRow(
                int(wl), int(weight or 1), float(flops or 0.0), w["run_s"], w["n"], w["since"], outstanding.get(wl, 0),
                w["default"], wl in exhausted, wl in preempted,
                sum(w["j"]) / len(w["j"]) if w["j"] else None, sum(w["b"]) / len(w["b"]) if w["b"] else None))
        return BudgetView(out, rounds, open_round, first_since)

    # -- reading --------------------------------------------------------------------------
    def shard(self, shard_id: int) -> Shard:
        """One shard by id."""
        with self.session() as s:
            shard = s.get(Shard, shard_id)
            if shard is None:
                raise NotFoundError(f"no shard {shard_id}")
            return shard

    def shards(
        self,
        *,
        states: Sequence[str] | None = None,
        shard_ids: Sequence[int] | None = None,
        hardware_class_id: int | None = None,
    ) -> list[Shard]:
        """Shards in id order matching every filter given (an empty ``shard_ids`` filters nothing)."""
        with self.session() as s:
            return list(s.scalars(self._shards_stmt(states, shard_ids, hardware_class_id)))

    @staticmethod
    def _shards_stmt(states: Sequence[str] | None, shard_ids: Sequence[int] | None,
                     hardware_class_id: int | None) -> Any:
        stmt = select(Shard).order_by(Shard.id)
        if states is not None:
            stmt = stmt.where(Shard.state.in_(list(states)))
        if shard_ids:
            stmt = stmt.where(Shard.id.in_(list(shard_ids)))
        if hardware_class_id is not None:
            stmt = stmt.where(Shard.hardware_class_id == hardware_class_id)
        return stmt

    def pending_shards(self, hardware_class_id: int) -> list[tuple[int, int]]:
        """``(shard id, workload id)`` of every pending shard of a class."""
        with self.session() as s:
            return [(int(i), int(w)) for i, w in s.execute(select(Shard.id, Shard.workload_id).where(
                Shard.hardware_class_id == hardware_class_id, Shard.state == PENDING))]

    # -- leases ---------------------------------------------------------------------------
    def _clock(self, now: dt.datetime | None, plus_s: float = 0.0) -> Any:
        """``now`` + ``plus_s`` as a literal where a test injects time, else the database's clock."""
        if now is not None:
            return now + dt.timedelta(seconds=plus_s)
        return db_now(self.dialect, plus_s)

    def lease_shard(
        self,
        hardware_class_id: int,
        owner: str,
        *,
        lease_s: float,
        shard_id: int | None = None,
        now: dt.datetime | None = None,
    ) -> Shard | None:
        """Lease the highest-priority pending shard of a class (or the given one) to ``owner``.

        The attempt count and the lease generation go up by one; a shard backing off after a lost
        lease (``not_before`` later than the database's now) is skipped, and so is a shard whose
        workload has another shard leased on the class (one search per workload at a time, so no
        candidate is measured twice: a unique index makes it hold under races). Returns the leased shard,
        or None when no pending shard is left (or every candidate was taken by another worker
        meanwhile). ``now`` replaces the database's clock (tests only).
        """
        check_lease_s(lease_s)
        for _ in range(_LEASE_RACES):
            try:
                leased = self._lease_one(hardware_class_id, owner, lease_s, shard_id, now)
            except ConflictError:  # another worker leased a shard of the same workload meanwhile
                continue
            if leased is not False:
                return leased
        return None

    def _lease_one(self, hardware_class_id: int, owner: str, lease_s: float, shard_id: int | None,
                   now: dt.datetime | None) -> Shard | None | bool:
        """One try of :meth:`lease_shard`: the shard, None (nothing to lease) or False (lost a race)."""
        busy = aliased(Shard)
        with self.session() as s:
            stmt = select(Shard).where(
                Shard.hardware_class_id == hardware_class_id, Shard.state == PENDING,
                Shard.not_before.is_(None) | (Shard.not_before <= self._clock(now)),
                # a workload another worker is searching waits (the unique index enforces it)
                ~exists().where(busy.workload_id == Shard.workload_id,
                                busy.hardware_class_id == Shard.hardware_class_id, busy.state == LEASED))
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
                    lease_expires_at=self._clock(now, lease_s),
                    heartbeat_at=self._clock(now),
                    leases=Shard.leases + 1,
                    lease_generation=Shard.lease_generation + 1,
                    not_before=None,
                    history=_event(candidate, "leased", owner=owner, attempt=candidate.leases + 1,
                                   generation=candidate.lease_generation + 1),
                    updated_at=utcnow(),
                )
            )
            if res.rowcount == 1:
                s.expire(candidate)
                shard = s.get(Shard, candidate.id)
                assert shard is not None
                return shard
        return False

    def reclaim_lease(
        self,
        hardware_class_id: int,
        owner: str,
        *,
        lease_s: float,
        shard_id: int | None = None,
        now: dt.datetime | None = None,
    ) -> Shard | None:
        """Renew a lease ``owner`` still holds on a shard of the class (attempts unchanged, a new
        generation: whatever the earlier holder under this owner still does is fenced out); None if none."""
        check_lease_s(lease_s)
        with self.session() as s:
            stmt = select(Shard).where(Shard.hardware_class_id == hardware_class_id, Shard.state == LEASED,
                                       Shard.lease_owner == owner)
            if shard_id is not None:
                stmt = stmt.where(Shard.id == shard_id)
            own = s.scalars(stmt.order_by(Shard.id).limit(1)).first()
            if own is None:
                return None
            res = s.execute(
                update(Shard)
                .where(Shard.id == own.id, Shard.state == LEASED, Shard.lease_owner == owner,
                       Shard.lease_generation == own.lease_generation)
                .values(lease_expires_at=self._clock(now, lease_s), heartbeat_at=self._clock(now),
                        lease_generation=Shard.lease_generation + 1,
                        history=_event(own, "reclaimed", owner=owner, attempt=own.leases,
                                       generation=own.lease_generation + 1), updated_at=utcnow())
            )
            if res.rowcount != 1:
                return None
            s.expire(own)
            return s.get(Shard, own.id)

    def heartbeat_lease(self, shard_id: int, owner: str, *, lease_s: float, generation: int | None = None) -> bool:
        """Push ``owner``'s lease on a shard ``lease_s`` past the database's now; False if it no
        longer holds it (with ``generation``: that generation of it)."""
        check_lease_s(lease_s)
        with self.session() as s:
            stmt = update(Shard).where(Shard.id == shard_id, Shard.state == LEASED, Shard.lease_owner == owner)
            if generation is not None:
                stmt = stmt.where(Shard.lease_generation == generation)
            res = s.execute(stmt.values(heartbeat_at=db_now(self.dialect),
                                        lease_expires_at=db_now(self.dialect, lease_s)))
            return res.rowcount == 1

    def expired_leases(self, now: dt.datetime | None = None) -> list[Shard]:
        """Leased shards whose lease expired before the database's now (or ``now``, tests only)."""
        with self.session() as s:
            return list(s.scalars(select(Shard).where(Shard.state == LEASED,
                                                      Shard.lease_expires_at < self._clock(now))
                                  .order_by(Shard.id)))

    def lose_lease(
        self,
        shard: Shard,
        *,
        state: str,
        error: str,
        backoff_s: float,
        crash_after: int,
        now: dt.datetime | None = None,
    ) -> LostLease | None:
        """End an expired lease as lost: the shard goes to ``state`` (pending, leasable again
        ``backoff_s`` after the database's now, or failed), its ``lost_leases`` goes up and the
        lease does not count as an attempt.

        One compare-and-set on the generation read *and* on the expiry, judged again on the
        database's clock: a heartbeat that extended the lease meanwhile wins. In the same
        transaction every candidate that was in flight gains a death; one in flight alone that
        reaches ``crash_after`` deaths is committed as a :data:`~tunefleet.vocab.CRASH`
        measurement. Returns what happened, or None when the lease was not (or no longer) expired.
        """
        with self.session() as s:
            res = s.execute(
                update(Shard)
                .where(Shard.id == shard.id, Shard.state == LEASED, Shard.lease_owner == shard.lease_owner,
                       Shard.lease_generation == shard.lease_generation, Shard.lease_expires_at < self._clock(now))
                .values(state=state, lease_owner=None, lease_expires_at=None, error=error,
                        leases=self._greatest(Shard.leases - 1, 0), lost_leases=Shard.lost_leases + 1,
                        not_before=self._clock(now, backoff_s) if state == PENDING and backoff_s > 0 else None,
                        history=_event(shard, "lease-expired", owner=shard.lease_owner,
                                       generation=shard.lease_generation, to=state, lost=shard.lost_leases + 1),
                        updated_at=utcnow())
            )
            if res.rowcount != 1:
                return None
            s.execute(update(InFlight).where(InFlight.shard_id == shard.id, InFlight.current.is_(True))
                      .values(deaths=InFlight.deaths + 1))
            current = list(s.scalars(select(InFlight).where(InFlight.shard_id == shard.id,
                                                            InFlight.current.is_(True))))
            s.execute(update(InFlight).where(InFlight.shard_id == shard.id).values(current=False))
            suspects = [c.trace_sha256 for c in current]
            crashed = None
            if len(current) == 1 and current[0].deaths >= crash_after:
                c = current[0]
                s.execute(self._insert(Measurement).on_conflict_do_nothing(
                    index_elements=["workload_id", "hardware_class_id", "trace_sha256", "attempt"]).values(
                    workload_id=shard.workload_id, hardware_class_id=shard.hardware_class_id, shard_id=shard.id,
                    trace_json=c.trace_json, trace_sha256=c.trace_sha256, repeat=0, args_info=c.args_info,
                    error_kind=CRASH, error_msg=(f"its worker died {c.deaths} times with this candidate in flight "
                                                 f"(alone the last time): it crashes the worker"),
                    energy_j=0.0, useful=False, tvm_version=c.tvm_version, target=c.target))
                s.execute(delete(InFlight).where(InFlight.shard_id == shard.id,
                                                 InFlight.trace_sha256 == c.trace_sha256))
                crashed = c.trace_sha256
            return LostLease(shard.id, state, shard.lost_leases + 1, suspects, crashed)

    def _greatest(self, a: Any, b: Any) -> Any:
        return func.max(a, b) if self.dialect == "sqlite" else func.greatest(a, b)

    # -- candidates in flight ----------------------------------------------------------------
    def set_in_flight(self, fence: LeaseFence, rows: Sequence[InFlightRow]) -> None:
        """Record the batch about to be built (fenced: raises
        :class:`~tunefleet.errors.StaleLeaseError` for a stale lease): it replaces the previous
        batch; suspects (candidates with deaths) stay until they are committed."""
        with self.session() as s:
            check_fence(s, self.dialect, fence)
            s.execute(delete(InFlight).where(InFlight.shard_id == fence.shard_id, InFlight.deaths == 0))
            s.execute(update(InFlight).where(InFlight.shard_id == fence.shard_id).values(current=False))
            suspects = set(s.scalars(select(InFlight.trace_sha256).where(InFlight.shard_id == fence.shard_id)))
            for row in rows:
                if row.trace_sha256 in suspects:
                    s.execute(update(InFlight).where(InFlight.shard_id == fence.shard_id,
                                                     InFlight.trace_sha256 == row.trace_sha256).values(current=True))
                else:
                    suspects.add(row.trace_sha256)
                    s.add(InFlight(shard_id=fence.shard_id, trace_sha256=row.trace_sha256, trace_json=row.trace_json,
                                   args_info=row.args_info, target=row.target, tvm_version=row.tvm_version,
                                   current=True, deaths=0))

    def suspects(self, shard_id: int) -> list[InFlight]:
        """Candidates of a shard that were in flight when a worker of it died, most deaths first."""
        with self.session() as s:
            return list(s.scalars(select(InFlight).where(InFlight.shard_id == shard_id, InFlight.deaths > 0)
                                  .order_by(InFlight.deaths.desc(), InFlight.created_at, InFlight.trace_sha256)))

    def end_lease(
        self,
        shard_id: int,
        owner: str | None,
        *,
        state: str,
        error: str | None,
        event: str,
        info: dict[str, Any] | None = None,
        now: dt.datetime | None = None,
        generation: int | None = None,
    ) -> bool:
        """Move a shard leased by ``owner`` (with ``generation``: that generation of its lease) to
        ``state``, releasing the lease; False if not so leased.

        ``event`` (with ``owner`` and ``info``) is appended to its history and ``error`` replaces
        its error. Raises :class:`~tunefleet.errors.NotFoundError` for an unknown shard.
        """
        with self.session() as s:
            shard = s.get(Shard, shard_id)
            if shard is None:
                raise NotFoundError(f"no shard {shard_id}")
            stmt = update(Shard).where(Shard.id == shard_id, Shard.state == LEASED, Shard.lease_owner == owner)
            if generation is not None:
                stmt = stmt.where(Shard.lease_generation == generation)
            res = s.execute(stmt.values(state=state, lease_owner=None, lease_expires_at=None, error=error,
                                        history=_event(shard, event, owner=owner, **(info or {})),
                                        updated_at=now or utcnow()))
            if res.rowcount == 1:
                # Nothing of the attempt is in flight any more; suspects (candidates in flight at a
                # worker's death) stay for the shard's next attempt unless the shard is done.
                gone = delete(InFlight).where(InFlight.shard_id == shard_id)
                s.execute(gone if state == DONE else gone.where(InFlight.deaths == 0))
            return res.rowcount == 1

    def release_leases(self, owner_prefix: str, *, lock_timeout_s: float | None = None) -> list[int]:
        """Give back every lease whose owner is ``owner_prefix`` or starts with ``owner_prefix + ":"``
        (a process stopped by its user): the shards go back to pending and the lease is not counted
        against their budget of leases. Returns their ids.

        ``lock_timeout_s`` bounds this transaction's waits for the shards' row locks on PostgreSQL
        (default: the session's lock timeout; SQLite waits its busy timeout): a process stopping
        gives up rather than wait on a lock holder that may never finish, and its leases then
        expire by themselves."""
        with self.session() as s:
            if lock_timeout_s is not None and self.dialect == "postgresql":
                s.execute(select(func.set_config("lock_timeout", f"{max(1, round(lock_timeout_s * 1000))}ms", True)))
            # autoescape: "_" in a hostname is not a LIKE wildcard (node_1 must not match nodeX1)
            held = s.scalars(select(Shard).where(Shard.state == LEASED, (Shard.lease_owner == owner_prefix)
                                                 | Shard.lease_owner.startswith(owner_prefix + ":", autoescape=True)))
            return [shard.id for shard in held.all() if self._give_back(s, shard, shard.lease_owner, "released")]

    def give_back_lease(self, shard_id: int, owner: str, reason: str | None = None) -> bool:
        """Give back ``owner``'s lease on one shard (its worker could not measure: no builder or
        runner, or a node fault), as :meth:`release_leases` does: pending again, the lease not
        counted against its budget of leases; ``reason`` goes into its history. False if ``owner``
        no longer holds it."""
        with self.session() as s:
            shard = s.get(Shard, shard_id)
            if shard is None:
                raise NotFoundError(f"no shard {shard_id}")
            return self._give_back(s, shard, owner, "given-back", reason=reason)

    def _give_back(self, s: Session, shard: Shard, owner: str | None, event: str, *, reason: str | None = None) -> bool:
        """Leased by ``owner`` -> pending, the lease not counted as an attempt; whether it was so leased."""
        why = {"reason": reason[:500]} if reason else {}
        res = s.execute(update(Shard).where(Shard.id == shard.id, Shard.state == LEASED, Shard.lease_owner == owner)
                        .values(state=PENDING, lease_owner=None, lease_expires_at=None,
                                leases=self._greatest(Shard.leases - 1, 0),
                                history=_event(shard, event, owner=owner, **why), updated_at=utcnow()))
        return res.rowcount == 1

    def retry_shards(self, shard_ids: Sequence[int] | None = None, *,
                     hardware_class_id: int | None = None) -> list[int]:
        """Failed or cancelled shards back to pending with a fresh attempt budget; returns their ids."""
        return self._transition([FAILED, CANCELLED], shard_ids, hardware_class_id, "retry",
                                state=PENDING, leases=0, lost_leases=0, not_before=None, error=None)

    def cancel_shards(self, shard_ids: Sequence[int] | None = None, *,
                      hardware_class_id: int | None = None) -> list[int]:
        """Pending, leased or failed shards to cancelled (a leased one loses its lease); returns their ids."""
        return self._transition([PENDING, LEASED, FAILED], shard_ids, hardware_class_id, "cancel",
                                state=CANCELLED, lease_owner=None, lease_expires_at=None)

    def _transition(self, from_states: Sequence[str], shard_ids: Sequence[int] | None,
                    hardware_class_id: int | None, event: str, **values: Any) -> list[int]:
        changed: list[int] = []
        with self.session() as s:
            for shard in s.scalars(self._shards_stmt(from_states, shard_ids, hardware_class_id)).all():
                # Compare-and-set on the state read: a shard that moved meanwhile is left alone.
                res = s.execute(update(Shard).where(Shard.id == shard.id, Shard.state == shard.state)
                                .values(history=_event(shard, event, previous=shard.state), **values))
                if res.rowcount:
                    changed.append(shard.id)
        return changed

    # -- budget ---------------------------------------------------------------------------
    def set_shard_priorities(self, priorities: dict[int, float]) -> int:
        """Set the priority of the shards given that are still pending; returns how many were."""
        changed = 0
        with self.session() as s:
            for shard_id, priority in priorities.items():
                res = s.execute(update(Shard).where(Shard.id == shard_id, Shard.state == PENDING)
                                .values(priority=priority))
                changed += int(res.rowcount or 0)
        return changed

    def grant_trials(
        self, hardware_class_id: int, grants: Sequence[TrialGrant], *, max_leases: int = 3,
        now: dt.datetime | None = None,
    ) -> list[tuple[int, TrialGrant, bool]]:
        """Add each grant's trials to its workload's first pending shard on the class, else a new one.

        Returns ``(shard id, grant, extended)`` per grant with trials, in order; ``extended`` is
        False where a new pending shard was inserted.
        """
        now = now or utcnow()
        out: list[tuple[int, TrialGrant, bool]] = []
        with self.session() as s:
            for grant in grants:
                if grant.trials <= 0:
                    continue
                pending = s.scalars(select(Shard).where(Shard.workload_id == grant.workload_id,
                                                        Shard.hardware_class_id == hardware_class_id,
                                                        Shard.state == PENDING)
                                    .order_by(Shard.id).limit(1)).first()
                if pending is not None:  # leased meanwhile: the update matches nothing, a new shard follows
                    res = s.execute(update(Shard).where(Shard.id == pending.id, Shard.state == PENDING)
                                    .values(trials=Shard.trials + grant.trials,
                                            history=[*(pending.history or []), grant.event], updated_at=now))
                    if res.rowcount:
                        out.append((pending.id, grant, True))
                        continue
                shard = Shard(workload_id=grant.workload_id, hardware_class_id=hardware_class_id,
                              trials=grant.trials, priority=grant.priority, state=PENDING,
                              max_leases=max_leases, history=[grant.event])
                s.add(shard)
                s.flush()
                out.append((shard.id, grant, False))
        return out

    # -- accounting -----------------------------------------------------------------------
    def add_shard_energy(self, shard_id: int, *, joules: float, source: str, node_s: float, cpu_s: float,
                         cost: float) -> None:
        """Add one attempt's energy, node and CPU seconds and money to a shard's totals."""
        with self.session() as s:
            s.execute(
                update(Shard).where(Shard.id == shard_id).values(
                    energy_j=func.coalesce(Shard.energy_j, 0.0) + joules,
                    energy_source=source,
                    node_s=func.coalesce(Shard.node_s, 0.0) + node_s,
                    cpu_s=func.coalesce(Shard.cpu_s, 0.0) + cpu_s,
                    cost=func.coalesce(Shard.cost, 0.0) + cost,
                )
            )
