"""A schedule of one workload made to fit another shape of the same operator.

Two workloads with the same fused-op sequence (``conv2d_add_relu`` at 32x32 and at 16x16) have
the same blocks and loop nests; only the loop extents differ. A trace measured on one replays
on the other instruction by instruction; what may no longer fit are its random decisions, above
all the tile sizes of ``SamplePerfectTile``, whose product must equal the new loop's extent (a
split whose factors do not multiply to the extent still replays, but pads or drops iterations).

:func:`adapt_trace` replays the donor's trace on the new module without its postprocessing and,
through :meth:`tvm.s_tir.Trace.apply_to_schedule`'s ``decision_provider``, re-fits every tile
decision that does not match the new extent (:func:`fit_tile`: the inner tiles are kept as
close as the divisors allow, the outermost takes the rest), then runs the target's
postprocessors as MetaSchedule's search does. A trace that needs no change is returned as it
was measured. The result is deterministic: nothing is sampled at random.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import tvm
from tvm.s_tir import meta_schedule as ms

from tunefleet.tvm.traces import candidate, trace_json_of

log = logging.getLogger(__name__)

AS_IS, ADAPTED, SKIPPED = "as_is", "adapted", "skipped"


def fit_tile(extent: int, donor: list[int], max_innermost: int = -1) -> list[int]:
    """Tile sizes for ``extent`` as close to the donor's as the divisors of ``extent`` allow.

    From the innermost tile outwards each keeps the largest divisor of what is left that is at
    most the donor's (the innermost also at most ``max_innermost`` when that is positive); the
    outermost takes the rest, so the product is ``extent``.
    """
    out = [1] * len(donor)
    left = max(int(extent), 1)
    for i in range(len(donor) - 1, 0, -1):
        cap = max(1, int(donor[i]))
        if i == len(donor) - 1 and max_innermost > 0:
            cap = min(cap, max_innermost)
        out[i] = max(d for d in range(1, min(cap, left) + 1) if left % d == 0)
        left //= out[i]
    out[0] = left
    return out


@dataclass(frozen=True)
class Adaptation:
    """What became of one donor trace on the new module."""

    outcome: str
    """:data:`AS_IS` (replays unchanged), :data:`ADAPTED` (decisions re-fitted, or only the
    postprocessing redone), :data:`SKIPPED`."""
    trace_json: str | None
    """The trace JSON to measure (None when skipped)."""
    refitted: int = 0
    """Decisions changed to fit the new shape."""
    reason: str = ""
    """Why it was skipped."""


class _Refit:
    """A ``decision_provider`` keeping every donor decision that still fits the new schedule."""

    def __init__(self, sch: Any, root_compute_at: bool) -> None:
        self.sch, self.root_compute_at = sch, root_compute_at
        self.changed = 0

    def __call__(self, inst: Any, inputs: list[Any], attrs: list[Any], decision: Any) -> Any:
        kind = inst.kind.name
        if kind == "SamplePerfectTile" and decision is not None:
            try:
                extent = int(self.sch.get(inputs[0]).extent)
            except TypeError:
                raise ValueError("a tiled loop has a symbolic extent") from None
            donor = [int(x) for x in decision]
            fitted = fit_tile(extent, donor, int(attrs[1]))
            if fitted != donor:
                self.changed += 1
                return fitted
        elif kind == "SampleComputeLocation" and self.root_compute_at and decision is not None and int(decision) >= 0:
            self.changed += 1
            return -1  # the block stays where it is (always a valid location)
        return decision


def _postprocs(mod: Any, target: Any) -> list[Any]:
    """The postprocessors MetaSchedule's search applies to ``mod`` for ``target``."""
    ctx = ms.TuneContext(mod, target=target, space_generator="post-order-apply", task_name="similar",
                         num_threads=1)
    return list(ctx.space_generator.postprocs)


def _last_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()] or [type(exc).__name__]
    return lines[-1].strip()[:200]


def adapt_trace(mod: Any, trace_json: str, target: Any, *, donor_mod: Any = None, seed: int = 1) -> Adaptation:
    """Make a trace measured on another shape of the same operator apply to ``mod``.

    Parameters
    ----------
    mod : tvm.ir.IRModule
        The new workload's module (as MetaSchedule tunes it).
    trace_json : str
        The donor's trace, as tunefleet stores it.
    target : tvm.target.Target
        The target whose postprocessors the adapted schedule must pass.
    donor_mod : tvm.ir.IRModule, optional
        The module the trace was measured on; needed when the trace does not replay on ``mod``
        at all (e.g. factors whose product is below a new extent). Without it, ``mod`` is used.
    seed : int
        The schedule's random state (no decision is sampled; kept for determinism).

    Returns
    -------
    Adaptation
        :data:`AS_IS` with ``trace_json`` unchanged when every decision fits and it replays;
        :data:`ADAPTED` with a new trace (decisions re-fitted, postprocessors run afresh);
        :data:`SKIPPED` with a reason when the trace cannot be made valid for ``mod``. Every
        returned trace goes through :func:`tunefleet.tvm.traces.candidate`.
    """
    parsed = json.loads(trace_json)
    if not parsed or not parsed[0]:
        return Adaptation(SKIPPED, None, reason="the donor trace is the unscheduled default")
    donor_trace = None
    for source in ([donor_mod] if donor_mod is not None else []) + [mod]:
        try:
            sch = tvm.s_tir.Schedule(source, seed=seed)
            tvm.s_tir.Trace.apply_json_to_schedule(parsed, sch)
        except Exception as exc:  # noqa: BLE001 - TVM raises many kinds for a trace it cannot replay; try the next
            log.debug("the donor trace does not replay on a module: %s", _last_line(exc))
            continue
        donor_trace = sch.trace
        break
    if donor_trace is None:
        return Adaptation(SKIPPED, None, reason="the trace replays neither on its module nor on this one")

    error = ""
    for root_compute_at in (False, True):
        sch = tvm.s_tir.Schedule(mod, seed=seed)
        refit = _Refit(sch, root_compute_at)
        try:
            donor_trace.apply_to_schedule(sch, remove_postproc=True, decision_provider=refit)
        except Exception as exc:  # noqa: BLE001 - a decision or block that does not exist in this module
            error = _last_line(exc)
            continue
        break
    else:
        return Adaptation(SKIPPED, None, reason=f"does not replay: {error}")

    if refit.changed == 0:
        try:
            candidate(mod, trace_json)
            return Adaptation(AS_IS, trace_json)
        except Exception as exc:  # noqa: BLE001 - its postprocessing does not replay here: run it afresh below
            log.debug("the donor trace's postprocessing does not replay: %s", _last_line(exc))
    sch.enter_postproc()
    for proc in _postprocs(mod, target):
        try:
            ok = proc.apply(sch)
        except Exception as exc:  # noqa: BLE001 - a postprocessor that raises rejects the schedule too
            return Adaptation(SKIPPED, None, reason=f"{type(proc).__name__}: {_last_line(exc)}")
        if not ok:
            return Adaptation(SKIPPED, None, reason=f"{type(proc).__name__} rejects it")
    adapted = trace_json_of(sch)
    try:
        candidate(mod, adapted)
    except Exception as exc:  # noqa: BLE001 - a trace that does not replay is never handed out
        return Adaptation(SKIPPED, None, reason=f"the adapted trace does not replay: {_last_line(exc)}")
    return Adaptation(ADAPTED, adapted, refitted=refit.changed)


__all__ = ["ADAPTED", "AS_IS", "SKIPPED", "Adaptation", "adapt_trace", "fit_tile"]
