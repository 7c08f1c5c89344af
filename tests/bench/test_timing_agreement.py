"""bench/timing_agreement.py: the ratios it prints from the figures it measured."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # bench/ is scripts, not a package

import timing_agreement


def _row(i: int, table: tuple[float, float, float | None], bench: tuple[float, float, float]) -> dict:
    names = ("tuned", "eager", "onnxruntime")
    return {"repeat": i, "table": dict(zip(names, table, strict=True)), "bench": dict(zip(names, bench, strict=True))}


def test_ratios_compare_within_a_repeat_and_with_the_previous_repeat() -> None:
    rows = timing_agreement.table_rows([_row(1, (6.0, 30.0, 5.0), (8.0, 40.0, 5.0)),
                                        _row(2, (9.0, 30.0, None), (8.0, 20.0, 4.0))])
    assert rows[0]["table/bench tuned"] == "0.750"
    assert rows[0]["table/prev tuned"] == "-"  # nothing before the first repeat
    assert rows[1]["table/bench tuned"] == "1.125"
    assert rows[1]["table/prev tuned"] == "1.500"
    assert rows[1]["bench/prev eager"] == "0.500"
    assert rows[1]["table/bench onnxruntime"] == "-"  # a runtime the table did not measure


def test_repeats_below_one_are_the_parser_s_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        timing_agreement.main(["mobilenet_v2", "--repeats", "0"])
    assert "--repeats must be at least 1" in capsys.readouterr().err
