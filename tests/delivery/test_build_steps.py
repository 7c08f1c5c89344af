"""The steps of :func:`tunefleet.delivery.build.build_model`, one test each: resolve, compile,
check, time. The tiny zoo ``mlp`` (3 workloads) stands in for a model; a measurement of the
default schedule (the empty trace) stands in for tuning, so nothing here tunes."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tests.engine.test_build_timing import CountingVM
from tunefleet.db import Database, NewMeasurement
from tunefleet.delivery.build import (
    BuildReport,
    Checked,
    Resolved,
    build_model,
    check,
    compile_tuned,
    resolve,
    time_builds,
)
from tunefleet.errors import CorrectnessError
from tunefleet.models.ingest import ingest
from tunefleet.models.workloads import extract
from tunefleet.store import LocalStore
from tunefleet.vocab import STAGE_LOG_KEY, UNTUNED_TIMING_S

EMPTY_TRACE = "[[],[]]"  # the default schedule: replays on any workload


def _measure_one(db: Database, store: LocalStore, model: Any, hardware: str) -> None:
    """Commit a measurement for the first of the model's workloads on ``hardware``."""
    extract(db, store, model, hardware)
    hw = db.hardware_class(hardware)
    wl = db.workloads(model.id, hw.id)[0][0]
    db.commit_measurements([NewMeasurement(wl.id, hw.id, EMPTY_TRACE, [1e-5])])


def test_resolve_counts_the_workloads_measured_on_the_class(fleet) -> None:  # type: ignore[no-untyped-def]
    db, store = fleet
    model = ingest(db, store, "mlp").model
    fresh = resolve(db, store, model, "x86")
    assert (fresh.tuned, fresh.predicted, fresh.zero_shot) == (0, 0, None) and len(fresh.found) == 3
    report = fresh.report
    assert (report.model, report.hardware, report.workloads, report.tuned_workloads, report.default_workloads) == (
        "mlp", "x86", 3, 0, 3)
    assert report.recipe == fresh.recipe.name == "nhwc+prepack+fastmath" and report.threads >= 1
    assert fresh.target.kind.name == "llvm" and fresh.loaded.input_info

    _measure_one(db, store, model, "arm")  # another class's measurement is not this class's
    assert resolve(db, store, model, "x86").tuned == 0
    _measure_one(db, store, model, "x86")
    again = resolve(db, store, model, "x86")
    assert (again.tuned, again.report.tuned_workloads, again.report.default_workloads) == (1, 1, 2)


def test_compile_tuned_reports_database_hits_and_exports(fleet, tmp_path) -> None:  # type: ignore[no-untyped-def]
    db, store = fleet
    model = ingest(db, store, "mlp").model
    untuned = resolve(db, store, model, "x86")
    out = tmp_path / "out" / "mlp.so"  # its folder is created
    exe = compile_tuned(db, untuned, output=out)
    assert exe is not None and untuned.report.database_hits == 0 and untuned.report.notes == []
    assert untuned.report.output == str(out) and out.stat().st_size > 0

    _measure_one(db, store, model, "x86")
    tuned = resolve(db, store, model, "x86")
    compile_tuned(db, tuned)
    assert (tuned.report.database_hits, tuned.report.transferred_workloads, tuned.report.output) == (1, 0, None)
    assert tuned.report.notes == []

    # one more workload said to have a schedule than the build found: the report says so
    short = resolve(db, store, model, "x86")
    short.tuned += 1
    compile_tuned(db, short)
    assert short.report.notes == [
        "1 workload(s) with schedules in the database were built with the default schedule "
        "(no record matched at build time)"]


def _doubled(offset: float = 0.0) -> Any:
    """A one-function Relax module: ``main(x) = x + x + offset`` on a 2x3 float32 tensor."""
    import tvm
    from tvm.script import relax as R

    @tvm.script.ir_module
    class Doubled:
        @R.function
        def main(x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
            with R.dataflow():
                y = R.add(R.add(x, x), R.const(offset, "float32"))
                R.output(y)
            return y

    return Doubled


def _resolved_for(mod: Any) -> Resolved:
    """What resolve would give for a stand-alone Relax module on the host CPU."""
    import tvm

    from tunefleet.models.frontends import LoadedModel
    from tunefleet.recipes import Recipe

    model = SimpleNamespace(name="doubled", format="relax", artifact_uri="")
    hw = SimpleNamespace(name="x86", target={"kind": "llvm"})
    loaded = LoadedModel(mod, None, [("x", (2, 3), "float32")])
    report = BuildReport("doubled", "x86", 1, 0, 1, threads=1)
    return Resolved(model, hw, tvm.target.Target("llvm"), Recipe(), loaded,  # type: ignore[arg-type]
                    [], 0, 0, None, report)


def test_check_compares_the_tuned_build_with_the_untuned_one(caplog: pytest.LogCaptureFixture) -> None:
    import tvm

    resolved = _resolved_for(_doubled())
    with caplog.at_level(logging.INFO, logger="tunefleet.delivery.build"):
        checked = check(resolved, tvm.compile(_doubled(), target="llvm"))
    assert resolved.report.max_abs_diff == 0.0
    assert set(checked.vms) == set(checked.first_call_s) == {"tuned", "untuned"}
    assert all(s > 0 for s in checked.first_call_s.values())
    assert [x.shape for x in checked.inputs_np] == [(2, 3)] and len(checked.inputs) == 1
    assert [getattr(r, STAGE_LOG_KEY) for r in caplog.records if hasattr(r, STAGE_LOG_KEY)] == [
        "checking and timing the tuned model"]

    wrong = _resolved_for(_doubled())
    with pytest.raises(CorrectnessError, match="tuned build of doubled disagrees with the untuned build "
                                               r"\(max abs diff 0.5\)"):
        check(wrong, tvm.compile(_doubled(offset=0.5), target="llvm"))
    assert wrong.report.max_abs_diff == pytest.approx(0.5)


@pytest.mark.parametrize("compare_torch", [False, True])
def test_time_builds_times_both_builds_and_the_alternatives(compare_torch: bool) -> None:
    resolved = _resolved_for(None)
    vms = {"tuned": CountingVM(), "untuned": CountingVM()}
    # the untuned build's first call took longer than the untuned timing: one plain call more
    checked = Checked(None, [np.zeros((2, 3), "float32")], [], vms, {"tuned": 0.001, "untuned": UNTUNED_TIMING_S * 3})
    time_builds(None, resolved, checked, repeat=7, compare_torch=compare_torch)  # type: ignore[arg-type]
    report = resolved.report
    assert report.tuned_ms == pytest.approx(2.0)  # the median of time_evaluator's repeats
    assert vms["tuned"].evaluator == {"number": 7, "repeat": 3} and vms["tuned"].calls == 0
    assert vms["untuned"].evaluator is None and vms["untuned"].calls == 1
    assert report.untuned_ms is not None and 1.0 <= report.untuned_ms < 500
    assert (report.torch_ms, report.onnxruntime_ms) == (None, None)  # no PyTorch module, not ONNX
    if compare_torch:
        assert report.notes[0] == "no PyTorch module for this model: eager latency not measured"
        assert len(report.notes) == 2 and "onnxruntime latency not measured" in report.notes[1]
    else:
        assert report.notes == []


def test_build_model_of_a_class_this_host_cannot_run_only_builds(fleet) -> None:  # type: ignore[no-untyped-def]
    db, store = fleet
    model = ingest(db, store, "mlp").model
    report = build_model(db, store, model, "arm")  # no output: linking aarch64 code needs a cross toolchain
    assert report.database_hits == 0 and report.workloads == 3
    assert (report.tuned_ms, report.untuned_ms, report.max_abs_diff) == (None, None, None)
    assert len(report.notes) == 1 and report.notes[0].startswith("not run: target llvm ")
    assert report.notes[0].endswith(" cannot run on this host")
