"""Where TVM's native (C++) log lines go: a log file instead of the terminal.

TVM's C++ ``LOG(WARNING)`` lines are written to ``std::cerr``, i.e. straight to file descriptor 2:
Python's ``logging`` never sees them, and in a terminal they land across ``tunefleet run``'s live
line. Both helpers here point fd 2 at a file at the OS level (``os.dup2``), so C and C++ writes
go there, and give Python's own ``sys.stderr`` a duplicate of what fd 2 was before, so the
tracebacks, warnings and log records Python writes still reach the user:

* :func:`native_stderr_to`, in the process that owns the terminal (``tunefleet run``, around its
  pipeline): every process it starts meanwhile — Prefect's temporary server, the fork server of
  the builder's and runner's pools and all their workers — inherits the redirected fd 2.
* :func:`redirect_native_stderr`, at the start of each worker process (the builder's pool, the
  runner's workers at ``DEBUG``, ``tune --workers`` processes): the file named by
  :data:`NATIVE_LOG_ENV`, which :func:`native_stderr_to` sets for its children and which a job's
  environment may set too. A worker forked from a fork server has the *server's* environment, so
  the variable counts there only if it was set before the server started (as ``run`` does).

The file is opened for appending, so several processes (and the ``logging`` handler of the same
log file) write to it without overwriting each other.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import IO

log = logging.getLogger(__name__)

NATIVE_LOG_ENV = "TUNEFLEET_NATIVE_LOG"
"""The file a worker process sends its fd 2 to (:func:`redirect_native_stderr`); unset: left alone."""


def _point_fd2_at(path: str | os.PathLike[str]) -> int:
    """Point fd 2 at ``path`` (appending, created if missing); a duplicate of what fd 2 was."""
    with contextlib.suppress(Exception):
        sys.stderr.flush()  # what Python buffered goes where it was meant to
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        saved = os.dup(2)
        os.dup2(fd, 2)
    finally:
        os.close(fd)
    return saved


def _text_stream(fd: int, like: object, *, closefd: bool) -> IO[str]:
    """A line-buffered text stream on ``fd`` with the encoding of the stream ``like``."""
    return open(fd, "w", buffering=1, encoding=getattr(like, "encoding", None) or "utf-8",
                errors="backslashreplace", closefd=closefd)


def redirect_native_stderr(path: str | os.PathLike[str] | None = None) -> bool:
    """Send this process's fd 2 to ``path`` (default: :data:`NATIVE_LOG_ENV`) for good, keeping
    Python's ``sys.stderr`` on where fd 2 went before; call it first thing in a worker process.

    Returns whether fd 2 was redirected: not without a path, nor when the file cannot be opened
    (the worker then goes on writing where it did; a log file is no reason for a worker to fail).
    """
    target = path if path is not None else os.environ.get(NATIVE_LOG_ENV)
    if not target:
        return False
    try:
        saved = _point_fd2_at(target)
    except OSError as exc:
        log.warning("TVM's native log stays on stderr: %s cannot be opened (%s)", target, exc)
        return False
    sys.stderr = _text_stream(saved, sys.stderr, closefd=True)
    return True


@contextlib.contextmanager
def native_stderr_to(path: str | os.PathLike[str]) -> Iterator[None]:
    """While open, fd 2 of this process — and of every process started meanwhile, which inherit
    it and :data:`NATIVE_LOG_ENV` — goes to ``path``; Python's ``sys.stderr`` (so the CLI's error
    lines, tracebacks and a console made with ``stderr=True``) keeps writing where fd 2 went
    before. Both, and the variable, are restored on leaving; the stream stays open on the
    duplicate (a log handler made meanwhile may hold it: it goes on writing where it did).

    Set the variable before a worker pool's fork server starts (the builder's and the runner's
    start with the first shard), or its workers never see it.
    """
    saved = _point_fd2_at(path)
    previous_stream, previous_env = sys.stderr, os.environ.get(NATIVE_LOG_ENV)
    stream = _text_stream(saved, previous_stream, closefd=True)
    sys.stderr = stream
    os.environ[NATIVE_LOG_ENV] = str(path)
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            stream.flush()
        os.dup2(saved, 2)
        if sys.stderr is stream:  # else someone else's stream is in place: theirs to restore
            sys.stderr = previous_stream
        if previous_env is None:
            os.environ.pop(NATIVE_LOG_ENV, None)
        else:
            os.environ[NATIVE_LOG_ENV] = previous_env
