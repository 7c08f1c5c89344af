"""A flow's result survives the API's copy of its final state (what ``state.result()`` falls back to
when the API answered the engine's final proposal with a state of its own)."""

from __future__ import annotations

import pytest


def test_a_flow_s_result_can_be_read_from_the_state_the_api_holds(flow_env: None) -> None:
    from prefect import flow
    from prefect.client.orchestration import get_client

    @flow(name="result-from-the-api")
    def answer() -> dict[str, int]:
        return {"shards_done": 3}

    state = answer(return_state=True)
    with get_client(sync_client=True) as client:
        stored = client.read_flow_run(state.state_details.flow_run_id).state
    assert stored is not None and stored.is_completed()
    assert stored.result() == {"shards_done": 3}


def test_without_persisted_results_the_api_s_state_has_no_result(flow_env: None) -> None:
    """The failure the harness's persistence avoids (CI met it once, in a retried flow run)."""
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.exceptions import MissingResult

    @flow(name="result-not-persisted", persist_result=False)
    def answer() -> dict[str, int]:
        return {"shards_done": 3}

    state = answer(return_state=True)
    with get_client(sync_client=True) as client:
        stored = client.read_flow_run(state.state_details.flow_run_id).state
    with pytest.raises(MissingResult):
        stored.result()
