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
