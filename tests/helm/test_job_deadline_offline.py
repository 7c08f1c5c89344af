"""The chart's flow-run Jobs carry a deadline (issue 34, item 3): Kubernetes ends a flow run that
hangs instead of letting it hold its node forever. Rendered and validated offline, like the rest
of tests/helm."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from tests.helm.offline import (
    VALUE_SETS,
    flow_run_jobs,
    objects,
    pools_spec,
    render,
    validate_strict,
)
from tunefleet.cluster import job_templates

NAMESPACE = "tuning"


@functools.cache
def jobs(set_name: str) -> dict[str, dict[str, Any]]:
    return flow_run_jobs(pools_spec(objects(render(VALUE_SETS[set_name], namespace=NAMESPACE))), NAMESPACE)


@pytest.mark.parametrize("set_name", sorted(VALUE_SETS))
def test_every_pools_flow_run_job_has_a_deadline_offline(set_name: str) -> None:
    rendered = jobs(set_name)
    assert rendered
    for hw, job in rendered.items():
        assert job["spec"]["activeDeadlineSeconds"] == job_templates.DEFAULT_ACTIVE_DEADLINE_S, hw
        validate_strict([job])


@pytest.mark.parametrize(("deadline", "expected"), [(7200, 7200), (None, None)], ids=["2h", "lifted"])
def test_the_charts_job_deadline_value_reaches_every_pool_offline(deadline: int | None, expected: int | None) -> None:
    from tests.helm.offline import REQUIRED, merge

    rendered = flow_run_jobs(pools_spec(objects(render(merge(REQUIRED, {"jobs": {"activeDeadlineSeconds": deadline}}),
                                                       namespace=NAMESPACE))), NAMESPACE)
    assert rendered
    for hw, job in rendered.items():
        assert job["spec"].get("activeDeadlineSeconds") == expected, hw
        validate_strict([job])


def test_the_chart_keeps_the_default_statement_timeout_offline() -> None:
    from tests.helm.offline import REQUIRED
    from tunefleet.config import DEFAULT_DB_STATEMENT_TIMEOUT_S

    (config,) = [o for o in objects(render(REQUIRED, namespace=NAMESPACE))
                 if o["kind"] == "ConfigMap" and "TUNEFLEET_DB_STATEMENT_TIMEOUT_S" in o.get("data", {})]
    assert float(config["data"]["TUNEFLEET_DB_STATEMENT_TIMEOUT_S"]) == DEFAULT_DB_STATEMENT_TIMEOUT_S > 0
