"""A model-level budget on real tuning (the tiny mlp, SQLite): rounds spent to the trial by one
tuner that stays up, and a deadline that ends a shard in flight done-short after its batch."""

from __future__ import annotations

import pytest

from tunefleet.budget import Budget
from tunefleet.config import load_settings
from tunefleet.db import Database
from tunefleet.engine.options import TuneOptions
from tunefleet.engine.worker import Tuner, drain
from tunefleet.hardware import seed_hardware_classes
from tunefleet.models.ingest import ingest
from tunefleet.models.workloads import extract
from tunefleet.planning.rounds import Deadline, Rounds
from tunefleet.store import LocalStore
from tunefleet.vocab import DONE

pytestmark = pytest.mark.slow


def test_rounds_and_a_deadline_on_real_tuning(tmp_path) -> None:  # type: ignore[no-untyped-def]
    settings = load_settings(home=tmp_path / "home", database_url=f"sqlite:///{tmp_path / 'tunefleet.db'}")
    db = Database.from_settings(settings)
    seed_hardware_classes(db, settings)
    store = LocalStore(settings.effective_store_path)
    model = ingest(db, store, "mlp").model
    extract(db, store, model, "x86")
    hw = db.hardware_class("x86")
    options = TuneOptions(seed=0, trials_per_iter=4, transfer=False)
    tuner = Tuner(db, "x86", options)
    try:
        rounds = Rounds("x86", [model.id], Budget(trials=28), min_trials=8, batch=4)
        summary = drain(db, "x86", options, tuner=tuner, refill=rounds)
        assert (summary.measured, summary.shards_done, summary.shards_failed) == (28, 4, 0)  # 3 minimums + 1 share
        assert summary.budget is not None and (summary.budget["trials"], summary.budget["rounds"]) == (28, 2)
        assert summary.stopped == "trial budget spent"
        assert all(db.count_measurements(wl.id, hw.id) >= 8 for wl, _ in db.workloads(model.id))

        # a deadline that passes during a shard's first batch: it stops after that batch, done-short
        now = [1_000.0]
        deadline = Deadline(now[0] + 100, clock=lambda: now[0])
        wl = db.workloads(model.id)[0][0]
        (shard,) = db.add_shards(hw.id, [(wl.id, 12, 1e15)])

        def late(shard_id: int, rows: object) -> None:
            now[0] += 1_000  # the batch "took" past the deadline

        result = tuner.tune_next(db, "me", options, on_batch=late, deadline=deadline)
        # one batch of 4, less any candidate the search proposed again (already measured: skipped, and
        # MetaSchedule's search is not repeatable to the candidate even with a seed); a batch of known
        # candidates only is asked again, up to 8 times (ResumingSearch)
        assert result is not None and result.shard_id == shard.id and result.state == DONE
        assert 1 <= result.measured <= 4 and result.skipped_known <= 8 * 4
        last = db.shard(shard.id).history[-1]
        assert (last["event"], last["cause"], last["unused_trials"]) == ("done-short", "stopped", 12 - result.measured)
        assert last["reason"] == "deadline: reached"
        assert tuner.tune_next(db, "me", options, deadline=deadline) is None  # nothing leased after it
    finally:
        tuner.close()
        db.close()
