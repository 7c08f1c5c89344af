"""A real Prefect server (on its own PostgreSQL database) and real process workers.

``tunefleet deploy`` registers the pools and deployments; runs are triggered through the API the
way the UI's "Run" button does (``POST /deployments/{id}/create_flow_run``); tunefleet's own
database is a separate PostgreSQL database. The fault test kills a worker (and its flow-run and
builder processes) with SIGKILL mid-shard, and checks the next run finishes the shard with every
committed measurement kept and nothing measured twice.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from tunefleet.planning import shard_queue
from tunefleet.config import load_settings
from tunefleet.db import Database
from tunefleet.testing.postgres import PostgresServer
from tunefleet.testing.prefect_server import PrefectServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(pg_server: PostgresServer) -> Iterator[PrefectServer]:
    name = pg_server.create_database()
    with PrefectServer(pg_server.url(name, driver="asyncpg")) as srv:
        yield srv
    pg_server.drop_database(name)


@pytest.fixture
def fleet(pg_server: PostgresServer, server: PrefectServer, tmp_path: Path) -> Iterator[dict[str, str]]:
    """tunefleet's environment for workers and the CLI: its own PostgreSQL database, a local store."""
    name = pg_server.create_database()
    env = {"TUNEFLEET_HOME": str(tmp_path / "home"), "TUNEFLEET_DATABASE_URL": pg_server.url(name)}
    out = subprocess.run([sys.executable, "-m", "tunefleet.cli.app", "deploy", "--hardware", "x86"],
                         env=server.env(**env), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tune/tune-x86" in out.stdout and "pipeline/pipeline" in out.stdout
    yield env
    pg_server.drop_database(name)


def _client(server: PrefectServer) -> Any:
    from prefect.client.orchestration import SyncPrefectClient

    return SyncPrefectClient(server.api_url)


def _trigger(server: PrefectServer, deployment: str, parameters: dict[str, Any]) -> Any:
    """Create a flow run from a deployment, as the UI does."""
    with _client(server) as client:
        dep = client.read_deployment_by_name(deployment)
        return client.create_flow_run_from_deployment(dep.id, parameters=parameters)


def _wait_final(server: PrefectServer, run_id: Any, timeout_s: float, worker: Any = None) -> Any:
    deadline = time.monotonic() + timeout_s
    with _client(server) as client:
        while time.monotonic() < deadline:
            run = client.read_flow_run(run_id)
            if run.state is not None and run.state.is_final():
                return run
            time.sleep(2)
    tail = worker.log_tail() if worker is not None else ""
    raise AssertionError(f"flow run {run_id} not finished within {timeout_s}s; worker log:\n{tail}")


def _db(env: dict[str, str]) -> Database:
    return Database.from_settings(load_settings(home=Path(env["TUNEFLEET_HOME"]),
                                                database_url=env["TUNEFLEET_DATABASE_URL"]))


def test_pipeline_deployment_runs_on_a_process_worker(server: PrefectServer, fleet: dict[str, str]) -> None:
    with server.worker("tunefleet-x86", env=fleet) as worker:
        run = _trigger(server, "pipeline/pipeline",
                       {"models": ["mlp"], "hardware": ["x86"], "trials": 4, "trials_per_iter": 4, "seed": 0,
                        "tune_on": "deployments"})
        final = _wait_final(server, run.id, 600, worker)
        assert final.state.is_completed(), f"{final.state.name}: {final.state.message}\n{worker.log_tail()}"
        with _client(server) as client:
            tune_dep = client.read_deployment_by_name("tune/tune-x86")
            runs = [r for r in client.read_flow_runs() if r.deployment_id == tune_dep.id]
        # the pipeline started tune-x86 as a child run on the pool; the others are its hourly schedule's,
        # still scheduled, or come due while the test ran (a suite met one at 08:00: the worker took it)
        children = [r for r in runs if r.parent_task_run_id is not None]
        assert len(children) == 1 and children[0].state.is_completed()
        now = datetime.now(timezone.utc)
        others = [(r.auto_scheduled, r.state.name, r.expected_start_time) for r in runs if r not in children]
        assert all(auto and (name in ("Scheduled", "Late") or due <= now) for auto, name, due in others), others
    db = _db(fleet)
    try:
        listed = shard_queue.list_shards(db, hardware="x86")
        assert len(listed) == 3 and {s.state for s in listed} == {"done"}
        assert db.count_measurements() >= 3
    finally:
        db.close()


def test_worker_killed_mid_shard_next_run_resumes(server: PrefectServer, fleet: dict[str, str]) -> None:
    from tunefleet.hardware import seed_hardware_classes
    from tunefleet.models.ingest import ingest
    from tunefleet.models.workloads import extract
    from tunefleet.store import open_store

    settings = load_settings(home=Path(fleet["TUNEFLEET_HOME"]), database_url=fleet["TUNEFLEET_DATABASE_URL"])
    db = Database.from_settings(settings)
    seed_hardware_classes(db, settings)
    store = open_store(settings)
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    (shard, *others), _ = shard_queue.plan(db, "x86", target_trials=12, shard_trials=12, model=model.id)
    shard_queue.cancel(db, [s.id for s in others])  # one shard keeps the test short
    lease_s = 8.0
    params = {"hardware": "x86", "lease_s": lease_s, "trials_per_iter": 4, "seed": 0}

    with server.worker("tunefleet-x86", env=fleet) as worker:
        _trigger(server, "tune/tune-x86", params)
        deadline = time.monotonic() + 300
        while db.count_measurements(shard_id=shard.id) < 4:
            assert time.monotonic() < deadline, worker.log_tail()
            time.sleep(0.5)
        worker.kill()  # SIGKILL to the worker, its flow-run process and its builder processes
    before = {m.id: m.trace_sha256 for m in db.measurements() if m.shard_id == shard.id}
    assert 4 <= len(before) < 12
    assert shard_queue.get_shard(db, shard.id).state == "leased"

    time.sleep(lease_s + 1)  # the dead worker's lease runs out
    with server.worker("tunefleet-x86", env=fleet) as worker:
        run = _trigger(server, "tune/tune-x86", params)
        final = _wait_final(server, run.id, 600, worker)
        assert final.state.is_completed(), worker.log_tail()

    after = {m.id: m.trace_sha256 for m in db.measurements() if m.shard_id == shard.id}
    resumed = shard_queue.get_shard(db, shard.id)
    assert resumed.state == "done" and (resumed.leases, resumed.lost_leases) == (1, 1)  # a lost lease is no attempt
    assert "lease-expired" in [h["event"] for h in resumed.history]
    assert before.items() <= after.items(), "a committed measurement was lost"
    # The resumed run measured exactly the rest of the budget, all new: a candidate measured again
    # would have collided with its committed twin (unique per trace) and left the shard short.
    assert len(after) == 12 and len(set(after.values())) == 12
    db.close()


def test_deploy_kubernetes_pool_renders_valid_jobs_and_refuses_a_type_change(
        server: PrefectServer, fleet: dict[str, str]) -> None:
    """`tunefleet deploy --pool-type kubernetes` on the real server; the Job is rendered and validated
    offline from what the server stored (no Kubernetes API server can run here)."""
    from tunefleet.cluster.job_templates import render_job, validate_manifest

    out = subprocess.run([sys.executable, "-m", "tunefleet.cli.app", "deploy", "--pool-type", "kubernetes",
                          "--hardware", "gpu", "--concurrency", "2"],
                         env=server.env(**fleet), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "tune/tune-gpu" in out.stdout and "pipeline/pipeline" not in out.stdout
    with _client(server) as client:
        pool = client.read_work_pool("tunefleet-gpu")
        deployment = client.read_deployment_by_name("tune/tune-gpu")
        limit = client.read_concurrency_limit_by_tag("tunefleet-hw:gpu")
    assert pool.type == "kubernetes" and deployment.work_pool_name == "tunefleet-gpu"
    assert limit.concurrency_limit == 2
    job = render_job(pool.base_job_template, deployment.job_variables, flow_run_name="tune-gpu-run")
    validate_manifest(job)
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["tunefleet.io/hardware"] == "gpu"
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] in (1, "1")

    again = subprocess.run([sys.executable, "-m", "tunefleet.cli.app", "deploy", "--pool-type", "process",
                            "--hardware", "gpu"], env=server.env(**fleet), capture_output=True, text=True, timeout=300)
    assert again.returncode == 2
    assert again.stderr.strip().splitlines()[-1] == (
        "tunefleet: error: work pool tunefleet-gpu exists with type kubernetes; delete it "
        "(prefect work-pool delete tunefleet-gpu) or deploy with --pool-type kubernetes")


def test_deploy_without_a_server_is_one_line(fleet: dict[str, str]) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(fleet, PREFECT_API_URL="http://127.0.0.1:9/api", PREFECT_HOME=fleet["TUNEFLEET_HOME"])
    out = subprocess.run([sys.executable, "-m", "tunefleet.cli.app", "deploy"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith(
        "tunefleet: error: cannot reach the Prefect server at http://127.0.0.1:9/api")
