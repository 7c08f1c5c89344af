"""tunefleet's database (not Prefect's) cut off for ~10 s in the middle of a tuning flow run.

PostgreSQL sits behind a TCP proxy the test controls. Mid-run the proxy resets every connection
and refuses new ones for 10 s: commits, heartbeats and leases fail with a transient error, the
``tune_shard`` task is retried with backoff, reclaims its own shard and resumes. The run
completes; every measurement committed before the outage is kept, and nothing is measured twice.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tunefleet.planning import shard_queue
from tunefleet.config import load_settings
from tunefleet.db import Database
from tunefleet.testing.postgres import PostgresServer
from tunefleet.testing.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.slow, pytest.mark.serial]  # serial: an outage timed against leases

OUTAGE_S = 10.0
BATCH = 32  # rows per commit: >= the COPY threshold (tunefleet.db.measurements._COPY_MIN_ROWS)


def test_tuning_survives_a_database_outage(flow_env, pg_server: PostgresServer, tmp_path: Path,  # type: ignore[no-untyped-def]
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName

    from tunefleet.flows.step_flows import tune
    from tunefleet.hardware import seed_hardware_classes
    from tunefleet.models.ingest import ingest
    from tunefleet.models.workloads import extract
    from tunefleet.store import open_store

    name = pg_server.create_database()
    direct = Database(pg_server.url(name))  # the test's own view, not through the proxy
    with TcpProxy("127.0.0.1", pg_server.port) as proxy:
        proxied_url = pg_server.url(name).replace(f":{pg_server.port}/", f":{proxy.port}/")
        monkeypatch.setenv("TUNEFLEET_DATABASE_URL", proxied_url)
        monkeypatch.setenv("TUNEFLEET_DB_CONNECT_TIMEOUT_S", "2")
        settings = load_settings()
        db = Database.from_settings(settings)
        seed_hardware_classes(db, settings)
        store = open_store(settings)
        model = ingest(db, store, "mlp").model
        extract(db, store, model, "x86")
        # Batches of 32 rows: PostgreSQL's COPY path (raw driver connection) meets the outage too.
        planned, _ = shard_queue.plan(db, "x86", target_trials=BATCH, shard_trials=BATCH, model=model.id)
        db.close()

        seen: dict[str, object] = {}

        def cut_off_mid_run() -> None:
            deadline = time.monotonic() + 300
            while direct.count_measurements() < 4 and time.monotonic() < deadline:
                time.sleep(0.2)
            seen["before"] = {m.id: m.trace_sha256 for m in direct.measurements()}
            proxy.pause()
            seen["cut"] = proxy.connections_cut
            time.sleep(OUTAGE_S)
            proxy.resume()

        outage = threading.Thread(target=cut_off_mid_run, daemon=True)
        outage.start()
        summary = tune(hardware="x86", lease_s=30.0, trials_per_iter=BATCH, seed=0)
        outage.join(timeout=60)

    assert "before" in seen, "the outage never happened: no measurement was committed in time"
    assert seen["cut"] >= 1  # live connections were reset, not just new ones refused
    assert summary["shards_done"] == len(planned) and summary["shards_failed"] == 0
    after = {m.id: m.trace_sha256 for m in direct.measurements()}
    before = seen["before"]
    assert isinstance(before, dict) and before.items() <= after.items(), "a committed measurement was lost"
    for shard in planned:
        state = shard_queue.get_shard(direct, shard.id)
        assert state.state == "done"
        per_shard = [m.trace_sha256 for m in direct.measurements() if m.shard_id == shard.id]
        assert len(per_shard) >= shard.trials and len(set(per_shard)) == len(per_shard)

    # The outage was absorbed by Prefect retries of tune_shard (transient errors only).
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="tune_shard")))
    assert max(r.run_count for r in runs) >= 2
    direct.close()
    pg_server.drop_database(name)
