"""The one timing function of the build report and the bench: alternating rounds, medians (a fake
clock and calls that advance it: no sleeping, nothing timed for real)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tunefleet.delivery.timing import (
    MIN_CALLS,
    WARMUP_CALLS,
    estimate_s,
    time_alternating,
)


class FakeClock:
    """Seconds that move only when a call says so; records which call ran, in order."""

    def __init__(self) -> None:
        self.now = 0.0
        self.log: list[str] = []

    def __call__(self) -> float:
        return self.now

    def call(self, name: str, durations: Iterator[float]) -> Callable[[], None]:
        def run() -> None:
            self.log.append(name)
            self.now += next(durations)

        return run


def _blocks(log: list[str]) -> list[tuple[str, int]]:
    """Consecutive calls of the same name as (name, count)."""
    out: list[tuple[str, int]] = []
    for name in log:
        if out and out[-1][0] == name:
            out[-1] = (name, out[-1][1] + 1)
        else:
            out.append((name, 1))
    return out


SLOW = 0.125
"""Seconds per call that end the warm-up after its 3 calls (0.375 s > 0.2 s) and give 5 calls a
round (0.3 s / 0.125 s is 2, raised to the 5 at least)."""


def test_the_order_rotates_each_round_after_a_warm_up_of_each() -> None:
    clock = FakeClock()
    calls = {name: clock.call(name, iter(lambda: SLOW, None)) for name in ("a", "b", "c")}
    out = time_alternating(calls, rounds=4, clock=clock)
    assert _blocks(clock.log) == [
        ("a", WARMUP_CALLS), ("b", WARMUP_CALLS), ("c", WARMUP_CALLS),  # warm-up, in the given order
        ("a", MIN_CALLS), ("b", MIN_CALLS), ("c", MIN_CALLS),  # round 0
        ("b", MIN_CALLS), ("c", MIN_CALLS), ("a", MIN_CALLS),  # round 1
        ("c", MIN_CALLS), ("a", MIN_CALLS), ("b", MIN_CALLS),  # round 2
        ("a", MIN_CALLS), ("b", MIN_CALLS), ("c", MIN_CALLS),  # round 3
    ]
    assert list(out) == ["a", "b", "c"]
    assert all(r == {"ms": 125.0, "rounds_ms": [125.0] * 4, "calls_per_round": MIN_CALLS} for r in out.values())


def test_each_round_keeps_its_median_call_and_the_latency_is_the_median_round() -> None:
    clock = FakeClock()
    warm = [SLOW] * WARMUP_CALLS
    rounds = [
        [0.1, 0.1, 0.1, 9.0, 9.0],  # two slow calls in a round: its median stays 0.1 s
        [0.3, 0.3, 0.3, 0.3, 0.3],  # a whole round disturbed: the median of the rounds drops it
        [0.2, 0.2, 0.2, 0.0, 0.0],
    ]
    calls = {"x": clock.call("x", iter(warm + [s for r in rounds for s in r]))}
    out = time_alternating(calls, rounds=3, clock=clock)["x"]
    assert out["rounds_ms"] == pytest.approx([100.0, 300.0, 200.0])
    assert out["ms"] == pytest.approx(200.0)
    assert out["calls_per_round"] == MIN_CALLS


def test_a_fast_call_warms_up_for_a_while_and_runs_more_calls_a_round() -> None:
    clock = FakeClock()
    fast = 1 / 64  # seconds, exact in binary: 13 calls pass the warm-up's 0.2 s, 8 fill a round of 0.125 s
    out = time_alternating({"fast": clock.call("fast", iter(lambda: fast, None))}, rounds=2, round_s=0.125,
                           clock=clock)["fast"]
    assert len(clock.log) == 13 + 2 * 8
    assert out == {"ms": 15.625, "rounds_ms": [15.625, 15.625], "calls_per_round": 8}


def test_between_is_read_after_each_block_untimed_and_kept_beside_its_figure() -> None:
    clock = FakeClock()
    readings = iter([60.0, 70.0, None, 350.0, 80.0, 90.0])
    seen: list[str] = []

    def between() -> float | None:
        seen.append(clock.log[-1])  # after the block of that call, before the next one
        clock.now += 5.0  # a probe that takes time: none of it is counted in a block
        return next(readings)

    calls = {name: clock.call(name, iter(lambda: SLOW, None)) for name in ("a", "b")}
    out = time_alternating(calls, rounds=3, clock=clock, between=between)
    assert seen == ["a", "b", "b", "a", "a", "b"]  # once per block, not in the warm-up
    assert out["a"] == {"ms": 125.0, "rounds_ms": [125.0] * 3, "calls_per_round": MIN_CALLS,
                        "round_trip_ns": [60.0, 350.0, 80.0]}
    assert out["b"]["round_trip_ns"] == [70.0, None, 90.0]


def test_no_rounds_is_refused() -> None:
    with pytest.raises(ValueError, match="rounds must be at least 1, not 0"):
        time_alternating({"x": lambda: None}, rounds=0)


def test_the_estimate_counts_the_warm_up_and_the_rounds() -> None:
    # a slow call: 3 warm-up calls and 5 calls in each of 5 rounds
    assert estimate_s({"slow": 2.0}, rounds=5) == pytest.approx(2.0 * (WARMUP_CALLS + 5 * MIN_CALLS))
    # a fast one: 0.2 s of warm-up, then about round_s a round; two calls add up
    assert estimate_s({"a": 0.001, "b": 0.001}, rounds=5, round_s=0.3) == pytest.approx(2 * (0.2 + 5 * 0.2))
