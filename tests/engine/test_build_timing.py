"""How a build times the untuned model: alone, with the tuned build's timing function when that
fits in the untuned timing, else in a few plain calls (unit tests, a stand-in VM that counts
calls: no TVM). And what a build times beside: after tuning, no tuning worker process."""

from __future__ import annotations

import time

import pytest

from tunefleet.delivery.build import _time_untuned
from tunefleet.delivery.timing import MIN_CALLS, WARMUP_CALLS, time_alternating
from tunefleet.vocab import UNTUNED_TIMING_S


class CountingVM:
    """Stands in for ``relax.VirtualMachine``: counts calls of ``main`` (each sleeps ``call_s``) and
    logs them in ``log`` (shared between stand-ins to see the order of calls); a ``time_evaluator``
    is recorded, never run: builds are timed with a wall clock around each call."""

    def __init__(self, name: str = "vm", log: list[str] | None = None, call_s: float = 0.001) -> None:
        self.name, self.log, self.call_s = name, log if log is not None else [], call_s
        self.calls = 0
        self.evaluator: dict[str, int] | None = None

    def __getitem__(self, name: str):  # type: ignore[no-untyped-def]
        assert name == "main"

        def main(*args: object) -> None:
            self.calls += 1
            self.log.append(self.name)
            time.sleep(self.call_s)

        return main

    def time_evaluator(self, name: str, dev: object, *, number: int, repeat: int, min_repeat_ms: int):  # type: ignore[no-untyped-def]
        self.evaluator = {"number": number, "repeat": repeat}
        raise AssertionError("a build is timed with plain calls, not time_evaluator")


def test_a_slow_build_is_timed_in_the_calls_that_fit_in_the_untuned_timing() -> None:
    vm = CountingVM()
    seconds = _time_untuned(vm, [], UNTUNED_TIMING_S / 2.5, 5)
    assert vm.calls == 2 and vm.evaluator is None
    assert 0.001 <= seconds < 0.5  # the plain calls' own time, not the first call's


def test_a_build_whose_one_call_outlasts_the_untuned_timing_is_not_called_again() -> None:
    """A second call would cost more than the whole allowance: the check's first call is the figure."""
    vm = CountingVM()
    assert _time_untuned(vm, [], UNTUNED_TIMING_S * 3, 5) == UNTUNED_TIMING_S * 3
    assert vm.calls == 0 and vm.evaluator is None


def test_a_build_whose_rounds_fit_is_timed_by_the_alternating_timing_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from tunefleet.delivery import build

    timed: list[tuple[list[str], int]] = []

    def spy(calls, rounds, *args, **kwargs):  # type: ignore[no-untyped-def]
        timed.append((list(calls), rounds))
        return time_alternating(calls, rounds, *args, **kwargs)

    monkeypatch.setattr(build, "time_alternating", spy)
    # 0.3 s a first call: its warm-up (3 calls) and a round (5 calls), 2.4 s, fit in the untuned
    # timing. The stand-in's calls take 20 ms: the warm-up runs for 0.2 s, the round about 0.3 s.
    vm = CountingVM(call_s=0.02)
    seconds = _time_untuned(vm, [], 0.3, 1)
    assert timed == [(["untuned"], 1)] and vm.evaluator is None
    assert vm.calls >= WARMUP_CALLS + MIN_CALLS
    assert 0.02 <= seconds < 0.2

    # 0.4 s a first call: 1.2 s of warm-up and 5 rounds of 2 s do not fit: plain calls, 10 s' worth
    slow = CountingVM(call_s=0.0)
    _time_untuned(slow, [], 0.4, 5)
    assert len(timed) == 1 and slow.calls == int(UNTUNED_TIMING_S / 0.4)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_closed_tuner_leaves_no_worker_process_behind(engine) -> None:  # type: ignore[no-untyped-def]
    """``tunefleet run`` closes the class's tuner when tuning ends (flows/pipeline.py), so that the
    build times the model with no tuning process beside it: closing stops the builder's pool and
    the runner's worker, MetaSchedule's LocalRunner (which has no shutdown of its own) included."""
    from tests.processes import live_workers as workers
    from tunefleet.engine.options import TuneOptions
    from tunefleet.engine.worker import Tuner

    _, db, _ = engine
    before = workers()
    tuner = Tuner(db, "x86", TuneOptions(parallel_measure=False))
    tuner.start()
    held = tuner.runner  # as a finished shard's objects may still hold it: closing must not wait for them
    started = workers() - before
    assert len(started) >= 2  # the builder's workers and the LocalRunner's
    tuner.close()
    assert not started & workers()
    del held
