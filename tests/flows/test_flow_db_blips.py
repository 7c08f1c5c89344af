"""A database blip in a flow's own body is a retried task run, not a failed flow run (issue 34, item 4).

The flows read the database outside their tasks — the ``tune`` flow's poll of the pending shards
while it waits for a shard it cannot lease yet, every flow's check of its hardware classes, the
``build`` flow's model names, the ``retrain`` flow's look for a current cost model — so one dropped
connection there failed the whole run. Each read is now a task run with the steps' retries
(transient errors only; an unknown hardware class still fails at once). On PostgreSQL the blip is
real (a TCP proxy resets every connection, :class:`~tunefleet.testing.tcp_proxy.TcpProxy`), on
SQLite a lock timeout; it is injected through a hook on the database call the flow makes. Under
Prefect's test harness, with the stand-in tuner of ``tests/budget`` (no TVM).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.budget.test_rounds import Clock, FakeTuner, add_stand_in_model
from tests.faults.test_db_blips import Blips, proxied_url
from tunefleet.db import Database
from tunefleet.errors import NotFoundError
from tunefleet.planning import shard_queue
from tunefleet.vocab import DONE


@pytest.fixture
def flow_db(flow_env, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Database, Blips]]:  # type: ignore[no-untyped-def]
    """The flows' database (the shared context's: through the proxy on PostgreSQL) with the
    stand-in's workloads, its blips, the stand-in tuner in every ``tune_shard``, and the flows'
    database reads retried at once (the steps' backoff, 5 s first, is not what is tested)."""
    from tunefleet.flows import step_flows

    from tunefleet.context import Context, shared_context

    with proxied_url(db_url) as (url, proxy):
        monkeypatch.setenv("TUNEFLEET_DATABASE_URL", url)
        monkeypatch.setenv("TUNEFLEET_DB_CONNECT_TIMEOUT_S", "2")
        db = shared_context().db
        add_stand_in_model(db)
        tuner = FakeTuner(Clock())
        monkeypatch.setattr(Context, "tuner", lambda self, hardware: tuner)
        for read in ("hardware_targets", "pending_shards", "model_names", "current_cost_models"):
            if hasattr(step_flows, read):
                monkeypatch.setattr(step_flows, read,
                                    getattr(step_flows, read).with_options(retry_delay_seconds=0))
        blips = Blips(proxy)
        blips.listen(db)
        yield db, blips


def _run_counts(name: str, state: Any) -> list[int]:
    """How many times each task run ``name``... of the flow run that ended in ``state`` ran."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        TaskRunFilter,
        TaskRunFilterFlowRunId,
        TaskRunFilterName,
    )

    flow_run = TaskRunFilterFlowRunId(any_=[state.state_details.flow_run_id])
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_=name),
                                                                   flow_run_id=flow_run))
    return [r.run_count for r in runs]


def test_a_blip_in_the_tune_flow_s_poll_of_pending_shards_is_retried(flow_db: tuple[Database, Blips],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue's last shard waits for its workload, which another worker searches; the flow's
    poll meets a blip, its task run is retried, and the flow goes on to tune the shard."""
    from tunefleet.flows.step_flows import tune

    db, blips = flow_db
    big = db.workload("big")
    hw = db.hardware_class("x86")
    theirs, ours = db.add_shards(hw.id, [(big.id, 4, 2.0), (big.id, 4, 1.0)])
    leased = shard_queue.lease(db, "x86", "other-worker")
    assert leased is not None and leased.id == theirs.id

    def other_worker_finishes() -> None:
        shard_queue.complete(db, theirs.id, "other-worker", generation=leased.lease_generation)

    monkeypatch.setattr(Database, "pending_shards",
                        blips.once_in(Database.pending_shards, then=other_worker_finishes))
    state = tune(hardware="x86", return_state=True)
    summary = state.result()

    assert len(blips.fired) == 1 and blips.fired[0].startswith("SELECT shards.id, shards.workload_id")
    assert summary["shards_done"] == 1 and [s["shard_id"] for s in summary["shards"]] == [ours.id]
    assert db.shard(ours.id).state == DONE and not db.pending_shards(hw.id)
    assert max(_run_counts("pending_shards", state)) == 2  # the poll's task run, retried once


def test_a_blip_in_a_flow_s_check_of_its_hardware_classes_is_retried(flow_db: tuple[Database, Blips],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from tunefleet.flows.step_flows import tune

    db, blips = flow_db
    monkeypatch.setattr(Database, "hardware_class", blips.once_in(Database.hardware_class))
    state = tune(hardware="x86", return_state=True)  # nothing to tune: it checks the class, finds none pending
    assert len(blips.fired) == 1 and state.result()["shards_done"] == 0
    assert max(_run_counts("hardware_targets", state)) == 2


def test_an_unknown_hardware_class_is_not_retried(flow_db: tuple[Database, Blips]) -> None:
    """Bad input is no blip: it fails the run at once, in one line naming the known classes."""
    from tunefleet.flows.step_flows import tune

    state = tune(hardware="tpu", return_state=True)
    with pytest.raises(NotFoundError, match=r"unknown hardware class 'tpu' \(known: .*x86"):
        state.result()
    assert _run_counts("hardware_targets", state) == [1]


@pytest.mark.parametrize(("read", "method", "arguments", "expected"), [
    ("model_names", "model", lambda db: ([db.model("m").id],), lambda db: {db.model("m").id: "m"}),
    ("current_cost_models", "current_cost_model", lambda db: (["x86"],), lambda db: {"x86": False}),
], ids=["build-model-names", "retrain-current-cost-models"])
def test_the_build_and_retrain_flows_reads_are_retried_task_runs(flow_db: tuple[Database, Blips],
                                                                 monkeypatch: pytest.MonkeyPatch, read: str,
                                                                 method: str, arguments: Any, expected: Any) -> None:
    """The ``build`` flow names its outputs after the models, the ``retrain`` flow skips zero-shot
    builds of a class without a current cost model: both reads are task runs retried like the
    rest (run here in a flow of their own: the flows around them build and train with TVM)."""
    from prefect import flow
    from tunefleet.flows import step_flows

    db, blips = flow_db
    args = arguments(db)
    monkeypatch.setattr(Database, method, blips.once_in(getattr(Database, method)))

    @flow(name=f"read-{read}")
    def reads() -> Any:
        return getattr(step_flows, read)(*args)

    state = reads(return_state=True)
    assert state.result() == expected(db)
    assert len(blips.fired) == 1 and _run_counts(read, state) == [2]
