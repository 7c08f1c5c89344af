"""`tunefleet run`'s live line: what it says while tuning and once the run has moved on to the
build (the step named by a log record, since the database cannot tell); a budget's rounds, whose
count never goes back, and a speed-up estimate over every workload of the model, read from real
database rows."""

from __future__ import annotations

import datetime as dt
import io
import logging

import pytest
from rich.console import Console

from tunefleet.budget import Budget
from tunefleet.cli.progress import RunProgress, Snapshot
from tunefleet.config import load_settings
from tunefleet.db import Database, NewMeasurement
from tunefleet.db.tables import utcnow
from tunefleet.planning.rounds import plan_round
from tunefleet.vocab import DEFAULT_TRACE_JSON, DONE, LEASED, PENDING, STAGE_LOG_KEY

SNAP = Snapshot(workloads=3, workloads_done=2, measured=41, errors=1, trials_left=10, latency_ratio=0.25)


def test_the_line_while_tuning_says_workloads_candidates_time_left_and_speed_up() -> None:
    assert SNAP.line(65, 30) == "tuning 2/3 workloads | 41 candidates, 1 errors | 1:05, ~0:07 left | kernels ~4.00x faster than untuned"
    assert SNAP.line(65, 30, budget_left_s=835) == \
        "tuning 2/3 workloads | 41 candidates, 1 errors | 1:05, budget 13:55 left | kernels ~4.00x faster than untuned"


def test_after_tuning_the_line_names_the_step_and_drops_the_trials_estimate() -> None:
    assert SNAP.line(65, 30, None, "building the tuned model") == \
        "building the tuned model (2/3 workloads tuned) | 41 candidates, 1 errors | 1:05 | kernels ~4.00x faster than untuned"


def test_a_stage_log_record_changes_the_line_and_prints_it_at_once(tunefleet_home, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO, logger="tunefleet")  # as `run`'s log file sets it
    out = io.StringIO()
    progress = RunProgress(load_settings(), "mlp", "x86", Console(file=out, width=200), interval_s=3600)
    with progress:
        progress._show(SNAP)
        progress._show(SNAP)  # nothing new: not printed again (a log file stays short)
        logging.getLogger("tunefleet.delivery.build").info("building mlp", extra={STAGE_LOG_KEY: "building the tuned model"})
        logging.getLogger("tunefleet.delivery.build").info("a record without a stage")
        progress._show(SNAP)
    logging.getLogger("tunefleet.delivery.build").info("after the run", extra={STAGE_LOG_KEY: "elsewhere"})
    lines = out.getvalue().splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["tuning 2/3 workloads", "building the tuned model (2/3 workloads tuned)"]
    assert progress.stage == "building the tuned model"  # the handler left with the run


def test_after_a_budgets_rounds_the_line_names_the_last_round() -> None:
    snap = Snapshot(workloads=2, workloads_done=2, measured=41, errors=0, trials_left=0, latency_ratio=None, round=3,
                    timed=(4, 5))
    assert snap.line(65, 30) == "round 3: 2/2 workloads | 41 candidates, 0 errors | 1:05 | " \
                                "speed-up after every workload is measured (4/5)"
    assert snap.line(65, 30, None, "building the tuned model").startswith(
        "building the tuned model (after round 3) | 41 candidates")


# -- read from the database -------------------------------------------------------------------
@pytest.fixture
def cnn(db_url: str):  # type: ignore[no-untyped-def]
    """A model of three workloads called 1, 2 and 4 times on x86, in a fresh database (SQLite and
    PostgreSQL): ``(db, class id, model id, workload ids)``."""
    db = Database(db_url)
    hw = db.upsert_hardware_class("x86", {"kind": "llvm", "num-cores": 2}, "x86")
    model, _ = db.add_model(name="cnn", source="zoo", format="x", sha256="e" * 64, artifact_uri="u")
    ids = []
    for i, (name, weight) in enumerate((("fused_conv2d_add_relu", 1), ("transpose1", 2), ("fused_matmul_add", 4))):
        wl, _ = db.add_workload(structural_hash=f"{i:04x}", name=name, op_kind="x", flops=1e6, tir_json="{}")
        db.link_model_workload(model.id, wl.id, weight)
        ids.append(wl.id)
    yield db, hw.id, model.id, ids
    db.close()


def _tune(db: Database, hw: int, shard_id: int, workload: int, trials: int, *, default_s: float | None = 1.0,
          best_s: float | None = None) -> None:
    """What a worker does with a shard: lease it, commit its trials (the default schedule first,
    then candidates, the last one ``best_s``), end it done."""
    assert db.lease_shard(hw, "w", lease_s=60, shard_id=shard_id) is not None
    default = (NewMeasurement(workload, hw, DEFAULT_TRACE_JSON, [default_s], shard_id=shard_id) if default_s is not None
               else NewMeasurement(workload, hw, DEFAULT_TRACE_JSON, None, error_kind="run", error_msg="timeout",
                                   shard_id=shard_id))
    others = [NewMeasurement(workload, hw, f'{{"shard": {shard_id}, "candidate": {i}}}',
                             [best_s if best_s is not None and i == trials - 2 else 10.0], shard_id=shard_id)
              for i in range(trials - 1)]
    db.commit_measurements([default, *others])
    assert db.end_lease(shard_id, "w", state=DONE, error=None, event="done")


def test_a_new_round_starts_a_count_of_its_own_and_no_line_goes_back(cnn, tunefleet_home):  # type: ignore[no-untyped-def]
    """A budget's second round re-plans shards for some workloads only: counted over every
    workload, "done" would drop from 3/3 when it opens; the line counts the round's workloads."""
    db, hw, model, _ = cnn
    out = io.StringIO()  # not a terminal: the plain lines a log file gets
    progress = RunProgress(load_settings(), "cnn", "x86", Console(file=out, width=200), interval_s=3600)
    since = utcnow() - dt.timedelta(seconds=1)
    readings: list[Snapshot] = []

    def look() -> None:
        snap = progress.read(db)
        assert snap is not None
        readings.append(snap)
        progress._show(snap)

    first = plan_round(db, "x86", [model], Budget.parse("200"), since, min_trials=4, batch=4)
    assert first.round == 1 and len(first.shards) == 3
    look()
    for shard in first.shards:
        _tune(db, hw, shard.id, shard.workload_id, shard.trials, best_s=0.5)
        look()
    second = plan_round(db, "x86", [model], Budget.parse("200"), since, min_trials=4, batch=4)
    again = sorted({s.workload_id for s in second.shards})
    assert second.round == 2 and again, "the second round re-plans workloads"
    assert len(second.shards) == len(again)  # a shard per workload
    rows = db.model_progress(model, hw, since)
    settled = [r for r in rows if not (r.shards.get(PENDING) or r.shards.get(LEASED))]
    assert len(settled) == 3 - len(again)  # what a count over every workload would now say
    look()
    _tune(db, hw, second.shards[0].id, second.shards[0].workload_id, second.shards[0].trials)
    look()

    positions = [s.position for s in readings]
    assert positions == sorted(positions), positions
    heads = [line.split(" | ")[0] for line in out.getvalue().splitlines()]
    assert heads == [f"round 1: {n}/3 workloads" for n in range(4)] + \
        [f"round 2: 0/{len(again)} workloads", f"round 2: 1/{len(again)} workloads"]


def test_workloads_the_deadline_cancelled_are_not_counted_done(cnn, tunefleet_home):  # type: ignore[no-untyped-def]
    """A wall-time budget's deadline cancels the round's shards not started: the line said
    "round 1: 34/34 workloads" where 23 had been tuned; it names them apart."""
    db, hw, model, _ = cnn
    since = utcnow() - dt.timedelta(seconds=1)
    first = plan_round(db, "x86", [model], Budget.parse("200"), since, min_trials=4, batch=4)
    tuned, *rest = first.shards
    _tune(db, hw, tuned.id, tuned.workload_id, tuned.trials, best_s=0.5)
    assert sorted(db.cancel_shards([s.id for s in rest])) == sorted(s.id for s in rest)
    snap = Snapshot.of(db.model_progress(model, hw, since))
    assert (snap.workloads, snap.workloads_done, snap.cancelled) == (3, 1, 2)
    assert snap.line(65, 30).startswith("round 1: 1/3 workloads (2 cancelled) | ")
    assert snap.line(65, 30, None, "building the tuned model").startswith("building the tuned model (after round 1) | ")


def test_the_speed_up_counts_every_workload_and_waits_until_each_has_a_run_time(cnn):  # type: ignore[no-untyped-def]
    db, hw, model, (conv, transpose, dense) = cnn  # called 1, 2 and 4 times
    since = utcnow() - dt.timedelta(seconds=1)
    a, b, c = db.add_shards(hw, [(wl, 4, 1.0) for wl in (conv, transpose, dense)])
    _tune(db, hw, a.id, conv, 4, default_s=4.0, best_s=1.0)
    _tune(db, hw, b.id, transpose, 4, default_s=2.0)  # the layout transform: nothing beat its default
    snap = Snapshot.of(db.model_progress(model, hw, since))
    # Over the two measured workloads alone it would read (1×1 + 2×2) / (1×4 + 2×2): 1.60x faster.
    assert (snap.latency_ratio, snap.timed) == (None, (2, 3))
    assert snap.line(65, 30).endswith(" | speed-up after every workload is measured (2/3)")

    _tune(db, hw, c.id, dense, 4, default_s=None, best_s=0.5)  # its default failed to run
    snap = Snapshot.of(db.model_progress(model, hw, since))
    # Every workload, by its calls; the dense one's best stands in for its default on both sides.
    assert snap.latency_ratio == pytest.approx((1 * 1.0 + 2 * 2.0 + 4 * 0.5) / (1 * 4.0 + 2 * 2.0 + 4 * 0.5))
    assert snap.timed is None
    assert snap.line(65, 30).endswith(" | kernels ~1.43x faster than untuned")

    queue = Snapshot.of(db.queue_progress([a.id, b.id, c.id], since), estimate=False)  # no model: no estimate
    assert (queue.latency_ratio, queue.timed, queue.round) == (None, None, None)
    assert queue.line(65, 30) == "tuning 3/3 workloads | 12 candidates, 1 errors | 1:05"


def test_the_line_reads_nothing_while_the_build_times_the_model(tunefleet_home) -> None:  # type: ignore[no-untyped-def]
    """A query a second on the cores the build times on would slow the calls timed (PyTorch eager
    most: it returns to Python between operators), so the run's table would disagree with the bench."""
    import time

    from tunefleet.delivery.timing import time_alternating, timing_now

    progress = RunProgress(load_settings(), "mlp", "x86", Console(file=io.StringIO()), interval_s=0.02)
    reads: list[bool] = []  # whether each reading happened while the timing ran
    progress.read = lambda db: reads.append(timing_now())  # type: ignore[method-assign,assignment,return-value]
    with progress:
        while not reads:
            time.sleep(0.01)
        time_alternating({"call": lambda: time.sleep(0.05)}, rounds=3, round_s=0)
        assert not timing_now()
        before = len(reads)
        while len(reads) == before:  # it reads again once the timing is over
            time.sleep(0.01)
    # (one reading may have checked just before the timing began: the timing lasts about a second,
    # about 50 readings without the pause)
    assert sum(reads) <= 1 and len(reads) >= 2, f"{sum(reads)} of {len(reads)} readings happened while the model was timed"
