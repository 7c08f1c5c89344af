"""A model's budget spent in rounds by a worker, on SQLite with a stand-in tuner (no TVM): the
rounds refill the queue as it empties, stop at a trial budget exactly and at a deadline."""

from __future__ import annotations

import datetime as dt
import math
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from tunefleet.budget import Budget
from tunefleet.db import Database, NewMeasurement
from tunefleet.energy import priorities
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.shard import ShardResult
from tunefleet.engine.worker import drain
from tunefleet.planning import rounds as round_planning
from tunefleet.planning import shard_queue
from tunefleet.planning.rounds import Deadline, Rounds, RoundsState
from tunefleet.vocab import CANCELLED, DEFAULT_TRACE_JSON, DONE, LEASED, PENDING

# workload name -> (weight, best run time it tends to, trials it takes to get there)
CURVES = {"big": (4, 1e-3, 40.0), "small": (1, 1e-4, 10.0), "flat": (1, 2e-3, 0.5)}


class Clock:
    def __init__(self, t: float = 1_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class FakeTuner:
    """Leases shards like :class:`tunefleet.engine.worker.Tuner` and commits made-up candidates:
    each workload's best run time falls from 10 ms towards its floor; a trial takes a second."""

    hardware = "x86"

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.leased: list[int] = []

    def tune_next(self, db: Database, owner: str, options: TuneOptions | None = None, *, shard_id: int | None = None,
                  on_batch: object = None, deadline: Deadline | None = None, reprioritise: bool = True,
                  ) -> ShardResult | None:
        if deadline is not None and deadline.reason():
            return None
        shard = shard_queue.lease(db, "x86", owner, shard_id=shard_id)
        if shard is None:
            return None
        self.leased.append(shard.id)
        wl = db.workload(shard.workload_id)
        _, floor, tau = CURVES[wl.name]
        done = db.count_measurements(wl.id, shard.hardware_class_id)
        rows = []
        for i in range(done, done + shard.trials):
            trace = DEFAULT_TRACE_JSON if i == 0 else f"{wl.name}-{i}"
            rows.append(NewMeasurement(wl.id, shard.hardware_class_id, trace, [floor + (1e-2 - floor) * math.exp(-i / tau)],
                                       shard_id=shard.id, build_s=0.5))
            self.clock.t += 1.0
        db.commit_measurements(rows)
        shard_queue.complete(db, shard.id, owner)
        return ShardResult(shard.id, DONE, len(rows), 0, 0, None, float(len(rows)))


def add_stand_in_model(database: Database) -> int:
    """A model ``m`` of the stand-in tuner's workloads (:data:`CURVES`, by name and weight); its id."""
    model, _ = database.add_model(name="m", source="zoo", format="x", sha256="a" * 64, artifact_uri="u")
    for name, (weight, _, _) in CURVES.items():
        wl, _ = database.add_workload(structural_hash=name, name=name, op_kind="dense", flops=1e6, tir_json="{}")
        database.link_model_workload(model.id, wl.id, weight)
    return model.id


@pytest.fixture
def db(tmp_path) -> Iterator[tuple[Database, int]]:  # type: ignore[no-untyped-def]
    database = Database(f"sqlite:///{tmp_path / 'db.sqlite'}")
    database.upsert_hardware_class("x86", {"kind": "llvm", "num-cores": 2}, "x86")
    yield database, add_stand_in_model(database)
    database.close()


def _per_workload(database: Database) -> dict[str, int]:
    hw = database.hardware_class("x86").id
    return {wl.name: database.count_measurements(wl.id, hw) for wl, _ in database.workloads()}


def test_rounds_refill_the_queue_and_stop_at_the_trial_budget_exactly(db: tuple[Database, int]) -> None:
    database, model = db
    clock = Clock()
    rounds = Rounds("x86", [model], Budget(trials=100), started_at=clock(), min_trials=8, batch=8, clock=clock)
    tuner = FakeTuner(clock)
    summary = drain(database, "x86", TuneOptions(), tuner=tuner, refill=rounds)  # type: ignore[arg-type]
    spent = _per_workload(database)
    assert sum(spent.values()) == 100 and summary.measured == 100
    assert min(spent.values()) >= 8  # every workload got its minimum
    assert spent["big"] > spent["flat"]  # the heavy workload still improving got most of the rest
    assert summary.budget is not None and summary.stopped == "trial budget spent"
    assert (summary.budget["trials"], summary.budget["rounds"], summary.budget["stopped"]) == (
        100, rounds.rounds, "trial budget spent")
    assert rounds.rounds >= 4
    planned = shard_queue.list_shards(database)
    assert {s.state for s in planned} == {DONE} and sum(s.trials for s in planned) == 100
    assert [s.history[0]["round"] for s in planned][:3] == [1, 1, 1]  # the minimums, in one round
    assert all(s.history[0]["budget"] == "100" for s in planned)
    first = sorted(planned[:3], key=lambda s: -s.priority)
    assert [database.workload(s.workload_id).name for s in first] == ["big", "small", "flat"]  # weight × FLOPs, then id
    parent = Rounds("x86", [model], Budget(trials=100), started_at=rounds.started_at, min_trials=8, batch=8, clock=clock)
    assert parent.why_over(database) == "trial budget spent"  # `tune --workers`: the workers refilled, not it
    again = Rounds("x86", [model], Budget(trials=100), started_at=time.time() + 2, min_trials=8, batch=8)
    assert again.why_over(database) is None  # planning nothing, it says another round could be planned
    assert again.refill(database) > 0  # a new budget (counted from its own start) spends again


def test_rounds_stop_at_the_deadline_and_cancel_the_rest_of_the_round(db: tuple[Database, int]) -> None:
    database, model = db
    clock = Clock()
    rounds = Rounds("x86", [model], Budget(seconds=60), started_at=clock(), min_trials=8, batch=8, clock=clock)
    assert rounds.deadline is not None and rounds.deadline.at == clock() + 60
    summary = drain(database, "x86", TuneOptions(), tuner=FakeTuner(clock), refill=rounds)  # type: ignore[arg-type]
    assert summary.stopped == rounds.stopped == "deadline: reached"
    assert 60 <= sum(_per_workload(database).values()) < 60 + 8 * 4  # at most the shard in flight goes over
    states = {s.state for s in shard_queue.list_shards(database)}
    assert PENDING not in states and LEASED not in states
    assert summary.budget is not None and summary.budget["kind"] == "duration" and summary.budget["seconds"] >= 60
    cut = [s for s in shard_queue.list_shards(database) if s.state == CANCELLED]
    assert all(s.history[-1]["event"] == "cancel" for s in cut)


def test_a_deadline_keeps_time_for_the_build_and_a_batch(db: tuple[Database, int]) -> None:
    database, model = db
    clock = Clock()
    rounds = Rounds("x86", [model], Budget(seconds=600), started_at=clock(), reserve_builds=1, clock=clock)
    assert rounds.refill(database) == 3
    assert rounds.deadline is not None and 0 < rounds.reserve_s < 100
    assert rounds.deadline.at == pytest.approx(clock() + 600 - rounds.reserve_s)
    # The model's last build on this class took 200 s here: the next round keeps that, a fifth more and 5 s
    hw = database.hardware_class("x86").id
    database.note_step_seconds(model, hw, "build", 200.0)
    assert rounds.refill(database) == 3  # the same three shards pending, nothing new; the reserve is refreshed
    assert rounds.reserve_s == pytest.approx(1.2 * 200.0 + 5.0)
    assert rounds.deadline.at == pytest.approx(clock() + 600 - rounds.reserve_s)
    deadline = Deadline(clock() + 100, clock=clock)
    assert deadline.reason() is None and deadline.reason(99) is None
    clock.t += 61
    assert deadline.reason(40.0) == "deadline: 39s left, less than the last search batch took (40s)"
    assert deadline.reason(30.0) is None  # a shorter batch still fits
    clock.t += 40
    assert deadline.reason() == "deadline: reached"


def test_a_budget_too_short_for_a_round_measures_the_hub_s_schedules_only(db: tuple[Database, int]) -> None:
    """The build's reserve leaves no time for a first round: the workloads another compatible class
    (a hub class) measured replay its schedules (and their default) in one small round with a
    deadline of its own, heaviest first; the others measure their default and as many candidates
    of a search in the same round (a default schedule left in the model costs more); no other round."""
    database, model = db
    clock = Clock()
    source = database.upsert_hardware_class("hub-x86", {"kind": "llvm", "num-cores": 2}, "tunefleet-hub")
    for wl, _ in database.workloads(model):
        if wl.name != "flat":
            database.commit_measurements([NewMeasurement(wl.id, source.id, f"{wl.name}-hub", [1e-4])])
    rounds = Rounds("x86", [model], Budget(seconds=20), started_at=clock(), reserve_builds=1, min_trials=8, batch=8,
                    clock=clock)
    assert rounds.refill(database) == 3
    assert rounds.reserve_s > 20  # the build's reserve alone is longer than the budget
    assert rounds.stopped == ("deadline: reached before the first round: 2 workload(s) measure the hub's "
                              "schedules only, 1 with none the first 2 candidates of a search")
    assert rounds.deadline is not None and rounds.deadline.at == clock() + round_planning.WORKER_START_S + (
        round_planning.first_round_s([1 + round_planning.REPLAY_SEEDS] * 3))
    planned = sorted(shard_queue.list_shards(database), key=lambda s: -s.priority)
    by_weight_flops = sorted((wl for wl, _ in database.workloads(model)),
                             key=lambda wl: -dict((w.id, n) for w, n in database.workloads(model))[wl.id] * wl.flops)
    assert [(database.workload(s.workload_id).name, s.trials) for s in planned] == [
        (wl.name, 3) for wl in by_weight_flops]
    assert {database.workload(s.workload_id).name for s in planned} == {"big", "small", "flat"}
    assert all(s.history[0]["replay"] is True and s.history[0]["round"] == 1 for s in planned)
    summary = drain(database, "x86", TuneOptions(), tuner=FakeTuner(clock), refill=rounds)  # type: ignore[arg-type]
    assert summary.measured == 9 and summary.budget is not None and summary.budget["stopped"] == rounds.stopped
    assert {s.state for s in shard_queue.list_shards(database)} == {DONE}
    assert rounds.refill(database) == 0 and len(shard_queue.list_shards(database)) == 3  # once


def test_a_budget_spent_before_tuning_starts_still_replays_the_hub(db: tuple[Database, int]) -> None:
    """Ingest and extraction took the whole budget: the loop still asks the rounds once, and they
    replay the hub's schedules (big's and small's) and search flat's a little."""
    database, model = db
    clock = Clock()
    source = database.upsert_hardware_class("hub-x86", {"kind": "llvm", "num-cores": 2}, "tunefleet-hub")
    for wl, _ in database.workloads(model):
        if wl.name != "flat":  # two of three: the replay round
            database.commit_measurements([NewMeasurement(wl.id, source.id, f"{wl.name}-hub", [1e-4])])
    rounds = Rounds("x86", [model], Budget(seconds=20), started_at=clock() - 60, reserve_builds=1, clock=clock)
    assert rounds.deadline is not None and rounds.deadline.reason() == "deadline: reached"
    summary = drain(database, "x86", TuneOptions(), tuner=FakeTuner(clock), refill=rounds)  # type: ignore[arg-type]
    assert summary.measured == 9 and sorted(database.workload(s.workload_id).name
                                            for s in shard_queue.list_shards(database)) == ["big", "flat", "small"]
    assert summary.budget is not None and summary.budget["stopped"] == (
        "deadline: reached before the first round: 2 workload(s) measure the hub's schedules only, 1 with none "
        "the first 2 candidates of a search")


@pytest.mark.parametrize("hub", [True, False], ids=["with-hub", "without-hub"])
def test_a_first_round_that_cannot_end_before_the_deadline_replays_the_hub_instead(db: tuple[Database, int],
                                                                                     hub: bool) -> None:
    """Time is left, but less than a first round needs (a shard's start and its trials, estimated):
    with the hub, the replay round; without it, the first round all the same."""
    database, model = db
    clock = Clock()
    if hub:
        source = database.upsert_hardware_class("hub-x86", {"kind": "llvm", "num-cores": 2}, "tunefleet-hub")
        for wl, _ in database.workloads(model):
            database.commit_measurements([NewMeasurement(wl.id, source.id, f"{wl.name}-hub", [1e-4])])
    need = round_planning.first_round_s([8, 8, 8])
    rounds = Rounds("x86", [model], Budget(seconds=need - 2), started_at=clock(), min_trials=8, batch=8, clock=clock)
    assert rounds.refill(database) == 3
    planned = sorted(s.trials for s in shard_queue.list_shards(database))
    if hub:
        assert rounds.stopped == (f"deadline: {need - 2:.0f}s left, less than a first round needs (about {need:.0f}s) "
                                  "before the first round: 3 workload(s) measure the hub's schedules only")
        assert planned == [3, 3, 3]
    else:
        assert rounds.stopped is None and planned == [8, 8, 8]  # nothing to replay: the round is planned


def test_a_model_the_hub_holds_less_than_half_of_gets_the_first_round_instead(db: tuple[Database, int]) -> None:
    """One of three workloads in the hub: a first round of search, as without a hub (two trials of
    search for most workloads would deliver less); its shards still measure the hub's schedules."""
    database, model = db
    clock = Clock()
    source = database.upsert_hardware_class("hub-x86", {"kind": "llvm", "num-cores": 2}, "tunefleet-hub")
    (big, _), *_ = [(wl, w) for wl, w in database.workloads(model) if wl.name == "big"]
    database.commit_measurements([NewMeasurement(big.id, source.id, "big-hub", [1e-4])])
    need = round_planning.first_round_s([8, 8, 8])
    rounds = Rounds("x86", [model], Budget(seconds=need - 2), started_at=clock(), min_trials=8, batch=8, clock=clock)
    assert rounds.refill(database) == 3 and rounds.stopped is None
    assert sorted(s.trials for s in shard_queue.list_shards(database)) == [8, 8, 8]
    assert not any(s.history[0].get("replay") for s in shard_queue.list_shards(database))


def test_a_budget_too_short_for_a_round_with_nothing_to_replay_plans_nothing(db: tuple[Database, int]) -> None:
    database, model = db
    clock = Clock()
    rounds = Rounds("x86", [model], Budget(seconds=20), started_at=clock(), reserve_builds=1, clock=clock)
    assert rounds.refill(database) == 0 and rounds.stopped == "deadline: reached"
    assert shard_queue.list_shards(database) == []  # no round planned, then cancelled


def test_a_round_that_measured_nothing_ends_the_rounds(db: tuple[Database, int]) -> None:
    database, model = db
    clock = Clock()
    rounds = Rounds("x86", [model], Budget(seconds=600), started_at=time.time() - 10, min_trials=8, batch=8)
    assert rounds.refill(database) == 3
    for shard in shard_queue.list_shards(database):  # every shard of the round ends before its first batch
        shard_queue.lease(database, "x86", "w", shard_id=shard.id)
        shard_queue.complete(database, shard.id, "w", event="done-short")
    assert rounds.refill(database) == 0
    assert rounds.stopped == "round 1 measured nothing: its shards ended before their first batch"
    assert len(shard_queue.list_shards(database)) == 3 and clock() == 1_000.0  # nothing planned again


def test_rounds_cross_processes_as_typed_state(db: tuple[Database, int]) -> None:
    import pickle

    _, model = db
    rounds = Rounds("x86", [model], Budget(seconds=90), started_at=5.0, reserve_builds=1, min_trials=4, batch=16)
    assert rounds.deadline is not None
    rounds.deadline.at = 80.0
    state = rounds.state
    assert isinstance(state, RoundsState) and pickle.loads(pickle.dumps(state)) == state  # spawn, Prefect
    again = Rounds.resume(state)
    assert again.state == state and again.budget == Budget(seconds=90) and again.deadline is not None
    held = again.deadline
    again.update(replace(state, rounds=3, spent=40, deadline_at=70.0, stopped="trial budget spent"))
    assert (again.rounds, again.spent, again.stopped, held.at) == (3, 40, "trial budget spent", 70.0)  # in place


def test_a_preempted_round_shard_gives_its_trials_back_to_the_budget(db: tuple[Database, int]) -> None:
    database, model = db
    hw = database.hardware_class("x86")
    res = round_planning.plan_round(database, "x86", [model], Budget(trials=24), Rounds("x86", [model], Budget(trials=1)).since,
                            min_trials=8)
    assert (res.round, res.plan.trials, res.outstanding, res.spent) == (1, 24, 24, 0)
    first = res.shards[0]
    assert priorities.reallocate(database, "x86", 5, from_workload_id=first.workload_id, from_shard_id=first.id) == []
    assert sum(s.trials for s in shard_queue.list_shards(database)) == 24  # nothing handed on: the next round has them
    flat = database.add_shards(hw.id, [(first.workload_id, 8, 1.0)])[0]  # a flat plan's shard hands them on
    assert priorities.reallocate(database, "x86", 5, from_workload_id=first.workload_id, from_shard_id=flat.id) != []


def test_a_wall_time_round_is_cut_to_the_trials_that_fit_before_the_deadline(db: tuple[Database, int]) -> None:
    database, model = db
    since = Rounds("x86", [model], Budget(trials=1), started_at=time.time() - 3600).since
    first = round_planning.plan_round(database, "x86", [model], Budget(seconds=600), since, min_trials=8, batch=8,
                              time_left_s=500)  # no pace yet: the minimums, whatever the time
    assert first.plan.trials == 24
    tuner = FakeTuner(Clock())
    while tuner.tune_next(database, "w") is not None:
        pass
    hw = database.hardware_class("x86").id
    with database.session() as s:  # the 24 trials took 120 s of wall time
        from sqlalchemy import update

        from tunefleet.db.tables import Measurement, utcnow

        s.execute(update(Measurement).values(created_at=utcnow() - dt.timedelta(seconds=120)))
    roomy = round_planning.plan_round(database, "x86", [model], Budget(seconds=600), since, min_trials=8, batch=8, dry=True)
    tight = round_planning.plan_round(database, "x86", [model], Budget(seconds=600), since, min_trials=8, batch=8,
                              time_left_s=60, dry=True)  # 5 s a trial: 12 fit
    assert roomy.plan.trials == 3 * 8 and 10 <= tight.plan.trials <= 12
    over = round_planning.plan_round(database, "x86", [model], Budget(seconds=600), since, min_trials=8, batch=8,
                             time_left_s=2, dry=True)
    assert over.plan.grants == () and over.stop == "deadline: about 0 trial(s) fit in the 2s left, not enough for another round"
    assert hw and shard_queue.list_shards(database, state="pending") == []  # dry: nothing planned


def test_a_worker_waits_for_a_shard_whose_workload_another_worker_searches(
        db: tuple[Database, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue's last shards belong to a workload another worker is searching: this worker waits
    for them (one search per workload at a time) instead of leaving them behind."""
    database, _ = db
    shard_queue.plan(database, "x86", target_trials=8, shard_trials=4)  # two shards per workload
    theirs = shard_queue.lease(database, "x86", "other")
    assert theirs is not None
    waits: list[float] = []

    def other_worker_finishes(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 1:
            shard_queue.complete(database, theirs.id, "other", generation=theirs.lease_generation)

    monkeypatch.setattr("tunefleet.engine.worker._wait", other_worker_finishes)
    summary = drain(database, "x86", TuneOptions(), tuner=FakeTuner(Clock()))  # type: ignore[arg-type]
    assert len(waits) == 1
    assert summary.shards_done == len(shard_queue.list_shards(database)) - 1
    assert {s.state for s in shard_queue.list_shards(database)} == {DONE}
