"""FleetCostModel's blended score: the fleet model and the online XGBModel on one feature extraction."""

from __future__ import annotations

from typing import Any

import numpy as np
from tvm.s_tir import meta_schedule as ms

from tests.tvm.conftest import matmul_mod
from tunefleet.engine.learned import FleetCostModel, _normalised, _same_features
from tunefleet.engine.shard import new_online_model
from tunefleet.testing.models import arbitrary_trained_model


def _matmul_context(cpu_target: Any, n: int = 64) -> Any:
    from tunefleet.tvm.builder import import_tensor_intrinsics

    import_tensor_intrinsics()
    return ms.TuneContext(matmul_mod(n), target=cpu_target,
                          space_generator="post-order-apply", search_strategy="replay-trace", task_name="mm",
                          rand_state=0, num_threads=2)


def _candidates(ctx: Any, n: int) -> list[Any]:
    ctx.pre_tuning(max_trials=n, num_trials_per_iter=n, design_spaces=ctx.generate_design_space(),
                   database=ms.database.MemoryDatabase(), cost_model=None)
    try:
        return list(ctx.generate_measure_candidates())
    finally:
        ctx.post_tuning()


def test_blended_score_extracts_features_once_and_equals_the_two_models(cpu_target: Any) -> None:
    ctx = _matmul_context(cpu_target)
    cands = _candidates(ctx, 128)
    assert len(cands) >= 110
    online = new_online_model(2)
    rng = np.random.default_rng(1)
    online.update(ctx, cands[:105], [ms.runner.RunnerResult([float(s)], None) for s in rng.uniform(1e-5, 1e-3, 105)])
    assert online.data_size >= online.num_warmup_samples and online.booster is not None  # past its warm-up
    fleet = FleetCostModel(arbitrary_trained_model(2), online=online)
    assert _same_features(online, fleet.extractor)  # the single-extraction path is the one taken
    want = 0.5 * _normalised(fleet.prior(ctx, cands)) + 0.5 * _normalised(online.predict(ctx, cands))
    got = fleet.predict(ctx, cands)
    assert got.shape == (len(cands),) and np.allclose(got, want)

    # An online model with another extractor is asked for its own scores (its own features).
    other = ms.cost_model.XGBModel(
        extractor=ms.feature_extractor.PerStoreFeature(buffers_per_store=3), num_tuning_cores=2)
    assert not _same_features(other, fleet.extractor)
    assert not _same_features(object(), fleet.extractor)


def test_before_the_online_warm_up_the_fleet_model_alone_scores(cpu_target: Any) -> None:
    ctx = _matmul_context(cpu_target)
    cands = _candidates(ctx, 24)
    online = new_online_model(2)
    online.update(ctx, cands, [ms.runner.RunnerResult([1e-4 * (i + 1)], None) for i in range(len(cands))])
    fleet = FleetCostModel(arbitrary_trained_model(3), online=online)
    got = fleet.predict(ctx, cands)
    # 24 samples < the 100 of the warm-up: the online model's (random) scores are not blended in
    assert np.allclose(got, _normalised(fleet.prior(ctx, cands)))


def _results_ranked(prior: np.ndarray, *, agree: bool) -> list[Any]:
    """Run times that order the candidates exactly as ``prior`` does (higher score faster), or reversed
    (a decreasing function of the score, so rounds agree with each other too)."""
    sign = 1.0 if agree else -1.0
    return [ms.runner.RunnerResult([1e-5 * (1.0 + 1.0 / (1.0 + np.exp(sign * float(x))))], None) for x in prior]


def test_the_warm_start_is_dropped_once_the_fleet_model_misranks_the_measurements(cpu_target: Any, caplog) -> None:  # type: ignore[no-untyped-def]
    import logging

    from tunefleet.learning.filter_audit import FilterAudit

    ctx = _matmul_context(cpu_target)
    cands = _candidates(ctx, 128)
    online = new_online_model(2)
    rng = np.random.default_rng(2)
    online.update(ctx, cands[:105], [ms.runner.RunnerResult([float(s)], None) for s in rng.uniform(1e-5, 1e-3, 105)])
    rounds = [cands[105:113], cands[113:121]]

    # a model whose scores order the measured run times right keeps guiding the search
    trusted = FleetCostModel(arbitrary_trained_model(2), online=online, audit=FilterAudit(0.6))
    for rnd in rounds:
        trusted.update(ctx, rnd, _results_ranked(trusted.prior(ctx, rnd), agree=True))
    assert trusted.dropped is None
    assert np.allclose(trusted.predict(ctx, cands[:20]),
                       0.5 * _normalised(trusted.prior(ctx, cands[:20]))
                       + 0.5 * _normalised(online.predict(ctx, cands[:20])))

    # one that orders them backwards is dropped after the round that shows it: the online model alone scores
    wrong = FleetCostModel(arbitrary_trained_model(2), online=online, audit=FilterAudit(0.6))
    with caplog.at_level(logging.INFO, logger="tunefleet.engine"):
        wrong.update(ctx, rounds[0], _results_ranked(wrong.prior(ctx, rounds[0]), agree=False))
    assert wrong.dropped is not None and wrong.dropped.startswith("the cost model ordered 0% of")
    assert "warm start ends for mm" in caplog.text
    assert np.allclose(wrong.predict(ctx, cands[:20]), online.predict(ctx, cands[:20]))

    # failed candidates are not judged; threshold 0 (or no online model: zero-shot) never drops it
    failed = FleetCostModel(arbitrary_trained_model(2), online=online, audit=FilterAudit(0.6))
    failed.update(ctx, rounds[0], [ms.runner.RunnerResult(None, "build error")] * len(rounds[0]))
    assert failed.dropped is None
    never = FleetCostModel(arbitrary_trained_model(2), online=online, audit=FilterAudit(0.0))
    never.update(ctx, rounds[0], _results_ranked(never.prior(ctx, rounds[0]), agree=False))
    assert never.dropped is None
    assert FleetCostModel(arbitrary_trained_model(2), audit=FilterAudit(0.6)).audit is None


def test_the_warm_start_is_judged_on_the_workloads_committed_measurements_first(cpu_target: Any) -> None:
    from tunefleet.learning.filter_audit import FilterAudit

    ctx = _matmul_context(cpu_target)
    past = _candidates(ctx, 12)
    online = new_online_model(2)

    def means(model: FleetCostModel, *, agree: bool) -> list[float]:
        return [float(r.run_secs[0]) for r in _results_ranked(model.prior(ctx, past), agree=agree)]

    # a resumed shard (or a workload measured here before) judges the model before its first round
    wrong = FleetCostModel(arbitrary_trained_model(2), online=online, audit=FilterAudit(0.6))
    wrong.judge_past(ctx, past, means(wrong, agree=False))
    assert wrong.dropped is not None and wrong.dropped.startswith("the cost model ordered 0% of")
    right = FleetCostModel(arbitrary_trained_model(2), online=online, audit=FilterAudit(0.6))
    right.judge_past(ctx, past, means(right, agree=True))
    assert right.dropped is None
    # one past measurement makes no pair: nothing is judged
    one = FleetCostModel(arbitrary_trained_model(2), online=online, audit=FilterAudit(0.6))
    one.judge_past(ctx, past[:1], means(one, agree=False)[:1])
    assert one.dropped is None and not one.audit.agreement[1]


class _CountingExtractor:
    """A PerStoreFeature that counts the candidates it extracted."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.extracted = inner, 0

    def extract_from(self, context: Any, candidates: list[Any]) -> Any:
        self.extracted += len(candidates)
        return self.inner.extract_from(context, candidates)


def test_a_schedule_scored_before_is_not_extracted_again(cpu_target: Any, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import tvm_ffi

    from tunefleet.engine import learned

    ctx = _matmul_context(cpu_target)
    cands = _candidates(ctx, 32)
    distinct = len({tvm_ffi.structural_hash(c.sch.mod) for c in cands})
    assert distinct >= 20
    want = FleetCostModel(arbitrary_trained_model(2)).prior(ctx, cands)  # a model of its own: no cache shared

    fleet = FleetCostModel(arbitrary_trained_model(2))
    counting = fleet.extractor = _CountingExtractor(fleet.extractor)
    # a generation carries schedules over: the same module twice in one call is extracted once
    first = fleet.prior(ctx, cands + cands[:5])
    assert counting.extracted == distinct
    assert np.array_equal(first[:32], want) and np.array_equal(first[32:], want[:5])
    # the next generation (or round) scores them again from the kept matrices, in any order
    assert np.array_equal(fleet.predict(ctx, cands[::-1]), _normalised(want[::-1]))
    assert counting.extracted == distinct
    assert (fleet.feature_misses, fleet.feature_hits) == (distinct, 2 * len(cands) + 5 - distinct)

    # the kept matrices are bounded: the least recently scored go first
    monkeypatch.setattr(learned, "FEATURE_CACHE_SIZE", 4)
    small = FleetCostModel(arbitrary_trained_model(2))
    counting = small.extractor = _CountingExtractor(small.extractor)
    assert np.array_equal(small.prior(ctx, cands), want)  # a call larger than the bound is still whole
    assert len(small._features_of) == 4 and counting.extracted == distinct
    kept = [c for c in cands if tvm_ffi.structural_hash(c.sch.mod) in small._features_of]
    gone = [c for c in cands if tvm_ffi.structural_hash(c.sch.mod) not in small._features_of]
    small.prior(ctx, kept[:1])
    assert counting.extracted == distinct  # among the last four: kept
    small.prior(ctx, gone[:1])
    assert counting.extracted == distinct + 1  # evicted: extracted again
