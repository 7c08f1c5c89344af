"""Live progress of a model's tuning on one hardware class, read from the database.

The tuning itself may run in this process, in worker processes or on other nodes; what they
commit is the truth, so :class:`RunProgress` polls the database (its own connection, once a
second) rather than listening to any one worker. In a terminal it keeps one live line up to date
(rich); otherwise it prints a plain line when a workload finishes, and at most one line a minute
in between, so a log file stays short.

What the database cannot tell — the run has moved on from tuning to building the model — comes
from the log: a record carrying :data:`~tunefleet.vocab.STAGE_LOG_KEY` (``extra=``) in this
process names the step the line shows from then on (the ``tunefleet`` logger is at INFO in
``run``, which logs to a file).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tunefleet.vocab import STAGE_LOG_KEY

if TYPE_CHECKING:
    from rich.console import Console

    from tunefleet.config import Settings
    from tunefleet.db import Database
    from tunefleet.db.reports import WorkloadProgress


@dataclass(frozen=True)
class Snapshot:
    """One reading of a model's tuning on a class."""

    workloads: int
    workloads_done: int
    measured: int
    """Candidates committed since the run started (measured, errored or filtered)."""
    errors: int
    trials_left: int
    latency_ratio: float | None
    """Σ weight × best / Σ weight × default over workloads whose default schedule was measured:
    the model's estimated latency so far as a fraction of the untuned build's."""

    @classmethod
    def of(cls, rows: list[WorkloadProgress]) -> Snapshot:
        done = sum(1 for r in rows if r.shards and not (r.shards.get("pending") or r.shards.get("leased")))
        with_default = [r for r in rows if r.default_s and r.best_s]
        ratio = (sum(r.weight * r.best_s for r in with_default) / sum(r.weight * r.default_s for r in with_default)
                 if with_default else None)
        return cls(len(rows), done, sum(r.measured_since for r in rows), sum(r.errors_since for r in rows),
                   sum(max(0, r.trials - r.spent) for r in rows), ratio)

    def line(self, elapsed_s: float, tuning_s: float | None, budget_left_s: float | None = None,
             stage: str | None = None) -> str:
        """``tuning 2/3 workloads | 41 candidates, 0 errors | 1:05, ~0:30 left | 3.10x faster than untuned``
        (with a wall-time budget, the time left is the budget's: ``1:05, budget 13:55 left``);
        after the tuning, the ``stage`` it is in: ``building the tuned model (3/3 workloads tuned) | ...``."""
        parts = [f"{stage} ({self.workloads_done}/{self.workloads} workloads tuned)" if stage
                 else f"tuning {self.workloads_done}/{self.workloads} workloads",
                 f"{self.measured} candidates, {self.errors} errors"]
        clock = _clock(elapsed_s)
        if budget_left_s is not None:
            clock += f", budget {_clock(max(0.0, budget_left_s))} left"
        elif tuning_s and self.measured and self.trials_left and not stage:
            clock += f", ~{_clock(self.trials_left * tuning_s / self.measured)} left"
        parts.append(clock)
        if self.latency_ratio:
            parts.append(f"{1 / self.latency_ratio:.2f}x faster than untuned")
        return " | ".join(parts)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else f"{minutes}:{secs:02d}"


class RunProgress:
    """A background thread showing how the tuning of ``model`` on ``hardware`` goes.

    Parameters
    ----------
    settings:
        Where the database is (the thread opens its own connection).
    model, hardware:
        The model's name (as ingested) and the class; without a model, the shards of the class
        that were pending or leased when the display started (what a ``tune`` worker drains).
    console:
        Where to print; live updates only when it is a terminal.
    interval_s:
        Seconds between readings.
    ends_at:
        When a wall-time budget ends (seconds since the epoch): the line shows the time left of it
        instead of an estimate from the trials planned (a budget plans them round by round).
    """

    def __init__(self, settings: Settings, model: str | None, hardware: str, console: Console, *,
                 interval_s: float = 1.0, ends_at: float | None = None) -> None:
        self.settings, self.model, self.hardware, self.console = settings, model, hardware, console
        self.interval_s = interval_s
        self.ends_at = ends_at
        self.started = time.monotonic()
        self.since = _utcnow()
        self.last: Snapshot | None = None
        self._first_row_at: float | None = None
        self._printed_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tunefleet-progress", daemon=True)
        self._live: object | None = None
        self._queue: list[int] | None = None
        self.stage: str | None = None
        """The step after tuning the run is in (None: tuning), from the log."""
        self._printed_stage: str | None = None
        self._stage_handler = _StageHandler(self)

    def __enter__(self) -> RunProgress:
        if self.console.is_terminal:
            from rich.live import Live
            from rich.text import Text

            self._live = Live(Text("preparing: ingest, extract, plan"), console=self.console, transient=True,
                              refresh_per_second=4)
            self._live.__enter__()  # type: ignore[attr-defined]
        logging.getLogger("tunefleet").addHandler(self._stage_handler)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        logging.getLogger("tunefleet").removeHandler(self._stage_handler)
        self._stop.set()
        self._thread.join(timeout=5)
        if self._live is not None:
            self._live.__exit__(None, None, None)  # type: ignore[attr-defined]

    def _run(self) -> None:
        from tunefleet.db import Database

        db = Database.from_settings(self.settings, check_schema=False)
        try:
            while not self._stop.wait(self.interval_s):
                try:
                    self._show(self.read(db))
                except Exception:  # a busy database (a long write) must not end the display
                    logging.getLogger(__name__).debug("progress not read this time", exc_info=True)
        finally:
            db.close()

    def read(self, db: Database) -> Snapshot | None:
        """The current reading, or None before the model's workloads are stored."""
        hw = db.hardware_class(self.hardware)
        if self.model is None:
            if self._queue is None:
                self._queue = [s.id for s in db.shards(states=["pending", "leased"], hardware_class_id=hw.id)]
            rows = db.queue_progress(self._queue, self.since)
        else:
            models = [m for m in db.models() if m.name == self.model]
            if not models:
                return None
            rows = db.model_progress(models[-1].id, hw.id, self.since)
        if not rows or not any(r.shards for r in rows):
            return None
        snap = Snapshot.of(rows)
        if snap.measured and self._first_row_at is None:
            self._first_row_at = time.monotonic()
        return snap

    def _show(self, snap: Snapshot | None) -> None:
        now = time.monotonic()
        tuning_s = now - self._first_row_at if self._first_row_at is not None else None
        if snap is None:
            return
        stage = self.stage
        text = snap.line(now - self.started, tuning_s,
                         self.ends_at - time.time() if self.ends_at is not None else None, stage)
        if self._live is not None:
            from rich.text import Text

            self._live.update(Text(text, overflow="ellipsis", no_wrap=True))  # type: ignore[attr-defined]
        elif (self.last is None or snap.workloads_done != self.last.workloads_done or stage != self._printed_stage
              or now - self._printed_at >= 60):
            self.console.print(text, highlight=False, soft_wrap=True)
            self._printed_at, self._printed_stage = now, stage
        self.last = snap


class _StageHandler(logging.Handler):
    """Takes the stage named by a ``tunefleet`` log record's :data:`~tunefleet.vocab.STAGE_LOG_KEY`."""

    def __init__(self, progress: RunProgress) -> None:
        super().__init__(logging.INFO)
        self.progress = progress

    def emit(self, record: logging.LogRecord) -> None:
        stage = getattr(record, STAGE_LOG_KEY, None)
        if stage is not None:
            self.progress.stage = str(stage)


def _utcnow() -> dt.datetime:
    from tunefleet.db.tables import utcnow

    return utcnow() - dt.timedelta(seconds=1)  # SQLite's timestamps have second resolution
