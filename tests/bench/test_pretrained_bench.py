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


def test_progress_says_where_each_heavy_workload_s_trials_went() -> None:
    ms = 1e-3
    trials = {
        1: [9 * ms, 5 * ms, 4 * ms, 4 * ms, 4 * ms, 4 * ms, 4 * ms, 4 * ms,  # its first round: 4 ms best
            3 * ms, 2.1 * ms, 2 * ms],  # a search batch: within 1.1x of 2 ms at its 10th trial
        2: [None, 1 * ms],  # an error, then its best: converged at its 2nd trial
        3: [None, None],  # nothing measured: left out
        4: [0.5 * ms],
    }
    workloads = {1: ("fused_matmul_add", 12), 2: ("softmax", 12), 3: ("broken", 1), 4: ("take", 1)}
    rows = pretrained_bench.progress(trials, workloads, top=2)
    assert [r["workload"] for r in rows] == ["fused_matmul_add", "softmax"]  # by calls x best; top 2
    heavy, light = rows
    assert heavy["trials"] == 11 and heavy["best_ms"] == pytest.approx(2.0)
    assert heavy["first_round_x"] == pytest.approx(2.0) and heavy["trials_to_within"] == 10
    assert light["first_round_x"] == pytest.approx(1.0) and light["trials_to_within"] == 2
    assert pretrained_bench.progress({}, workloads) == []


def test_report_only_needs_an_earlier_run_s_homes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        pretrained_bench.parse_args(["electra.onnx", "--report-only"])
    assert "name its --work-dir" in capsys.readouterr().err
    assert pretrained_bench.main(["electra.onnx", "--arms", "scratch,pretrained", "--work-dir", str(tmp_path),
                                  "--report-only"]) == 2
    assert f"no home of the arm(s) scratch, pretrained under {tmp_path}" in capsys.readouterr().err


def test_report_only_on_a_home_without_the_model_is_one_line(capsys: pytest.CaptureFixture[str],
                                                             tmp_path: Path) -> None:
    assert pretrained_bench.connect(tmp_path / "scratch", "off").db.models() == []  # a real, empty home
    assert pretrained_bench.main(["electra.onnx", "--arms", "scratch", "--work-dir", str(tmp_path),
                                  "--report-only"]) == 2
    err = capsys.readouterr().err
    assert "scratch's home" in err and "no model 'electra'" in err and len(err.strip().splitlines()) == 1
