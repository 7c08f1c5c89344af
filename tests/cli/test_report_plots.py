"""`tunefleet report tuning` and `report energy --plot`: PNG charts of a made-up tuning history.

No TVM: a SQLite database in a temporary TUNEFLEET_HOME is filled through the Database API with
invented traces and run times, so every expected value below can be worked out by hand.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib.image
import pytest

from tunefleet.cli.app import main
from tunefleet.cli.plots import energy_figure, tuning_figure
from tunefleet.config import load_settings
from tunefleet.db import Database, NewMeasurement
from tunefleet.energy.accounting import EnergyRow, energy_report
from tunefleet.errors import NotFoundError, NotSupportedError
from tunefleet.vocab import FILTERED

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

#: workload name -> (calls in the model, run times in ms in commit order; None: a run error,
#: FILTERED: scored out by the cost model). Latency shares (calls x best): dense 4 x 2 = 8,
#: conv 1 x 5 = 5, relu 10 x 0.1 = 1, add 1 x 0.01; broken has no success, idle no measurement.
HISTORY: dict[str, tuple[int, list[float | str | None]]] = {
    "dense": (4, [None, 4.0, FILTERED, 3.0, 5.0, 2.0]),
    "conv": (1, [6.0, 5.0]),
    "relu": (10, [0.2, 0.1, 0.3]),
    "add": (1, [0.01]),
    "broken": (2, [None, None]),
    "idle": (3, []),
}


def _record(wl: int, hw: int, i: int, ms: float | str | None, useful: bool = False) -> NewMeasurement:
    trace = f'{{"insts": [["SamplePerfectTile", {i}]]}}'
    if ms == FILTERED:
        return NewMeasurement(wl, hw, trace, None, error_kind=FILTERED, energy_j=0.0, useful=False)
    if ms is None:
        return NewMeasurement(wl, hw, trace, None, error_kind="run", error_msg="made up", energy_j=1.0,
                              energy_source="estimate", useful=False)
    assert isinstance(ms, float)
    return NewMeasurement(wl, hw, trace, [ms / 1e3], build_s=0.1, energy_j=2.0, energy_source="estimate",
                          useful=useful)


def _fill(home: Path, *, measure: bool = True) -> Database:
    db = Database.from_settings(load_settings(home=home))
    hw = db.upsert_hardware_class("x86", {"kind": "llvm", "num-cores": 2}, "x86", watts_per_core=10,
                                  price_per_hour=0.1)
    model, _ = db.add_model(name="toy", source="zoo", format="relax-nn", sha256="7" * 64, artifact_uri="u")
    records = []
    for n, (name, (weight, times)) in enumerate(HISTORY.items()):
        wl, _ = db.add_workload(structural_hash=f"{n:02x}" * 8, name=name, op_kind="dense/matmul", flops=1e6,
                                tir_json="{}")
        db.link_model_workload(model.id, wl.id, weight)
        best = math.inf
        for i, ms in enumerate(times):
            records.append(_record(wl.id, hw.id, 100 * n + i, ms, useful=isinstance(ms, float) and ms < best))
            best = min(best, ms) if isinstance(ms, float) else best
    if measure:
        # one commit per workload, in HISTORY's order: the id order the figure walks
        for wl_id in sorted({r.workload_id for r in records}):
            db.commit_measurements([r for r in records if r.workload_id == wl_id])
    return db


def _assert_png(path: Path, shape: tuple[int, int]) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC
    image = matplotlib.image.imread(path)
    assert image.shape[:2] == shape and image.shape[2] in (3, 4)
    assert path.stat().st_size < 150_000


def test_tuning_figure_plots_the_heaviest_workloads_best_so_far(tmp_path: Path) -> None:
    db = _fill(tmp_path / "home")
    fig = tuning_figure(db, "toy", "x86", tmp_path / "out" / "toy.png", top=3)

    _assert_png(tmp_path / "out" / "toy.png", (450, 1200))
    assert fig.labels == ["dense", "conv", "relu"]  # largest calls x best first; add (0.01 ms) left out
    dense = fig.series[0]
    assert (dense.weight, dense.best_ms, dense.share_ms) == (4, 2.0, 8.0)
    # a run error before the first success, then a filtered candidate: trials, never an improvement
    assert math.isnan(dense.best_so_far_ms[0])
    assert dense.best_so_far_ms[1:] == pytest.approx([4.0, 4.0, 3.0, 3.0, 2.0])
    assert fig.series[2].best_so_far_ms == pytest.approx([0.2, 0.1, 0.1])
    assert (fig.trials, fig.measured_workloads, fig.workloads) == (14, 4, 6)
    # the estimate counts a workload from its first success; broken and idle never count
    assert fig.estimate_ms[-1] == pytest.approx(4 * 2.0 + 5.0 + 10 * 0.1 + 0.01)
    assert fig.elapsed_s[0] >= 0 and fig.elapsed_s == sorted(fig.elapsed_s)
    assert tuning_figure(db, "toy", "x86", tmp_path / "all.png").labels == ["dense", "conv", "relu", "add"]


def test_no_measurements_is_one_line_naming_the_command(tmp_path: Path) -> None:
    db = _fill(tmp_path / "home", measure=False)
    with pytest.raises(NotFoundError) as err:
        tuning_figure(db, "toy", "x86", tmp_path / "toy.png")
    message = str(err.value)
    assert "\n" not in message and message.startswith("no measurements of model 'toy' on x86")
    assert "`tunefleet plan --model toy --hardware x86 && tunefleet tune --hardware x86`" in message
    assert not (tmp_path / "toy.png").exists()


def test_energy_figure_stacks_useful_over_wasted_per_row(tmp_path: Path) -> None:
    def row(model: str, useful: float, wasted: float) -> EnergyRow:
        return EnergyRow(model_id=1, model=model, hardware="x86", joules=useful + wasted,
                         kwh=(useful + wasted) / 3.6e6, useful_joules=useful, wasted_joules=wasted,
                         wasted_pct=100 * wasted / (useful + wasted), cost=0.0, trials=1, errors=0, filtered=0,
                         best_latency_ms=1.0, tuned_workloads=1, workloads=1, sources="estimate")

    fig = energy_figure([row("a", 30_000, 90_000), row("b", 5_000, 1_000)], tmp_path / "energy.png")
    assert fig.unit == "kJ"  # the largest bar, 120 kJ, reads best in kJ
    assert fig.bars == [("a\nx86", 30_000, 90_000), ("b\nx86", 5_000, 1_000)]
    _assert_png(tmp_path / "energy.png", (450, 700))
    with pytest.raises(NotFoundError, match="^no measurements yet"):
        energy_figure([], tmp_path / "none.png")


def test_without_matplotlib_the_error_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("matplotlib", "matplotlib.figure", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(__import__("sys").modules, name, None)  # import raises ImportError
    db = _fill(tmp_path / "home")
    with pytest.raises(NotSupportedError) as err:
        tuning_figure(db, "toy", "x86", tmp_path / "toy.png")
    assert str(err.value) == "not supported: plots need matplotlib; pip install 'tunefleet[plots]'"


def test_cli_report_tuning_and_energy_plot(tunefleet_home: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(tunefleet_home)
    monkeypatch.chdir(tmp_path)

    assert main(["report", "tuning", "toy"]) == 0  # default name, in the current directory
    assert capsys.readouterr().out.strip() == "wrote toy-x86-tuning.png"
    _assert_png(tmp_path / "toy-x86-tuning.png", (450, 1200))
    assert main(["report", "tuning", "toy", "--hardware", "x86", "--top", "1", "-o", "sub/t.png"]) == 0
    assert capsys.readouterr().out.strip() == "wrote sub/t.png"
    assert (tmp_path / "sub" / "t.png").read_bytes()[:8] == PNG_MAGIC

    assert main(["report", "energy", "--plot", "energy.png"]) == 0
    out = capsys.readouterr().out
    assert "tuning energy and cost" in out and out.strip().endswith("wrote energy.png")
    _assert_png(tmp_path / "energy.png", (450, 700))
    assert main(["report", "energy", "--json", "--plot", "e2.png"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)  # stdout stays JSON; the note goes to stderr
    assert [r["model"] for r in rows] == ["toy"] and "wrote e2.png" in captured.err
    [row] = energy_report(Database.from_settings(load_settings()))
    # 8 improvements x 2 J useful; 2 successes that did not improve x 2 J + 3 run errors x 1 J wasted
    assert (row.useful_joules, row.wasted_joules) == (pytest.approx(16.0), pytest.approx(7.0))


def test_cli_no_data_is_one_error_line(tunefleet_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    _fill(tunefleet_home, measure=False)
    monkeypatch.chdir(tmp_path)
    assert main(["report", "tuning", "toy"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tunefleet: error: no measurements of model 'toy' on x86; tune it with")
    assert not (tmp_path / "toy-x86-tuning.png").exists()
    assert main(["report", "tuning", "nope"]) == 2
    assert "no model 'nope'" in capsys.readouterr().err
