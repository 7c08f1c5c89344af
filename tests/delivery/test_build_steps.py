"""The steps of :func:`tunefleet.delivery.build.build_model`, one test each: resolve, compile,
check, time. The tiny zoo ``mlp`` (3 workloads) stands in for a model; a measurement of the
default schedule (the empty trace) stands in for tuning, so nothing here tunes."""

from __future__ import annotations

import logging
from dataclasses import replace
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
from tunefleet.errors import CorrectnessError, DatabaseUnavailableError
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
    assert report.recipe == fresh.recipe.name == "nhwc+prepack+fastmath+fold+winograd" and report.threads >= 1
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

    model = SimpleNamespace(name="doubled", source="zoo", format="relax", artifact_uri="")
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


def _blocks(log: list[str]) -> list[str]:
    """The names of consecutive runs of calls (``a a b b a`` -> ``a b a``)."""
    return [name for i, name in enumerate(log) if i == 0 or log[i - 1] != name]


def test_time_builds_times_the_tuned_build_and_the_alternatives_in_alternating_rounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tunefleet.delivery import alternatives

    log: list[str] = []
    asked: list[dict[str, Any]] = []

    def fake_calls(inputs: Any, threads: int, *, torch_module: Any, onnx_bytes: Any, no_module: Any = None) -> Any:
        asked.append({"inputs": inputs, "threads": threads, "torch_module": torch_module, "onnx_bytes": onnx_bytes})
        return {"torch": lambda: log.append("torch"), "onnxruntime": lambda: log.append("onnxruntime")}, ["a note"]

    monkeypatch.setattr(alternatives, "calls", fake_calls)
    resolved = _resolved_for(None)
    vms = {"tuned": CountingVM("tuned", log, call_s=0.0), "untuned": CountingVM("untuned", log, call_s=0.0)}
    # the untuned build's first call took longer than the untuned timing: not called again
    inputs_np = [np.zeros((2, 3), "float32")]
    checked = Checked(None, inputs_np, [], vms, {"tuned": 0.001, "untuned": UNTUNED_TIMING_S * 3})
    time_builds(None, resolved, checked, rounds=3)  # type: ignore[arg-type]
    assert _blocks(log) == ["tuned", "torch", "onnxruntime",  # warm-up
                            "tuned", "torch", "onnxruntime",  # round 0
                            "torch", "onnxruntime", "tuned",  # round 1: the order rotates
                            "onnxruntime", "tuned", "torch"]  # round 2
    assert vms["untuned"].calls == 0
    assert vms["tuned"].evaluator is vms["untuned"].evaluator is None
    assert resolved.report.untuned_ms == pytest.approx(UNTUNED_TIMING_S * 3 * 1e3)  # the check's call
    assert asked == [{"inputs": inputs_np, "threads": 1, "torch_module": None, "onnx_bytes": None}]
    report = resolved.report
    assert all(v is not None and v >= 0 for v in (report.tuned_ms, report.torch_ms, report.onnxruntime_ms,
                                                   report.untuned_ms))
    assert report.notes == ["a note"]


def test_time_builds_on_two_threads_says_where_their_cpus_sat(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real probe between CPUs 0 and 1 after each block (the suite's parallel phase gives a worker
    one CPU, where a build has no probe: the CPUs are named here)."""
    from tunefleet.delivery import placement

    monkeypatch.setattr(placement, "probe_for", lambda threads: placement.CoreProbe((0, 1), round_trips=2000))
    resolved = _resolved_for(None)
    resolved.report.threads = 2
    vms = {"tuned": CountingVM("tuned", call_s=0.0), "untuned": CountingVM("untuned", call_s=0.0)}
    checked = Checked(None, [np.zeros((2, 3), "float32")], [], vms, {"tuned": 0.001, "untuned": 0.001})
    time_builds(None, resolved, checked, rounds=3, compare_torch=False)  # type: ignore[arg-type]
    report = resolved.report
    assert sum(side["blocks"] for side in report.placement.values()) == 6  # 3 rounds of the two builds
    assert all(set(side["ms"]) == {"tuned", "untuned"} for side in report.placement.values())
    assert report.placement_line.startswith("timed with the two CPUs ")


def test_time_builds_without_the_alternatives_times_the_tuned_build_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from tunefleet.delivery import alternatives

    monkeypatch.setattr(alternatives, "calls", lambda *a, **k: pytest.fail("the alternatives were asked for"))
    log: list[str] = []
    resolved = _resolved_for(None)
    vms = {"tuned": CountingVM("tuned", log, call_s=0.0), "untuned": CountingVM("untuned", log, call_s=0.0)}
    # a first call of 4 s: its alternating timing does not fit, two plain calls do, alone, after
    checked = Checked(None, [np.zeros((2, 3), "float32")], [], vms, {"tuned": 0.001, "untuned": UNTUNED_TIMING_S / 2.5})
    time_builds(None, resolved, checked, rounds=2, compare_torch=False)  # type: ignore[arg-type]
    assert _blocks(log) == ["tuned", "untuned"] and vms["untuned"].calls == 2
    report = resolved.report
    assert report.tuned_ms is not None and report.untuned_ms is not None
    assert (report.torch_ms, report.onnxruntime_ms, report.notes) == (None, None, [])


def test_time_builds_notes_an_alternative_without_a_call() -> None:
    """The real alternatives of a model with no PyTorch module, not ingested as ONNX: two notes."""
    resolved = _resolved_for(None)
    vms = {"tuned": CountingVM("tuned", call_s=0.0), "untuned": CountingVM("untuned", call_s=0.0)}
    checked = Checked(None, [np.zeros((2, 3), "float32")], [], vms, {"tuned": 0.001, "untuned": UNTUNED_TIMING_S * 3})
    time_builds(None, resolved, checked, rounds=1)  # type: ignore[arg-type]
    report = resolved.report
    assert report.tuned_ms is not None and (report.torch_ms, report.onnxruntime_ms) == (None, None)
    assert report.notes == ["no PyTorch module for this model: eager latency not measured",
                            "no ONNX model and no PyTorch module to export: onnxruntime latency not measured"]


def test_build_model_of_a_class_this_host_cannot_run_only_builds(fleet) -> None:  # type: ignore[no-untyped-def]
    db, store = fleet
    model = ingest(db, store, "mlp").model
    report = build_model(db, store, model, "arm")  # no output: linking aarch64 code needs a cross toolchain
    assert report.database_hits == 0 and report.workloads == 3
    assert (report.tuned_ms, report.untuned_ms, report.max_abs_diff) == (None, None, None)
    assert len(report.notes) == 1 and report.notes[0].startswith("not run: target llvm ")
    assert report.notes[0].endswith(" cannot run on this host (the class's recipe was built, not compared with others)")
    assert report.delivered == "nhwc+prepack+fastmath+fold"


def _slowed(monkeypatch: pytest.MonkeyPatch, slow: set[str], seconds: float = 0.02) -> None:
    """Make the timed calls of the builds whose key is in ``slow`` take ``seconds`` longer (what a
    layout conversion that costs more than it saves looks like to the timing)."""
    import time

    from tunefleet.delivery import build

    real = build._call

    def call(vm: Any, inputs: list[Any]) -> Any:
        inner = real(vm, inputs)
        key = next(k for k, v in _vms_seen[-1].items() if v is vm)
        if key not in slow:
            return inner
        return lambda: (time.sleep(seconds), inner())[1]

    _vms_seen: list[dict[str, Any]] = []
    real_time_builds = build.time_builds

    def time_builds_(store: Any, resolved: Any, checked: Any, **kw: Any) -> None:
        _vms_seen.append(checked.vms)
        real_time_builds(store, resolved, checked, **kw)

    monkeypatch.setattr(build, "_call", call)
    monkeypatch.setattr(build, "time_builds", time_builds_)


def test_other_recipes_are_the_frontend_layout_with_and_without_prepacking(fleet, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import torch

    from tunefleet.delivery.build import other_recipes

    db, store = fleet
    # small-cnn's convolutions have under 32 channels: no Winograd, so the class's Winograd recipe
    # has the workloads of its direct twin, which the build does not compile again
    cnn = resolve(db, store, ingest(db, store, "small-cnn", image_size=16).model, "x86")
    assert cnn.recipe.name == "nhwc+prepack+fastmath+fold+winograd"
    assert [r.name for r in other_recipes(cnn)] == ["native+prepack+fastmath+fold", "native+fastmath+fold"]
    mlp = resolve(db, store, ingest(db, store, "mlp").model, "x86")  # no convolution: the layout changes nothing
    assert [r.name for r in other_recipes(mlp)] == ["nhwc+fastmath+fold+winograd"]
    gpu = resolve(db, store, mlp.model, "gpu")
    assert other_recipes(gpu) == []  # the frontend's layout, no prepacking already
    # A model with a convolution Winograd applies to compares with direct convolutions too (a hub's
    # or an older recipe's schedules are for them)
    path = tmp_path / "block.onnx"
    block = torch.nn.Sequential(torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU())
    torch.onnx.export(block, (torch.zeros(1, 32, 16, 16),), str(path), dynamo=False, input_names=["x"])
    winograd = resolve(db, store, ingest(db, store, str(path)).model, "x86")
    assert [r.name for r in other_recipes(winograd)] == ["nhwc+prepack+fastmath+fold", "native+prepack+fastmath+fold",
                                                         "native+fastmath+fold"]
    direct = replace(winograd, recipe=replace(winograd.recipe, winograd=False))
    assert [r.name for r in other_recipes(direct)] == ["native+prepack+fastmath+fold", "native+fastmath+fold"]


def _measure_under_other_recipes(db: Database, store: LocalStore, model: Any, hardware: str) -> list[str]:
    """Commit a measurement of the default schedule for every workload of the model under each
    of the class's other recipes (what a hub or an earlier recipe leaves); their names."""
    from tunefleet.delivery.build import other_recipes
    from tunefleet.models.ingest import load_model
    from tunefleet.tvm.extract import extract_workloads

    resolved = resolve(db, store, model, hardware)
    hw, loaded = db.hardware_class(hardware), load_model(db, store, model)
    for recipe in other_recipes(resolved):
        for w in extract_workloads(loaded.mod, resolved.target, params=loaded.params, recipe=recipe):
            row, _ = db.add_workload(structural_hash=w.structural_hash, name=w.name, op_kind=w.op_kind,
                                     flops=float(w.flops), tir_json=w.tir_json)
            db.commit_measurements([NewMeasurement(row.id, hw.id, EMPTY_TRACE, [1e-5])])
    return [r.name for r in other_recipes(resolved)]


def test_a_recipe_without_a_stored_schedule_of_its_own_is_not_compiled(fleet) -> None:  # type: ignore[no-untyped-def]
    """The class tunes under its own recipe: the others' builds would run their layout's kernels
    on default schedules (the untuned build's part), so they are not compiled, and one note says
    so — also when the class's schedules cover a workload they share (small-cnn's matmul is the
    same under the class's recipe and the frontend's layout with prepacking); a recipe with a
    stored schedule of its own is compiled."""
    from tunefleet.delivery.build import compile_others

    db, store = fleet
    model = ingest(db, store, "small-cnn", image_size=16).model
    extract(db, store, model, "x86")
    hw = db.hardware_class("x86")
    for wl, _ in db.workloads(model.id, hw.id):  # every workload of the class's recipe measured
        db.commit_measurements([NewMeasurement(wl.id, hw.id, EMPTY_TRACE, [1e-5])])
    skipped = ("not built under recipe native+prepack+fastmath+fold, native+fastmath+fold: no stored schedule of "
               "its own (its kernels would run default schedules, which the untuned build stands for)")
    fresh = resolve(db, store, model, "x86")
    assert fresh.tuned == fresh.report.workloads
    assert compile_others(db, fresh) == {} and fresh.report.notes == [skipped]
    report = build_model(db, store, model, "x86", compare_torch=False, rounds=1)
    assert set(report.builds_ms) == {"nhwc+prepack+fastmath+fold+winograd", "untuned"} and skipped in report.notes

    names = _measure_under_other_recipes(db, store, model, "x86")
    again = resolve(db, store, model, "x86")
    assert set(compile_others(db, again)) == set(names) and again.report.notes == []

    names = _measure_under_other_recipes(db, store, model, "x86")
    again = resolve(db, store, model, "x86")
    assert set(compile_others(db, again)) == set(names) and again.report.notes == []


def test_a_build_whose_layout_conversion_loses_is_not_delivered(fleet, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The class's recipe (NHWC) made slower than the others: the build under the frontend's
    layout is delivered, exported, and the report says which and why."""
    db, store = fleet
    model = ingest(db, store, "small-cnn", image_size=16).model
    _measure_under_other_recipes(db, store, model, "x86")  # else they are not built (the test above)
    _slowed(monkeypatch, {"tuned"})
    # Every build runs default schedules here: a first call slowed by other load must not screen one
    # out (screening has a test of its own).
    monkeypatch.setattr("tunefleet.delivery.build.SCREEN_FACTOR", float("inf"))
    out = tmp_path / "cnn.so"
    report = build_model(db, store, model, "x86", output=out, compare_torch=False, rounds=3)
    assert set(report.builds_ms) == {"nhwc+prepack+fastmath+fold+winograd", "native+prepack+fastmath+fold",
                                     "native+fastmath+fold", "untuned"}
    assert report.builds_ms["nhwc+prepack+fastmath+fold+winograd"] > 20.0  # the slowed build
    assert report.delivered != "nhwc+prepack+fastmath+fold+winograd"
    assert report.tuned_ms == report.builds_ms[report.delivered]
    assert report.recipe == "nhwc+prepack+fastmath+fold+winograd" and report.max_abs_diff is not None
    assert report.output == str(out) and out.stat().st_size > 0
    assert "build" not in db.step_seconds([model.id], db.hardware_class("x86").id)  # not the build `run` makes
    if report.delivered == "untuned":
        assert any(n.startswith("delivered the UNTUNED build: every tuned build was slower") for n in report.notes)
    else:
        assert any(n.startswith(f"delivered the build under recipe {report.delivered}, not the class's "
                                "nhwc+prepack+fastmath+fold+winograd: it was the fastest") for n in report.notes)


def test_a_tuned_build_slower_than_the_untuned_one_is_never_delivered(fleet, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    db, store = fleet
    model = ingest(db, store, "mlp").model
    _slowed(monkeypatch, {"tuned", "nhwc+fastmath+fold"})
    report = build_model(db, store, model, "x86", output=tmp_path / "mlp.so", compare_torch=False, rounds=3)
    assert report.delivered == "untuned" and report.tuned_ms == report.untuned_ms
    assert min(v for k, v in report.builds_ms.items() if k != "untuned") > report.untuned_ms
    assert any(n.startswith("delivered the UNTUNED build: every tuned build was slower (") for n in report.notes)
    assert (tmp_path / "mlp.so").stat().st_size > 0


def test_with_nothing_slowed_the_fastest_build_is_delivered(fleet) -> None:  # type: ignore[no-untyped-def]
    db, store = fleet
    model = ingest(db, store, "mlp").model
    report = build_model(db, store, model, "x86", compare_torch=False, rounds=3)
    assert report.tuned_ms == min(report.builds_ms.values()) == report.builds_ms[report.delivered]


def test_a_build_whose_first_call_is_far_slower_is_not_timed() -> None:
    """A build under another recipe whose stored schedules did not cover it runs default schedules:
    its first call says it cannot win, and timing it would cost the budget seconds per call."""
    log: list[str] = []
    resolved = _resolved_for(None)
    vms = {"tuned": CountingVM("tuned", log, call_s=0.0), "native+fastmath+fold": CountingVM("other", log, call_s=0.0),
           "untuned": CountingVM("untuned", log, call_s=0.0)}
    checked = Checked(None, [np.zeros((2, 3), "float32")], [], vms,
                      {"tuned": 0.001, "native+fastmath+fold": 0.5, "untuned": 0.002})
    time_builds(None, resolved, checked, rounds=3, compare_torch=False)  # type: ignore[arg-type]
    assert "other" not in log and {"tuned", "untuned"} <= set(log)
    assert set(resolved.report.builds_ms) == {"native", "untuned"}
    assert resolved.report.notes == ["the build under recipe native+fastmath+fold was not timed: its first call "
                                     "took 500.000 ms, 500x the fastest build's"]


def test_a_build_whose_time_cannot_be_noted_is_delivered_all_the_same(fleet, monkeypatch,  # type: ignore[no-untyped-def]
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """The build's time is a note for the next run's planning: a database gone at that moment
    fails no build that was made, checked, timed and delivered."""
    db, store = fleet
    model = ingest(db, store, "mlp").model

    def gone(*_: Any) -> None:
        raise DatabaseUnavailableError("database unavailable: connection refused")

    monkeypatch.setattr(db, "note_step_seconds", gone)
    with caplog.at_level(logging.WARNING, logger="tunefleet.delivery.build"):
        report = build_model(db, store, model, "x86", rounds=1)  # compares the alternatives: `run`'s build
    assert report.delivered is not None and report.tuned_ms is not None
    assert any("not noted for the next run's planning: database unavailable" in r.getMessage() for r in caplog.records)
