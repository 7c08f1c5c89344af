"""`tunefleet run`'s live line: what it says while tuning and once the run has moved on to the
build (the step named by a log record, since the database cannot tell)."""

from __future__ import annotations

import io
import logging

from rich.console import Console

from tunefleet.cli.progress import RunProgress, Snapshot
from tunefleet.config import load_settings
from tunefleet.vocab import STAGE_LOG_KEY

SNAP = Snapshot(workloads=3, workloads_done=2, measured=41, errors=1, trials_left=10, latency_ratio=0.25)


def test_the_line_while_tuning_says_workloads_candidates_time_left_and_speed_up() -> None:
    assert SNAP.line(65, 30) == "tuning 2/3 workloads | 41 candidates, 1 errors | 1:05, ~0:07 left | 4.00x faster than untuned"
    assert SNAP.line(65, 30, budget_left_s=835) == \
        "tuning 2/3 workloads | 41 candidates, 1 errors | 1:05, budget 13:55 left | 4.00x faster than untuned"


def test_after_tuning_the_line_names_the_step_and_drops_the_trials_estimate() -> None:
    assert SNAP.line(65, 30, None, "building the tuned model") == \
        "building the tuned model (2/3 workloads tuned) | 41 candidates, 1 errors | 1:05 | 4.00x faster than untuned"


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
