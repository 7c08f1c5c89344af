"""The budget and its allocator, as pure functions (no TVM, no database)."""

from __future__ import annotations

import math

import pytest

from tunefleet.budget import Budget, format_duration
from tunefleet.errors import ParameterError
from tunefleet.planning.allocation import RUNNER_CALL_S, WorkloadHistory, allocate, build_reserve_s
from tunefleet.vocab import CONFIRM_ROUNDS, UNTUNED_TIMING_S


# -- the budget ---------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "trials", "seconds"), [
    ("2000", 2000, None), (2000, 2000, None), ("15m", None, 900.0), ("90s", None, 90.0), ("1h", None, 3600.0),
    ("1h30m", None, 5400.0), (" 1H 30M ", None, 5400.0), ("2.5s", None, 2.5), ("1m30s", None, 90.0),
])
def test_a_budget_is_trials_or_a_wall_time(text: str | int, trials: int | None, seconds: float | None) -> None:
    budget = Budget.parse(text)
    assert (budget.trials, budget.seconds) == (trials, seconds)
    assert Budget.parse(str(budget)) == budget  # its text reads back
    assert Budget.parse(budget) is budget


@pytest.mark.parametrize("text", ["", "0", "-5", "15x", "m", "1.5h", "15 minutes", "2000 trials", "0m", "h30", True])
def test_bad_budget_text_is_one_line_naming_it(text: object) -> None:
    with pytest.raises(ParameterError) as info:
        Budget.parse(text, name="--budget")  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith(f"invalid --budget: {text!r} (") and "\n" not in message
    assert "15m" in message and "2000" in message  # says what would do


@pytest.mark.parametrize(("text", "says"), [
    ("1000000001", "at most 1,000,000,000 trials"), ("99999999999999999999", "at most 1,000,000,000 trials"),
    ("8785h", "a wall time of at most 366 days"), ("999999999h", "a wall time of at most 366 days"),
])
def test_an_absurd_budget_is_one_line_saying_the_limit(text: str, says: str) -> None:
    with pytest.raises(ParameterError) as info:
        Budget.parse(text, name="--budget")
    assert str(info.value) == f"invalid --budget: {text!r} ({says})"
    assert Budget.parse("1000000000").trials == 1_000_000_000 and Budget.parse("8784h").seconds == 366 * 86400


def test_budget_text_and_description() -> None:
    assert [format_duration(s) for s in (900, 5400, 90, 3600, 2.5)] == ["15m", "1h30m", "1m30s", "1h", "2.5s"]
    assert Budget(trials=20).describe() == "20 trials" and Budget(seconds=900).describe() == "15m of wall time"
    with pytest.raises(ValueError):
        Budget(trials=2, seconds=3)
    with pytest.raises(ValueError):
        Budget()


# -- the allocator --------------------------------------------------------------------------------
def _wl(i: int, run_s: list[float | None], *, weight: int = 1, **kw: object) -> WorkloadHistory:
    return WorkloadHistory(i, weight, tuple(run_s), **kw)  # type: ignore[arg-type]


def _split(plan) -> dict[int, int]:  # type: ignore[no-untyped-def]
    return {g.workload_id: g.trials for g in plan.grants}


def test_first_round_gives_every_workload_its_minimum_unmeasured_defaults_first() -> None:
    fresh = [_wl(1, [], flops=1e6), _wl(2, [], weight=4, flops=1e6), _wl(3, [1e-3] * 3)]
    plan = allocate(fresh, 1000, min_trials=8, batch=16)
    assert _split(plan) == {1: 8, 2: 5 + 3, 3: 5}  # the measured one tops up to 8 as well
    order = [g.workload_id for g in sorted(plan.grants, key=lambda g: -g.priority)]
    assert order == [2, 1, 3]  # never measured first (the heavier first), then the one below its minimum
    assert [g.why for g in sorted(plan.grants, key=lambda g: -g.priority)] == ["default", "default", "minimum"]


def test_trials_move_away_from_a_workload_that_stopped_improving() -> None:
    improving = _wl(1, [8e-3, 4e-3, 3e-3, 2e-3, 1e-3, 0.9e-3, 0.8e-3, 0.7e-3, 0.6e-3, 0.5e-3])
    slowing = _wl(2, [8e-3, 4e-3, 4e-3, 4e-3, 4e-3, 4e-3, 4e-3, 4e-3, 4e-3, 3.92e-3], weight=2)  # a bigger share
    stalled = _wl(3, [8e-3, 4e-3, 4e-3, 4e-3, 4e-3, 4e-3, 4e-3, 4e-3, 4e-3, 4e-3], weight=2)
    assert stalled.plateaued(8) and not slowing.plateaued(8)
    plan = allocate([improving, slowing, stalled], None, min_trials=8, batch=4, window=8)
    assert _split(plan) == {1: 8}  # both batches of the round to the one still improving
    assert _split(allocate([improving, slowing, stalled], None, min_trials=8, batch=4, window=8, max_batches=1)) == {
        1: 4, 2: 4}  # the slowing one gets a batch only once the improving one is capped
    recovers = _wl(2, [8e-3] + [4e-3] * 7 + [1e-3, 0.5e-3], weight=2)
    assert _split(allocate([improving, recovers], None, min_trials=8, batch=4, window=8))[2] >= 4  # back in play


def test_a_plateaued_or_exhausted_workload_leaves_and_the_rounds_stop_when_all_did() -> None:
    flat = _wl(1, [4e-3] + [1e-3] * 9)  # nothing better over its last 8 trials
    assert flat.plateaued(8) and not flat.plateaued(16)
    done = _wl(2, [2e-3] * 10, exhausted=True)
    stopped = _wl(3, [2e-3, 1e-3] + [None] * 8, preempted=True)
    plan = allocate([flat, done, stopped], None, min_trials=8, batch=4, window=8)
    assert plan.grants == () and plan.stop is not None and plan.stop.startswith("no workload can use more trials")
    only_exhausted = allocate([done], 100, min_trials=8, batch=4)
    assert only_exhausted.stop == "no workload can use more trials: every search space ran out of new candidates"


def test_never_below_the_minimum_and_the_budget_is_spent_exactly() -> None:
    fresh = [_wl(i, [], flops=float(i)) for i in range(1, 4)]
    assert _split(allocate(fresh, 20, min_trials=8, batch=4)) == {3: 8, 2: 8}  # no sliver for workload 1
    short = allocate([_wl(1, [], outstanding=0)], 5, min_trials=8, batch=4)
    assert short.grants == () and short.stop == "the 5 trial(s) left cannot give 1 more workload(s) their minimum of 8"
    # round after round (each workload keeps improving a little): the whole budget, to the trial
    histories = {i: [8e-3] for i in (1, 2, 3)}
    budget, spent, rounds = 61, 0, 0
    while True:
        plan = allocate([_wl(i, r) for i, r in histories.items()], budget - spent, min_trials=8, batch=4)
        if not plan.grants:
            break
        rounds += 1
        assert plan.trials <= max(24, 3 * 4) and all(g.trials <= 4 * 4 for g in plan.grants)
        for g in plan.grants:
            histories[g.workload_id] += [histories[g.workload_id][-1] * 0.9 ** (1 / g.workload_id)] * g.trials
        spent += plan.trials
    assert (spent, plan.stop) == (budget, "trial budget spent")
    assert rounds == 1 + 3 + 1  # the minimums (24), three rounds of a batch per workload (36), the last 1
    assert all(len(r) >= 8 for r in histories.values())


def test_a_round_is_a_batch_per_workload_in_play_and_caps_one_workload() -> None:
    dominant = _wl(1, [1.0] + [0.01] * 7, weight=100)
    others = [_wl(i, [1e-3] + [0.9e-3] * 7) for i in range(2, 7)]
    plan = allocate([dominant, *others], None, min_trials=8, batch=10, max_batches=4)
    split = _split(plan)
    assert plan.trials == 6 * 10 and split[1] == 40  # capped at 4 batches; the other 2 go on down the list
    waiting = [_wl(1, [1e-3] * 8, outstanding=8), _wl(2, [1e-3] * 8, outstanding=4)]
    assert allocate(waiting, None, min_trials=8, batch=4).stop == "waiting for open shards"


def test_energy_aware_scores_per_joule() -> None:
    cheap = _wl(1, [8e-3, 6e-3] + [4e-3] * 6, joules_per_trial=1.0)
    costly = _wl(2, [8e-3, 6e-3] + [2e-3] * 6, weight=2, joules_per_trial=10.0)  # gains more, at 10x the energy
    # the costly one's second batch is still worth more than the cheap one's first
    assert _split(allocate([cheap, costly], None, min_trials=8, batch=4)) == {2: 8}
    assert _split(allocate([cheap, costly], 4, min_trials=8, batch=4)) == {2: 4}
    assert _split(allocate([cheap, costly], 4, min_trials=8, batch=4, energy_aware=True)) == {1: 4}


def test_one_shot_plan_spends_it_all_by_flops_before_anything_is_measured() -> None:
    fresh = [_wl(1, [], flops=1e9, weight=2), _wl(2, [], flops=1e6)]
    plan = allocate(fresh, 100, min_trials=8, batch=16, rounds=False)
    assert plan.trials == 100 and _split(plan)[1] > _split(plan)[2] >= 8
    assert len(plan.grants) == 2  # one grant per workload: its minimum and its share together
    with pytest.raises(ValueError):
        allocate(fresh, None, rounds=False)


def test_build_reserve_grows_with_the_model_and_its_measured_latency() -> None:
    small = build_reserve_s([_wl(1, [1e-3], default_s=5e-3)])
    slow = build_reserve_s([_wl(1, [1e-3], default_s=2.0)])
    assert 10 < small < 35 and slow > small + 2 * 2.0 + UNTUNED_TIMING_S  # the check call, then ~10 s of timing
    # An untuned call of 20 s (bert-base): the check call alone, its figure; not 16 calls, nor a second.
    huge = build_reserve_s([_wl(1, [1e-3], default_s=20.0)])
    assert 20.0 < huge - small < 1.2 * 20.0 + 1
    many = build_reserve_s([_wl(i, [], weight=1) for i in range(24)], compile_s=2.0)
    assert many > 1.2 * (24 * 2.0)
    assert build_reserve_s([]) == 0.0


def test_build_reserve_takes_the_measured_extraction_then_the_last_build() -> None:
    """mobilenet_v2 on a Zen 3 VM: 34 workloads, candidates built in 0.32 s, extracted in 26 s;
    its build took 152 s where the estimate without the extraction's time kept 89 s (the build
    compiled the other recipes then)."""
    model = [_wl(i, [3e-4], default_s=7.6e-3) for i in range(34)]
    guessed = build_reserve_s(model, compile_s=0.32)
    measured = build_reserve_s(model, compile_s=0.32, extract_s=26.0)
    # the load is the extraction measured, and the alternatives' setup as long; both compiles at
    # least half as long (here: longer than a candidate build per workload)
    guessed_load = 5.0 + 0.25 * 34
    assert measured - guessed == pytest.approx(1.2 * (2 * (26.0 - guessed_load) + 2 * (13.0 - 34 * 0.32)))
    assert measured > 82  # the build took 82 s once it folded the weights once and skipped the other recipes
    # a slow candidate build (Winograd's) outweighs a quick extraction
    assert build_reserve_s(model, compile_s=1.3, extract_s=10.0) > 1.2 * (10.0 + 2 * 34 * 1.3 + 10.0)
    # built here before: that build, a fifth more and 5 s, whatever the estimate
    assert build_reserve_s(model, compile_s=0.32, extract_s=26.0, last_build_s=127.0) == pytest.approx(1.2 * 127 + 5)
    assert build_reserve_s(model, compile_s=0.32, extract_s=26.0, last_build_s=300.0) == pytest.approx(1.2 * 300 + 5)
    # a pipeline's build takes the model its extract step kept: no load, the rest as estimated
    assert measured - build_reserve_s(model, compile_s=0.32, extract_s=26.0, kept=True) == pytest.approx(1.2 * 26.0)
    assert build_reserve_s(model, compile_s=0.32, extract_s=26.0, last_build_s=127.0, kept=True) == \
        pytest.approx(1.2 * 127 + 5)  # a measured build is measured the way it runs
    with_confirm = build_reserve_s(model, compile_s=0.32, last_build_s=127.0, confirm_top=3)
    assert with_confirm - (1.2 * 127 + 5) == pytest.approx(
        build_reserve_s(model, compile_s=0.32, confirm_top=3) - guessed)  # the re-timing on top


def test_build_reserve_keeps_time_for_re_timing_the_fastest_schedules() -> None:
    """Each of ``confirm_top`` schedules per workload: half a candidate's compile (two builder
    processes) and CONFIRM_ROUNDS runner calls, with 70 % more for the second pass, and the builder's start."""
    model = [_wl(i, [1e-3], default_s=5e-3) for i in range(20)]
    plain = build_reserve_s(model, compile_s=0.4)
    assert build_reserve_s(model, compile_s=0.4, confirm_top=1) == plain  # one schedule: nothing to choose
    extra = build_reserve_s(model, compile_s=0.4, confirm_top=3) - plain
    per_schedule = 0.4 / 2 + CONFIRM_ROUNDS * (RUNNER_CALL_S + 5 * 1e-3)
    assert extra == pytest.approx(1.2 * (10.0 + 1.7 * 3 * 20 * per_schedule))


def test_a_workload_whose_first_round_beat_nothing_is_not_starved_before_its_window_is_full() -> None:
    """Its first random candidates all lost to its default schedule: until a full window says it
    plateaued, it scores the median rate of the workloads that improved, so its latency share
    (here the model's largest) buys it the round's batches, not the floor rate's nothing."""
    stuck = _wl(1, [1.4e-3] + [2e-3, 3e-3, 1.5e-3, 4e-3, 2.5e-3, 1.6e-3, 3.9e-3])  # nothing beats the default
    improving = [_wl(i, [4e-3] + [0.2e-3] * 7) for i in (2, 3, 4)]  # 20x on their first round
    plan = allocate([stuck, *improving], None, min_trials=8, batch=8, window=16)
    assert _split(plan)[1] == 4 * 8  # the largest share: the round's cap of 4 batches
    # a full window with nothing better: it plateaued and leaves
    flat = _wl(1, [1.4e-3] + [2e-3] * 16)
    assert flat.plateaued(16)
    assert 1 not in _split(allocate([flat, *improving], None, min_trials=8, batch=8, window=16))
    # alone (no improving workload to take a rate from), it keeps the floor rate, as before
    assert _split(allocate([stuck], None, min_trials=8, batch=8, window=16)) == {1: 8}


def test_a_heavy_workload_still_improving_is_not_starved_by_young_ones_first_steps() -> None:
    """resnet18 on a slow CPU (docs/performance.md): after phase 1, the heaviest workload (called
    twice, 136 trials, 25 % better over its last 128) against workloads that had only their minimum
    of 8 trials, whose first searched candidates fell fast. Ranked by their improvement per trial,
    the young ones took every batch of the next plans and the heavy one none; with each batch
    valued by the drop it is expected to buy, a young one's second batch is worth less than the
    heavy one's first."""
    heavy = _wl(1, [200e-3, 4e-3, 3.5e-3, 3.3e-3, 3.2e-3, 3.1e-3, 3e-3, 2.987e-3]
                + [2.987e-3 * (2.248 / 2.987) ** ((i + 1) / 128) for i in range(128)], weight=2)
    young = [_wl(i, [160e-3, 4.61e-3, 3.5e-3, 2.8e-3, 2.2e-3, 1.9e-3, 1.66e-3, 1.66e-3]) for i in range(2, 12)]
    split = _split(allocate([heavy, *young], None, min_trials=8, batch=64, window=128))
    assert split.get(1, 0) >= 64
    assert max(split.values()) <= 2 * 64  # no young one takes the round's cap of 4 batches either
    # its exponent is fitted from its first searched candidate on, not from the default schedule,
    # once it ran half a window (a batch) of search; before, it has shown no pace
    assert young[0].exponent(14) == pytest.approx(math.log(4.61 / 1.66) / math.log(8 / 2))
    assert young[0].exponent(128) is None
    assert heavy.exponent(128) == pytest.approx(math.log(2.987 / 2.248) / math.log(136 / 8))


def test_a_first_round_s_few_trials_do_not_starve_a_heavy_workload() -> None:
    """resnet18's default run from the hub bundle (Zen 4, docs/performance.md): after the replay
    round's 8 trials each (the hub's schedules adapted, a few candidates), the 28x28 Winograd
    convolution (called twice, at half the sgemm peak) had barely improved on its first adapted
    schedule while its neighbours' first steps were steep. Fitted to those 8 trials its exponent
    was 100x smaller than theirs, and the round that took the rest of the 15 minutes gave it
    nothing. Less than a batch shows no pace: the round is split by latency share."""
    heavy = _wl(1, [60e-3, 0.87e-3, 0.9e-3, 0.88e-3, 0.86e-3, 0.95e-3, 0.9e-3, 0.86e-3], weight=2)
    steep = [_wl(i, [40e-3, 1.2e-3, 0.9e-3, 0.7e-3, 0.6e-3, 0.5e-3, 0.46e-3, 0.45e-3], weight=2) for i in (2, 3, 4)]
    assert heavy.exponent(128) is None and all(w.exponent(128) is None for w in steep)
    split = _split(allocate([heavy, *steep], 4 * 64, min_trials=8, batch=64, window=128))
    assert split[1] == max(split.values()) >= 64  # the largest share gets the most of the round
    # once the others ran a batch of search, their pace counts (and the heavy one still gets the median)
    searched = [_wl(i, [40e-3] + [0.45e-3 * 0.999 ** k for k in range(72)], weight=2) for i in (2, 3, 4)]
    assert all(w.exponent(128) is not None for w in searched)
    assert 1 in _split(allocate([heavy, *searched], 4 * 64, min_trials=8, batch=64, window=128))
