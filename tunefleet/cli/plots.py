"""Charts of tuning progress and tuning energy, written as PNG files.

:func:`tuning_figure` draws how one model's tuning went on one hardware class: the best latency
so far of its heaviest workloads against trials, and the model's estimated latency against
tuning time. :func:`energy_figure` draws the useful and wasted joules of an energy report
(:func:`tunefleet.energy.accounting.energy_report`) per model and hardware class.

matplotlib is optional (``pip install 'tunefleet[plots]'``) and imported only when a chart is
drawn, always with its non-interactive Agg canvas: no window, no display needed, and no change to
the process's global pyplot backend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunefleet.errors import NotFoundError, NotSupportedError

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.db.tables import HardwareClass, Model
    from tunefleet.energy.accounting import EnergyRow

#: Measurements committed closer together than this are one commit (one tuning round).
_SAME_COMMIT_S = 0.5

#: Size of the PNGs (inches at :data:`DPI`): about 1200 x 450 pixels, well under 150 KB.
DPI = 100


@dataclass(frozen=True)
class WorkloadSeries:
    """Best-so-far mean run time of one workload against the trials measured for it."""

    label: str
    structural_hash: str
    weight: int
    """Calls of the workload in the model."""
    best_ms: float
    """Its best mean run time at the end (ms)."""
    best_so_far_ms: list[float]
    """One value per trial (1, 2, ...); NaN until its first successful measurement."""

    @property
    def share_ms(self) -> float:
        """What the workload contributes to the model's latency: weight x best (ms)."""
        return self.weight * self.best_ms


@dataclass(frozen=True)
class TuningFigure:
    """What :func:`tuning_figure` drew."""

    path: Path
    model: str
    hardware: str
    series: list[WorkloadSeries]
    """The workloads plotted in panel (a), largest latency share first."""
    elapsed_s: list[float] = field(default_factory=list)
    """Panel (b)'s x: seconds since the first measurement, one per commit (tuning round)."""
    estimate_ms: list[float] = field(default_factory=list)
    """Panel (b)'s y: sum of weight x best so far over the workloads with a success by then."""
    measured_workloads: int = 0
    workloads: int = 0
    trials: int = 0

    @property
    def labels(self) -> list[str]:
        return [s.label for s in self.series]


@dataclass(frozen=True)
class EnergyFigure:
    """What :func:`energy_figure` drew: one stacked bar per (model, hardware class)."""

    path: Path
    bars: list[tuple[str, float, float]]
    """``(label, useful joules, wasted joules)`` in report order."""
    unit: str


def _matplotlib() -> tuple[Any, Any]:
    """``(Figure, FigureCanvasAgg)``, or a one-line error saying how to install matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise NotSupportedError("not supported: plots need matplotlib; pip install 'tunefleet[plots]'") from None
    return Figure, FigureCanvasAgg


def _save(fig: Any, canvas_cls: Any, path: Path) -> None:
    canvas_cls(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png")


def _labels(workloads: Sequence[Any]) -> dict[int, str]:
    """Workload names, with a hash prefix where two workloads share a name."""
    names = [w.name for w in workloads]
    return {w.id: w.name if names.count(w.name) == 1 else f"{w.name} ({w.structural_hash[:6]})" for w in workloads}


def tuning_figure(db: Database, model: Model | str | int, hardware: HardwareClass | str, path: str | Path, *,
                  top: int = 6) -> TuningFigure:
    """Draw one model's tuning progress on one hardware class as a two-panel PNG.

    Parameters
    ----------
    db:
        The tunefleet database.
    model, hardware:
        A model (record, name, id or sha256 prefix) and a hardware class (record or name).
    path:
        The PNG to write (folders are created).
    top:
        Panel (a) shows this many workloads, those with the largest latency share (the model's
        call count x best mean run time).

    Returns
    -------
    TuningFigure
        The workloads plotted and the estimate series, for tests and callers.

    Notes
    -----
    Panel (a): best-so-far mean run time (ms, log scale) of each of the ``top`` workloads against
    the trials measured for it, in measurement (id) order; errored and filtered candidates count as
    trials but never improve the best. Panel (b): the model's estimated latency, the sum over its
    workloads of weight x best so far, against seconds since the first measurement; a workload
    counts only from its first successful measurement, so the estimate can rise while workloads
    are still being reached (a dashed line marks when every workload has one). Default schedules of
    unmeasured workloads are not included. Candidates committed together (one tuning round) make
    one step.

    Raises
    ------
    NotFoundError
        The model or class is unknown, or nothing of the model was measured on the class.
    NotSupportedError
        matplotlib is not installed.
    """
    Figure, canvas_cls = _matplotlib()
    mo = db.model(model) if isinstance(model, (str, int)) else model
    hw = db.hardware_class(hardware) if isinstance(hardware, str) else hardware
    linked = db.workloads(mo.id, hw.id)
    if not linked:
        raise NotFoundError(f"model {mo.name!r} has no workloads; run `tunefleet extract {mo.name} --hardware {hw.name}`")
    weights = {w.id: weight for w, weight in linked}
    labels = _labels([w for w, _ in linked])
    hashes = {w.id: w.structural_hash for w, _ in linked}
    points = db.measurement_timeline(hw.id, list(weights))
    if not any(p.mean_run_s is not None for p in points):
        what = f"only {len(points)} failed or filtered candidates" if points else "no measurements"
        raise NotFoundError(f"{what} of model {mo.name!r} on {hw.name}; tune it with "
                            f"`tunefleet plan --model {mo.name} --hardware {hw.name} && tunefleet tune --hardware {hw.name}`")

    t0 = points[0].created_at
    curves: dict[int, list[float]] = {wl: [] for wl in weights}
    best: dict[int, float] = {}
    elapsed_s: list[float] = []
    estimate_ms: list[float] = []
    all_measured_s: float | None = None
    for i, p in enumerate(points):
        if p.mean_run_s is not None and (p.workload_id not in best or p.mean_run_s < best[p.workload_id]):
            best[p.workload_id] = p.mean_run_s
        curves[p.workload_id].append(best[p.workload_id] * 1e3 if p.workload_id in best else math.nan)
        t = (p.created_at - t0).total_seconds()
        if all_measured_s is None and len(best) == len(weights):
            all_measured_s = t
        # A round's candidates are committed together: one step per commit, not a spike per row.
        last_of_commit = i + 1 == len(points) or (points[i + 1].created_at - p.created_at).total_seconds() >= _SAME_COMMIT_S
        if best and last_of_commit:
            elapsed_s.append(t)
            estimate_ms.append(sum(weights[wl] * s for wl, s in best.items()) * 1e3)

    series = sorted((WorkloadSeries(labels[wl], hashes[wl], weights[wl], best[wl] * 1e3, curves[wl]) for wl in best),
                    key=lambda s: (-s.share_ms, s.structural_hash))[:max(0, top)]
    result = TuningFigure(Path(path), mo.name, hw.name, series, elapsed_s, estimate_ms,
                          measured_workloads=len(best), workloads=len(weights), trials=len(points))

    fig = Figure(figsize=(12, 4.5), layout="constrained")
    ax_wl, ax_model = fig.subplots(1, 2)
    for s in series:
        trials = range(1, len(s.best_so_far_ms) + 1)
        ax_wl.plot(trials, s.best_so_far_ms, drawstyle="steps-post", label=f"{s.label} x{s.weight}")
    ax_wl.set_yscale("log")
    ax_wl.set_xlabel("trials measured for the workload (errors and filtered included)")
    ax_wl.set_ylabel("best mean run time so far (ms, log scale)")
    ax_wl.set_title(f"(a) the {len(series)} workloads with the largest latency share (calls x best)")
    ax_wl.grid(True, which="both", alpha=0.3)
    ax_wl.legend(fontsize="small", title="workload x calls", title_fontsize="small")

    ax_model.plot(elapsed_s, estimate_ms, drawstyle="steps-post", marker=".", color="tab:purple")
    if all_measured_s is not None and len(weights) > 1:
        ax_model.axvline(all_measured_s, linestyle="--", color="gray", linewidth=1)
        ax_model.annotate("every workload measured", (all_measured_s, 0), xytext=(3, 3), textcoords="offset points",
                          fontsize="small", color="gray")
    ax_model.set_xlabel("tuning time (s since the first measurement)")
    ax_model.set_ylabel("estimated latency (ms): sum of calls x best so far,\n"
                        "each workload counted from its first success")
    ax_model.set_title(f"(b) {mo.name}: {len(best)} of {len(weights)} workloads measured")
    ax_model.set_ylim(bottom=0)
    ax_model.grid(True, alpha=0.3)
    fig.suptitle(f"Tuning of {mo.name} on {hw.name}: {len(points)} trials, estimated latency "
                 f"{estimate_ms[-1]:.3g} ms at the end")
    _save(fig, canvas_cls, result.path)
    return result


def energy_figure(rows: Sequence[EnergyRow], path: str | Path) -> EnergyFigure:
    """Draw an energy report as one stacked bar (useful, wasted) per model and hardware class.

    ``rows`` are :class:`~tunefleet.energy.accounting.EnergyRow` (``useful_joules``, ``wasted_joules``,
    ``wasted_pct``, ``sources``). Joules are shown in J, kJ or MJ, whichever suits the largest bar.

    Raises
    ------
    NotFoundError
        ``rows`` is empty (nothing measured yet).
    NotSupportedError
        matplotlib is not installed.
    """
    Figure, canvas_cls = _matplotlib()
    if not rows:
        raise NotFoundError("no measurements yet: nothing to chart; tune a model first (`tunefleet tune`)")
    largest = max(r.useful_joules + r.wasted_joules for r in rows)
    unit, scale = next(((u, f) for u, f in (("MJ", 1e6), ("kJ", 1e3)) if largest >= 10 * f), ("J", 1.0))
    bars = [(f"{r.model}\n{r.hardware}", r.useful_joules, r.wasted_joules) for r in rows]
    labels = [b[0] for b in bars]
    useful = [b[1] / scale for b in bars]
    wasted = [b[2] / scale for b in bars]

    fig = Figure(figsize=(max(7.0, 1.2 * len(rows) + 4), 4.5), layout="constrained")
    ax = fig.subplots()
    width = 0.6 if len(rows) > 1 else 0.4
    ax.bar(labels, useful, width, color="tab:green", label="useful: beat the best so far")
    ax.bar(labels, wasted, width, bottom=useful, color="tab:gray", label="wasted: no improvement, or an error")
    for i, r in enumerate(rows):
        if r.wasted_pct is not None:
            ax.annotate(f"{r.wasted_pct:.0f}% wasted", (i, useful[i] + wasted[i]), ha="center", va="bottom",
                        fontsize="small", xytext=(0, 2), textcoords="offset points")
    ax.set_ylabel(f"tuning energy ({unit})")
    ax.set_xlabel("model / hardware class")
    ax.margins(y=0.12)
    sources = sorted({s for r in rows for s in r.sources.split("+") if s and s != "-"})
    ax.set_title(f"Tuning energy per model and hardware class ({unit})\nenergy source: {'+'.join(sources) or '-'}")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    result = EnergyFigure(Path(path), bars, unit)
    _save(fig, canvas_cls, result.path)
    return result
