"""`tunefleet run` as a new user meets it: checks before any server starts, a short output with a
log file, and an honest error when nothing was tuned. (Ctrl-C, the README's command resuming the
run from the folder above a clone: the walk-through, tests/cli/test_cli_run.py.)"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pytest

from tests.cli.test_cli_config import error_line, run_cli
from tunefleet.errors import TunefleetError


@pytest.mark.parametrize(("args", "says"), [
    (["--model", "nosuch"], "nosuch: no such file, and not a zoo model"),
    (["--model", "mlp", "--trials", "0"], "invalid --trials: 0 (must be >= 1)"),
    (["--model", "mlp", "--budget", "15x"], "invalid --budget: '15x' (give a trial count such as 2000, or a wall time"),
    (["--model", "mlp", "--hardware", "tpu"], "unknown hardware class 'tpu'; known: arm, gpu, x86"),
    (["--model", "ftp://host/m.onnx"], "not supported: model URI scheme"),
])
def test_a_bad_run_is_refused_before_any_server_starts(tmp_path: Path, args: list[str], says: str) -> None:
    home = tmp_path / "home"
    started = time.monotonic()
    out = run_cli("run", *args, env={"TUNEFLEET_HOME": str(home)})
    assert out.returncode == 2 and says in error_line(out.stderr)
    assert time.monotonic() - started < 30  # a Prefect server alone takes longer to start
    assert not (home / "prefect").exists() and not (home / "logs").exists(), "nothing was started"


def test_a_missing_compiler_is_named_before_anything_is_ingested(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tunefleet.tvm.compiler import missing_compiler

    home = tmp_path / "home"
    out = run_cli("run", "--model", "mlp", env={"TUNEFLEET_HOME": str(home), "CXX": str(tmp_path / "no-such-g++")})
    assert out.returncode == 2
    assert f"the C/C++ compiler CXX names, '{tmp_path / 'no-such-g++'}', is not there" in error_line(out.stderr)
    assert not (home / "prefect").exists() and not (home / "logs").exists(), "nothing was started"
    assert missing_compiler() is None  # this machine has one
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no compiler on it
    assert missing_compiler().startswith("no C/C++ compiler on PATH: TVM links every tuned candidate")  # type: ignore[union-attr]


def test_a_bad_budget_setting_or_a_duration_to_plan_is_one_line(tmp_path: Path) -> None:
    env = {"TUNEFLEET_HOME": str(tmp_path / "home")}
    out = run_cli("run", "--model", "mlp", env={**env, "TUNEFLEET_BUDGET": "soon"})
    assert out.returncode == 2 and error_line(out.stderr).startswith("tunefleet: error: invalid setting TUNEFLEET_BUDGET")
    out = run_cli("plan", "--budget", "15m", env=env)
    assert out.returncode == 2 and "'15m' is a duration; a plan takes a number of trials" in error_line(out.stderr)
    out = run_cli("tune", "--budget", "200", env=env)
    assert out.returncode == 2 and "'200' is a number of trials; give --model" in error_line(out.stderr)


def test_a_missing_extra_is_named_before_anything_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from tunefleet.models.frontends import MissingDependencyError
    from tunefleet.models.ingest import check_source

    model = tmp_path / "net.onnx"
    model.write_bytes(b"not read by the check")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in ("onnx", "torch") else real(name, *a))
    with pytest.raises(MissingDependencyError, match=r"net.onnx \(ONNX\) needs onnx.*pip install 'tunefleet\[onnx\]'"):
        check_source(str(model))
    with pytest.raises(MissingDependencyError, match=r"zoo model 'resnet18' needs torch.*tunefleet\[torch\]"):
        check_source("resnet18")
    check_source("mlp")  # built with TVM alone


def _seeded(tmp_path: Path):  # type: ignore[no-untyped-def]
    from tunefleet.db import Database
    from tunefleet.vocab import FAILED

    db = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    hw = db.upsert_hardware_class("x86", {"kind": "llvm", "num-cores": 2}, "x86")
    model, _ = db.add_model(name="mlp", source="zoo", format="x", sha256="c" * 64, artifact_uri="u")
    ids = []
    for i in range(2):
        wl, _ = db.add_workload(structural_hash=f"{i:04x}", name=f"dense{i}", op_kind="dense", flops=1.0, tir_json="{}")
        db.link_model_workload(model.id, wl.id, 1)
        ids.append(wl.id)
    shards = db.add_shards(hw.id, [(wl, 4, 1.0) for wl in ids], max_leases=1)
    for shard in shards:
        db.lease_shard(hw.id, "w", lease_s=60, shard_id=shard.id)
        db.end_lease(shard.id, "w", state=FAILED, error="ImportError: cannot import name 'x'\ntraceback...",
                     event="attempt-failed")
    return db, model


def test_a_run_where_no_shard_succeeded_is_one_error_line_with_the_resume_command(tmp_path: Path) -> None:
    from rich.console import Console

    from tunefleet.cli.run import _run_summary

    from tunefleet.config import load_settings

    db, model = _seeded(tmp_path)
    settings = load_settings(home=tmp_path)
    args = argparse.Namespace(model="mlp", hardware="x86", trials=4, json=False)
    result = {"models": [{"model_id": model.id, "created": False, "sha256": model.sha256}],
              "extracted": [{"workloads": 2, "new_workloads": 0}],
              "planned": [{"new_shards": 2, "new_trials": 8, "workloads": 2}],
              "tuned": {"x86": {"shards_done": 0, "shards_failed": 2, "measured": 0, "errors": 0, "seconds": 1.0}},
              "energy": [], "builds": [{"tuned_workloads": 0, "workloads": 2, "default_workloads": 2,
                                        "hub": "0 of 2 workloads start from the hub"}]}
    console = Console(file=open(os.devnull, "w"))  # noqa: SIM115 - closed with the process
    with pytest.raises(TunefleetError) as as_json:  # --json: the same error, no JSON pretending success
        _run_summary(console, db, argparse.Namespace(**{**vars(args), "json": True}), result, tmp_path / "run.log",
                     settings)
    with pytest.raises(TunefleetError) as info:
        _run_summary(console, db, args, result, tmp_path / "run.log", settings)
    message = str(info.value)
    assert str(as_json.value) == message
    assert "\n" not in message
    assert "no shard of mlp on x86 succeeded: 2 failed (first: ImportError: cannot import name 'x')" in message
    assert f"log: {tmp_path / 'run.log'}" in message
    assert message.endswith("resume with: tunefleet shards retry --hardware x86 && "
                            "tunefleet run --model mlp --hardware x86 --trials 4")


def test_plan_says_when_a_models_workloads_are_of_another_recipe_or_missing(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from tunefleet.cli.tuning import _warn_recipes
    from tunefleet.db import Database

    db = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    hw = db.upsert_hardware_class("x86", {"kind": "llvm", "num-cores": 2}, "x86")  # CPU: nhwc+prepack+fastmath+fold
    gpu = db.upsert_hardware_class("gpu", {"kind": "cuda"}, "gpu")
    old, _ = db.add_model(name="old", source="zoo", format="x", sha256="c" * 64, artifact_uri="u")
    new, _ = db.add_model(name="new", source="zoo", format="x", sha256="d" * 64, artifact_uri="u")
    wl, _ = db.add_workload(structural_hash="0001", name="conv", op_kind="conv2d", flops=1.0, tir_json="{}")
    db.set_model_workloads(old.id, hw.id, "native", {wl.id: 1})  # extracted before recipes existed
    db.set_model_workloads(new.id, hw.id, "nhwc+prepack+fastmath+fold", {wl.id: 1})
    db.set_model_workloads(old.id, gpu.id, "native+fold", {wl.id: 1})
    _warn_recipes(db, "x86", None)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model old was extracted for x86 under recipe native, but the class now uses " \
                              "nhwc+prepack+fastmath+fold: its earlier tuning no longer applies" in err[0]
    _warn_recipes(db, "gpu", None)  # extracted under the GPU class's recipe: nothing to say
    _warn_recipes(db, "gpu", "new")
    assert capsys.readouterr().err.strip() == ("tunefleet: warning: model new has no workloads on gpu yet: extract it "
                                               "first (`tunefleet extract new --hardware gpu`)")


def test_a_temporary_prefect_server_records_no_task_runs_and_a_real_one_is_left_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The temporary server's task-run recorder stalled runs for 60 s on SQLite's lock; a server of
    the user's own (PREFECT_API_URL) is configured where it runs, and a choice of the user's wins."""
    from tunefleet.cli.environment import prefect_environment
    from tunefleet.config import load_settings

    key = "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED"
    settings = load_settings(home=tmp_path / "home")
    monkeypatch.setattr(os, "environ", dict(os.environ))  # what it sets (PREFECT_HOME...) stays in this test
    for name in (key, "PREFECT_API_URL"):
        monkeypatch.delenv(name, raising=False)
    prefect_environment(settings)
    assert os.environ[key] == "false"
    monkeypatch.setenv(key, "true")
    prefect_environment(settings)
    assert os.environ[key] == "true"
    monkeypatch.delenv(key)
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    prefect_environment(settings)
    assert key not in os.environ


def test_the_run_says_which_cost_model_warm_started_it(tmp_path: Path) -> None:
    from tunefleet.cli.run import _cost_model_line
    from tunefleet.config import load_settings
    from tunefleet.learning.pretrained import vector_code

    db, _ = _seeded(tmp_path)
    tuned = {"shards_done": 4, "warm_start_dropped": 1}
    line = _cost_model_line(db, load_settings(home=tmp_path), "x86", tuned)
    assert line.startswith("the one shipped with tunefleet (v0")
    code = " for x86 AVX2 code" if vector_code(db.hardware_class("x86").target) == "avx2" else ""
    assert f"(v0{code}, trained on AMD EPYC (family " in line  # which one, and the CPUs it learned from
    assert line.endswith("; dropped in 1 of 4 shard(s) whose measurements it misranked")
    off = load_settings(home=tmp_path, pretrained_cost_model=False)
    assert _cost_model_line(db, off, "x86", tuned).startswith("none (TUNEFLEET_PRETRAINED_COST_MODEL=false")
    cold = load_settings(home=tmp_path, warm_start=False)
    assert _cost_model_line(db, cold, "x86", tuned).startswith("none (TUNEFLEET_WARM_START=false")
    row = db.add_cost_model(hardware_class_id=db.hardware_class("x86").id, artifact_uri="u", metrics={})
    db.promote_cost_model(row.id)
    assert _cost_model_line(db, off, "x86", {"shards_done": 2}) == f"x86's own v{row.version}"
