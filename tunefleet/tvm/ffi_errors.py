"""Exceptions raised in Python methods that MetaSchedule calls from C++, kept for the engine.

The FFI re-wraps what a Python callback raises: a
:class:`~tunefleet.errors.DatabaseUnavailableError` in ``get_top_k`` comes back out of
``ms.tune_tasks`` as a plain ``RuntimeError`` with the same text, and the engine could no longer
tell a lost connection (retry, no attempt spent) from a crashed search (the shard's fault).
Every method C++ calls back is decorated with :func:`keeps_failure`, which records the original
exception on its object (``.failure``, the first one) and, while :func:`collect_failures` is
open on this thread, in that list too; the engine then raises the original.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

_sinks = threading.local()


def keeps_failure(method: F) -> F:
    """Decorate a method MetaSchedule calls from C++: what it raises is kept, then re-raised."""

    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except BaseException as exc:
            if getattr(self, "failure", None) is None:
                self.failure = exc
            sink = getattr(_sinks, "current", None)
            if sink is not None and not any(seen is exc for seen in sink):
                sink.append(exc)  # nested decorated calls see the same exception: keep it once
            raise

    return wrapper  # type: ignore[return-value]


@contextmanager
def collect_failures() -> Iterator[list[BaseException]]:
    """Collect, in order, what decorated methods raise on this thread inside the block (also from
    objects the caller never sees, e.g. a policy's cost model). Blocks nest; the inner one
    collects alone."""
    outer = getattr(_sinks, "current", None)
    _sinks.current = seen = []
    try:
        yield seen
    finally:
        _sinks.current = outer

