"""Re-timing each workload's fastest recorded schedules before a build, side by side.

A workload's best schedule is the fastest of every candidate tuning measured for it, each timed
once (five cold runs). On a noisy machine the fastest of many noisy figures is lower than what
that schedule runs at, and the more candidates, the luckier the record: the build then takes the
luckiest measurement rather than the fastest schedule, and more tuning "improves" a workload by
finding a luckier figure (docs/performance.md, issue 31's rows: "the tuner keeps the luckiest
measurement").

So a build asked to (``confirm_top``; off by default: on that VM choosing so did not make resnet18
measurably faster, for about a minute per build) first has :func:`confirm_bests` re-time, on this node, each workload's ``top`` fastest
recorded schedules in alternating rounds (every schedule once per round, so drift spreads over
all of them) and commits each schedule's round means as a new measurement of it (the next
``attempt``, ``measure_mode`` ``retimed:<rounds>``). :meth:`~tunefleet.db.measurements.MeasurementsMixin.best_measurements`
ranks a schedule by its latest measurement, so the build takes the fastest re-timed one. A
workload whose fastest schedule is a re-timed one is left alone: a second build re-times nothing
(idempotent), a build after more tuning re-times only the workloads with a new record. When the
re-timing demotes a workload's records below one not re-timed, the next pass re-times its new top
(at most :data:`PASSES`; the report counts the workloads left so).

Every build (no setting) also times each Winograd workload's fastest schedule beside its rewrite
split by tile (:func:`confirm_by_tile`); those figures are committed as paired measurements
(``paired:<rounds>``), which decide between the two and rank nothing.

:func:`retime` is the timing itself, shared with ``bench/remeasure_best.py``.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tunefleet.vocab import BUILD_ERROR, CONFIRM_ROUNDS, RUN_ERROR

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.db.tables import HardwareClass

log = logging.getLogger(__name__)

PASSES = 2
"""Re-timing passes at most. After a pass, a workload's re-timed schedules can all fall behind a
record below them that was not re-timed (the next lucky one): the next pass re-times its new top."""
RETIMED_MODE = "retimed"
"""``measure_mode`` prefix of a re-timing's measurement (``retimed:<rounds>``)."""


@dataclass
class Confirmation:
    """What :func:`confirm_bests` re-timed, and what it changed."""

    workloads: int = 0
    """Workloads re-timed (each ``top`` schedules, or all it has when fewer)."""
    schedules: int = 0
    """Schedules re-timed (a schedule re-timed in two passes counts twice)."""
    failed: int = 0
    """Re-timings that failed to build or run (committed as errors: the schedule leaves the best)."""
    changed: int = 0
    """Workloads now built with another schedule than their fastest record."""
    unsettled: int = 0
    """Workloads whose fastest schedule is still a record not re-timed after the last pass."""
    recorded_s: float = 0.0
    """The re-timed workloads' fastest records, weight x run time summed."""
    confirmed_s: float = 0.0
    """The same workloads' fastest schedules after re-timing, weight x run time summed."""
    seconds: float = 0.0
    rounds: int = CONFIRM_ROUNDS
    top: int = 0
    passes: int = 0
    """Passes run."""
    workload_ids: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def summary(self) -> str:
        if not self.workloads:
            return "re-timing: every workload's fastest schedule was re-timed before (nothing to do)"
        line = (f"re-timed the {self.top} fastest schedules of {self.workloads} workloads side by side "
                f"({self.rounds} rounds, {self.seconds:.0f} s): their records summed {self.recorded_s * 1e3:.2f} ms, "
                f"the fastest re-timed {self.confirmed_s * 1e3:.2f} ms; {self.changed} workloads build with "
                "another schedule than their record")
        if self.unsettled:
            line += (f"; {self.unsettled} workloads still build with a record not re-timed "
                     f"(their re-timed schedules fell behind one in each of {self.passes} passes)")
        if self.failed:
            line += f"; {self.failed} re-timings failed (left out)"
        return line


@dataclass
class Retimed:
    """One schedule's re-timing: a mean per round that ran (seconds), or why it failed."""

    runs: list[float] = field(default_factory=list)
    error: str | None = None
    error_kind: str | None = None  # BUILD_ERROR | RUN_ERROR | None

    @property
    def failed(self) -> bool:
        return self.error is not None or not self.runs


def retime(hw: HardwareClass, rows: list[tuple[Any, Any]], *, rounds: int = CONFIRM_ROUNDS,
           threads: int | None = None) -> list[Retimed]:
    """Build the given recorded schedules and time them in ``rounds`` alternating rounds with the
    tuner's evaluator (:func:`tunefleet.tvm.runner.make_runner`), serially, in this process's
    runner.

    ``rows`` are (workload, measurement) pairs (a :class:`~tunefleet.db.tables.Workload` and a
    row of :meth:`best_measurements`). Returns, per row, what its rounds measured.
    """
    from tunefleet.tvm.without_torch import import_tvm

    import_tvm()  # without importing torch, as the tuner does
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tunefleet.tvm.builder import PersistentBuilder
    from tunefleet.tvm.runner import make_runner, stop_runner
    from tunefleet.tvm.targets import make_target
    from tunefleet.tvm.threads import class_threads, use_threads
    from tunefleet.tvm.traces import candidate

    target = make_target(hw.target)
    threads = use_threads(threads or class_threads(hw.target))
    mods: dict[int, Any] = {}
    cands = []
    for wl, m in rows:
        mod = mods.setdefault(wl.id, tvm.ir.load_json(wl.tir_json))
        cands.append(candidate(mod, m.trace_json, m.args_info))
    out = [Retimed() for _ in rows]
    with PersistentBuilder(max_workers=threads) as builder:
        built = builder.build([ms.builder.BuilderInput(c.sch.mod, target) for c in cands])
    for i, b in enumerate(built):
        if b.error_msg:
            out[i].error, out[i].error_kind = last_line(b.error_msg), BUILD_ERROR
    ok = [i for i, b in enumerate(built) if not b.error_msg]
    runner = make_runner(target)
    try:
        for _ in range(rounds):
            futures = runner.run([ms.runner.RunnerInput(built[i].artifact_path, "cpu", cands[i].args_info)
                                  for i in ok])
            for i, f in zip(ok, futures):
                res = f.result()
                if res.error_msg is None:
                    out[i].runs.append(statistics.fmean(float(x) for x in res.run_secs))
                else:
                    out[i].error, out[i].error_kind = last_line(res.error_msg), RUN_ERROR
    finally:
        # the build that follows times the model in this process: no measuring worker may live on
        stop_runner(runner)
    return out


def last_line(error: str) -> str:
    """A TVM error's last line (where it says what went wrong), at most 200 characters."""
    lines = error.strip().splitlines()
    return lines[-1][:200] if lines else "failed"


def retimed_rows(db: Database, hw: HardwareClass, todo: list[tuple[Any, Any]], timed: list[Retimed], rounds: int,
                 fingerprint: str, mode: str = RETIMED_MODE) -> list[Any]:
    """Each re-timed schedule as its next attempt (``measure_mode`` ``<mode>:<rounds>``), or as the
    error its re-timing failed with. The next attempt after every one stored, paired ones included
    (the ranking's latest may not be the latest: a commit reusing an attempt would be dropped as a
    duplicate)."""
    from tunefleet.tvm.commit import CandidateCommitter

    shas: dict[int, set[str]] = {}
    for wl, m in todo:
        shas.setdefault(wl.id, set()).add(m.trace_sha256)
    latest = {wl_id: db.latest_attempts(wl_id, hw.id, keys) for wl_id, keys in shas.items()}
    return [CandidateCommitter(db, wl.id, hw.id, target=fingerprint).row(
        m.trace_json, None if t.failed else t.runs, args_info=m.args_info,
        repeat=latest[wl.id].get(m.trace_sha256, -1) + 1,
        error_kind=(t.error_kind or RUN_ERROR) if t.failed else None,
        error_msg=(t.error or "no round ran") if t.failed else None,
        measure_mode=f"{mode}:{rounds}", trace_sha256=m.trace_sha256)
        for (wl, m), t in zip(todo, timed, strict=True)]


def confirm_bests(db: Database, hw: HardwareClass, weights: dict[int, int], *, top: int = 3,
                  rounds: int = CONFIRM_ROUNDS, passes: int = PASSES) -> Confirmation:
    """Re-time each workload's ``top`` fastest schedules on this node and commit the figures, so
    that the build takes the fastest re-timed one (see the module docstring).

    ``weights`` maps the model's workload ids to their calls in the model. A workload with one
    schedule measured has nothing to choose from and is left alone. The node must run the
    class's code (the caller checks). A schedule whose re-timing fails to build or run is
    committed as that error, so it leaves the best; it is counted in ``failed``.
    """
    from tunefleet.tvm.targets import make_target, target_fingerprint

    started = time.monotonic()
    result = Confirmation(rounds=rounds, top=top)
    if top < 2:
        return result
    fingerprint = target_fingerprint(make_target(hw.target))
    workloads: dict[int, Any] = {}
    record: dict[int, tuple[str, float]] = {}  # each re-timed workload's fastest record, before any re-timing
    for _ in range(passes):
        todo = []
        for wl_id in weights:
            best = db.best_measurements(wl_id, hw.id, top)
            if len(best) < 2 or best[0].attempt > 0:
                continue
            record.setdefault(wl_id, (best[0].trace_sha256, float(best[0].mean_run_s)))
            if wl_id not in workloads:
                workloads[wl_id] = db.workload(wl_id)
            wl = workloads[wl_id]
            todo += [(wl, m) for m in best]
        if not todo:
            break
        log.info("re-timing %d schedules of %d workloads in %d rounds", len(todo), len({w.id for w, _ in todo}),
                 rounds)
        timed = retime(hw, todo, rounds=rounds)
        result.failed += sum(t.failed for t in timed)
        db.commit_measurements(retimed_rows(db, hw, todo, timed, rounds, fingerprint))
        result.schedules += len(todo)
        result.passes += 1
    for wl_id, (sha, recorded) in record.items():
        best = db.best_measurements(wl_id, hw.id, 1)
        weight = weights[wl_id]
        result.recorded_s += weight * recorded
        result.confirmed_s += weight * (float(best[0].mean_run_s) if best else recorded)
        result.changed += bool(best) and best[0].trace_sha256 != sha
        result.unsettled += bool(best) and best[0].attempt == 0
    result.workloads = len(record)
    result.workload_ids = sorted(record)
    result.seconds = time.monotonic() - started
    return result


def confirm_by_tile(db: Database, hw: HardwareClass, weights: dict[int, int], *,
                    rounds: int = CONFIRM_ROUNDS) -> int:
    """Time each Winograd workload's fastest schedule beside its rewrite whose threads keep their
    own tiles (:func:`tunefleet.tvm.partition.thread_local`), side by side on this node, and commit
    both figures as paired measurements (each schedule's next attempt, ``measure_mode``
    ``paired:<rounds>``, :data:`~tunefleet.db.measurements.PAIRED_MODE`). The pairing then decides
    between the two (:func:`tunefleet.tvm.partition.build_order`): two figures of one moment, not a
    record and a rewrite measured minutes apart, while the VM's cores may have shared a cache for
    one and not the other. Paired figures rank nothing, so a pairing at a slow moment leaves the
    workload's ranking as tuning measured it. Returns the workloads timed so.

    A workload whose fastest schedule splits by tile already, or has no rewrite, is left alone; so
    is one whose fastest schedule was paired with its rewrite before (that pairing decides), so a
    later build times only the workloads whose fastest record is new since. A schedule that fails
    to build or run is committed as that error. The node must run the class's code (the caller
    checks).
    """
    from types import SimpleNamespace

    from tunefleet.db.measurements import PAIRED_MODE
    from tunefleet.tvm.partition import rewrite_of, splits_by_tile
    from tunefleet.tvm.targets import make_target, target_fingerprint
    from tunefleet.tvm.threads import class_threads

    threads = class_threads(hw.target)
    todo: list[tuple[Any, Any]] = []
    for wl_id in weights:
        rows = db.best_measurements(wl_id, hw.id, 1)
        if not rows or splits_by_tile(rows[0].trace_json) is not False:
            continue
        fastest = rows[0]
        found = rewrite_of(fastest.trace_json, threads)
        if found is None:
            continue
        variant, sha = found
        if {fastest.trace_sha256, sha} <= db.paired_measurements(wl_id, hw.id).keys():
            continue
        wl = db.workload(wl_id)
        todo += [(wl, fastest), (wl, SimpleNamespace(trace_json=variant, trace_sha256=sha, args_info=fastest.args_info))]
    if not todo:
        return 0
    log.info("timing %d Winograd schedules beside their rewrite split by tile, %d rounds", len(todo) // 2, rounds)
    fingerprint = target_fingerprint(make_target(hw.target))
    db.commit_measurements(retimed_rows(db, hw, todo, retime(hw, todo, rounds=rounds), rounds, fingerprint,
                                        mode=PAIRED_MODE))
    return len(todo) // 2


__all__ = ["Confirmation", "Retimed", "confirm_bests", "confirm_by_tile", "retime", "last_line", "PASSES",
           "RETIMED_MODE"]
