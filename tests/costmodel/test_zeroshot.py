"""Export → retrain → promote → zero-shot build on tiny models, with real tuning, on SQLite and PostgreSQL.

Predictions are stored apart from measurements and never come back where measurements are asked
for; ``verify`` measures exactly the top K; a promoted model warm-starts new shards.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from tests.conftest import on_backend
from tunefleet.budget import Budget
from tunefleet.vocab import DEFAULT_TRACE_SHA256
from tunefleet.learning import costmodel
from tunefleet.learning import dataset
from tunefleet.planning import shard_queue
from tunefleet.delivery.best import best
from tunefleet.delivery.build import build_model
from tunefleet.errors import NotFoundError, NotSupportedError
from tunefleet.models.ingest import ingest
from tunefleet.engine.learned import _normalised
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.worker import Tuner, drain
from tunefleet.models.workloads import extract
from tunefleet.delivery.zeroshot import borrowed_schedules, predict_workloads

pytestmark = pytest.mark.slow


def _train_current(db, store) -> costmodel.RetrainResult:  # type: ignore[no-untyped-def]
    """Tune mlp a little, export, retrain; make the new model current even if the guard refused it."""
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    shard_queue.plan(db, "x86", target_trials=10, model=model.id)
    assert drain(db, "x86", TuneOptions(seed=0, trials_per_iter=5)).shards_failed == 0
    assert dataset.export(db, store) is not None
    result = costmodel.retrain(db, store, "x86", holdout_fraction=0.34, num_boost_round=20)
    beats_random = result.metrics["heldout"]["pairwise_accuracy"] > max(
        b["pairwise_accuracy"] for b in result.metrics["baselines"].values())
    assert result.promoted is beats_random  # the transfer guard decides, not the test
    if not result.promoted:
        db.promote_cost_model(result.cost_model_id)  # an operator's explicit override
    return result


def _prediction_count(db) -> int:  # type: ignore[no-untyped-def]
    from sqlalchemy import func, select

    from tunefleet.db.tables import Prediction

    with db.session() as s:
        return int(s.scalar(select(func.count(Prediction.id))) or 0)


@on_backend("sqlite")
def test_zero_shot_build_predictions_never_measured(engine, tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings, db, store = engine
    hw = db.hardware_class("x86")
    cnn = ingest(db, store, "small-cnn").model
    with pytest.raises(NotSupportedError, match="without a current cost model.*costmodel retrain"):
        build_model(db, store, cnn, "x86", zero_shot=True, compare_torch=False, pretrained=False)

    trained = _train_current(db, store)
    measured_before = db.count_measurements(hardware_class_id=hw.id)
    # a wall-time budget counts the proposals' searches too: two searches take more than 50 ms, so
    # nothing is left to verify (the build below finds their proposals stored)
    extract(db, store, cnn, "x86")
    searched = predict_workloads(db, store, "x86", [wl.id for wl, _ in db.workloads(cnn.id)][:2],
                                 verify=Budget(seconds=0.05))
    assert [w.status for w in searched.workloads] == ["predicted", "predicted"]
    assert searched.verify_candidates == 0 and searched.search_seconds >= 0.05
    report = build_model(db, store, cnn, "x86", zero_shot=True, compare_torch=False, output=tmp_path / "cnn.so")
    # small-cnn was never measured: every workload is built from a prediction, none from the default
    # small-cnn under the CPU recipe (NHWC: its boundary transposes included): 7 workloads, all predicted
    assert (report.workloads, report.tuned_workloads, report.predicted_workloads, report.default_workloads) == (7, 0, 7, 0)
    assert report.database_hits == 7
    assert report.tuned_ms is not None and report.max_abs_diff is not None  # outputs checked against untuned
    assert report.zero_shot_s_per_task is not None and report.zero_shot_s_per_task > 0
    assert db.count_measurements(hardware_class_id=hw.id) == measured_before  # nothing measured
    n_predictions = _prediction_count(db)
    assert n_predictions >= 7

    import tvm

    from tunefleet.tvm.bridge import FleetDatabase

    plain = FleetDatabase(db, "x86")
    for wl, _ in db.workloads(cnn.id):
        preds = db.best_predictions(wl.id, hw.id, 5)
        assert preds and all(p.cost_model_id == trained.cost_model_id for p in preds)
        assert db.best_measurements(wl.id, hw.id) == []
        with pytest.raises(NotFoundError, match="no measurement"):
            best(db, wl.structural_hash, "x86")
        workload = plain.commit_workload(tvm.ir.load_json(wl.tir_json))
        assert plain.get_top_k(workload, 5) == []  # the MetaSchedule database users get: measurements only
        predicted = FleetDatabase(db, "x86", with_predictions=True).get_top_k(workload, 1)
        assert len(predicted) == 1 and predicted[0].run_secs is None  # marked: no run times
    assert dataset.export(db, store) is None  # predictions are not measurements: nothing to export

    # again: idempotent, the same model does not search or store anything new
    again = predict_workloads(db, store, "x86", [wl.id for wl, _ in db.workloads(cnn.id)])
    assert {w.status for w in again.workloads} == {"cached"}
    assert _prediction_count(db) == n_predictions

    # a budget of 5 candidates over two workloads: both default schedules, then the first workload's
    # first batch (what it borrows, then its proposals) cut to the 3 left, nothing more of the
    # second (its default only: not "verified"); measured outside any shard. A proposal that is the
    # default schedule (a small space can propose it), or one twice in the batch, is skipped before
    # the cut: uncounted, the next one in the workload's queue takes its place. A workload of an
    # operator mlp has at another shape borrows mlp's schedules first.
    from tunefleet.tvm.traces import candidate, trace_sha256_of

    chosen = [wl for wl, _ in db.workloads(cnn.id)][:2]
    lent = {wl.id: [trace_sha256_of(candidate(tvm.ir.load_json(wl.tir_json), t).sch)
                    for t in borrowed_schedules(db, wl, hw)] for wl in chosen}
    verified = predict_workloads(db, store, "x86", [wl.id for wl in chosen], verify=5)
    assert [(w.status, w.verified) for w in verified.workloads] == [("verified", 4), ("cached", 1)]
    assert (verified.verify_budget, verified.verify_candidates) == ("5", 5) and verified.verify_seconds > 0
    for wl, n, item in zip(chosen, (3, 0), verified.workloads):
        rows = [m for m in db.measurements(hardware_class_id=hw.id) if m.workload_id == wl.id]
        assert len(rows) == n + 1 and all(r.shard_id is None for r in rows)
        proposed = [p.trace_sha256 for p in db.best_predictions(wl.id, hw.id, 5)
                    if p.trace_sha256 != DEFAULT_TRACE_SHA256]
        expected = [t for t in dict.fromkeys(lent[wl.id] + proposed) if t != DEFAULT_TRACE_SHA256][:n]
        assert {r.trace_sha256 for r in rows} == {DEFAULT_TRACE_SHA256, *expected}
        assert item.borrowed == len(lent[wl.id][:n])
    assert predict_workloads(db, store, "x86", [chosen[0].id]).workloads[0].status == "measured"

    # measure_traces skips what is measured or given twice before it applies its limit: p0 measured,
    # then of [p0, p1, p1, p2, p3] a limit of 2 measures p1 and p2
    from tunefleet.engine.learned import measure_traces
    from tunefleet.engine.worker import Tuner as MeasuringTuner

    def fresh(wl):  # type: ignore[no-untyped-def]
        return list({p.trace_sha256: p for p in db.best_predictions(wl.id, hw.id, 5)
                     if p.trace_sha256 != DEFAULT_TRACE_SHA256}.values())

    second = next(wl for wl, _ in db.workloads(cnn.id)[4:] if len(fresh(wl)) >= 4)  # [2:4] are timed below
    p0, p1, p2, p3 = fresh(second)[:4]
    sent: list[int] = []
    measuring = MeasuringTuner(db, "x86")
    try:
        assert measure_traces(db, second, hw, [(p0.trace_json, p0.args_info)], builder=measuring.builder,
                              runner=measuring.runner) == 1
        n = measure_traces(db, second, hw, [(p.trace_json, p.args_info) for p in (p0, p1, p1, p2, p3)],
                           builder=measuring.builder, runner=measuring.runner, sent=sent, limit=2)
    finally:
        measuring.close()
    assert (n, sent) == (2, [1, 3])
    assert db.measured_trace_hashes(second.id, hw.id) == {p0.trace_sha256, p1.trace_sha256, p2.trace_sha256}

    # a wall-time budget is checked before each batch: 100 ms (their proposals are stored: no
    # search) let the first (a default schedule, which takes longer) start, no second
    others = [wl for wl, _ in db.workloads(cnn.id)][2:4]
    timed = predict_workloads(db, store, "x86", [wl.id for wl in others], verify=Budget(seconds=0.1))
    assert (timed.verify_budget, timed.verify_candidates) == ("0.1s", 1)
    assert [w.verified for w in timed.workloads] == [1, 0]


@on_backend("postgresql")
def test_warm_start_uses_current_model(engine, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    settings, db, store = engine
    trained = _train_current(db, store)
    tuner = Tuner(db, "x86", store=store)
    try:
        loaded = tuner.cost_model(db)
        assert loaded is not None and loaded.cost_model_id == trained.cost_model_id
        assert Tuner(db, "x86", TuneOptions(warm_start=False), store=store).cost_model(db) is None
        shard_queue.plan(db, "x86", target_trials=16)  # top up: new shards
        with caplog.at_level(logging.INFO, logger="tunefleet.engine"):
            result = tuner.tune_next(db, "warm-test", TuneOptions(trials_per_iter=3, seed=0))
        assert result is not None and result.state == "done" and result.measured > 0
        assert f"warm-starts with cost model v{trained.version}" in caplog.text
    finally:
        tuner.close()

    # an unreadable current model: logged, and shards tune without it
    store.put_bytes(store.key_from_uri(trained.artifact_uri), b"not a model")
    broken = Tuner(db, "x86", store=store)
    with caplog.at_level(logging.WARNING, logger="tunefleet.engine"):
        assert broken.cost_model(db) is None
    assert "cannot be loaded, tuning without it" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tunefleet.engine"):
        assert broken.cost_model(db) is None
    assert "cannot be loaded" not in caplog.text, "said once per model, not for every shard"
    broken.close()


def test_scores_are_non_negative_and_scaled() -> None:
    out = _normalised(np.array([-3.0, 1.0, 5.0, np.nan]))
    assert out.min() == 0.0 and out.max() == 1.0 and np.isfinite(out).all()
    assert (_normalised(np.array([2.0, 2.0])) == 0.5).all()  # no information: all equal


@on_backend("postgresql")
def test_zero_shot_verification_borrows_other_shapes_of_a_compatible_class(engine) -> None:  # type: ignore[no-untyped-def]
    """mlp's two matmul_add_relu layers are one operator at two shapes: the first tuned a little on
    x86-avx2 only; zero-shot on x86 verifies the second with the avx2 schedules, fitted to its
    shape, after its default schedule and before any proposal (the shipped cost model proposes)."""
    import tvm

    from tests.engine.test_warm_shapes import fc1_tuned_on_avx2_only
    from tunefleet.planning.warm_shapes import shape_seeds
    from tunefleet.tvm.traces import candidate, trace_sha256_of

    _, db, store = engine
    x86, avx2, (other, first, second) = fc1_tuned_on_avx2_only(db, store)

    assert shape_seeds(db, second, x86).traces == []  # nothing of its kind measured on x86 itself
    lent = borrowed_schedules(db, second, x86)
    assert 1 <= len(lent) <= 3 and lent == shape_seeds(db, second, x86, source=avx2, limit=3).traces
    assert borrowed_schedules(db, other, x86) == []  # matmul_add: other fused ops, measured nowhere
    assert borrowed_schedules(db, first, avx2) == []  # measured there: nothing to borrow

    result = predict_workloads(db, store, "x86", [second.id], verify=1 + len(lent))
    (item,) = result.workloads
    assert (item.status, item.verified, item.borrowed) == ("verified", 1 + len(lent), len(lent))
    mod = tvm.ir.load_json(second.tir_json)
    rows = [m for m in db.measurements(hardware_class_id=x86.id) if m.workload_id == second.id]
    assert {r.trace_sha256 for r in rows} == {DEFAULT_TRACE_SHA256} | {trace_sha256_of(candidate(mod, t).sch)
                                                                      for t in lent}
    assert all(r.error_kind is None for r in rows), "the fitted schedules build and run here"


@on_backend("sqlite")
def test_zero_shot_verification_refines_with_the_budget_left(engine) -> None:  # type: ignore[no-untyped-def]
    """Once every default, borrowed and proposed schedule is measured, what is left of the budget
    refines: a search from the best measured schedules, whose new schedules are measured, the
    workload that costs the model most (best measured time x calls) first (the shipped model)."""
    from tunefleet.delivery import zeroshot

    _, db, store = engine
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    hw = db.hardware_class("x86")
    _, first, second = sorted((wl for wl, _ in db.workloads(model.id)), key=lambda wl: wl.flops)
    # nothing of mlp is measured anywhere: nothing to borrow; each queue is its default + 1 proposal
    assert borrowed_schedules(db, first, hw) == [] == borrowed_schedules(db, second, hw)
    calls = {first.id: 1_000_000, second.id: 1}  # the lighter workload, called a million times, costs more
    result = predict_workloads(db, store, "x86", [second.id, first.id], top_k=1,
                               verify=4 + zeroshot.REFINED + 1, weights=calls)
    heavy, light = result.workloads
    assert (heavy.workload, light.workload) == (second.structural_hash, first.structural_hash)
    # a queue: the default, and the proposal unless it is the default schedule itself
    queued = {wl.id: 1 + sum(p.trace_sha256 != DEFAULT_TRACE_SHA256 for p in db.best_predictions(wl.id, hw.id, 1))
              for wl in (first, second)}
    assert result.verify_candidates == 4 + zeroshot.REFINED + 1
    assert (light.verified, light.refined) == (queued[first.id] + zeroshot.REFINED, zeroshot.REFINED)  # refined first
    left = 4 + zeroshot.REFINED + 1 - sum(queued.values()) - zeroshot.REFINED  # the rest: the other one
    assert (heavy.verified, heavy.refined) == (queued[second.id] + left, left) and left >= 1
    assert light.borrowed == heavy.borrowed == 0
    for wl, item in ((first, light), (second, heavy)):
        rows = [m for m in db.measurements(hardware_class_id=hw.id) if m.workload_id == wl.id]
        hashes = [r.trace_sha256 for r in rows]
        assert len(hashes) == len(set(hashes)) == item.verified  # every schedule measured once
        proposed = {p.trace_sha256 for p in db.best_predictions(wl.id, hw.id, 5)}
        assert len(set(hashes) - proposed - {DEFAULT_TRACE_SHA256}) == item.refined  # new: not the proposals
