"""A shard's lease kept alive from a background thread while its worker tunes it."""

from __future__ import annotations

import logging
import threading

from tunefleet.db import Database
from tunefleet.errors import (
    DatabaseUnavailableError,
    HeartbeatStoppedError,
    LeaseLostError,
)
from tunefleet.planning import shard_queue

log = logging.getLogger(__name__)


class Heartbeat:
    """Extends a shard's lease (of one generation) every third of its length; notes when it ends.

    The tuning thread calls :meth:`check` after every committed batch and :meth:`reason` before
    every round: once another worker took the shard, :meth:`check` raises
    :class:`~tunefleet.errors.LeaseLostError`; once the thread died of anything else (a bug, a
    database error that is not a lost connection), it raises
    :class:`~tunefleet.errors.HeartbeatStoppedError` — the lease would lapse unnoticed otherwise.
    A lost connection is retried at the next tick: the lease may still hold.
    """

    def __init__(self, db: Database, shard_id: int, owner: str, lease_s: float, generation: int | None = None) -> None:
        self.db, self.shard_id, self.owner, self.lease_s = db, shard_id, owner, lease_s
        self.generation = generation
        self.lost: str | None = None
        self.stopped: str | None = None
        self._stop = threading.Event()
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
        """One renewal; a lost connection is logged and left to the next tick."""
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

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
