"""Plateau policy (pure) and the energy-aware budget (on SQLite and PostgreSQL), without TVM."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from tunefleet.db import Database, NewMeasurement
from tunefleet.db.database import FILTERED
from tunefleet.energy import priorities
from tunefleet.planning import shard_queue
from tunefleet.planning.preemption import PreemptionPolicy, new_state, observe_round, stop_reason


# -- the plateau policy -----------------------------------------------------------------------
def test_plateau_after_patience_stale_rounds() -> None:
    policy = PreemptionPolicy(epsilon=0.05, patience=2)
    st = new_state(1, 1)
    observe_round(st, 10e-3, 5.0, 1, policy)  # first result: an improvement
    assert (st.rounds, st.stale_rounds, stop_reason(st, policy)) == (1, 0, None)
    observe_round(st, 9.9e-3, 5.0, 1, policy)  # 1% better: stale (<= 5%)
    observe_round(st, None, 5.0, 1, policy)  # a round of errors: stale
    assert st.stale_rounds == 2 and st.best_s == pytest.approx(9.9e-3)
    assert stop_reason(st, policy).startswith("plateau")
    observe_round(st, 5e-3, 5.0, 1, policy)  # a real improvement resets the count
    assert st.stale_rounds == 0 and stop_reason(st, policy) is None
    assert stop_reason(st, PreemptionPolicy(enabled=False, patience=1)) is None
    assert len(st.recent) == 2  # only the window is kept


def test_low_gain_per_joule_stops_even_while_improving() -> None:
    policy = PreemptionPolicy(epsilon=0.0, patience=2, min_gain_us_per_kj=100.0)
    st = new_state(1, 1, best_s=1.0e-3)
    observe_round(st, 0.99e-3, 1000.0, 1, policy)  # 10 us gained for 1 kJ
    assert stop_reason(st, policy) is None  # window not full yet
    observe_round(st, 0.98e-3, 1000.0, 1, policy)  # 20 us over 2 kJ = 10 us/kJ < 100
    assert "low gain" in (stop_reason(st, policy) or "")
    heavy = new_state(1, 1, best_s=1.0e-3)
    for best in (0.99e-3, 0.98e-3):
        observe_round(heavy, best, 1000.0, 50, policy)  # called 50 times per inference: 500 us/kJ
    assert stop_reason(heavy, policy) is None


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        PreemptionPolicy(patience=0)


# -- the energy-aware budget ------------------------------------------------------------------
@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    database.upsert_hardware_class("x86", {"kind": "llvm", "num-cores": 2}, "x86")
    m, _ = database.add_model(name="m", source="zoo", format="x", sha256="a" * 64, artifact_uri="u")
    for i, (h, w) in enumerate([("aa", 1), ("bb", 4), ("cc", 1), ("dd", 1)]):
        wl, _ = database.add_workload(structural_hash=h, name=f"w{i}", op_kind="dense", flops=1.0, tir_json="{}")
        database.link_model_workload(m.id, wl.id, w)
    shard_queue.plan(database, "x86", target_trials=8)
    yield database
    database.close()


def _measure(db: Database, h: str, means: list[float | None], joules: float = 2.0) -> None:
    wl, hw = db.workload(h), db.hardware_class("x86")
    db.commit_measurements(NewMeasurement(wl.id, hw.id, f"{h}-{len(means)}-{i}", None if m is None else [m],
                                          error_kind=None if m is not None else "run", energy_j=joules)
                           for i, m in enumerate(means))


def test_outlook_is_weight_times_rate_over_joules(db: Database) -> None:
    _measure(db, "aa", [8e-3, 6e-3, 4e-3, 4e-3, 2e-3], joules=2.0)  # 6 ms gained over the last 4 trials
    _measure(db, "bb", [8e-3, 8e-3, 8e-3, 8e-3, 8e-3], joules=2.0)  # flat
    _measure(db, "cc", [None, None])  # nothing worked yet
    wl_ids = {h: db.workload(h).id for h in ("aa", "bb", "cc", "dd")}
    hw = db.hardware_class("x86")
    db.commit_measurements([NewMeasurement(wl_ids["aa"], hw.id, "aa-f", None, error_kind=FILTERED, energy_j=0.0)])
    views = priorities.outlooks(db, "x86", window=4)
    a, b, c, d = (views[wl_ids[h]] for h in ("aa", "bb", "cc", "dd"))
    assert a.trials == 5  # the filtered candidate is not a trial here
    assert a.rate_s_per_trial == pytest.approx(6e-3 / 4) and a.joules_per_trial == pytest.approx(2.0)
    assert a.gain_per_joule == pytest.approx(1 * (6e-3 / 4) / 2.0)
    assert b.rate_s_per_trial == 0 and not b.improving
    assert c.unexplored and d.unexplored and math.isinf(c.gain_per_joule) and c.improving
    assert c.joules_per_trial == pytest.approx(2.0)  # its own mean
    assert d.joules_per_trial == pytest.approx(2.0)  # the class mean: never measured

    priorities.reprioritise(db, "x86")
    order = []
    while (sh := shard_queue.lease(db, "x86", "w")) is not None:
        order.append(db.workload(sh.workload_id).structural_hash)
    assert order[:2] == ["cc", "dd"]  # unexplored first (equal weights)
    assert order[2:] == ["aa", "bb"]  # then by expected gain per joule: bb has the weight but gains nothing


def _outlook_by_definition(means: list[float | None], window: int) -> tuple[int, float | None, float]:
    """(trials, best, rate) read off the best-so-far curve trial by trial: the definition."""
    curve: list[float | None] = []
    for mean in means:
        prev = curve[-1] if curve else None
        curve.append(mean if mean is not None and (prev is None or mean < prev) else prev)
    best = curve[-1] if curve else None
    if best is None:
        return len(curve), None, 0.0
    k = min(window, len(curve) - 1)
    then = curve[-1 - k] if k > 0 else None
    rate = (then - best) / k if (then is not None and k > 0) else best / max(1, len(curve))
    return len(curve), best, max(rate, 0.0)


def test_outlooks_computed_in_the_database_match_the_definition(db: Database) -> None:
    import random

    rng = random.Random(7)
    hw = db.hardware_class("x86")
    history: dict[str, list[float | None]] = {h: [] for h in ("aa", "bb", "cc", "dd")}
    for i in range(160):  # interleaved, as several shards commit; errors and filtered rows mixed in
        h = rng.choice(["aa", "aa", "bb", "cc"])
        wl = db.workload(h)
        if rng.random() < 0.1:
            db.commit_measurements([NewMeasurement(wl.id, hw.id, f"f{i}", None, error_kind=FILTERED, energy_j=0.0)])
            continue
        mean = None if rng.random() < 0.15 else rng.uniform(1e-3, 9e-3)
        history[h].append(mean)
        db.commit_measurements([NewMeasurement(wl.id, hw.id, f"m{i}", None if mean is None else [mean],
                                               error_kind=None if mean is not None else "run", energy_j=1.5)])
    for window in (1, 4, 16, 500):
        views = priorities.outlooks(db, "x86", window=window)
        for h, means in history.items():
            trials, best, rate = _outlook_by_definition(means, window)
            got = views[db.workload(h).id]
            assert (got.trials, got.best_s is None) == (trials, best is None), (h, window)
            if best is not None:
                assert got.best_s == pytest.approx(best) and got.rate_s_per_trial == pytest.approx(rate), (h, window)


def test_reallocate_gives_unused_trials_to_improving_workloads(db: Database) -> None:
    _measure(db, "aa", [8e-3, 4e-3], joules=1.0)  # improving fast and cheap
    _measure(db, "bb", [8e-3, 7e-3], joules=1.0)  # improving slowly (but weight 4)
    _measure(db, "cc", [5e-3, 5e-3])  # flat: gets nothing
    _measure(db, "dd", [3e-3, 2e-3])  # the preempted one
    hw, dd = db.hardware_class("x86"), db.workload("dd")
    st = new_state(dd.id, hw.id, 2e-3)
    st.preempted = True
    db.save_tuning_state(st)
    granted = priorities.reallocate(db, "x86", 24, from_workload_id=dd.id, from_shard_id=None, min_chunk=8)
    got = {db.workload(g.workload_id).structural_hash: g.trials for g in granted}
    # aa gains 4 ms x weight 1 per J, bb 1 ms x weight 4 per J: equal expected gain, equal shares
    assert got == {"aa": 12, "bb": 12}
    # both still have their planned pending shard (8 trials): the trials are added to it, no new shard
    assert all(g.extended for g in granted)
    by_id = {s.id: s for s in shard_queue.list_shards(db, hardware="x86")}
    assert len(by_id) == 4 and all(by_id[g.shard_id].trials == 8 + 12 for g in granted)
    assert all(by_id[g.shard_id].history[-1]["event"] == "reallocated" for g in granted)
    assert db.tuning_state(dd.id, hw.id).freed_trials == 24
    # a preempted workload is never a recipient, and planning skips it; a recipient whose shard is
    # leased (no pending one left) gets a new shard
    bb_shard = next(s for s in by_id.values() if s.workload_id == db.workload("bb").id)
    assert shard_queue.lease(db, "x86", "w", shard_id=bb_shard.id) is not None
    again = priorities.reallocate(db, "x86", 8, from_workload_id=db.workload("aa").id, min_chunk=8)
    assert [(db.workload(g.workload_id).structural_hash, g.trials, g.extended) for g in again] == [("bb", 8, False)]
    new = next(s for s in shard_queue.list_shards(db, hardware="x86") if s.id == again[0].shard_id)
    assert (new.state, new.trials, new.history[0]["event"]) == ("pending", 8, "reallocated")
    _, view = shard_queue.plan(db, "x86", target_trials=100)
    assert {v.structural_hash: v.new_trials for v in view}["dd"] == 0
    assert [v.preempted for v in view if v.structural_hash == "dd"] == [True]


def test_nothing_improving_means_nothing_spent(db: Database) -> None:
    for h in ("aa", "bb", "cc", "dd"):
        _measure(db, h, [5e-3, 5e-3])
    assert priorities.reallocate(db, "x86", 16, from_workload_id=db.workload("aa").id) == []
