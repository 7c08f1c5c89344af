"""Live progress of a model's tuning on one hardware class, read from the database.

The tuning itself may run in this process, in worker processes or on other nodes; what they
commit is the truth, so :class:`RunProgress` polls the database (its own connection, once a
second) rather than listening to any one worker. In a terminal it keeps one live line up to date
(rich); otherwise it prints a plain line when a workload finishes or a budget's round opens, and
at most one line a minute in between, so a log file stays short.

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

from tunefleet.delivery.timing import timing_now
from tunefleet.vocab import CANCELLED, LEASED, PENDING, STAGE_LOG_KEY

if TYPE_CHECKING:
    from rich.console import Console

    from tunefleet.config import Settings
    from tunefleet.db import Database
    from tunefleet.db.reports import WorkloadProgress


@dataclass(frozen=True)
class Snapshot:
    """One reading of a model's tuning on a class.

    With a budget, the workload count is the current round's: a round re-plans shards for some
    workloads, so a count over all of them ("workloads with nothing pending") would go backwards
    each time a round opens (36/36, then 33/36). Within a round the count only grows, and a new
    round's line starts with a higher round number, so no line reads as going back.
    """

    workloads: int
    """Workloads in the current round (without rounds: the model's, or the queue's)."""
    workloads_done: int
    """Those of them with no shard (of the round) pending or leased, and one that was not cancelled."""
    measured: int
    """Candidates committed since the run started (measured, errored or filtered)."""
    errors: int
    trials_left: int
    latency_ratio: float | None
    """The model's kernels' time with the best schedules so far as a fraction of their time with
    the default ones, over every workload (:meth:`of`); None until every workload has a run time."""
    round: int | None = None
    """The budget's latest round (None: no rounds, e.g. ``--trials``)."""
    timed: tuple[int, int] | None = None
    """``(workloads with a measured run time, workloads of the model)`` while the estimate waits for
    the rest (None: the estimate is shown, or there is no model to estimate for)."""
    cancelled: int = 0
    """Workloads of the round whose every shard was cancelled (the deadline came first): not done."""

    @classmethod
    def of(cls, rows: list[WorkloadProgress], *, estimate: bool = True) -> Snapshot:
        """The reading of a model's rows (:meth:`~tunefleet.db.reports.ReportsMixin.model_progress`);
        ``estimate=False`` for rows without run times (a queue's, no model to weigh by).

        The estimate is Σ weight × best / Σ weight × default over *every* workload the model runs
        on the class — the transposes its extraction recipe adds around conv2d converted to NHWC
        on CPU included, since the tuned build runs them too. A workload whose default schedule
        has no run time (it failed) counts its best in both sums, which can only understate the
        speed-up. While some workload has no run time at all there is no figure (:attr:`timed`
        counts those that have one) rather than a ratio over part of the model.

        It is a sum of kernels, which the line says: the database keeps no latency of the untuned
        build itself (``tunefleet build`` times it and reports it, it stores nothing), so the
        reference is the default schedules of the same workloads. The untuned build differs from
        that reference (the frontend's layout without the recipe's transposes, no prepacking) and
        neither sum sees the time between kernels, so on a small model the builds' real ratio can
        be far from this; the build's latency table that follows the run has both real figures.
        """
        current = max((n for r in rows for n in r.rounds), default=None)
        states = ([r.shards for r in rows] if current is None
                  else [r.rounds[current] for r in rows if current in r.rounds])
        settled = [st for st in states if st and not (st.get(PENDING) or st.get(LEASED))]
        cancelled = sum(1 for st in settled if set(st) == {CANCELLED})
        ratio, timed = None, None
        if estimate:
            with_time, tuned, untuned = 0, 0.0, 0.0
            for r in rows:
                if r.best_s is not None:
                    with_time += 1
                    tuned += r.weight * r.best_s
                    untuned += r.weight * (r.default_s if r.default_s is not None else r.best_s)
            if with_time < len(rows):
                timed = (with_time, len(rows))
            elif untuned > 0:
                ratio = tuned / untuned
        return cls(len(states), len(settled) - cancelled, sum(r.measured_since for r in rows),
                   sum(r.errors_since for r in rows), sum(max(0, r.trials - r.spent) for r in rows), ratio, current,
                   timed, cancelled)

    @property
    def position(self) -> tuple[int, int]:
        """``(round, workloads done)``: never smaller in a later reading of one run."""
        return (self.round or 0, self.workloads_done)

    def line(self, elapsed_s: float, tuning_s: float | None, budget_left_s: float | None = None,
             stage: str | None = None) -> str:
        """``round 2: 3/5 workloads | 41 candidates, 0 errors | 1:05, budget 13:55 left | kernels ~3.10x
        faster than untuned`` (without rounds: ``tuning 2/3 workloads``; without a wall-time budget, an
        estimate from the trials planned: ``1:05, ~0:30 left``; before every workload has a run
        time: ``speed-up after every workload is measured (2/3)``); after the tuning, the ``stage``
        it is in: ``building the tuned model (after round 2) | ...``."""
        count = f"{self.workloads_done}/{self.workloads} workloads"
        if self.cancelled:
            count += f" ({self.cancelled} cancelled)"
        if stage:
            head = f"{stage} (after round {self.round})" if self.round else f"{stage} ({count} tuned)"
        else:
            head = f"round {self.round}: {count}" if self.round else f"tuning {count}"
        parts = [head, f"{self.measured} candidates, {self.errors} errors"]
        clock = _clock(elapsed_s)
        if budget_left_s is not None:
            clock += f", budget {_clock(max(0.0, budget_left_s))} left"
        elif tuning_s and self.measured and self.trials_left and not stage:
            clock += f", ~{_clock(self.trials_left * tuning_s / self.measured)} left"
        parts.append(clock)
        if self.latency_ratio:
            parts.append(f"kernels ~{1 / self.latency_ratio:.2f}x faster than untuned")
        elif self.timed is not None:
            parts.append(f"speed-up after every workload is measured ({self.timed[0]}/{self.timed[1]})")
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

            # Redrawn by this display's thread, after each reading: no refresh thread of Rich's own
            # drawing while the build times the model (see _run).
            self._live = Live(Text("preparing: ingest, extract, plan"), console=self.console, transient=True,
                              auto_refresh=False)
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
                if timing_now():  # the build is timing the model on these cores: no query, no redraw
                    continue
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
        snap = Snapshot.of(rows, estimate=self.model is not None)
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

            self._live.update(Text(text, overflow="ellipsis", no_wrap=True), refresh=True)  # type: ignore[attr-defined]
        elif (self.last is None or snap.position != self.last.position or stage != self._printed_stage
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
