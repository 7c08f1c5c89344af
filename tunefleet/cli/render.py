"""How the commands print: JSON, rich tables, the build report and the lines of a run's summary.

rich is imported by the functions that draw, so that ``tunefleet --help`` stays fast.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any


def print_json(obj: Any) -> None:
    """Print ``obj`` as indented JSON with sorted keys (dates and other objects as strings)."""
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Print a rich table (160 columns wide when stdout is not a terminal; None shows empty).

    Parameters
    ----------
    title : str
        The table's title.
    columns : Sequence[str]
        The column headers.
    rows : Sequence[Sequence[Any]]
        The cells, row by row, shown with ``str``.
    """
    from rich.console import Console
    from rich.table import Table

    tbl = Table(title=title)
    for col in columns:
        tbl.add_column(col)
    for row in rows:
        tbl.add_row(*("" if v is None else str(v) for v in row))
    Console(width=None if sys.stdout.isatty() else 160).print(tbl)


def report_table(report: Any) -> None:
    """Print a build report (:class:`~tunefleet.delivery.build.BuildReport`, or the same fields
    from a flow's result): the latency of each build against the untuned one, then its notes."""
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    rows = [("untuned (default schedules)", ms(report.untuned_ms), "1.00x" if report.untuned_ms else "-")]
    if report.tuned_ms is not None:
        speed = f"{report.untuned_ms / report.tuned_ms:.2f}x" if report.untuned_ms else "-"
        label = f"tunefleet tuned ({report.tuned_workloads}/{report.workloads} workloads tuned"
        label += f", {report.predicted_workloads} zero-shot" if report.predicted_workloads else ""
        label += f", {report.transferred_workloads} transferred)" if report.transferred_workloads else ")"
        delivered = getattr(report, "delivered", "")
        if delivered == "untuned":
            label = "tunefleet: the UNTUNED build delivered (every tuned build was slower)"
        elif delivered and delivered != report.recipe:
            label += f", recipe {delivered}"
        rows.append((label, ms(report.tuned_ms), speed))
    if report.torch_ms is not None:
        speed = f"{report.untuned_ms / report.torch_ms:.2f}x" if report.untuned_ms else "-"
        rows.append((f"PyTorch eager ({report.threads} threads)", ms(report.torch_ms), speed))
    if report.onnxruntime_ms is not None:
        speed = f"{report.untuned_ms / report.onnxruntime_ms:.2f}x" if report.untuned_ms else "-"
        rows.append((f"onnxruntime ({report.threads} threads)", ms(report.onnxruntime_ms), speed))
    table(f"{report.model} on {report.hardware}: latency (median)", ["build", "latency (ms)", "speed-up vs untuned"], rows)
    if report.recipe:
        print(f"recipe {report.recipe}: {report.database_hits} of {report.workloads} functions built from the database"
              + (f", {report.prepacked_weights} weight(s) prepacked at build time" if report.prepacked_weights else ""))
    if getattr(report, "placement_line", ""):
        print(report.placement_line)
    builds = getattr(report, "builds_ms", None) or {}
    if len(builds) > 2:
        print("builds timed side by side: " + ", ".join(f"{name} {v:.3f} ms" for name, v in builds.items()))
    if report.default_workloads:
        print(f"{report.default_workloads} of {report.workloads} workloads had no record and kept the default schedule")
    if report.predicted_workloads:
        print(f"{report.predicted_workloads} of {report.workloads} workloads used a zero-shot prediction, PREDICTED "
              "(not measured)" + (f"; search {report.zero_shot_s_per_task:.1f}s per task"
                                  if report.zero_shot_s_per_task else ""))
    if report.verify_budget:
        print(f"zero-shot verification (--verify {report.verify_budget}): proposals searched in "
              f"{getattr(report, 'propose_s', 0.0):.0f}s, then {report.verified} candidate(s) measured in "
              f"{report.verify_s:.0f}s (default schedules first, then {report.verified_borrowed} borrowed from other "
              f"shapes or classes, proposals, and {report.verified_refined} from searches refining the best "
              "measured); each workload measured so is built with its best measured schedule")
    if report.transferred_workloads:
        print(f"{report.transferred_workloads} of {report.workloads} workloads used a schedule TRANSFERRED from a "
              "compatible class (its latency was measured there, not here)")
    for note in report.notes:
        print(note)
    if report.output:
        print(f"wrote {report.output}")


def split_line(split: dict[str, float]) -> str:
    """Seconds per measured candidate and where they went (search, build, run, the rest)."""
    return (f"{split['total']:.2f} s per measured candidate: search {split['search']:.2f}, build {split['build']:.2f}, "
            f"run {split['run']:.2f}, other {split['other']:.2f} (shard starts, commits)")


def budget_line(spent: dict[str, Any]) -> str:
    """``budget 15m: spent 1234 trials and 14:12 in 9 round(s); stopped: deadline: reached``."""
    from tunefleet.budget import format_duration

    return (f"budget {spent['budget']}: spent {spent['trials']} trials and {format_duration(round(spent['seconds']))} "
            f"in {spent['rounds']} round(s); stopped: {spent['stopped']}")


def print_run_steps(console: Any, result: dict[str, Any], hardware: str) -> None:
    """``tunefleet run``'s lines of the steps before the build (1/5 ingest to 4/5 tune).

    Parameters
    ----------
    console : rich.console.Console
        Where the run prints (stderr with ``--json``).
    result : dict
        The ``pipeline`` flow's result.
    hardware : str
        The run's hardware class.
    """
    model, ex, pl = result["models"][0], result["extracted"][0], result["planned"][0]
    tuned = result["tuned"][hardware]
    console.print(f"1/5 ingest: model {model['model_id']} ({'new' if model['created'] else 'already stored'}, "
                  f"sha256 {model['sha256'][:12]})")
    console.print(f"2/5 extract: {ex['workloads']} workloads ({ex['new_workloads']} new)")
    spent = tuned.get("budget")
    if spent:
        console.print(f"3/5 plan: budget {spent['budget']} in {spent['rounds']} round(s): {pl['new_shards']} shard(s) "
                      f"over {pl['workloads']} workload(s), at least {spent['min_trials']} trials each first",
                      highlight=False)
    else:
        console.print(f"3/5 plan: {pl['new_shards']} new shard(s), {pl['new_trials']} trials over {pl['workloads']} "
                      "workload(s)")
    console.print(f"4/5 tune: {tuned['shards_done']} shard(s) done, {tuned['shards_failed']} failed, "
                  f"{tuned['measured']} candidates measured ({tuned['errors']} errors) in {tuned['seconds']:.0f}s"
                  + (f"; stopped: {spent['stopped']}" if spent else ""), highlight=False)
    if tuned.get("seconds_per_candidate"):
        console.print(f"   {split_line(tuned['seconds_per_candidate'])}", highlight=False)


def print_run_build(console: Any, result: dict[str, Any]) -> None:
    """``tunefleet run``'s energy lines and its build (5/5): the build report's table."""
    from types import SimpleNamespace

    for row in result["energy"]:
        wasted = "-" if row["wasted_pct"] is None else f"{row['wasted_pct']:.1f}%"
        console.print(f"   energy: {row['joules']:,.0f} J ({row['kwh']:.6f} kWh, source {row['sources']}), "
                      f"{row['cost']:.4f} in node time, {wasted} wasted on candidates that did not improve")
    console.print("5/5 build:")
    report_table(SimpleNamespace(**result["builds"][0]))


def print_run_end(console: Any, result: dict[str, Any], hardware: str, untuned: Sequence[str]) -> None:
    """``tunefleet run``'s last lines: the workloads left untuned (``untuned``, their names) and
    what the budget spent."""
    if untuned:
        console.print(f"not tuned (no successful measurement; default schedule): {', '.join(untuned)}", highlight=False)
    total = result.get("budget")
    if total:
        from tunefleet.budget import format_duration

        reserve = total["build_reserve_s"].get(hardware)
        console.print(f"budget {total['budget']}: spent {total['trials']} trials and {format_duration(round(total['seconds']))} "
                      f"of wall time in {total['rounds']} round(s); stopped: {total['stopped'].get(hardware)}"
                      + (f"; build {total['build_s']:.0f}s (reserved {reserve:.0f}s)" if reserve and total["build_s"]
                         else ""), highlight=False)
