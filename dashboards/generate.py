"""Grafana dashboards for tunefleet, as code (grafana-foundation-sdk, Grafana 11.6 build).

    python dashboards/generate.py            # rewrite energy.json, cost.json, tuning.json
    python dashboards/generate.py --check    # exit 1 if a committed file differs from the code
    python dashboards/generate.py --query http://127.0.0.1:9090   # run every panel query

Every dashboard has a ``datasource`` variable (any Prometheus) and a ``hardware`` variable
(multi-select, "All" = ``.*``). Panel ids are explicit and unique across all three dashboards
(energy 1xx, cost 2xx, tuning 3xx) so links and alerts that name a panel keep working.

The metrics come from :class:`tunefleet.energy.metrics.FleetMetrics`. Shard jobs push one Pushgateway
group each, so every counter exists once per shard: panels always aggregate
(``sum by (hardware, ...)``) instead of showing raw series.

For tests and tooling, :func:`panel_queries` lists every panel query of a dashboard JSON and
:func:`substitute` replaces the Grafana variables (``$hardware``, ``$__rate_interval``,
``$__range``, ``$__interval``) so the query can be sent to Prometheus as is;
:func:`query_panels` does both and runs them against ``/api/v1/query``. Those three need only
the standard library; building the dashboards needs ``grafana-foundation-sdk``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NamedTuple

HERE = Path(__file__).resolve().parent

#: ``{hardware=~"$hardware"}``: every panel honours the hardware variable.
HW = 'hardware=~"$hardware"'
J_PER_KWH = "3.6e6"


class PanelQuery(NamedTuple):
    """One query of one panel: ``(dashboard uid, panel id, panel title, PromQL with variables)``."""

    dashboard: str
    panel_id: int
    title: str
    expr: str


class Target(NamedTuple):
    expr: str
    legend: str = ""


# --------------------------------------------------------------------------------------------
# Panel helpers (the SDK is imported lazily so panel_queries/substitute work without it)
# --------------------------------------------------------------------------------------------


def _sdk() -> SimpleNamespace:
    from grafana_foundation_sdk.builders import bargauge, common as cb, dashboard as db, prometheus, stat, table, timeseries
    from grafana_foundation_sdk.models import common as cm, dashboard as dm, prometheus as pm

    return SimpleNamespace(bargauge=bargauge, cb=cb, db=db, prometheus=prometheus, stat=stat, table=table,
                           timeseries=timeseries, cm=cm, dm=dm, pm=pm)


def _ds(sdk: Any) -> Any:
    return sdk.dm.DataSourceRef(type_val="prometheus", uid="${datasource}")


def _queries(sdk: Any, targets: Sequence[Target], *, instant: bool, table: bool = False) -> list[Any]:
    out = []
    for i, t in enumerate(targets):
        q = sdk.prometheus.Dataquery().expr(t.expr).ref_id(chr(ord("A") + i)).datasource(_ds(sdk))
        q = q.instant() if instant else q.range()
        if t.legend:
            q = q.legend_format(t.legend)
        if table:
            q = q.format(sdk.pm.PromQueryFormat.TABLE)
        out.append(q)
    return out


def _common(sdk: Any, panel: Any, pid: int, title: str, desc: str, pos: tuple[int, int, int, int], unit: str) -> Any:
    x, y, w, h = pos
    return (panel.id(pid).title(title).description(desc).datasource(_ds(sdk)).unit(unit)
            .grid_pos(sdk.dm.GridPos(h=h, w=w, x=x, y=y)))


def timeseries(pid: int, title: str, desc: str, pos: tuple[int, int, int, int], unit: str, targets: Sequence[Target],
               *, stack: bool = False) -> Callable[[Any], Any]:
    def build(sdk: Any) -> Any:
        p = _common(sdk, sdk.timeseries.Panel(), pid, title, desc, pos, unit).targets(_queries(sdk, targets, instant=False))
        p = p.fill_opacity(30 if stack else 10).line_width(1)
        if stack:
            p = p.stacking(sdk.cb.StackingConfig().mode(sdk.cm.StackingMode.NORMAL))
        return p.legend(sdk.cb.VizLegendOptions().display_mode(sdk.cm.LegendDisplayMode.TABLE)
                        .placement(sdk.cm.LegendPlacement.BOTTOM).show_legend(True).calcs(["lastNotNull", "max"]))
    return build


def stat(pid: int, title: str, desc: str, pos: tuple[int, int, int, int], unit: str, targets: Sequence[Target],
         *, decimals: int | None = None) -> Callable[[Any], Any]:
    def build(sdk: Any) -> Any:
        p = _common(sdk, sdk.stat.Panel(), pid, title, desc, pos, unit).targets(_queries(sdk, targets, instant=True))
        p = p.reduce_options(sdk.cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
        p = p.graph_mode(sdk.cm.BigValueGraphMode.NONE).color_mode(sdk.cm.BigValueColorMode.VALUE)
        return p.decimals(decimals) if decimals is not None else p
    return build


def bargauge(pid: int, title: str, desc: str, pos: tuple[int, int, int, int], unit: str,
             targets: Sequence[Target]) -> Callable[[Any], Any]:
    def build(sdk: Any) -> Any:
        p = _common(sdk, sdk.bargauge.Panel(), pid, title, desc, pos, unit).targets(_queries(sdk, targets, instant=True))
        return (p.orientation(sdk.cm.VizOrientation.HORIZONTAL).display_mode(sdk.cm.BarGaugeDisplayMode.GRADIENT)
                .reduce_options(sdk.cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)).min(0))
    return build


def table(pid: int, title: str, desc: str, pos: tuple[int, int, int, int], unit: str, targets: Sequence[Target],
          *, value_name: str, sort_desc: bool = True) -> Callable[[Any], Any]:
    """An instant query in table format: Time hidden, the value column named and sorted."""
    def build(sdk: Any) -> Any:
        p = _common(sdk, sdk.table.Panel(), pid, title, desc, pos, unit)
        p = p.targets(_queries(sdk, targets, instant=True, table=True))
        p = p.with_transformation(sdk.dm.DataTransformerConfig(
            id_val="organize", options={"excludeByName": {"Time": True}, "renameByName": {"Value": value_name}}))
        return p.sort_by([sdk.cb.TableSortByFieldState().display_name(value_name).desc(sort_desc)])
    return build


def _dashboard(uid: str, title: str, description: str, panels: Iterable[Callable[[Any], Any]]) -> dict[str, Any]:
    sdk = _sdk()
    d = (sdk.db.Dashboard(title).uid(uid).description(description).tags(["tunefleet"]).editable()
         .time("now-24h", "now").refresh("1m").timezone("browser")
         .tooltip(sdk.dm.DashboardCursorSync.CROSSHAIR)
         .with_variable(sdk.db.DatasourceVariable("datasource").label("Data source").type("prometheus"))
         .with_variable(sdk.db.QueryVariable("hardware").label("Hardware class").datasource(_ds(sdk))
                        .query("label_values(tunefleet_trials_total, hardware)")
                        .refresh(sdk.dm.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(sdk.dm.VariableSort.ALPHABETICAL_ASC)
                        .multi(True).include_all(True).all_value(".*")))
    for panel in panels:
        d = d.with_panel(panel(sdk))
    from grafana_foundation_sdk.cog.encoder import JSONEncoder

    return json.loads(JSONEncoder(sort_keys=True).encode(d.build()))


# --------------------------------------------------------------------------------------------
# The dashboards
# --------------------------------------------------------------------------------------------

ENERGY = "tunefleet_energy_joules_total"


def energy_dashboard() -> dict[str, Any]:
    total_range = f"sum(increase({ENERGY}{{{HW}}}[$__range]))"
    return _dashboard("tunefleet-energy", "tunefleet — energy",
                      "Energy spent measuring candidates: useful (beat the best so far) vs wasted (did not, or "
                      "failed), by hardware class, source (RAPL, NVML or estimate) and model.", [
        stat(101, "Energy (kWh)", "Energy spent measuring over the time range.", (0, 0, 6, 4), "kwatth",
             [Target(f"{total_range} / {J_PER_KWH}")], decimals=3),
        stat(102, "Wasted energy", "Share of the energy spent on candidates that did not improve the best "
             "latency of their workload (errors included), over the time range.", (6, 0, 6, 4), "percentunit",
             [Target(f'sum(increase({ENERGY}{{{HW}, kind="wasted"}}[$__range])) / {total_range}')], decimals=1),
        stat(103, "Estimated share", "Share of the energy whose source includes an estimate (CPU time x the "
             "class's power figure; e.g. estimate, nvml+estimate) rather than only RAPL or NVML counters, "
             "over the time range.", (12, 0, 6, 4),
             "percentunit",
             [Target(f'sum(increase({ENERGY}{{{HW}, source=~".*estimate.*"}}[$__range])) / {total_range}')],
             decimals=1),
        stat(104, "Wasted energy (kWh)", "Energy spent on candidates that did not improve, over the time range.",
             (18, 0, 6, 4), "kwatth",
             [Target(f'sum(increase({ENERGY}{{{HW}, kind="wasted"}}[$__range])) / {J_PER_KWH}')], decimals=3),
        timeseries(105, "Energy by hardware class", "Joules spent per rate interval, stacked by hardware class.",
                   (0, 4, 12, 9), "joule",
                   [Target(f"sum by (hardware) (increase({ENERGY}{{{HW}}}[$__rate_interval]))", "{{hardware}}")],
                   stack=True),
        timeseries(106, "Useful vs wasted power", "Average power drawn by measurements, split into useful "
                   "and wasted.", (12, 4, 12, 9), "watt",
                   [Target(f"sum by (kind) (rate({ENERGY}{{{HW}}}[$__rate_interval]))", "{{kind}}")], stack=True),
        bargauge(107, "Energy per model (kWh)", "Tuning energy attributed to each model by the accounting "
                 "step (shared workloads apportioned by weight).", (0, 13, 12, 9), "kwatth",
                 [Target(f"sum by (model, kind) (tunefleet_model_energy_joules{{{HW}}}) / {J_PER_KWH}",
                         "{{model}} · {{kind}}")]),
        table(108, "Energy sources in use", "Joules over the time range per hardware class and source "
              "(rapl, nvml, estimate, or a mix such as nvml+estimate).", (12, 13, 12, 9), "joule",
              [Target(f"sum by (hardware, source) (increase({ENERGY}{{{HW}}}[$__range]))")], value_name="Energy"),
    ])


COST = "tunefleet_cost_total"


def cost_dashboard() -> dict[str, Any]:
    return _dashboard("tunefleet-cost", "tunefleet — cost",
                      "Money spent on tuning nodes (price per hour x node time) in each hardware class's price "
                      "units, by hardware class and model.", [
        stat(201, "Total cost", "Cost of tuning nodes over the time range (price units).", (0, 0, 8, 4), "none",
             [Target(f"sum(increase({COST}{{{HW}}}[$__range]))")], decimals=2),
        stat(202, "Cost per useful trial", "Cost over the time range divided by the candidates that improved "
             "a best latency.", (8, 0, 8, 4), "none",
             [Target(f"sum(increase({COST}{{{HW}}}[$__range])) / "
                     f'sum(increase(tunefleet_trials_total{{{HW}, kind="useful"}}[$__range]))')], decimals=4),
        stat(203, "Cost attributed to models", "Sum of the per-model costs set by the accounting step.",
             (16, 0, 8, 4), "none", [Target(f"sum(tunefleet_model_cost{{{HW}}})")], decimals=2),
        timeseries(204, "Cost rate by hardware class (per hour)", "Spending rate in price units per hour, "
                   "stacked by hardware class.", (0, 4, 12, 9), "none",
                   [Target(f"sum by (hardware) (rate({COST}{{{HW}}}[$__rate_interval])) * 3600", "{{hardware}}")],
                   stack=True),
        bargauge(205, "Cost by hardware class", "Cost over the time range per hardware class.", (12, 4, 12, 9),
                 "none", [Target(f"sum by (hardware) (increase({COST}{{{HW}}}[$__range]))", "{{hardware}}")]),
        bargauge(206, "Cost per model", "Tuning cost attributed to each model (shared workloads apportioned "
                 "by weight).", (0, 13, 12, 9), "none",
                 [Target(f"sum by (model) (tunefleet_model_cost{{{HW}}})", "{{model}}")]),
        table(207, "Cost per model and hardware class", "Per-model cost on each hardware class.",
              (12, 13, 12, 9), "none", [Target(f"sum by (model, hardware) (tunefleet_model_cost{{{HW}}})")], value_name="Cost"),
    ])


TRIALS = "tunefleet_trials_total"
DURATION = "tunefleet_shard_duration_seconds_bucket"


def tuning_dashboard() -> dict[str, Any]:
    trials_range = f"sum(increase({TRIALS}{{{HW}}}[$__range]))"
    return _dashboard("tunefleet-tuning", "tunefleet — tuning",
                      "Tuning throughput, measurement errors, shards and progress of best latencies.", [
        stat(301, "Trials measured", "Candidates measured over the time range.", (0, 0, 5, 4), "short",
             [Target(trials_range)], decimals=0),
        stat(302, "Useful trials", "Share of measured candidates that improved a best latency.", (5, 0, 5, 4),
             "percentunit", [Target(f'sum(increase({TRIALS}{{{HW}, kind="useful"}}[$__range])) / {trials_range}')],
             decimals=1),
        stat(303, "Measure errors", "Candidates that failed to build or run, over the time range.", (10, 0, 5, 4),
             "short", [Target(f"sum(increase(tunefleet_measure_errors_total{{{HW}}}[$__range]))")], decimals=0),
        stat(304, "Shards leased", "Shards being tuned right now.", (15, 0, 4, 4), "short",
             [Target(f'sum(tunefleet_shards{{{HW}, state="leased"}})')], decimals=0),
        stat(305, "Since last push", "Time since any shard last pushed its metrics to the Pushgateway "
             "(all hardware classes: the push timestamp carries only the grouping key's labels).",
             (19, 0, 5, 4), "s", [Target("time() - max(tunefleet_last_push_timestamp_seconds)")],
             decimals=0),
        timeseries(306, "Throughput by hardware class", "Candidates measured per second.", (0, 4, 12, 8),
                   "short", [Target(f"sum by (hardware) (rate({TRIALS}{{{HW}}}[$__rate_interval]))", "{{hardware}}")],
                   stack=True),
        timeseries(307, "Measure errors by stage", "Failed candidates per second, by hardware class and stage "
                   "(build or run).", (12, 4, 12, 8), "short",
                   [Target(f"sum by (hardware, stage) (rate(tunefleet_measure_errors_total{{{HW}}}[$__rate_interval]))",
                           "{{hardware}} {{stage}}")]),
        timeseries(308, "Shard states", "Shards per state (pending, leased, done, failed, cancelled).",
                   (0, 12, 12, 8), "short",
                   [Target(f"sum by (state) (tunefleet_shards{{{HW}}})", "{{state}}")]),
        bargauge(309, "Shard duration p50 / p95", "Quantiles of shard wall-clock time over the time range, "
                 "per hardware class (from the histogram; buckets 1 s to 2 h).", (12, 12, 12, 8), "s",
                 [Target(f"histogram_quantile(0.5, sum by (le, hardware) (increase({DURATION}{{{HW}}}[$__range])))",
                         "{{hardware}} p50"),
                  Target(f"histogram_quantile(0.95, sum by (le, hardware) (increase({DURATION}{{{HW}}}[$__range])))",
                         "{{hardware}} p95")]),
        timeseries(310, "Best latency (fastest workload) by hardware class", "Lowest best latency over all "
                   "workloads of a hardware class; it falls as tuning finds faster schedules.", (0, 20, 12, 9),
                   "s", [Target(f"min by (hardware) (tunefleet_best_latency_seconds{{{HW}}})", "{{hardware}}")]),
        table(311, "Top workloads by best latency", "The 20 slowest workloads (best latency so far): where "
              "inference time goes and further tuning pays most.", (12, 20, 12, 9), "s",
              [Target(f"topk(20, min by (workload, hardware) (tunefleet_best_latency_seconds{{{HW}}}))")],
              value_name="Best latency"),
    ])


#: File name -> builder.
DASHBOARDS: dict[str, Callable[[], dict[str, Any]]] = {
    "energy.json": energy_dashboard,
    "cost.json": cost_dashboard,
    "tuning.json": tuning_dashboard,
}


def render(dashboard: Mapping[str, Any]) -> str:
    """The committed form: indent 2, sorted keys, trailing newline."""
    return json.dumps(dashboard, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def generate() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {name: render(build()) for name, build in DASHBOARDS.items()}


def load_committed(directory: Path = HERE) -> dict[str, dict[str, Any]]:
    """File name -> parsed committed dashboard JSON."""
    return {name: json.loads((directory / name).read_text(encoding="utf-8")) for name in DASHBOARDS}


# --------------------------------------------------------------------------------------------
# Queries (standard library only)
# --------------------------------------------------------------------------------------------


def panel_queries(dashboard_json: Mapping[str, Any]) -> list[PanelQuery]:
    """Every PromQL query of every panel (rows' nested panels included), in panel order."""
    out: list[PanelQuery] = []

    def walk(panels: Iterable[Mapping[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets") or []:
                if target.get("expr"):
                    out.append(PanelQuery(dashboard_json["uid"], int(panel["id"]), panel.get("title", ""), target["expr"]))
            walk(panel.get("panels") or [])

    walk(dashboard_json.get("panels") or [])
    return out


_VAR_RE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")


def substitute(expr: str, hardware: str = ".*", rate_interval: str = "1m", range: str = "1h",  # noqa: A002
               interval: str | None = None) -> str:
    """Replace the Grafana variables of a panel query so Prometheus can run it.

    ``$hardware`` (a regex: ``.*`` means all), ``$__rate_interval``, ``$__range`` and
    ``$__interval`` (defaults to ``rate_interval``), written ``$name`` or ``${name}``. Any other
    variable raises ``KeyError``, so a query using a variable no dashboard defines is caught.
    """
    values = {"hardware": hardware, "__rate_interval": rate_interval, "__range": range,
              "__interval": interval or rate_interval}

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"unknown Grafana variable ${name} in {expr!r}")
        return values[name]

    return _VAR_RE.sub(repl, expr)


class QueryOutcome(NamedTuple):
    query: PanelQuery
    promql: str
    error: str | None  # None when Prometheus answered "success"
    result: list[dict[str, Any]]


def query_panels(prom_url: str, dashboards: Iterable[Mapping[str, Any]] | None = None, *, hardware: str = ".*",
                 rate_interval: str = "30s", range: str = "5m", timeout: float = 10.0) -> list[QueryOutcome]:  # noqa: A002
    """Run every panel query (variables substituted) as an instant query against Prometheus."""
    boards = list(dashboards) if dashboards is not None else list(load_committed().values())
    outcomes = []
    for board in boards:
        for q in panel_queries(board):
            promql = substitute(q.expr, hardware=hardware, rate_interval=rate_interval, range=range)
            url = prom_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
            try:
                with urllib.request.urlopen(url, timeout=timeout) as resp:
                    body = json.load(resp)
            except urllib.error.HTTPError as exc:  # 400/422: Prometheus explains in the body
                try:
                    body = json.load(exc)
                except ValueError:
                    body = {"status": "error", "error": str(exc)}
            if body.get("status") != "success":
                outcomes.append(QueryOutcome(q, promql, f"{body.get('errorType')}: {body.get('error')}", []))
            else:
                outcomes.append(QueryOutcome(q, promql, None, body["data"]["result"]))
    return outcomes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="exit 1 if a committed dashboard differs from the code")
    group.add_argument("--query", metavar="PROMETHEUS_URL", help="run every panel query against this Prometheus")
    args = parser.parse_args(argv)
    if args.query:
        bad = 0
        for o in query_panels(args.query):
            status = o.error or (f"{len(o.result)} series" if o.result else "EMPTY")
            bad += bool(o.error or not o.result)
            print(f"{o.query.dashboard} #{o.query.panel_id} {o.query.title}: {status}")
        return 1 if bad else 0
    stale = []
    for name, text in generate().items():
        path = HERE / name
        if args.check:
            if not path.exists() or path.read_text(encoding="utf-8") != text:
                stale.append(name)
        else:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if stale:
        print(f"dashboards out of date: {', '.join(stale)}; run: python dashboards/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
