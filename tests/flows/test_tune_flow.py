"""The ``tune`` flow drives the engine's tuning loop under Prefect (the test harness's server): it
waits for a pending shard it cannot lease yet instead of returning, and spends a model's budget in
rounds through ``plan_round`` and ``end_rounds`` task runs. A stand-in tuner (no TVM) leases like
the real one and commits made-up candidates."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from tunefleet.flows.step_flows import tune

from tests.budget.test_rounds import Clock, FakeTuner, add_stand_in_model
from tunefleet.db import Database
from tunefleet.planning import shard_queue
from tunefleet.vocab import DONE, PENDING


@pytest.fixture
def stand_in(flow_env, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Database, int]]:  # type: ignore[no-untyped-def]
    """The shared context's database with a model of the stand-in's workloads; every ``tune_shard``
    task tunes with the stand-in tuner."""
    from tunefleet.context import Context, shared_context

    db = shared_context().db
    model_id = add_stand_in_model(db)
    tuner = FakeTuner(Clock())
    monkeypatch.setattr(Context, "tuner", lambda self, hardware: tuner)
    yield db, model_id


def test_the_tune_flow_waits_for_a_pending_shard_another_worker_holds_up(stand_in: tuple[Database, int]) -> None:
    """The last shard's workload is being searched by another live worker: the flow waits for that
    worker to finish and then tunes it (it used to return at once, leaving the shard behind)."""
    db, _ = stand_in
    big = db.workload("big")
    hw = db.hardware_class("x86")
    theirs, ours = db.add_shards(hw.id, [(big.id, 4, 2.0), (big.id, 4, 1.0)])
    leased = shard_queue.lease(db, "x86", "other-worker")  # a live lease: it does not expire meanwhile
    assert leased is not None and leased.id == theirs.id
    url = shared_url()

    def other_worker_finishes() -> None:
        time.sleep(2.5)
        other = Database(url)
        try:
            shard_queue.complete(other, theirs.id, "other-worker", generation=leased.lease_generation)
        finally:
            other.close()

    worker = threading.Thread(target=other_worker_finishes)
    started = time.monotonic()
    worker.start()
    try:
        summary = tune(hardware="x86")
    finally:
        worker.join(timeout=30)
    assert summary["shards_done"] == 1 and [s["shard_id"] for s in summary["shards"]] == [ours.id]
    assert db.shard(ours.id).state == DONE and db.shard(theirs.id).state == DONE
    assert not db.pending_shards(hw.id) and summary["stopped"] is None
    assert time.monotonic() - started >= 2.5  # it waited for the other worker


def test_the_tune_flow_spends_a_trial_budget_in_rounds_of_task_runs(stand_in: tuple[Database, int]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    db, model = stand_in
    state = tune(hardware="x86", budget="40", model_ids=[model], trials_per_iter=8, return_state=True)
    summary = state.result()
    assert (summary["measured"], summary["stopped"]) == (40, "trial budget spent")
    budget = summary["budget"]
    assert (budget["budget"], budget["kind"], budget["trials"], budget["stopped"]) == ("40", "trials", 40,
                                                                                       "trial budget spent")
    assert budget["rounds"] >= 2 and summary["shards_done"] == len(summary["shards"])
    assert set(summary) >= {"hardware", "shards_done", "shards_failed", "measured", "errors", "skipped_known",
                            "seconds", "shards", "stopped", "budget", "seconds_per_candidate"}
    assert not db.pending_shards(db.hardware_class("x86").id)
    # Prefect 3 records task runs from events, which reach the API a moment after the flow returns.
    deadline = time.monotonic() + 30
    while True:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(
                id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
        names = [r.name.rsplit("-", 1)[0] for r in runs]
        if "end_rounds" in names or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert names.count("tune_shard") == summary["shards_done"] + names.count("plan_round")  # one empty lease a round
    assert names.count("plan_round") == budget["rounds"] + 1 and names.count("end_rounds") == 1  # the last planned none
    assert PENDING not in {s.state for s in db.shards()}


def shared_url() -> str:
    from tunefleet.context import shared_context

    return shared_context().settings.effective_database_url
