"""A shard's lease kept alive from a background thread while its worker tunes it."""

from __future__ import annotations

import logging
import threading

from tunefleet import shards
from tunefleet.db import Database
from tunefleet.errors import DatabaseError
from tunefleet.shards import LeaseLostError

log = logging.getLogger(__name__)


class Heartbeat:
    """Extends a shard's lease every third of its length; notes when the lease is lost.

    The tuning thread calls :meth:`check` after every committed batch, which raises
    :class:`~tunefleet.shards.LeaseLostError` once another worker took the shard.
    """

    def __init__(self, db: Database, shard_id: int, owner: str, lease_s: float) -> None:
        self.db, self.shard_id, self.owner, self.lease_s = db, shard_id, owner, lease_s
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{shard_id}", daemon=True)

    def _run(self) -> None:
        interval = max(1.0, self.lease_s / 3)
        while not self._stop.wait(interval):
            try:
                shards.heartbeat(self.db, self.shard_id, self.owner, lease_s=self.lease_s)
            except LeaseLostError as exc:
                self.lost = str(exc)
                log.error("%s", exc)
                return
            except DatabaseError as exc:  # transient: the lease may still hold; try next tick
                log.warning("heartbeat for shard %d failed: %s", self.shard_id, exc)

    def check(self, *_: object) -> None:
        """Raise if the lease was lost (an ``after_commit`` hook: its arguments are ignored)."""
        if self.lost:
            raise LeaseLostError(self.lost)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
