"""The one path by which candidates reach the database: measured, errored, filtered or recorded.

:class:`CandidateCommitter` turns MetaSchedule's candidates and results into
:class:`~tunefleet.db.NewMeasurement` rows for one (workload, hardware class[, shard]) and commits
them; :class:`CommitCallback` is the ``MeasureCallback`` that calls it after every measured batch,
so a killed worker loses at most the batch in flight. What the rows carry beyond MetaSchedule's
results (energy, the useful flag) is added by an ``annotate`` hook the engine injects.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tvm
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms

from tunefleet.db import Database, NewMeasurement
from tunefleet.db.shards import InFlightRow, LeaseFence
from tunefleet.errors import NodeFaultError
from tunefleet.tvm.ffi_errors import keeps_failure
from tunefleet.tvm.traces import trace_json_of, trace_sha256_of
from tunefleet.vocab import BUILD_ERROR, FILTERED, RUN_ERROR

log = logging.getLogger(__name__)

# A callback seeing each batch as (shard id, [(trace sha256, mean run seconds or None)]).
CandidateHook = Callable[[int | None, list[tuple[str, float | None]]], None]


@dataclass
class ShardProgress:
    """What a shard's search and commits did so far."""

    measured: int = 0
    errors: int = 0
    skipped_known: int = 0
    filtered: int = 0
    duplicates: int = 0
    """Candidates measured that the commit refused: another search had committed them first
    (one search per workload at a time, ``Database.lease_shard``, and a resumed shard's suspects
    checked against what is committed, make this 0)."""
    stop_reason: str | None = None
    best_s: float | None = None
    first_best_s: float | None = None
    batches: int = 0
    commit_s: float = 0.0
    search_s: float = 0.0
    """Wall time the search spent proposing candidates (sampling, evolving, cost-model scoring)."""
    build_s: float = 0.0
    """Wall time building the proposed candidates (when the builder reports it)."""
    run_s: float = 0.0
    """Wall time from the builds' end to the batch's results: measuring on this node."""
    proposed_at: float | None = None
    """When the search last handed a batch out (the build starts then)."""
    started: float = field(default_factory=time.monotonic)

    def count(self, records: list[NewMeasurement], stored: int | None = None) -> None:
        """Take a committed batch of measured candidates into the counts and the best so far;
        ``stored``: how many of them the commit stored (the rest were measured already: counted
        as ``duplicates``, not as measured)."""
        self.batches += 1
        stored = len(records) if stored is None else stored
        self.measured += stored
        self.duplicates += len(records) - stored
        for rec in records:
            mean = rec.mean_run_s
            if mean is None:
                self.errors += 1
            elif self.best_s is None or mean < self.best_s:
                self.best_s = mean
                if self.first_best_s is None:
                    self.first_best_s = mean


class CandidateCommitter:
    """Rows of one workload on one hardware class (and shard), committed in batches.

    With ``fence`` (the shard's lease), every commit checks the lease in its own transaction: a
    stale one raises :class:`~tunefleet.errors.StaleLeaseError` and stores nothing.
    """

    def __init__(self, db: Database, workload_id: int, hardware_class_id: int, *, shard_id: int | None = None,
                 target: str = "", fence: LeaseFence | None = None) -> None:
        self.db, self.workload_id, self.hardware_class_id = db, workload_id, hardware_class_id
        self.shard_id, self.target, self.fence = shard_id, target, fence

    def row(self, trace_json: str, run_secs: list[float] | None, *, args_info: list[Any] | None = None,
            **extra: Any) -> NewMeasurement:
        extra.setdefault("target", self.target)
        return NewMeasurement(self.workload_id, self.hardware_class_id, trace_json, run_secs, args_info=args_info,
                              shard_id=self.shard_id, tvm_version=tvm.__version__, **extra)

    def measured(self, cands: list[Any], built: list[Any], ran: list[Any], *,
                 build_seconds: Callable[[str], float | None] | None = None,
                 measure_info: Callable[[str], dict[str, Any] | None] | None = None) -> list[NewMeasurement]:
        """Rows of a measured batch: run times, or the build or run error, with build time and mode."""
        rows = []
        for cand, b, r in zip(cands, built, ran, strict=True):
            build_err = b.error_msg
            run_err = None if build_err else r.error_msg
            run_secs = None if (build_err or run_err) else [float(x) for x in r.run_secs]
            path = b.artifact_path
            info = measure_info(path) if (measure_info and path) else None
            rows.append(self.row(
                trace_json_of(cand.sch), run_secs, args_info=[a.as_json() for a in cand.args_info],
                build_s=build_seconds(path) if (build_seconds and path) else None,
                error_kind=BUILD_ERROR if build_err else (RUN_ERROR if run_err else None),
                error_msg=(build_err or run_err or None) and str(build_err or run_err)[:8000],
                measure_mode=_measure_mode(info) if run_secs is not None else None,
            ))
        return rows

    def filtered(self, cands: list[Any]) -> int:
        """Commit candidates the cost model scored out: never built or run, a spent trial each."""
        return self.db.commit_measurements([self.row(
            trace_json_of(c.sch), None, args_info=[a.as_json() for a in c.args_info], error_kind=FILTERED,
            error_msg="scored out by the cost model", energy_j=0.0, useful=False) for c in cands], fence=self.fence)

    def commit(self, rows: list[NewMeasurement]) -> int:
        return self.db.commit_measurements(rows, fence=self.fence)

    def in_flight(self, cands: list[Any]) -> None:
        """Record the batch about to be built (fenced), so a worker death can be pinned on a candidate."""
        if self.fence is None or not cands:
            return
        self.db.set_in_flight(self.fence, [
            InFlightRow(trace_sha256_of(c.sch), trace_json_of(c.sch), [a.as_json() for a in c.args_info],
                        self.target, tvm.__version__) for c in cands])


def _measure_mode(info: dict[str, Any] | None) -> str | None:
    if not info or info.get("mode") in (None, "serial"):
        return "serial" if info else None
    return f"parallel:{int(info.get('degree') or 0)}"


@derived_object
class CommitCallback(ms.measure_callback.PyMeasureCallback):
    """Commit every measured candidate of a batch (successes and build/run errors) as it is measured.

    Parameters
    ----------
    committer:
        Where the rows go.
    build_seconds, measure_info:
        The builder's and runner's per-artifact figures (build time; serial or parallel mode).
    annotate:
        Called with the batch's rows before they are committed (e.g. to add their energy); what it
        returns is handed to every ``after_commit`` hook with the rows.
    after_commit:
        Called with (rows, what ``annotate`` returned) once the batch is committed; an exception
        stops the search (e.g. the lease was lost).
    node_check:
        Called when every candidate of a batch failed to build or run, before anything of it is
        committed: it returns why the node cannot build or run the workload's default schedule
        either (:func:`tunefleet.tvm.probe.probe`), and then the batch is the node's fault: nothing
        is stored, and :class:`~tunefleet.errors.NodeFaultError` stops the search. None: the
        candidates are at fault, and their errors are committed as usual.
    """

    def __init__(self, committer: CandidateCommitter, *, build_seconds: Callable[[str], float | None] | None = None,
                 measure_info: Callable[[str], dict[str, Any] | None] | None = None,
                 annotate: Callable[[list[NewMeasurement]], Any] | None = None,
                 after_commit: list[Callable[[list[NewMeasurement], Any], None]] | None = None,
                 progress: ShardProgress | None = None, build_wall: Callable[[], float] | None = None,
                 node_check: Callable[[], str | None] | None = None) -> None:
        self.committer = committer
        self.node_check = node_check
        self.build_seconds, self.measure_info = build_seconds, measure_info
        self.build_wall = build_wall
        self._build_wall_seen = build_wall() if build_wall is not None else 0.0
        self.annotate = annotate
        self.after_commit = list(after_commit or [])
        self.progress = progress or ShardProgress()
        self.failure: BaseException | None = None

    @keeps_failure  # MetaSchedule calls this from C++, which re-wraps what we raise: keep the original
    def apply(self, task_scheduler: Any, task_id: int, measure_candidates: list[Any],
              builder_results: list[Any], runner_results: list[Any]) -> None:
        self._apply(measure_candidates, builder_results, runner_results)

    def _time_batch(self) -> None:
        """Split the batch's wall time since the search handed it out into build and run."""
        p = self.progress
        if p.proposed_at is None:
            return
        batch = time.monotonic() - p.proposed_at
        build = 0.0
        if self.build_wall is not None:
            wall = self.build_wall()
            build, self._build_wall_seen = min(batch, wall - self._build_wall_seen), wall
        p.build_s += build
        p.run_s += batch - build
        p.proposed_at = None

    def _apply(self, cands: list[Any], built: list[Any], ran: list[Any]) -> None:
        self._time_batch()
        rows = self.committer.measured(cands, built, ran, build_seconds=self.build_seconds,
                                       measure_info=self.measure_info)
        if self.node_check is not None and rows and all(r.error_kind in (BUILD_ERROR, RUN_ERROR) for r in rows):
            reason = self.node_check()
            if reason is not None:
                raise NodeFaultError(f"all {len(rows)} candidates of a batch failed and so did the workload's default "
                                     f"schedule ({reason}): the node is at fault, nothing was stored")
        note = self.annotate(rows) if self.annotate is not None else None
        t0 = time.perf_counter()
        stored = self.committer.commit(rows)
        p = self.progress
        p.commit_s += time.perf_counter() - t0
        p.count(rows, stored)
        if stored < len(rows):
            log.warning("shard %s: %d of %d measured candidates were committed before by another search",
                        self.committer.shard_id, len(rows) - stored, len(rows))
        log.info("shard %s: batch %d committed %d candidates (%d errors so far), best %.3g ms",
                 self.committer.shard_id, p.batches, stored, p.errors, (p.best_s or float("nan")) * 1e3)
        for hook in self.after_commit:
            hook(rows, note)
