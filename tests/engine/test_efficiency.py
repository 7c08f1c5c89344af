"""Cost-efficient tuning on real TVM tuning of the tiny ``mlp``, on SQLite and PostgreSQL:
plateau preemption (and resuming with its persisted state), reallocation of the unused trials,
cost-model filtering (recorded, never measured), and the warm start dropped when it misranks a shard."""

from __future__ import annotations

import pytest

from tests.conftest import on_backend
from tunefleet.db.database import FILTERED
from tunefleet.db.tables import Measurement
from tunefleet.energy.accounting import energy_report
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.shard import ShardKit, ShardResult, run_shard
from tunefleet.engine.worker import Tuner, drain
from tunefleet.models.ingest import ingest
from tunefleet.models.workloads import extract
from tunefleet.planning import shard_queue
from tunefleet.planning.preemption import new_state
from tunefleet.testing.models import arbitrary_trained_model

pytestmark = pytest.mark.slow


def _mlp(engine):  # type: ignore[no-untyped-def]
    _, db, store = engine
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    return db, store, model


def _tune(db, shard, trained=None, on_batch=None, **knobs) -> ShardResult:  # type: ignore[no-untyped-def]
    """Tune one leased shard as worker "w" with these knobs (and the class's trained model)."""
    # Seeds from other shapes (warm_start_shapes) would add rows to the first round: counted apart, off here.
    knobs.setdefault("warm_start_shapes", False)
    return run_shard(db, shard, "w", TuneOptions(**knobs), ShardKit(trained_model=trained, on_batch=on_batch))


def _rows(db, workload_id: int) -> list[Measurement]:  # type: ignore[no-untyped-def]
    return [m for m in db.measurements() if m.workload_id == workload_id]


def _extra_shard(db, workload_id: int, trials: int) -> int:  # type: ignore[no-untyped-def]
    """A pending x86 shard of one workload besides those ``shard_queue.plan`` made; its id."""
    from tunefleet.db.tables import Shard

    with db.session() as sess:
        shard = Shard(workload_id=workload_id, hardware_class_id=db.hardware_class("x86").id, trials=trials,
                      priority=0.0, state="pending", max_leases=3, history=[])
        sess.add(shard)
        sess.flush()
        return int(shard.id)


@on_backend("postgresql")
def test_plateaued_workloads_are_preempted_and_their_trials_reallocated(engine) -> None:  # type: ignore[no-untyped-def]
    db, _, model = _mlp(engine)
    hw = db.hardware_class("x86")
    shard_queue.plan(db, "x86", target_trials=24, model=model.id)
    # every round after the first is stale (an improvement must beat 100%): a plateau after 1 + 2 rounds
    options = TuneOptions(seed=0, trials_per_iter=4, preempt=True, preempt_epsilon=1.0, preempt_patience=2,
                          warm_start_shapes=False)
    summary = drain(db, "x86", options)
    assert summary.shards_failed == 0 and summary.preempted >= 3
    states = {s.workload_id: s for s in db.tuning_states(hw.id)}
    assert len(states) == 3 and all(s.preempted and s.reason.startswith("plateau") for s in states.values())
    for wl, _ in db.workloads(model.id):
        assert states[wl.id].rounds == 3, "1 improving round + patience stale rounds, then nothing more"
        assert len(_rows(db, wl.id)) <= 13  # 3 rounds of at most 4 (+ the default schedule), never 24
    done = shard_queue.list_shards(db, hardware="x86", state="done")
    preempted = [s for s in done if any(e["event"] == "preempted" for e in s.history)]
    reallocated = [s for s in done if any(e["event"] == "reallocated" for e in s.history)]
    assert preempted and all(e["unused_trials"] > 0 for s in preempted for e in s.history if e["event"] == "preempted")
    assert reallocated, "the first preempted workload's trials went to the workloads not explored yet"
    # the budget is conserved: trials spent + trials given up never exceed what was planned
    assert db.count_measurements(hardware_class_id=hw.id) <= 3 * 24
    # planning again plans nothing for preempted workloads; resetting their plateaus plans them again
    created, view = shard_queue.plan(db, "x86", target_trials=24, model=model.id)
    assert created == [] and all(v.preempted for v in view)
    db.reset_plateaus(hw.id)
    created, _ = shard_queue.plan(db, "x86", target_trials=48, model=model.id)
    assert len(created) == 3


def test_resumed_shard_keeps_the_plateau_state(engine) -> None:  # type: ignore[no-untyped-def]
    db, _, model = _mlp(engine)
    hw = db.hardware_class("x86")
    wl = db.workloads(model.id)[0][0]
    shard_queue.plan(db, "x86", target_trials=16, model=model.id)
    # A dead worker's attempt had already seen 1 stale round against an (unbeatable) best of 1 ps.
    st = new_state(wl.id, hw.id, best_s=1e-12)
    st.rounds, st.stale_rounds = 2, 1
    db.save_tuning_state(st)
    shard = next(s for s in shard_queue.list_shards(db, hardware="x86") if s.workload_id == wl.id)
    leased = shard_queue.lease(db, "x86", "w", shard_id=shard.id)
    result = _tune(db, leased, seed=0, trials_per_iter=4, preempt=True, preempt_patience=2)
    assert result.state == "done" and result.preempted is not None
    # one more stale round (4 search candidates + the default schedule) completes the plateau counted before
    assert result.measured <= 5, "the crash"
    assert result.unused_trials == 16 - result.measured
    after = db.tuning_state(wl.id, hw.id)
    assert (after.rounds, after.stale_rounds, after.preempted) == (3, 2, True)
    # a shard of the workload planned before the plateau (e.g. a second 64-trial shard) ends at once:
    # it measures nothing and its trials go to the workloads still improving
    late = shard_queue.lease(db, "x86", "w", shard_id=_extra_shard(db, wl.id, 8))
    assert late is not None and late.workload_id == wl.id
    again = _tune(db, late, seed=0, trials_per_iter=4, preempt=True, preempt_patience=2)
    assert (again.state, again.measured, again.unused_trials) == ("done", 0, 8) and again.preempted


@on_backend("sqlite")
def test_filtered_candidates_are_recorded_and_never_measured(engine, caplog) -> None:  # type: ignore[no-untyped-def]
    import logging

    db, store, model = _mlp(engine)
    by_flops = sorted((pair[0] for pair in db.workloads(model.id)), key=lambda w: w.flops)
    wl, small = by_flops[-1], by_flops[0]
    shard_queue.plan(db, "x86", target_trials=24, model=model.id)
    shard_of = {s.workload_id: s for s in shard_queue.list_shards(db, hardware="x86")}

    # filtering on, but the class has no trained model (and the shipped one is off): one warning, and
    # every candidate is measured (the online model that guides the search is never used as the filter)
    one_round_id = _extra_shard(db, small.id, 6)  # one round of the smallest workload is enough to show it
    tuner = Tuner(db, "x86", TuneOptions(filter_fraction=0.5, trials_per_iter=6, seed=0, warm_start_shapes=False,
                                         pretrained_cost_model=False), store=store)
    try:
        with caplog.at_level(logging.WARNING, logger="tunefleet.engine"):
            plain = tuner.tune_next(db, "w", shard_id=one_round_id)
    finally:
        tuner.close()
    assert plain.state == "done" and plain.filtered == 0 and plain.measured > 0
    assert "filtering is on but x86 has no current cost model" in caplog.text

    measured: list[str] = []
    leased = shard_queue.lease(db, "x86", "w", shard_id=shard_of[wl.id].id)
    result = _tune(db, leased, arbitrary_trained_model(), seed=0, trials_per_iter=6, warm_start=False,
                   filter_fraction=0.5, filter_min_agreement=0.0,  # no audit: filters from round 1
                   on_batch=lambda _sid, batch: measured.extend(sha for sha, _ in batch))
    assert result.state == "done"
    rows = _rows(db, wl.id)
    filtered = [m for m in rows if m.error_kind == FILTERED]
    assert filtered and result.filtered == len(filtered)
    assert not {m.trace_sha256 for m in filtered} & set(measured), "a filtered candidate reached the runner"
    assert all(m.run_secs is None and m.mean_run_s is None and m.energy_j == 0.0 and m.build_s is None
               for m in filtered)
    assert len(rows) == 24 and len(measured) == 24 - len(filtered), "a filtered candidate spends a trial"
    (row,) = [r for r in energy_report(db, model=model.id) if r.hardware == "x86"]
    assert row.filtered == len(filtered) and row.trials == len(measured) + plain.measured
    # the dataset knows about them but never learns from them
    from tunefleet.learning.dataset import export

    version = export(db, store, hardware="x86")
    assert version.row_count == len(measured) + plain.measured
    assert version.manifest["hardware"]["x86"]["filtered"] == len(filtered)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the audit does not touch the database backend
def test_the_filter_is_on_probation_until_its_model_ranks_the_measurements(engine, caplog) -> None:  # type: ignore[no-untyped-def]
    import logging

    db, _, model = _mlp(engine)
    small, _, big = sorted((pair[0] for pair in db.workloads(model.id)), key=lambda w: w.flops)
    shard_queue.plan(db, "x86", target_trials=24, model=model.id)
    shard_of = {s.workload_id: s for s in shard_queue.list_shards(db, hardware="x86")}

    # agreement 1.0 demanded: an arbitrary model cannot order every pair of real measurements right,
    # so it fails its probation after round 1 (measured in full) and never drops a candidate
    with caplog.at_level(logging.INFO, logger="tunefleet.engine"):
        result = _tune(db, shard_queue.lease(db, "x86", "w", shard_id=shard_of[big.id].id), arbitrary_trained_model(), seed=0,
                       trials_per_iter=6, warm_start=False, filter_fraction=0.5, filter_min_agreement=1.0)
    assert result.state == "done" and result.filter_stopped is not None and result.filtered == 0
    assert "pairs of this workload's measured candidates right (< 100%)" in result.filter_stopped
    assert "filtering stops for" in caplog.text and "filtering starts for" not in caplog.text
    rows = _rows(db, big.id)
    assert len(rows) == 24 and not [m for m in rows if m.error_kind == FILTERED]

    # a threshold any ranking but an exactly reversed one passes: round 1 (the default schedule + 6
    # search candidates) is measured in full, then the filter is trusted and drops half of each round
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tunefleet.engine"):
        trusted = _tune(db, shard_queue.lease(db, "x86", "w", shard_id=shard_of[small.id].id), arbitrary_trained_model(), seed=0,
                       trials_per_iter=6, warm_start=False, filter_fraction=0.5, filter_min_agreement=0.01)
    assert trusted.state == "done" and trusted.filter_stopped is None, caplog.text
    assert "filtering starts for" in caplog.text
    rows = sorted(_rows(db, small.id), key=lambda m: m.id)
    first_filtered = min(i for i, m in enumerate(rows) if m.error_kind == FILTERED)
    assert first_filtered == 7, "round 1 is measured in full"
    # 24 trials: 7 in round 1, then 6 (3 filtered), 6 (3 filtered), 5 (2 filtered)
    assert len(rows) == 24 and trusted.filtered == 8 == sum(m.error_kind == FILTERED for m in rows)

    # a later shard of a workload is judged on the measurements committed before it: the model that
    # failed on them measures its whole budget; the one that passed filters from its first round
    again = _tune(db, shard_queue.lease(db, "x86", "w", shard_id=_extra_shard(db, big.id, 6)), arbitrary_trained_model(), seed=1, trials_per_iter=6, warm_start=False,
                   filter_fraction=0.5, filter_min_agreement=1.0)
    assert again.state == "done" and again.filtered == 0 and again.filter_stopped is not None
    assert len(_rows(db, big.id)) == 24 + 6
    more = _tune(db, shard_queue.lease(db, "x86", "w", shard_id=_extra_shard(db, small.id, 6)), arbitrary_trained_model(), seed=1, trials_per_iter=6, warm_start=False,
                   filter_fraction=0.5, filter_min_agreement=0.01)
    # half of its one round of 6 is filtered; the exact count depends on how many of the search's candidates
    # are new (an already measured one is skipped, not scored: 2 of 5 then, as seen in a full run)
    assert more.state == "done" and more.filtered in (2, 3) and more.filter_stopped is None


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # the warm start's audit does not touch the database
def test_a_warm_start_that_misranks_the_shard_is_dropped_in_tuning(engine, caplog) -> None:  # type: ignore[no-untyped-def]
    import logging

    db, _, model = _mlp(engine)
    big = max((pair[0] for pair in db.workloads(model.id)), key=lambda w: w.flops)
    shard_queue.plan(db, "x86", target_trials=12, model=model.id)
    (shard,) = [s for s in shard_queue.list_shards(db, hardware="x86") if s.workload_id == big.id]
    # agreement 1.0 demanded: an arbitrary model cannot order every pair of 12 real measurements right,
    # so the shard's FleetCostModel drops it (the unit test checks the scores that follow)
    with caplog.at_level(logging.INFO, logger="tunefleet.engine"):
        result = _tune(db, shard_queue.lease(db, "x86", "w", shard_id=shard.id), arbitrary_trained_model(), seed=0,
                       trials_per_iter=6, warm_start_min_agreement=1.0)
    assert result.state == "done" and len(_rows(db, big.id)) == 12
    assert f"warm start ends for {big.name}" in caplog.text
    assert result.warm_start_dropped is not None and "(< 100%)" in result.warm_start_dropped
    # a later shard of the workload is judged on its 12 committed measurements before its one round
    # of 2 candidates (too few to judge alone: 4 are needed), and the same model is dropped at once
    caplog.clear()
    later = shard_queue.lease(db, "x86", "w", shard_id=_extra_shard(db, big.id, trials=2))
    with caplog.at_level(logging.INFO, logger="tunefleet.engine"):
        again = _tune(db, later, arbitrary_trained_model(), seed=0, trials_per_iter=2, warm_start_min_agreement=1.0)
    assert again.state == "done" and again.measured == 2 and again.warm_start_dropped is not None
    assert f"warm start ends for {big.name}" in caplog.text
    # a threshold of 0 keeps it: nothing dropped, nothing logged
    caplog.clear()
    kept = shard_queue.lease(db, "x86", "w", shard_id=_extra_shard(db, big.id, trials=2))
    with caplog.at_level(logging.INFO, logger="tunefleet.engine"):
        same = _tune(db, kept, arbitrary_trained_model(), seed=0, trials_per_iter=2, warm_start_min_agreement=0.0)
    assert same.state == "done" and same.warm_start_dropped is None and "warm start ends" not in caplog.text
