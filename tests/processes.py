"""The worker processes a test has left behind."""

from __future__ import annotations


def live_workers() -> set[int]:
    """This process's live descendants but the process-wide helpers multiprocessing keeps (its
    forkserver, which forks the builder's workers, and its resource tracker): direct children with
    their command lines."""
    import psutil

    me = psutil.Process()
    out = set()
    for p in me.children(recursive=True):
        try:
            helper = p.ppid() == me.pid and any(
                s in " ".join(p.cmdline()) for s in ("forkserver import main", "resource_tracker import main"))
            if not helper and p.status() != psutil.STATUS_ZOMBIE:
                out.add(p.pid)
        except psutil.NoSuchProcess:
            continue
    return out
