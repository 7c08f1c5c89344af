"""Ctrl-C (or SIGTERM) in the long commands (``run``, ``tune``): stop at once, give the leases
back, exit 130 (143 for SIGTERM)."""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tunefleet.config import Settings


def stop_on_ctrl_c(settings: Settings, resume: str) -> None:
    """From now on Ctrl-C (SIGINT) and SIGTERM (``kill``, Kubernetes stopping a pod) stop this
    command at once and cleanly: this process's shard leases are given back (no lease is spent),
    its child processes (builder and runner workers, Prefect's temporary server) are stopped, and
    the command that resumes is printed; exit 128 + the signal's number (130, 143).

    A KeyboardInterrupt raised into MetaSchedule's C++ search or Prefect's engine is not a clean
    stop (either may swallow it or crash), so the handler finishes the process itself. Committed
    measurements are kept (each batch commits in one transaction); the batch in flight is lost.

    Parameters
    ----------
    settings : Settings
        Where the leases are (the database).
    resume : str
        The command that carries on where this one stopped, printed on stderr.
    """
    import os
    import signal

    from tunefleet.engine.worker import owner_token

    owner_token()  # made now, before any child starts, so the children's owners share it

    def stop(signum: int, frame: object) -> None:
        # Whatever fails in here, the process exits: an exception escaping a signal handler is
        # raised into whatever the main thread runs, which may retry instead of stopping.
        try:
            stop_children_and_give_back(settings, resume)
        finally:
            os._exit(128 + signum)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


RELEASE_LOCK_TIMEOUT_S = 5.0
"""The longest Ctrl-C waits for a shard's row lock before it leaves that lease to expire."""


def stop_children_and_give_back(settings: Settings, resume: str) -> None:
    """Ctrl-C's work before the exit: give this process tree's leases back, stop the children.

    The handler runs on the thread it interrupted, which may be inside a transaction that holds
    the very rows the release updates (a batch being committed, a lease being renewed): that
    transaction is rolled back first (its batch is lost anyway), or the release, on a connection
    of its own, would wait for a thread that never resumes. A lock held elsewhere (a child, a
    stuck thread) is waited for at most :data:`RELEASE_LOCK_TIMEOUT_S`."""
    import os

    import psutil

    from tunefleet.db import Database
    from tunefleet.db.connection import roll_back_this_thread
    from tunefleet.engine.worker import worker_owner

    children = psutil.Process().children(recursive=True)
    owners = [worker_owner(pid) for pid in (os.getpid(), *(c.pid for c in children))]
    try:
        roll_back_this_thread()
        db = Database.from_settings(settings, check_schema=False)
        given = sum(len(db.release_leases(owner, lock_timeout_s=RELEASE_LOCK_TIMEOUT_S)) for owner in owners)
        released = f"{given} shard lease(s) given back"
    except Exception as exc:  # noqa: BLE001 - the leases then expire on their own
        from tunefleet.config import mask_secrets

        released = f"leases not given back ({mask_secrets(str(exc).splitlines()[0])}); they expire by themselves"
    for child in children:
        with contextlib.suppress(psutil.Error):  # a child may exit between listing and signalling
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=5)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    print(f"tunefleet: stopped; {released}; resume with: {resume}", file=sys.stderr, flush=True)
