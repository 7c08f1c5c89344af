"""`tunefleet run` and the delivery commands, driven as a user does, on the embedded defaults."""

from __future__ import annotations

import json
import re

import pytest

from tests.cli.test_cli_config import error_line, run_cli


@pytest.mark.slow
def test_run_then_best_build_and_shards(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {"TUNEFLEET_HOME": str(tmp_path / "home")}
    out = run_cli("run", "--model", "mlp", "--trials", "6", "-o", str(tmp_path / "out"), env=env, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "5/5 build" in out.stdout and "tunefleet tuned (3/3 workloads tuned)" in out.stdout
    assert re.search(r"^hub: \d+ of 3 workloads start from the hub", out.stdout, re.MULTILINE), out.stdout
    assert (tmp_path / "out" / "mlp-x86.so").exists()
    # it ran as the Prefect `pipeline` flow (ephemeral mode, Prefect's database under the tunefleet home)
    (log,) = (home_logs := tmp_path / "home" / "logs").glob("run-*.log")
    text = log.read_text()
    assert "Starting temporary server" in text, home_logs  # Prefect's ephemeral mode, logged to the file
    assert "database is locked" not in text  # its task-run recorder is off (cli/environment.py)
    assert list((tmp_path / "home" / "prefect").glob("*.db")), "Prefect's database is under the tunefleet home"

    workloads = json.loads(run_cli("workloads", "list", "--json", "--model", "mlp", env=env).stdout)
    assert len(workloads) == 3
    best = run_cli("best", workloads[0]["hash"][:8], "--hardware", "x86", "--json", env=env)
    assert best.returncode == 0, best.stderr
    record = json.loads(best.stdout)[0]
    assert record["mean_run_s"] > 0 and record["untuned_s"] >= record["mean_run_s"]
    assert record["origin"] == "tuned here" or record["origin"].startswith("hub: ")

    shards = json.loads(run_cli("shards", "list", "--json", env=env).stdout)
    assert {s["state"] for s in shards} == {"done"}
    # nothing new to tune (the pipeline run twice: tests/flows/test_flows.py)
    again = run_cli("plan", "--model", "mlp", "--hardware", "x86", "--trials", "6", env=env)
    assert again.returncode == 0 and "planned 0 new shard(s)" in again.stdout, again.stdout

    energy = json.loads(run_cli("report", "energy", "--json", env=env).stdout)
    assert [(r["model"], r["hardware"], r["sources"]) for r in energy] == [("mlp", "x86", "estimate")]
    assert energy[0]["joules"] > 0 and energy[0]["trials"] >= 18  # 3 workloads x 6 trials
    assert 0 <= energy[0]["wasted_pct"] < 100  # the first valid candidate of each workload is useful

    exported = run_cli("dataset", "export", env=env, timeout=300)
    assert exported.returncode == 0 and "dataset v1:" in exported.stdout, exported.stderr[-2000:]
    versions = json.loads(run_cli("dataset", "list", "--json", env=env).stdout)
    assert [(v["version"], v["rows"], v["complete"]) for v in versions] == [(1, energy[0]["trials"], True)]
    assert "nothing new to export" in run_cli("dataset", "export", env=env, timeout=300).stdout

    retrained = run_cli("costmodel", "retrain", "--hardware", "x86", "--holdout", "0.34", env=env, timeout=300)
    assert retrained.returncode == 0, retrained.stderr[-2000:]
    assert re.search(r"^(NOT )?promoted: ", retrained.stdout, re.MULTILINE), retrained.stdout
    if "NOT promoted" in retrained.stdout:  # the transfer guard refused it: promote it by hand
        promoted = run_cli("costmodel", "promote", "1", "--hardware", "x86", env=env)
        assert promoted.returncode == 0 and "v1 is now the current model" in promoted.stdout
    assert run_cli("ingest", "small-cnn", env=env).returncode == 0
    built = run_cli("build", "small-cnn", "--zero-shot", "--json", env=env, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    report = json.loads(built.stdout)
    # every workload of the NHWC recipe (7: its layout transposes at the boundary included) predicted
    assert (report["predicted_workloads"], report["tuned_workloads"], report["default_workloads"]) == (7, 0, 0)
    assert report["workloads"] == 7 and report["database_hits"] == 7
    cnn = json.loads(run_cli("workloads", "list", "--json", "--model", "small-cnn", env=env).stdout)
    predicted = run_cli("best", cnn[0]["hash"], "--zero-shot", "--top", "2", "--json", env=env, timeout=300)
    assert [p["source"] for p in json.loads(predicted.stdout)] == ["predicted", "predicted"]
    measured_only = run_cli("best", cnn[0]["hash"], env=env)
    assert measured_only.returncode == 2 and "no measurement of workload" in error_line(measured_only.stderr)

    # cost-efficient tuning from the CLI: the current model filters half of each round from the start
    # (the audit that may stop it is off here: its decision depends on measured times, and
    # tests/engine/test_efficiency.py checks it)
    assert run_cli("plan", "--hardware", "x86", "--trials", "10", "--model", "mlp", env=env).returncode == 0
    tuned = run_cli("tune", "--efficient", "--trials-per-iter", "4", "--seed", "0",
                    env={**env, "TUNEFLEET_FILTER_MIN_AGREEMENT": "0"}, timeout=900)
    assert tuned.returncode == 0, tuned.stderr[-2000:]
    counted = re.search(r"(\d+) filtered, (\d+) shard\(s\) preempted", tuned.stdout)
    assert counted and int(counted.group(1)) > 0, tuned.stdout
    energy = json.loads(run_cli("report", "energy", "--json", env=env).stdout)
    assert [r["filtered"] for r in energy if r["model"] == "mlp"] == [int(counted.group(1))]


def test_unknown_hardware_and_model_are_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {"TUNEFLEET_HOME": str(tmp_path / "home")}
    out = run_cli("plan", "--hardware", "tpu", "--trials", "4", env=env)
    assert out.returncode == 2
    assert error_line(out.stderr).startswith("tunefleet: error: unknown hardware class 'tpu' (known: arm, gpu, x86, x86-avx2)")
    out = run_cli("ingest", "no-such-model", env=env)
    assert out.returncode == 2 and "no such file, and not a zoo model" in error_line(out.stderr)
    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(b"\x00garbage" * 50)
    out = run_cli("ingest", str(bad), env=env)
    assert out.returncode == 2 and "corrupt.onnx" in error_line(out.stderr)


def test_zero_shot_without_a_model_is_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {"TUNEFLEET_HOME": str(tmp_path / "home")}
    assert run_cli("ingest", "mlp", env=env).returncode == 0
    out = run_cli("build", "mlp", "--zero-shot", env=env)
    assert out.returncode == 2
    assert error_line(out.stderr).startswith("tunefleet: error: not supported: zero-shot on x86 without a current cost model")
    out = run_cli("build", "mlp", "--verify", "2", env=env)
    assert out.returncode == 2 and error_line(out.stderr) == "tunefleet: error: --verify needs --zero-shot"
    out = run_cli("costmodel", "promote", "3", env=env)
    assert out.returncode == 2 and "no cost model v3 for x86" in error_line(out.stderr)


def test_hardware_list_json(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = run_cli("hardware", "list", "--json", env={"TUNEFLEET_HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    names = {h["name"] for h in json.loads(out.stdout)}
    assert names == {"x86", "x86-avx2", "arm", "gpu"}
