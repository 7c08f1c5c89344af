"""The Prefect layer: tasks stay thin (their logic runs with ``task.fn``), flows run under the harness."""

from __future__ import annotations

import pytest
from prefect.states import Completed, Failed

from tunefleet.budget import Budget
from tunefleet.errors import DatabaseUnavailableError, NotFoundError, NotSupportedError
from tunefleet.flows.pipeline import head_start, pipeline
from tunefleet.errors import ParameterError
from tunefleet.flows.step_flows import plan, tune
from tunefleet.models.frontends import ModelFormatError
from tunefleet.planning.shard_queue import LeaseLostError
from tunefleet.tasks import steps


def _count_measurements() -> int:
    from tunefleet.context import shared_context

    return shared_context().db.count_measurements()


def test_retry_condition_retries_only_transient_failures() -> None:
    transient = [DatabaseUnavailableError("db gone"), LeaseLostError("lease taken")]
    for exc in transient:
        assert steps.retry_if_transient(None, None, Failed(data=exc)) is True
    for exc in [ModelFormatError("corrupt.onnx: not ONNX"), NotFoundError("no model"), ValueError("bug")]:
        assert steps.retry_if_transient(None, None, Failed(data=exc)) is False
    assert steps.retry_if_transient(None, None, Completed(data=1)) is False


def test_tasks_are_plain_functions_over_the_core(flow_env) -> None:  # type: ignore[no-untyped-def]
    model = steps.ingest.fn("mlp")
    assert model["created"] is True and steps.ingest.fn("mlp")["model_id"] == model["model_id"]
    ext = steps.extract.fn(model["model_id"], "x86")
    assert ext["workloads"] == 3
    planned = steps.plan.fn("x86", 4, model_ids=[model["model_id"]])
    assert planned == {"hardware": "x86", "new_shards": 3, "new_trials": 12, "workloads": 3}
    assert steps.plan.fn("x86", 4, model_ids=[model["model_id"]])["new_shards"] == 0
    # a trial budget: the 12 trials planned above count against it; every workload first tops up to
    # its minimum of 8, and the rest goes to one of them (a shard each)
    by_budget = steps.plan.fn("x86", None, model_ids=[model["model_id"]], budget=Budget(trials=40))
    assert (by_budget["new_trials"], by_budget["new_shards"], by_budget["stop"]) == (40 - 12, 3, None)
    assert steps.plan.fn("x86", None, model_ids=[model["model_id"]], budget=Budget(trials=40))["stop"] == \
        "trial budget spent"


def test_transient_failure_is_retried_deterministic_one_is_not(flow_env, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from prefect import flow

    import tunefleet.models.ingest
    import tunefleet.models.workloads

    real_extract = tunefleet.models.workloads.extract
    calls = {"n": 0}

    def flaky_extract(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            raise DatabaseUnavailableError("database failed: server closed the connection unexpectedly")
        return real_extract(*args, **kwargs)

    monkeypatch.setattr(tunefleet.models.workloads, "extract", flaky_extract)

    @flow
    def extract_twice() -> dict:  # type: ignore[type-arg]
        model = steps.ingest("mlp")
        return steps.extract.with_options(retry_delay_seconds=0)(model["model_id"], "x86")

    assert extract_twice()["workloads"] == 3
    assert calls["n"] == 2

    @flow
    def ingest_corrupt(path: str) -> dict:  # type: ignore[type-arg]
        return steps.ingest.with_options(retry_delay_seconds=0)(path)

    bad = tmp_path / "corrupt.onnx"
    bad.write_bytes(b"\x00garbage" * 64)
    ingest_calls = {"n": 0}
    real_ingest = tunefleet.models.ingest.ingest

    def counting_ingest(*args, **kwargs):  # type: ignore[no-untyped-def]
        ingest_calls["n"] += 1
        return real_ingest(*args, **kwargs)

    monkeypatch.setattr(tunefleet.models.ingest, "ingest", counting_ingest)
    with pytest.raises(ModelFormatError, match="corrupt.onnx"):
        ingest_corrupt(str(bad))
    assert ingest_calls["n"] == 1  # a corrupt model is not retried


def test_flow_parameters_are_checked_before_any_work(flow_env) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(NotFoundError, match="unknown hardware class 'tpu'"):
        pipeline(models=["mlp"], hardware=["tpu"])
    with pytest.raises(ParameterError, match="models"):
        pipeline(models=[], hardware=["x86"])
    with pytest.raises(ParameterError, match="trials: 0"):
        plan(hardware=["x86"], trials=0)
    with pytest.raises(NotSupportedError, match="not supported: tuning hardware class 'arm'"):
        tune(hardware="arm")
    with pytest.raises(NotSupportedError, match="tune_on='deployments'"):
        pipeline(models=["mlp"], hardware=["x86", "arm"])
    with pytest.raises(ParameterError, match="^invalid parameters: give trials .* or budget, not both$"):
        pipeline(models=["mlp"], trials=4, budget="100")
    with pytest.raises(ParameterError, match=r"^invalid parameter budget: '15x' \(give a trial count"):
        pipeline(models=["mlp"], budget="15x")
    with pytest.raises(ParameterError, match="'100' is a number of trials; give model_ids"):
        tune(hardware="x86", budget="100")
    with pytest.raises(ParameterError, match="'15m' is a duration; a plan takes a number of trials"):
        plan(hardware=["x86"], trials=None, budget="15m")
    assert _count_measurements() == 0


@pytest.mark.slow
def test_pipeline_tunes_once_and_records_a_summary_artifact(flow_env, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    import tunefleet.models.ingest
    import tunefleet.tvm.extract

    calls = {"load_model": 0, "extract_workloads": 0}
    for module, name in [(tunefleet.models.ingest, "load_model"), (tunefleet.tvm.extract, "extract_workloads")]:
        def counting(*args, _real=getattr(module, name), _name=name, **kwargs):  # type: ignore[no-untyped-def]
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, counting)
    with head_start(["mlp"], ["x86"]):  # as `tunefleet run` calls it: the steps begun in a thread meanwhile
        first = pipeline(models=["mlp"], hardware=["x86"], trials=4, trials_per_iter=4, seed=0,
                         output_dir=str(tmp_path / "out"))
    # the extract step took the ingest step's import (or the head start's), and the build the extract
    # step's workloads: the flow run saw the head start's kept models
    assert calls == {"load_model": 0, "extract_workloads": 1}
    tuned = first["tuned"]["x86"]
    assert first["planned"][0]["new_shards"] == 3
    assert tuned["shards_done"] == 3 and tuned["shards_failed"] == 0 and tuned["measured"] >= 3
    assert (tmp_path / "out" / "mlp-x86.so").exists()
    build = first["builds"][0]
    assert build["tuned_workloads"] == 3 and build["tuned_ms"] <= build["untuned_ms"] * 1.2
    # the library is in the artifact store too (on a cluster the node's scratch space is gone after)
    from tunefleet.context import shared_context

    store = shared_context().store
    assert build["library_uri"].startswith(store.uri("builds/mlp-x86") + "/")
    assert store.get_bytes(store.key_from_uri(build["library_uri"])) == (tmp_path / "out" / "mlp-x86.so").read_bytes()
    measured = _count_measurements()
    assert measured == tuned["measured"]

    second = pipeline(models=["mlp"], hardware=["x86"], trials=4, trials_per_iter=4, seed=0, build=False)
    assert second["models"][0]["created"] is False and second["extracted"][0]["new_workloads"] == 0
    assert second["planned"][0]["new_shards"] == 0 and second["tuned"]["x86"]["shards_done"] == 0
    assert _count_measurements() == measured  # nothing tuned twice

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["pipeline-summary"])))
    assert len(arts) == 2 and arts[0].type == "table"


@pytest.mark.slow
def test_retrain_flow_ends_with_zero_shot_builds(flow_env) -> None:  # type: ignore[no-untyped-def]
    from tunefleet.context import shared_context
    from tunefleet.flows.step_flows import retrain

    pipeline(models=["mlp"], hardware=["x86"], trials=8, trials_per_iter=4, seed=0, build=False)
    first = retrain(hardware=["x86"])[0]
    assert first["version"] == 1 and first["zero_shot_builds"] == []
    db = shared_context().db
    if not first["promoted"]:  # the transfer guard refused it: an operator promotes it explicitly
        db.promote_cost_model(_model_id(db, 1))
    cnn = steps.ingest.fn("small-cnn")["model_id"]
    with pytest.raises(ParameterError, match="verify: -1"):
        retrain(hardware=["x86"], zero_shot_model_ids=[cnn], verify=-1)
    second = retrain(hardware=["x86"], zero_shot_model_ids=[cnn])[0]
    assert second["version"] == 2
    (build,) = second["zero_shot_builds"]
    assert (build["predicted_workloads"], build["tuned_workloads"], build["default_workloads"]) == (7, 0, 0)  # NHWC recipe
    assert build["tuned_ms"] is not None and build["output"] is None  # no output_dir: the store has it
    assert build["library_uri"] and build["library_uri"].endswith(".so")


def _model_id(db, version: int) -> int:  # type: ignore[no-untyped-def]
    from sqlalchemy import select

    from tunefleet.db.tables import CostModel

    with db.session() as s:
        return int(s.scalar(select(CostModel.id).where(CostModel.version == version)))
