"""How a build times the untuned model: a slow one in a few plain calls, not 16 (unit tests, a
stand-in VM that counts calls: no TVM)."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tunefleet.delivery.build import _time_vm
from tunefleet.vocab import UNTUNED_TIMING_S


class CountingVM:
    """Stands in for ``relax.VirtualMachine``: counts plain calls of ``main``; time_evaluator is
    recorded, not run."""

    def __init__(self) -> None:
        self.calls = 0
        self.evaluator: dict[str, int] | None = None

    def __getitem__(self, name: str):  # type: ignore[no-untyped-def]
        assert name == "main"

        def main(*args: object) -> None:
            self.calls += 1
            time.sleep(0.001)

        return main

    def time_evaluator(self, name: str, dev: object, *, number: int, repeat: int, min_repeat_ms: int):  # type: ignore[no-untyped-def]
        self.evaluator = {"number": number, "repeat": repeat}

        return lambda *args: SimpleNamespace(results=[0.002, 0.001, 0.003])


@pytest.mark.parametrize(("one_call_s", "calls"), [(UNTUNED_TIMING_S / 2.5, 2), (UNTUNED_TIMING_S * 3, 1)])
def test_a_slow_build_is_timed_in_the_calls_that_fit_in_the_untuned_timing(one_call_s: float, calls: int) -> None:
    vm = CountingVM()
    seconds = _time_vm(vm, None, [], 5, one_call_s=one_call_s)
    assert vm.calls == calls and vm.evaluator is None
    assert 0.001 <= seconds < 0.5  # the plain calls' own time, not the first call's


def test_a_fast_build_is_timed_by_time_evaluator_in_3_repeats() -> None:
    vm = CountingVM()
    assert _time_vm(vm, None, [], 5, one_call_s=0.01) == 0.002
    assert vm.calls == 0 and vm.evaluator == {"number": 5, "repeat": 3}
    _time_vm(vm, None, [], 5)  # no first call known: always time_evaluator
    assert vm.calls == 0
