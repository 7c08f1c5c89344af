"""``ResumingSearch`` on its own: what it hands out, and when it asks the evolutionary search.

The inner search here is a stand-in that counts its calls and proposes schedules of a real 16x16
matmul (sampling, evolving and scoring a population is what the skip saves; its results are not
what these tests check). The default and the seeds are real candidates of the same matmul.
"""

from __future__ import annotations

from typing import Any

from tvm import s_tir
from tvm.ir import IRModule

from tests.tvm.conftest import matmul_mod
from tunefleet.tvm.search import ResumingSearch
from tunefleet.tvm.traces import candidate, trace_json_of


def _split(mod: IRModule, factor: int) -> str:
    sch = s_tir.Schedule(mod)
    sch.split(sch.get_loops(sch.get_sblock("C"))[0], [None, factor])
    return trace_json_of(sch)


class _CountingSearch:
    """Proposes ``batch`` split schedules per call (new factors each time) and counts its calls."""

    def __init__(self, mod: IRModule, batch: int = 4) -> None:
        self.mod, self.batch, self.calls, self.factor = mod, batch, 0, 1

    def generate_measure_candidates(self) -> list[Any]:
        self.calls += 1
        out = []
        for _ in range(self.batch):
            self.factor *= 2
            sch = s_tir.Schedule(self.mod)
            sch.split(sch.get_loops(sch.get_sblock("C"))[1], [None, self.factor])
            out.append(candidate(self.mod, trace_json_of(sch)))
        return out

    def notify_runner_results(self, measure_candidates: list[Any], results: list[Any]) -> None:
        pass


def _search(budget: int | None, seeds: int) -> tuple[Any, _CountingSearch]:
    mod = matmul_mod()
    inner = _CountingSearch(mod)
    search = ResumingSearch(inner, set(), seeds=[_split(mod, f) for f in (2, 4)[:seeds]], budget=budget)
    search._mod = mod
    return search, inner


def test_the_default_and_seeds_that_fill_the_budget_are_handed_out_without_searching() -> None:
    """A replay round's shard (the default and two hub schedules, a budget of 3): the evolutionary
    search is never asked for a population it would only see cut."""
    search, inner = _search(budget=3, seeds=2)
    out = search.generate_measure_candidates()
    assert len(out) == 3 and inner.calls == 0
    assert search.generate_measure_candidates() is None  # the budget is spent
    assert inner.calls == 0


def test_a_budget_beyond_the_default_and_seeds_asks_the_search_for_the_rest() -> None:
    search, inner = _search(budget=5, seeds=2)
    out = search.generate_measure_candidates()
    assert inner.calls == 1 and len(out) == 5  # 3 forced + 2 of the search's 4, cut to the budget
    search, inner = _search(budget=None, seeds=1)
    out = search.generate_measure_candidates()
    assert inner.calls == 1 and len(out) == 2 + inner.batch
