"""MetaSchedule's ``Database`` interface over the tunefleet database, scoped to one hardware class.

MetaSchedule's own databases ignore the target when queried (apache/tvm#15549): a CPU record
can answer an aarch64 query. :class:`FleetDatabase` is bound to one hardware class, so every
query is target-aware, and it reads *measurements* only — cost-model predictions live in
their own table and never come back from here.

Records are stored as MetaSchedule's own JSON pieces: ``TuningRecord.as_json()`` is
``[trace, run_secs, target, args_info]``; the trace goes to ``trace_json``, the target to
``target``, args_info to ``args_info``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import tvm
from tvm.ir import IRModule
from tvm.ir.utils import derived_object
from tvm.s_tir import meta_schedule as ms
from tvm.s_tir.meta_schedule.database import TuningRecord, Workload

from tunefleet.db import Database
from tunefleet.errors import NotFoundError
from tunefleet.tvm.commit import CandidateCommitter
from tunefleet.tvm.extract import workload_hash
from tunefleet.tvm.ffi_errors import keeps_failure
from tunefleet.tvm.partition import PREFER_DEPTH, ordered_for_build
from tunefleet.tvm.threads import class_threads
from tunefleet.vocab import RUN_ERROR

log = logging.getLogger(__name__)

# MetaSchedule's run time for a candidate whose build or run failed (TuningRecord::IsValid rejects it).
_FAILED_RUN_S = 1e10


def record_parts(record: TuningRecord) -> dict[str, Any]:
    """Split a TuningRecord into the columns tunefleet stores."""
    trace, run_secs, target, args_info = record.as_json()
    return {
        "trace_json": json.dumps(trace, separators=(",", ":")),
        "run_secs": [float(x) for x in run_secs] if run_secs is not None else None,
        "target": json.dumps(target, sort_keys=True, separators=(",", ":")) if target is not None else "",
        "args_info": args_info,
    }


def record_from_row(trace_json: str, run_secs: list[float] | None, target: str, args_info: Any,
                    workload: Workload) -> TuningRecord:
    return TuningRecord.from_json(
        [json.loads(trace_json), run_secs, json.loads(target) if target else None, args_info], workload
    )


@derived_object
class FleetDatabase(ms.database.PyDatabase):
    """A MetaSchedule database reading and writing tunefleet measurements of one hardware class.

    Parameters
    ----------
    db:
        The tunefleet database.
    hardware:
        Name of the hardware class every query and commit is scoped to.
    with_predictions:
        Zero-shot builds only: a workload with no measurement on the class answers with the
        best-scored *prediction* of the cost model (a record without run times). Off by default,
        so nothing asking for measurements ever gets a prediction.
    transfer:
        A workload with no measurement (and no prediction asked for) answers with what this
        lookup returns for its id — an object with ``trace_json`` and ``args_info``, e.g. the best
        schedule of the most compatible class that builds for this one
        (:func:`tunefleet.planning.transfer.transfer_best`, injected by the caller) — as a record without
        run times: its latency was measured elsewhere. None: no such answer.
    """

    def __init__(self, db: Database, hardware: str, *, with_predictions: bool = False,
                 transfer: Callable[[int], Any] | None = None) -> None:
        super().__init__()
        self.db = db
        self.hw = db.hardware_class(hardware)
        self.threads = class_threads(self.hw.target)
        self.with_predictions = with_predictions
        self.transfer = transfer
        self.transferred: dict[int, Any] = {}
        """Workload id -> what ``transfer`` returned for it (or None)."""
        self.answered: set[int] = set()
        """Ids of the workloads ``get_top_k`` returned a record for."""
        self._ids: dict[str, int] = {}

    # -- workloads ------------------------------------------------------------------------
    def _workload_id(self, mod: IRModule, *, create: bool) -> int | None:
        key = workload_hash(mod)
        if key in self._ids:
            return self._ids[key]
        try:
            wl_id = self.db.workload(key).id
        except NotFoundError:
            if not create:
                return None
            wl, _ = self.db.add_workload(
                structural_hash=key, name=_func_name(mod), op_kind="unknown", flops=0.0,
                tir_json=tvm.ir.save_json(mod),
            )
            wl_id = wl.id
        self._ids[key] = wl_id
        return wl_id

    @keeps_failure
    def has_workload(self, mod: IRModule) -> bool:
        return self._workload_id(mod, create=False) is not None

    @keeps_failure
    def commit_workload(self, mod: IRModule) -> Workload:
        self._workload_id(mod, create=True)
        return Workload(mod)

    # -- records --------------------------------------------------------------------------
    @keeps_failure
    def commit_tuning_record(self, record: TuningRecord) -> None:
        """Store a record measured elsewhere (no shard). A record without run times, or with
        MetaSchedule's failed-run marker (every run time 1e10 s, what its ``AddToDatabase``
        callback commits for a run that failed), is stored as a run error, never as a latency."""
        wl_id = self._workload_id(record.workload.mod, create=True)
        assert wl_id is not None
        parts = record_parts(record)
        run_secs = parts["run_secs"]
        error = None
        if not run_secs:
            error = "record committed without run times"
        elif all(x >= _FAILED_RUN_S for x in run_secs):
            run_secs, error = None, "record committed with MetaSchedule's failed-run marker (1e10 s)"
        committer = CandidateCommitter(self.db, wl_id, self.hw.id, target=parts["target"])
        committer.commit([committer.row(parts["trace_json"], run_secs, args_info=parts["args_info"],
                                        error_kind=RUN_ERROR if error else None, error_msg=error)])

    @keeps_failure
    def get_top_k(self, workload: Workload, top_k: int) -> list[TuningRecord]:
        wl_id = self._workload_id(workload.mod, create=False)
        if wl_id is None or top_k <= 0:
            return []
        records = self._top_k(wl_id, workload, top_k)
        if records:
            self.answered.add(wl_id)
        return records

    def _top_k(self, wl_id: int, workload: Workload, top_k: int) -> list[TuningRecord]:
        # the build's choice first: a Winograd schedule that splits by tile where a pairing or the
        # figures say so
        rows = ordered_for_build(self.db, wl_id, self.hw.id, self.threads, top_k + PREFER_DEPTH)[:top_k]
        if not rows and self.with_predictions:
            preds = self.db.best_predictions(wl_id, self.hw.id, top_k)
            if preds:
                return [record_from_row(p.trace_json, None, "", p.args_info, workload) for p in preds]
        if not rows and self.transfer is not None:
            if wl_id not in self.transferred:
                self.transferred[wl_id] = self.transfer(wl_id)
            found = self.transferred[wl_id]
            return [] if found is None else [record_from_row(found.trace_json, None, "", found.args_info, workload)]
        return [record_from_row(r.trace_json, r.run_secs, r.target, r.args_info, workload) for r in rows]

    @keeps_failure
    def get_all_tuning_records(self) -> list[TuningRecord]:
        records = []
        for wl, _ in self.db.workloads():
            rows = self.db.best_measurements(wl.id, self.hw.id, n=1_000_000)
            if rows:
                workload = Workload(tvm.ir.load_json(wl.tir_json))
                records += [record_from_row(r.trace_json, r.run_secs, r.target, r.args_info, workload) for r in rows]
        return records

    @keeps_failure
    def __len__(self) -> int:
        return self.db.count_measurements(hardware_class_id=self.hw.id)


def _func_name(mod: IRModule) -> str:
    names = [gv.name_hint for gv in mod.get_global_vars()]
    return names[0] if len(names) == 1 else ",".join(sorted(names))[:200]
