"""Timing runtimes against each other: the one way tunefleet times a model.

``tunefleet run``/``build`` (:func:`tunefleet.delivery.build.time_builds`) and
``bench/versus_alternatives.py`` both time the tuned build and what a user would run instead with
:func:`time_alternating`: wall clock around one call from Python, in rounds whose order rotates, so
that a machine that is busier in one moment than another slows every runtime alike instead of the
one that happened to run then. A figure of the build report and the bench's figure are the same
measurement. Imports nothing heavy (the build's reserve, planned before any build, sizes itself
on the same :data:`~tunefleet.vocab.TIMING_ROUNDS` and :data:`~tunefleet.vocab.TIMING_ROUND_S`).
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tunefleet.vocab import TIMING_ROUND_S as ROUND_S
from tunefleet.vocab import TIMING_ROUNDS as ROUNDS

WARMUP_CALLS = 3
"""Calls of each runtime before timing, at least (more for a fast one, up to :data:`WARMUP_S`)."""

WARMUP_S = 0.2
"""A fast runtime is called for about this long to warm up (at most :data:`MAX_CALLS` calls)."""

MIN_CALLS = 5
"""Calls of each runtime per round, at least."""

MAX_CALLS = 200
"""Calls of each runtime per round, at most (and of its warm-up)."""

_timing = threading.Event()


def timing_now() -> bool:
    """True while :func:`time_alternating` runs in this process. A display that reads the
    database every second (``tunefleet run``'s live line) pauses then: its queries would take the
    interpreter and a core from the calls being timed, and PyTorch eager, which returns to Python
    between operators, would be slowed most."""
    return _timing.is_set()


def time_alternating(calls: Mapping[str, Callable[[], Any]], rounds: int = ROUNDS, round_s: float = ROUND_S, *,
                     clock: Callable[[], float] = time.perf_counter,
                     between: Callable[[], float | None] | None = None) -> dict[str, dict[str, Any]]:
    """Latency of each zero-argument call, timed in alternating rounds.

    Each call is warmed up first: :data:`WARMUP_CALLS` calls, more for a fast one (for about
    :data:`WARMUP_S` seconds, at most :data:`MAX_CALLS` calls); the warm-up also sizes its rounds
    (enough calls for about ``round_s`` seconds, :data:`MIN_CALLS` to :data:`MAX_CALLS`). Then, in
    every round, each call runs its calls back to back, one call at a time with the wall clock
    around it, and the round keeps their median; the order of the calls rotates by one each round
    (round 0: a, b, c; round 1: b, c, a; ...). A call's latency is the median of its rounds.
    While it runs, :func:`timing_now` is true in this process. With ``between``, it is called
    after each block (untimed), and what it returns is kept beside the block's figure: the
    placement of the threads' CPUs (:class:`tunefleet.delivery.placement.CoreProbe`), which moves
    a library's speed on a VM.

    Parameters
    ----------
    calls : mapping of str to callable
        Name -> a zero-argument call (e.g. ``lambda: main(*inputs)``); each is timed as it is, its
        result dropped.
    rounds : int
        Rounds (at least 1).
    round_s : float
        About how long each call is timed per round, in seconds.
    clock : callable
        Seconds (``time.perf_counter``; tests give a fake one).
    between : callable, optional
        Called after each block; its readings (a float, or None) go to ``"round_trip_ns"``.

    Returns
    -------
    dict of str to dict
        For each name, in the order of ``calls``: ``"ms"`` (the median of the rounds, in
        milliseconds), ``"rounds_ms"`` (each round's median, in the order of the rounds),
        ``"calls_per_round"`` and, with ``between``, ``"round_trip_ns"`` (its reading after each
        of those blocks).

    Raises
    ------
    ValueError
        ``rounds`` below 1.
    Exception
        Whatever a call raises.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, not {rounds}")
    _timing.set()
    try:
        return _time_alternating(calls, rounds, round_s, clock, between)
    finally:
        _timing.clear()


def _time_alternating(calls: Mapping[str, Callable[[], Any]], rounds: int, round_s: float,
                      clock: Callable[[], float], between: Callable[[], float | None] | None
                      ) -> dict[str, dict[str, Any]]:
    names = list(calls)
    n_calls: dict[str, int] = {}
    for name in names:
        fn = calls[name]
        t0 = clock()
        k = 0
        while k < WARMUP_CALLS or (clock() - t0 < WARMUP_S and k < MAX_CALLS):
            fn()
            k += 1
        per_call = (clock() - t0) / k
        n_calls[name] = MAX_CALLS if per_call <= 0 else max(MIN_CALLS, min(MAX_CALLS, int(round_s / per_call)))
    per_round: dict[str, list[float]] = {name: [] for name in names}
    readings: dict[str, list[float | None]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names) if names else 0
        for name in names[shift:] + names[:shift]:
            fn, times = calls[name], []
            for _ in range(n_calls[name]):
                t = clock()
                fn()
                times.append(clock() - t)
            per_round[name].append(statistics.median(times) * 1e3)
            if between is not None:
                readings[name].append(between())
    return {name: {"ms": statistics.median(per_round[name]), "rounds_ms": per_round[name],
                   "calls_per_round": n_calls[name], **({"round_trip_ns": readings[name]} if between else {})}
            for name in names}


def estimate_s(call_s: Mapping[str, float], rounds: int = ROUNDS, round_s: float = ROUND_S) -> float:
    """About how long :func:`time_alternating` takes for calls of these durations.

    Parameters
    ----------
    call_s : mapping of str to float
        Name -> seconds per call (e.g. the first call's).
    rounds, round_s :
        As for :func:`time_alternating`.

    Returns
    -------
    float
        Seconds: each call's warm-up and its rounds.
    """
    total = 0.0
    for s in call_s.values():
        warmup = max(WARMUP_CALLS * s, min(WARMUP_S, MAX_CALLS * s))
        per_round = max(MIN_CALLS, min(MAX_CALLS, int(round_s / s))) * s if s > 0 else 0.0
        total += warmup + rounds * per_round
    return total
