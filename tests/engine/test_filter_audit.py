"""The filter's audit of its cost model against the measurements (pure logic; the engine test
``test_the_filter_is_on_probation_until_its_model_ranks_the_measurements`` runs it in tuning)."""

from __future__ import annotations

import numpy as np
import pytest

from tunefleet.learning.filter_audit import FilterAudit, agreement


def test_agreement_counts_pairs_ordered_right_and_ties_half() -> None:
    fast_to_slow = np.array([1.0, 2.0, 3.0, 4.0])
    assert agreement(np.array([4.0, 3.0, 2.0, 1.0]), fast_to_slow) == (1.0, 6)  # higher score = faster
    assert agreement(np.array([1.0, 2.0, 3.0, 4.0]), fast_to_slow) == (0.0, 6)
    assert agreement(np.zeros(4), fast_to_slow) == (0.5, 6)
    # one pair wrong of six
    assert agreement(np.array([4.0, 3.0, 1.0, 2.0]), fast_to_slow) == (pytest.approx(5 / 6), 6)
    # equal run times make no pair
    assert agreement(np.array([3.0, 2.0, 1.0]), np.array([1.0, 1.0, 2.0])) == (1.0, 2)
    assert agreement(np.array([1.0, 2.0]), np.array([5.0, 5.0])) == (None, 0)


def _feed(audit: FilterAudit, scores: list[float], means: list[float | None], start: int = 0) -> None:
    keys = [f"c{start + i}" for i in range(len(scores))]
    audit.kept(keys, scores)
    for key, mean in zip(keys, means, strict=True):
        audit.measured(key, mean)


def test_a_model_that_ranks_the_measurements_ends_its_probation_and_keeps_filtering() -> None:
    audit = FilterAudit(0.6)
    assert not audit.trusted, "on probation until judged: nothing is filtered"
    _feed(audit, [4.0, 3.0, 2.0], [1e-3, 2e-3, 3e-3])
    assert audit.check() is None and not audit.trusted, "3 measured: too few to judge (min_measured 4)"
    _feed(audit, [1.0], [4e-3], start=3)
    assert audit.check() is None and audit.stopped is None and audit.trusted
    assert audit.passed == "the cost model ordered 100% of 6 pairs right (>= 60%)"
    _feed(audit, [2.5, 0.5], [2.5e-3, 9e-3], start=4)
    assert audit.check() is None and audit.trusted and audit.agreement == (1.0, 15)


def test_a_model_that_does_not_rank_them_never_filters() -> None:
    audit = FilterAudit(0.6)
    _feed(audit, [1.0, 2.0, 3.0, 4.0], [1e-3, 2e-3, 3e-3, 4e-3])
    reason = audit.check()
    assert reason == "the cost model ordered 0% of 6 pairs of this workload's measured candidates right (< 60%)"
    assert audit.stopped == reason and audit.passed is None and not audit.trusted
    assert audit.check() is None, "said once"


def test_a_trusted_model_that_stops_ranking_them_stops_filtering() -> None:
    audit = FilterAudit(0.6)
    _feed(audit, [4.0, 3.0, 2.0, 1.0], [1e-3, 2e-3, 3e-3, 4e-3])
    assert audit.check() is None and audit.trusted
    # the kept candidates of the next rounds come out in the reverse order of their scores
    _feed(audit, [9.0, 8.0, 7.0, 6.0], [9e-3, 8e-3, 7e-3, 6e-3], start=4)
    reason = audit.check()
    assert reason is not None and reason.startswith("the cost model ordered 21% of 28 pairs")
    assert not audit.trusted and audit.passed is not None, "stopped for good, though it once passed"
    _feed(audit, [1.0, 2.0], [1e-3, 2e-3], start=8)
    assert audit.check() is None and not audit.trusted


def test_failed_and_unscored_candidates_are_not_judged() -> None:
    audit = FilterAudit(0.6)
    _feed(audit, [4.0, 3.0, 2.0, 1.0, 5.0], [1e-3, 2e-3, 3e-3, None, None])  # two failed
    audit.measured("never-scored", 1.0)  # e.g. the default schedule, measured unfiltered
    assert audit.agreement == (1.0, 3) and audit.check() is None  # 3 measured: below min_measured
    audit.measured("c0", 9.0)  # a key is judged once
    assert audit.agreement == (1.0, 3)


def test_zero_never_stops_and_bad_settings_are_refused() -> None:
    audit = FilterAudit(0.0)
    assert audit.trusted, "audit off: filtering from the first round"
    _feed(audit, [1.0, 2.0, 3.0, 4.0, 5.0], [1e-3, 2e-3, 3e-3, 4e-3, 5e-3])
    assert audit.check() is None and audit.trusted and audit.agreement == (0.0, 10)
    with pytest.raises(ValueError, match="min_agreement must be in"):
        FilterAudit(1.5)
    with pytest.raises(ValueError, match="min_measured must be >= 2"):
        FilterAudit(0.6, min_measured=1)


def test_the_threshold_comes_from_the_settings(tunefleet_home, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tunefleet.config import load_settings
    from tunefleet.engine.options import TuneOptions
    from tunefleet.errors import ConfigError, ParameterError

    assert TuneOptions.from_settings(load_settings()).filter_min_agreement == 0.6
    monkeypatch.setenv("TUNEFLEET_FILTER_MIN_AGREEMENT", "0.75")
    assert TuneOptions.from_settings(load_settings()).filter_min_agreement == 0.75
    monkeypatch.setenv("TUNEFLEET_FILTER_MIN_AGREEMENT", "2")
    with pytest.raises(ConfigError, match="invalid setting TUNEFLEET_FILTER_MIN_AGREEMENT: Input should be less"):
        load_settings()
    with pytest.raises(ParameterError, match="invalid filter_min_agreement: -0.1"):
        TuneOptions.validated(filter_min_agreement=-0.1)
