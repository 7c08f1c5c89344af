"""bench/pretrained_bench.py: what each tuning arm changes in the tuning options."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # bench/ is scripts, not a package

import pretrained_bench

from tunefleet.engine.options import TuneOptions


@pytest.mark.parametrize(("arm", "pretrained", "min_agreement"), [
    ("scratch", False, TuneOptions().warm_start_min_agreement),
    ("pretrained", True, TuneOptions().warm_start_min_agreement),
    ("pretrained-nocheck", True, 0.0),  # the shipped model guides every shard, whatever it misranks
])
def test_each_tuning_arm_sets_the_cost_model_and_its_check(arm: str, pretrained: bool, min_agreement: float) -> None:
    assert arm in pretrained_bench.TUNING
    options = TuneOptions().replace(**pretrained_bench.arm_knobs(arm))
    assert options.pretrained_cost_model is pretrained
    assert options.warm_start_min_agreement == min_agreement
    assert TuneOptions().warm_start_min_agreement > 0  # else the two warm arms would be one


def test_an_unknown_arm_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert pretrained_bench.main(["electra.onnx", "--arms", "pretrained,nocheck"]) == 2
    assert "unknown arm(s) nocheck" in capsys.readouterr().err
