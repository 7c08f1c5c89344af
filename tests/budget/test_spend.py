"""A request's budget checked once (:class:`tunefleet.planning.spend.Spend`): every parameter error
in its caller's words, and the rounds, deadline and per-class share it leads to (no database)."""

from __future__ import annotations

import pytest

from tunefleet.budget import Budget
from tunefleet.errors import ParameterError
from tunefleet.planning.spend import PLAN, RUN, TUNE, Spend

FLAG, PARAMETER = "--budget", "parameter budget"


@pytest.mark.parametrize(("caller", "kwargs", "says"), [
    (RUN, {"budget": "100", "trials": 4, "name": PARAMETER},
     "invalid parameters: give trials (a target per workload) or budget, not both"),
    (RUN, {"budget": "15x", "name": PARAMETER},
     "invalid parameter budget: '15x' (give a trial count such as 2000, or a wall time such as 90s, 15m, 1h or 1h30m)"),
    (RUN, {"budget": "15x", "name": FLAG}, "invalid --budget: '15x' (give a trial count"),
    (RUN, {"default": "soon", "name": FLAG}, "invalid TUNEFLEET_BUDGET: 'soon' (give a trial count"),
    (PLAN, {"name": PARAMETER, "trials": None}, "invalid parameters: give trials (a target per workload) or budget"),
    (PLAN, {"budget": "15m", "name": PARAMETER},
     ("invalid parameter budget: '15m' is a duration; a plan takes a number of trials (a duration is spent by the "
      "tune or pipeline flow)")),
    (PLAN, {"budget": "15m", "name": FLAG},
     ("invalid --budget: '15m' is a duration; a plan takes a number of trials (e.g. 2000) — a duration is spent by "
      "`tunefleet run --budget` or `tunefleet tune --budget`")),
    (TUNE, {"budget": "100", "name": PARAMETER},
     ("invalid parameter budget: '100' is a number of trials; give model_ids to spend it on, or a duration to stop "
      "tuning at")),
    (TUNE, {"budget": "200", "name": FLAG},
     ("invalid --budget: '200' is a number of trials; give --model to spend it on, or a duration (e.g. 15m) to stop "
      "tuning at")),
    (TUNE, {"model_ids": [1], "name": FLAG}, "--model needs --budget (tune drains the whole queue of the class otherwise)"),
    (TUNE, {"model_ids": [1], "name": PARAMETER}, "invalid parameters: model_ids needs budget"),
])
def test_a_bad_request_is_one_line_in_its_callers_words(caller: str, kwargs: dict, says: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(ParameterError) as info:
        Spend.request(caller, **kwargs)  # type: ignore[arg-type]
    assert str(info.value).startswith(says) and "\n" not in str(info.value)


def test_what_passes_is_typed() -> None:
    run = Spend.request(RUN, None, started_at=10.0, name=FLAG, default="15m")  # the setting's default
    assert (run.budget, run.trials, run.started_at, run.ends_at) == (Budget(seconds=900), None, 10.0, 910.0)
    flat = Spend.request(RUN, None, trials=8, name=FLAG, default="15m")
    assert (flat.budget, flat.trials, flat.ends_at) == (None, 8, None)
    plan = Spend.request(PLAN, " 2000 ", model_ids=[3], name=PARAMETER)
    assert (plan.budget, plan.trials, plan.model_ids) == (Budget(trials=2000), None, (3,))
    assert Spend.request(TUNE, None, name=PARAMETER).tuning("x86") == (None, None)  # drain the queue


def test_a_tune_gets_rounds_for_models_and_a_bare_deadline_for_a_wall_time_alone() -> None:
    rounds, deadline = Spend.request(TUNE, "90s", model_ids=[1, 2], started_at=100.0).tuning(
        "x86", batch=16, energy_aware=True, reserve_builds=1)
    assert rounds is not None and deadline is rounds.deadline and deadline is not None and deadline.at == 190.0
    assert (rounds.hardware, rounds.model_ids, rounds.batch, rounds.energy_aware, rounds.reserve_builds) == (
        "x86", [1, 2], 16, True, 1)
    trials, none = Spend.request(TUNE, "40", model_ids=[1], started_at=100.0).tuning("x86")
    assert trials is not None and trials.budget == Budget(trials=40) and none is None and trials.deadline is None
    bare_rounds, bare = Spend.request(TUNE, "1m", started_at=100.0).tuning("x86")
    assert bare_rounds is None and bare is not None and bare.at == 160.0


def test_classes_tuned_one_after_another_share_the_wall_time_left() -> None:
    spend = Spend.request(RUN, "10m", started_at=1_000.0)
    first = spend.share_for(0, 3, now=1_060.0)  # 540 s left for 3 classes
    assert (first.budget, first.started_at) == (Budget(seconds=180), 1_060.0)
    last = spend.share_for(2, 3, now=1_500.0)  # 100 s left for the last one
    assert last.budget == Budget(seconds=100)
    assert spend.share_for(2, 3, now=2_000.0).budget == Budget(seconds=1)  # late: a second, not nothing
    assert spend.share_for(0, 1) is spend  # a lone class: the whole budget, from the run's start
    trials = Spend.request(RUN, "500", started_at=1_000.0)
    assert trials.share_for(1, 2) is trials  # a number of trials is per class
