"""Capability-aware transfer: a class with no measurement for a workload borrows another class's schedule.

Hardware classes carry capability records (``capabilities``: ``arch``, ``isa`` features such as
avx2/avx512f/neon/sve, ``cores``; for GPUs ``sm``). When the asking class has no measurement of
a workload, :func:`transfer_best` looks at the classes that have one, most compatible first
(:func:`compatibility`), replays their best schedules on the workload and **compiles each for
the asking class's target**; the first that builds is returned, marked as transferred (the
source class and its latency there — never a latency on the asking class). A schedule that
does not replay or build for the asking target is skipped, so transfer never returns one that
fails to build. ``verify`` measures it on this node and stores it as an ordinary measurement.

Compatibility (higher is better; None = never transfer):

- a different architecture family (x86_64, aarch64, cuda) is incompatible: a schedule's
  vector widths, thread bindings and tensor intrinsics are ISA-specific;
- CPUs of one family: the share of the source's ISA features the asking class also has (a
  schedule tuned with avx512 may rely on 512-bit vectors), plus small bonuses for equal core
  counts (parallel loop extents were tuned for them), the same ``mcpu`` (the same code) and the
  same CPU (``capabilities["cpu"]``: the same timings; a hub class tuned on this CPU ranks first);
- GPUs: a source with a compute capability above the asking class's is incompatible (it may
  use newer instructions); otherwise closer is better.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from tunefleet.hardware import same_cpu
from tunefleet.vocab import DEFAULT_TRACE_SHA256

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.db.tables import HardwareClass, Workload

log = logging.getLogger(__name__)

#: How many of a source class's best schedules are tried before moving to the next class.
CANDIDATES_PER_SOURCE = 3


def _family(caps: dict[str, Any], target: dict[str, Any]) -> str:
    if str(target.get("kind")) == "cuda" or caps.get("arch") == "cuda":
        return "cuda"
    arch = str(caps.get("arch") or str(target.get("mtriple") or "x86_64").split("-", 1)[0]).lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch)


def _sm(caps: dict[str, Any], target: dict[str, Any]) -> int | None:
    text = str(caps.get("sm") or target.get("arch") or "")
    digits = "".join(ch for ch in text if ch.isdigit())
    return int(digits) if digits else None


def compatibility(asking: HardwareClass, source: HardwareClass) -> float | None:
    """How safely ``source``'s schedules transfer to ``asking`` (module docstring); None = never."""
    a_caps, s_caps = dict(asking.capabilities or {}), dict(source.capabilities or {})
    family = _family(a_caps, dict(asking.target))
    if family != _family(s_caps, dict(source.target)):
        return None
    if family == "cuda":
        a_sm, s_sm = _sm(a_caps, dict(asking.target)), _sm(s_caps, dict(source.target))
        if a_sm is None or s_sm is None or s_sm > a_sm:
            return None
        return 1.0 / (1.0 + (a_sm - s_sm) / 10.0)
    s_isa, a_isa = set(s_caps.get("isa") or []), set(a_caps.get("isa") or [])
    share = len(s_isa & a_isa) / len(s_isa) if s_isa else 0.5
    same_cores = a_caps.get("cores") is not None and a_caps.get("cores") == s_caps.get("cores")
    # Tuned for the same code (mcpu) and timed on the same CPU: its best is the best here too.
    same_mcpu = bool(asking.target.get("mcpu")) and asking.target.get("mcpu") == source.target.get("mcpu")
    a_cpu, s_cpu = a_caps.get("cpu"), s_caps.get("cpu")
    same_cpu_model = a_cpu is not None and s_cpu is not None and same_cpu(a_cpu, s_cpu)
    return share + (0.1 if same_cores else 0.0) + (0.1 if same_mcpu else 0.0) + (0.2 if same_cpu_model else 0.0)


@dataclass
class TransferredSchedule:
    """A schedule borrowed from another class; its latency is the *source* class's."""

    workload: str
    hardware: str
    source_hardware: str
    source_mean_run_s: float
    source_measurement_id: int
    compatibility: float
    trace_json: str
    args_info: list[Any] | None
    verified_mean_run_s: float | None = None
    """Measured on the asking class when ``verify`` was asked for."""

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "source": "transferred"}


def builds_for(wl: Workload, hw: HardwareClass, trace_json: str) -> bool:
    """Whether a trace replays on the workload and compiles for the class's target."""
    return _replays_and_builds(wl, trace_json, hw)


def _replays_and_builds(wl: Workload, trace_json: str, hw: HardwareClass | None) -> bool:
    """Whether a trace replays on the workload and, with ``hw``, compiles for its target."""
    import tvm

    from tunefleet.tvm.targets import make_target

    try:
        sch = tvm.s_tir.Schedule(tvm.ir.load_json(wl.tir_json))
        tvm.s_tir.Trace.apply_json_to_schedule(json.loads(trace_json), sch)
        if hw is not None:
            tvm.compile(sch.mod, target=make_target(hw.target))
    except Exception as exc:  # TVM raises many kinds for a schedule it cannot replay or lower
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        what = "replay" if hw is None else f"build for {hw.name}"
        log.info("a schedule of %s does not %s: %s", wl.name, what, lines[-1][:200])
        return False
    return True


def compatible_classes(db: Database, asking: HardwareClass) -> list[tuple[float, HardwareClass]]:
    """The other classes whose schedules may transfer to ``asking`` (:func:`compatibility` not
    None), most compatible first, then by name."""
    ranked = [(score, hw) for hw in db.hardware_classes()
              if hw.id != asking.id and (score := compatibility(asking, hw)) is not None]
    ranked.sort(key=lambda pair: (-pair[0], pair[1].name))
    return ranked


def transfer_candidates(db: Database, wl: Workload, asking: HardwareClass) -> list[tuple[float, HardwareClass]]:
    """Other classes with a measurement of the workload, most compatible first."""
    return [(score, hw) for score, hw in compatible_classes(db, asking) if db.best_measurements(wl.id, hw.id, 1)]


def replays(wl: Workload, trace_json: str) -> bool:
    """Whether a trace replays on the workload (no compile: the builder tells the rest)."""
    return _replays_and_builds(wl, trace_json, None)


@dataclass
class TransferSeeds:
    """The schedules a shard of a workload new to its class measures first, and where they came from."""

    traces: list[str]
    sources: list[str]
    """The class each trace came from (a hub class for an imported record)."""
    skipped: int = 0
    """Records that did not replay on the workload."""


def transfer_seeds(db: Database, wl: Workload, asking: HardwareClass, limit: int) -> TransferSeeds:
    """Up to ``limit`` best schedules of the most compatible classes with a record of the
    workload (the most compatible class's first, then the next's), each replayed on it.

    They are measured on the asking class in its first round, as ordinary measurements: one that
    fails to build there, or runs slower than the default schedule, is never its best; the search
    then evolves from the best measured (MetaSchedule draws its initial population from the
    class's best records).
    """
    out = TransferSeeds([], [])
    seen: set[str] = set()
    for _, source in transfer_candidates(db, wl, asking):
        for row in db.best_measurements(wl.id, source.id, 2 * limit):
            if len(out.traces) >= limit:
                return out
            if row.trace_sha256 in seen or row.trace_sha256 == DEFAULT_TRACE_SHA256:  # measured anyway
                continue
            seen.add(row.trace_sha256)
            if not replays(wl, row.trace_json):
                out.skipped += 1
                continue
            out.traces.append(row.trace_json)
            out.sources.append(source.name)
    return out


def transfer_best(db: Database, workload: str | int, hardware: str) -> TransferredSchedule | None:
    """The best schedule of the most compatible class that builds for ``hardware``, or None.

    Only for a workload the class has no measurement of (otherwise there is nothing to borrow:
    use :func:`tunefleet.delivery.best.best`). :func:`tunefleet.engine.worker.verify_transfer`
    measures it here and commits it as an ordinary measurement.
    """
    wl = db.workload(workload)
    asking = db.hardware_class(hardware)
    if db.best_measurements(wl.id, asking.id, 1):
        return None
    for score, source in transfer_candidates(db, wl, asking):
        for row in db.best_measurements(wl.id, source.id, CANDIDATES_PER_SOURCE):
            if not builds_for(wl, asking, row.trace_json):
                continue
            return TransferredSchedule(wl.structural_hash, asking.name, source.name, float(row.mean_run_s or 0.0),
                                       row.id, score, row.trace_json, row.args_info)
    return None


__all__ = ["TransferSeeds", "TransferredSchedule", "builds_for", "compatibility", "replays", "transfer_best",
           "transfer_candidates", "transfer_seeds"]
