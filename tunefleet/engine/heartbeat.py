"""A shard's lease kept alive from a background thread while its worker tunes it, and only while
the tuning makes progress.

A heartbeat that renewed the lease whatever the tuning thread did would keep a shard forever
from the fleet once that thread hangs (a build that never returns, a deadlock): the worker's
process is alive, so the lease never lapses. The tuning thread touches a :class:`ProgressClock`
whenever something returns — a round starts, the search hands out a batch, a build or a run
returns, a batch is committed — and the heartbeat renews the lease only while the last touch is less than a lease old; after
that the lease lapses and another worker takes the shard over. One build's timeout is kept
below half a lease (:func:`bound_build_timeout`), so a build that is killed for its timeout
returns well within it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from tunefleet.db import Database
from tunefleet.errors import (
    DatabaseUnavailableError,
    HeartbeatStoppedError,
    LeaseLostError,
)
from tunefleet.planning import shard_queue

log = logging.getLogger(__name__)

BUILD_SHARE_OF_LEASE = 0.45
"""The longest one build may take, as a share of the lease: under half of it."""


class ProgressClock:
    """When the tuning thread last made progress, and what it was (``touch``): read by the
    :class:`Heartbeat` from its own thread.

    Parameters
    ----------
    clock:
        Seconds on a monotonic clock (tests pass a fake one).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: tuple[float, str] = (clock(), "started")

    def touch(self, what: str) -> None:
        """Something returned just now (``what`` names it in the heartbeat's log)."""
        self._last = (self._clock(), what)

    def idle(self) -> tuple[float, str]:
        """Seconds since the last progress, and what it was."""
        at, what = self._last
        return self._clock() - at, what


def bound_build_timeout(builder: Any, lease_s: float) -> None:
    """Keep one build of ``builder`` under half a lease (:data:`BUILD_SHARE_OF_LEASE`): a build
    longer than that is killed and reported as a build error, so the heartbeat, which renews the
    lease only while builds, runs and commits return within a lease, never lets a live worker's
    lease lapse over one slow build. A longer timeout is lowered, with a warning (once per
    builder); builders without a timeout (``timeout_s``, or ``timeout_sec`` for MetaSchedule's
    ``LocalBuilder``) are left alone."""
    limit = BUILD_SHARE_OF_LEASE * lease_s
    for attr in ("timeout_s", "timeout_sec"):
        current = getattr(builder, attr, None)
        if isinstance(current, bool) or not isinstance(current, (int, float)) or current <= limit:
            continue
        setattr(builder, attr, limit)
        log.warning("one build may take %.3g s, more than half the %g s lease: lowered to %.3g s (a build longer "
                    "than that is a build error); raise TUNEFLEET_LEASE_S (--lease-s) to allow longer builds",
                    current, lease_s, limit)


class Heartbeat:
    """Extends a shard's lease (of one generation) every third of its length while the tuning
    thread makes progress; notes when it ends.

    With a ``progress`` clock, a beat renews the lease only if the tuning thread made progress
    less than a lease ago; otherwise it says once (an error in the log) that it stops renewing,
    and the lease lapses: another worker may take the shard over. Once the thread moves again
    the beats renew again — or find the lease taken (``LeaseLostError``). Without one, every beat
    renews.

    The tuning thread calls :meth:`check` after every committed batch and :meth:`reason` before
    every round: once another worker took the shard, :meth:`check` raises
    :class:`~tunefleet.errors.LeaseLostError`; once the thread died of anything else (a bug, a
    database error that is not a lost connection), it raises
    :class:`~tunefleet.errors.HeartbeatStoppedError` — the lease would lapse unnoticed otherwise.
    A lost connection is retried at the next tick: the lease may still hold.
    """

    def __init__(self, db: Database, shard_id: int, owner: str, lease_s: float, generation: int | None = None,
                 progress: ProgressClock | None = None) -> None:
        self.db, self.shard_id, self.owner, self.lease_s = db, shard_id, owner, lease_s
        self.generation = generation
        self.progress = progress
        self.lost: str | None = None
        self.stopped: str | None = None
        self.stalled: str | None = None
        """Why the last beat did not renew the lease (no progress for a lease), or None."""
        self._stop = threading.Event()
        self._started = False
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{shard_id}", daemon=True)

    def _run(self) -> None:
        interval = max(1.0, self.lease_s / 3)
        try:
            while not self._stop.wait(interval):
                self.beat()
        except LeaseLostError as exc:
            self.lost = str(exc)
            log.error("%s", exc)
        except BaseException as exc:  # any death of this thread must reach the tuning thread
            self.stopped = (f"heartbeat of shard {self.shard_id} stopped: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}; the lease would lapse")
            log.error("%s", self.stopped)

    def beat(self) -> None:
        """One renewal, if the tuning thread made progress less than a lease ago; a lost
        connection is logged and left to the next tick."""
        if self.progress is not None:
            idle, what = self.progress.idle()
            if idle >= self.lease_s:
                if self.stalled is None:
                    self.stalled = (f"shard {self.shard_id}: nothing returned for {idle:.0f} s (last: {what}), a "
                                    f"whole lease ({self.lease_s:g} s): the tuning thread looks stuck; the heartbeat "
                                    "stops renewing the lease so that another worker can take the shard over")
                    log.error("%s", self.stalled)
                return
            if self.stalled is not None:
                log.warning("shard %d: the tuning thread moves again (%s); the heartbeat renews the lease again",
                            self.shard_id, what)
                self.stalled = None
        try:
            shard_queue.heartbeat(self.db, self.shard_id, self.owner, lease_s=self.lease_s, generation=self.generation)
        except DatabaseUnavailableError as exc:  # transient: the lease may still hold; try next tick
            log.warning("heartbeat for shard %d failed: %s", self.shard_id, exc)

    def reason(self) -> str | None:
        """Why the shard's work must stop (the lease lost, or the heartbeat dead), or None."""
        return self.lost or self.stopped

    def check(self, *_: object) -> None:
        """Raise if the lease was lost or the heartbeat died (an ``after_commit`` hook: its
        arguments are ignored)."""
        if self.lost:
            raise LeaseLostError(self.lost)
        if self.stopped:
            raise HeartbeatStoppedError(self.stopped)

    def watch(self, progress: ProgressClock) -> None:
        """From now on renew only while ``progress`` is touched less than a lease ago (a heartbeat
        started at the lease renews unconditionally while its shard sets up: one blocking step
        of that, a first import, can outlast a short lease without anything being stuck)."""
        progress.touch("tuning started")
        self.progress = progress

    def start(self) -> Heartbeat:
        """Start beating (once: a second call, or one after :meth:`stop`, does nothing)."""
        if self.progress is not None:
            self.progress.touch("tuning started")
        if not self._started:
            self._started = True
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating (a stopped heartbeat does not start again)."""
        self._stop.set()
        if self._started:
            self._thread.join(timeout=5)

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
