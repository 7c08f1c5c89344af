"""Traces and measure candidates: the one way tunefleet turns a stored schedule into a candidate.

A schedule is stored as its trace's JSON (``TuningRecord.as_json``'s first part) with the sha256
of that text as its identity; :func:`candidate` replays one on a workload's module (or leaves it
unscheduled) and gives the ``MeasureCandidate`` MetaSchedule builds and runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

import tvm
from tvm.s_tir import meta_schedule as ms


def to_python(obj: Any) -> Any:
    """Plain JSON values from what TVM's ``as_json`` returns (FFI arrays, maps, IntImm, ...)."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if hasattr(obj, "value") and type(obj).__name__ in {"IntImm", "FloatImm", "StringImm"}:
        return obj.value
    if hasattr(obj, "items"):
        return {str(k): to_python(v) for k, v in obj.items()}
    if hasattr(obj, "__iter__"):
        return [to_python(x) for x in obj]
    raise TypeError(f"cannot turn {type(obj).__name__} into JSON")


def trace_json_of(sch: Any) -> str:
    """The JSON text tunefleet stores for a candidate's trace (as TuningRecord.as_json writes it)."""
    return json.dumps(to_python(sch.trace.as_json()), separators=(",", ":"))


def trace_sha256_of(sch: Any) -> str:
    return hashlib.sha256(trace_json_of(sch).encode()).hexdigest()


def candidate(mod: Any, trace_json: str | None = None, args_info: list[Any] | None = None) -> Any:
    """A MeasureCandidate of ``mod`` scheduled by a trace (its JSON text; None: unscheduled).

    ``args_info`` (as stored with a measurement) gives the argument shapes to measure with;
    without it they are read from the scheduled module's entry function.
    """
    sch = tvm.s_tir.Schedule(mod)
    if trace_json is not None:
        tvm.s_tir.Trace.apply_json_to_schedule(json.loads(trace_json), sch)
    if args_info:
        args = [ms.arg_info.ArgInfo.from_json(a) for a in args_info]
    else:
        # remove_preproc: a schedule that repacks weights (RewriteLayout) is measured with the
        # packed shapes, as MetaSchedule's own search measures it.
        args = ms.arg_info.ArgInfo.from_entry_func(sch.mod, remove_preproc=True)
    return ms.MeasureCandidate(sch, args)


def past_candidates(mod: Any, rows: Iterable[Any]) -> tuple[list[Any], list[float]]:
    """Committed measurements (``trace_json``, ``mean_run_s``) as MeasureCandidates of ``mod``
    with their mean run times, to judge a cost model on; a trace that does not apply (e.g. one
    another TVM version wrote) is left out."""
    cands, means = [], []
    for row in rows:
        try:
            cands.append(candidate(mod, row.trace_json))
        except Exception:  # noqa: BLE001 - TVM raises many kinds for a trace it cannot replay; not judged
            continue
        means.append(float(row.mean_run_s))
    return cands, means


def mean_run_s(result: Any) -> float | None:
    """A MetaSchedule ``RunnerResult``'s mean run time in seconds; None when it failed."""
    if result.error_msg or not result.run_secs:
        return None
    secs = [float(x) for x in result.run_secs]
    return sum(secs) / len(secs)
