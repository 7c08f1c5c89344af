"""bench/remeasure_best.py: the sums it prints from the figures it re-timed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # bench/ is scripts, not a package

import remeasure_best


def _row(workload: str, weight: int, pick: str, recorded: float, runs: list[float], error: str | None = None) -> dict:
    return {"workload": workload, "workload_id": hash(workload) % 100, "weight": weight, "pick": pick,
            "measurement_id": 1, "recorded_s": recorded, "recorded_secs": [recorded] * 5, "mode": "serial",
            "runs": runs, **({"error": error} if error else {})}


def test_sums_weigh_each_workload_by_its_calls_and_take_the_median_of_the_rounds() -> None:
    report = remeasure_best.report_rows([
        _row("conv", 2, "best", 1e-3, [3e-3, 1.5e-3, 2e-3]),  # median 2e-3: 2x its record
        _row("conv", 2, "#2", 1.2e-3, [1.2e-3]),
        _row("pool", 1, "best", 0.5e-3, [0.5e-3, 0.5e-3]),
        _row("pool", 1, "#2", 0.6e-3, [], error="RuntimeError: it failed"),  # left out of its sum
    ])
    best = report["sums"]["best"]
    assert best["workloads"] == 2
    assert best["recorded_s"] == pytest.approx(2 * 1e-3 + 0.5e-3)
    assert best["retimed_s"] == pytest.approx(2 * 2e-3 + 0.5e-3)
    assert report["sums"]["#2"] == pytest.approx({"workloads": 1, "recorded_s": 2.4e-3, "retimed_s": 2.4e-3})
    rows = {(r["workload"], r["pick"]): r for r in report["rows"]}
    assert rows[("conv", "best")]["ratio"] == pytest.approx(2.0)
    assert rows[("pool", "#2")]["retimed_s"] is None and rows[("pool", "#2")]["error"] == "RuntimeError: it failed"


def test_a_report_with_nothing_re_timed_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    remeasure_best.print_report(remeasure_best.report_rows([_row("conv", 1, "best", 1e-3, [], error="E: x")]))
    out = capsys.readouterr().out
    assert "nothing re-timed" in out and "(E: x)" in out


@pytest.mark.parametrize(("argv", "says"), [(["m", "--hardware", "x86", "--top", "0"], "--top and --rounds"),
                                            (["m", "--hardware", "x86", "--before", "yesterday"], "'yesterday'")])
def test_bad_arguments_are_one_line(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        remeasure_best.parse_args(argv)
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "error:" in last and says in last
