"""Reports from the database: ``report energy|tuning`` and ``metrics serve``."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import TYPE_CHECKING

from tunefleet import api
from tunefleet.cli.common import TCP_PORT, at_least, listen_address
from tunefleet.cli.render import print_json, table
from tunefleet.errors import TunefleetError

if TYPE_CHECKING:
    from tunefleet.cli.common import AddParser, Subparsers
    from tunefleet.config import Settings

log = logging.getLogger("tunefleet")


def cmd_report_energy(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.energy.accounting import energy_report

    ctx = api.connect(settings)
    rows = energy_report(ctx.db, model=args.model, hardware=args.hardware)
    if args.json:
        print_json([r.as_dict() for r in rows])
    elif not rows:
        print("no measurements yet")
    else:
        table("tuning energy and cost per model and hardware class",
              ["model", "hardware", "joules", "kWh", "money", "wasted %", "trials", "errors", "filtered",
               "best latency (ms)", "tuned workloads", "source"],
              [(r.model, r.hardware, f"{r.joules:,.0f}", f"{r.kwh:.6f}", f"{r.cost:.4f}",
                "-" if r.wasted_pct is None else f"{r.wasted_pct:.1f}", r.trials, r.errors, r.filtered,
                "-" if r.best_latency_ms is None else f"{r.best_latency_ms:.3f}", f"{r.tuned_workloads}/{r.workloads}",
                r.sources) for r in rows])
        if any("estimate" in r.sources for r in rows):
            print("estimate: CPU-seconds x the class's W per busy core + idle W x node time (no RAPL/NVML counter here)")
    if args.plot and rows:
        from tunefleet.cli.plots import energy_figure

        chart = energy_figure(rows, args.plot)
        # with --json, stdout stays parseable
        print(f"wrote {chart.path}", file=sys.stderr if args.json else sys.stdout)
    elif args.plot:
        print(f"no chart written to {args.plot}: nothing measured yet", file=sys.stderr)
    return 0


def cmd_report_tuning(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.cli.plots import tuning_figure

    ctx = api.connect(settings)
    model = ctx.db.model(args.model)
    output = args.output or f"{model.name}-{args.hardware}-tuning.png"
    chart = tuning_figure(ctx.db, model, args.hardware, output, top=args.top)
    print(f"wrote {chart.path}")
    return 0


def cmd_metrics_serve(args: argparse.Namespace, settings: Settings) -> int:
    """A long-running exporter of the fleet gauges (per-model energy and cost, shard states)."""
    import time

    from tunefleet.energy.accounting import publish_fleet_metrics
    from tunefleet.energy.metrics import FleetMetrics

    ctx = api.connect(settings)
    metrics = FleetMetrics()
    publish_fleet_metrics(ctx.db, metrics)
    server = metrics.serve(args.port, addr=args.addr)
    print(f"serving http://{args.addr}:{server.server_port}/metrics (refreshed every {args.interval:g}s)", flush=True)
    while True:
        time.sleep(args.interval)
        try:
            publish_fleet_metrics(ctx.db, metrics)
        except TunefleetError as exc:  # keep serving the last values through a database outage
            log.warning("metrics not refreshed: %s", exc)


# -- parsers --------------------------------------------------------------------------------
def _add_report(sub: Subparsers) -> None:
    rep = sub.add_parser("report", help="reports from the database").add_subparsers(dest="sub", required=True)
    ren = rep.add_parser("energy", help="joules, kWh, money, wasted %% per model and hardware class")
    ren.add_argument("--model", default=None, help="only this model (name or id; default every model)")
    ren.add_argument("--hardware", default=None, help="only this hardware class (default every class)")
    ren.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ren.add_argument("--plot", default=None, metavar="FILE",
                     help="also write a PNG chart of useful vs wasted joules per row (needs tunefleet[plots])")
    ren.set_defaults(handler=cmd_report_energy)
    rtu = rep.add_parser("tuning", help="PNG chart of a model's tuning progress: best latency vs trials and time")
    rtu.add_argument("model", help="model name, id or sha256 prefix (see `tunefleet models list`)")
    rtu.add_argument("--hardware", default="x86", help="hardware class (default x86; see `tunefleet hardware list`)")
    rtu.add_argument("-o", "--output", default=None, metavar="FILE",
                     help="PNG to write (default <model>-<hardware>-tuning.png in the current directory)")
    rtu.add_argument("--top", type=at_least(1, "--top"), default=6,
                     help="plot this many workloads, those with the largest calls x best latency (default 6)")
    rtu.set_defaults(handler=cmd_report_tuning)


def _add_metrics(sub: Subparsers) -> None:
    met = sub.add_parser("metrics", help="Prometheus metrics").add_subparsers(dest="sub", required=True)
    mse = met.add_parser("serve", help="serve the fleet's gauges from the database on /metrics")
    mse.add_argument("--port", type=TCP_PORT, default=9464, help="TCP port to listen on (default 9464)")
    mse.add_argument("--addr", type=listen_address, default="127.0.0.1",
                     help="address of this machine to listen on (default 127.0.0.1)")
    mse.add_argument("--interval", type=at_least(1, "--interval"), default=15, help="seconds between refreshes from the database (default 15)")
    mse.set_defaults(handler=cmd_metrics_serve)


#: This module's commands, each with what adds it to the parser (:func:`tunefleet.cli.app.build_parser`).
PARSERS: dict[str, AddParser] = {"report": _add_report, "metrics": _add_metrics}
