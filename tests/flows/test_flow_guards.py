"""Flow parameters are refused before any work, as one line naming the parameter."""

from __future__ import annotations

import pytest

from tunefleet.errors import ParameterError
from tunefleet.flows.pipeline import pipeline
from tunefleet.flows.step_flows import tune


def test_tuning_parameters_are_refused_before_any_work(flow_env) -> None:  # type: ignore[no-untyped-def]
    from tunefleet.context import shared_context

    with pytest.raises(ParameterError, match=r"^invalid lease_s: 1(\.0)? \(Input should be greater than or equal to 3\)$"):
        tune(hardware="x86", lease_s=1)
    with pytest.raises(ParameterError, match=r"^invalid trials_per_iter: 0 "):
        tune(hardware="x86", trials_per_iter=0)
    with pytest.raises(ParameterError, match=r"^invalid lease_s: 2\.5 "):
        pipeline(models=["mlp"], hardware=["x86"], lease_s=2.5)
    assert shared_context().db.models() == [], "nothing ingested"
