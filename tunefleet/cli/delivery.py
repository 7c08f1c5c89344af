"""What tuning delivers: ``best``, ``build`` and ``export-db``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tunefleet import api
from tunefleet.cli.common import at_least
from tunefleet.cli.render import print_json, report_table, table
from tunefleet.errors import NotFoundError, TunefleetError

if TYPE_CHECKING:
    from tunefleet.budget import Budget
    from tunefleet.cli.common import AddParser, Subparsers
    from tunefleet.config import Settings
    from tunefleet.context import Context


def cmd_best(args: argparse.Namespace, settings: Settings) -> int:
    if args.verify and not (args.zero_shot or args.transfer):
        raise TunefleetError("--verify needs --zero-shot or --transfer")
    if args.zero_shot and args.transfer:
        raise TunefleetError("--zero-shot and --transfer exclude each other")
    ctx = api.connect(settings)
    unmeasured = not ctx.db.best_measurements(ctx.db.workload(args.workload).id, ctx.db.hardware_class(args.hardware).id, 1)
    if args.zero_shot and unmeasured:
        return _best_predicted(ctx, args)
    if args.transfer and unmeasured:
        return _best_transferred(ctx, args)
    found = api.best(ctx, args.workload, args.hardware, n=args.top)
    if args.json:
        print_json([b.as_dict() for b in found])
    else:
        table(f"best schedules of {found[0].workload} on {args.hardware}",
              ["rank", "mean run (ms)", "untuned (ms)", "measurement", "measured at", "tvm", "origin"],
              [(i + 1, f"{b.mean_run_s * 1e3:.4f}", f"{b.untuned_s * 1e3:.4f}" if b.untuned_s else "-",
                b.measurement_id, b.measured_at, b.tvm_version, b.origin) for i, b in enumerate(found)])
    return 0


def _best_predicted(ctx: Context, args: argparse.Namespace) -> int:
    """`best --zero-shot` for a workload never measured on the class: the cost model's proposals."""
    from tunefleet.delivery.zeroshot import predict_workloads
    from tunefleet.learning.pretrained import SHIPPED_VERSION

    wl = ctx.db.workload(args.workload)
    top_k = max(args.top, args.verify, 1)
    res = predict_workloads(ctx.db, ctx.store, args.hardware, [wl.id], top_k=top_k, verify=args.verify,
                            pretrained=ctx.settings.pretrained_cost_model)
    if args.verify:  # measured now: answer with measurements, like any measured workload
        found = api.best(ctx, wl.structural_hash, args.hardware, n=args.top)
        if args.json:
            print_json([{**b.as_dict(), "source": "measured (zero-shot verified)"} for b in found])
        else:
            table(f"best of {args.verify} schedules verified for {wl.structural_hash} on {args.hardware} (its "
                  "default, borrowed ones, zero-shot proposals, then refining searches' schedules), measured",
                  ["rank", "mean run (ms)", "untuned (ms)", "measurement"],
                  [(i + 1, f"{b.mean_run_s * 1e3:.4f}", f"{b.untuned_s * 1e3:.4f}" if b.untuned_s else "-",
                    b.measurement_id) for i, b in enumerate(found)])
        return 0
    preds = ctx.db.best_predictions(wl.id, ctx.db.hardware_class(args.hardware).id, args.top)
    item = res.workloads[0]
    if args.json:
        print_json([{"workload": wl.structural_hash, "hardware": args.hardware, "source": "predicted",
                     "cost_model_version": res.cost_model_version, "rank": i + 1, "score": p.score,
                     "trace_json": p.trace_json, "search_seconds": item.seconds} for i, p in enumerate(preds)])
    else:
        by = ("the cost model shipped with tunefleet (v0)" if res.cost_model_version == SHIPPED_VERSION
              else f"cost model v{res.cost_model_version}")
        table(f"zero-shot schedules of {wl.structural_hash} on {args.hardware}: PREDICTED by {by}, not measured",
              ["rank", "predicted score", "prediction id"], [(i + 1, f"{p.score:.4f}", p.id) for i, p in enumerate(preds)])
        if item.status == "predicted":
            print(f"searched {item.candidates_scored} candidates in {item.seconds:.1f}s; measure them with --verify K")
    return 0


def _best_transferred(ctx: Context, args: argparse.Namespace) -> int:
    """`best --transfer`: the best schedule of the most compatible class that builds for this one."""
    from tunefleet.planning.transfer import transfer_best

    found = transfer_best(ctx.db, args.workload, args.hardware)
    if found is None:
        raise NotFoundError(f"no measurement of workload {args.workload} on {args.hardware}, and no compatible "
                            "class has a schedule that builds for it")
    if args.verify:
        from tunefleet.engine.worker import verify_transfer

        verify_transfer(ctx.db, found)
    if args.json:
        print_json([found.as_dict()])
        return 0
    table(f"best schedule of {found.workload} for {args.hardware}: TRANSFERRED from {found.source_hardware}",
          ["source class", "compatibility", "mean run there (ms)", "measured here (ms)", "source measurement"],
          [(found.source_hardware, f"{found.compatibility:.2f}", f"{found.source_mean_run_s * 1e3:.4f}",
            f"{found.verified_mean_run_s * 1e3:.4f}" if found.verified_mean_run_s else "not measured (--verify 1)",
            found.source_measurement_id)])
    return 0


def cmd_build(args: argparse.Namespace, settings: Settings) -> int:
    ctx = api.connect(settings)
    if args.verify is not None and not args.zero_shot:
        raise TunefleetError("--verify needs --zero-shot")
    from rich.console import Console

    from tunefleet.cli.environment import log_to_file
    from tunefleet.tvm.native_log import native_stderr_to

    model = ctx.db.model(args.model)
    log_path = log_to_file(settings, "build", verbose=args.verbose)
    console = Console(stderr=True)  # stderr, so --json stays clean
    console.print(f"logs: {log_path}", highlight=False, soft_wrap=True)
    # A spinner: extraction, zero-shot search and verification, compiling and timing take minutes.
    # TVM's C++ warnings (the zero-shot search's among them) go to the log file, as in `run`.
    with native_stderr_to(log_path), \
            console.status(f"building {model.name} for {args.hardware} with the best stored schedules"):
        report = api.build(ctx, model, args.hardware, output=args.output, zero_shot=args.zero_shot,
                           top_k=args.top_k, verify=args.verify, transfer=args.transfer,
                           confirm_top=args.confirm_top)
    if args.json:
        print_json(report.as_dict())
    else:
        report_table(report)
    return 0


def cmd_export_db(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.delivery.best import export_json_database

    ctx = api.connect(settings)
    done = export_json_database(ctx.db, args.hardware, args.directory, top_k=args.top)
    hub = f"; {done.from_hub} of them from the hub, measured on {args.hardware}" if done.from_hub else ""
    print(f"wrote {done.records} record(s) for {done.workloads} workload(s) to {args.directory} (MetaSchedule "
          f"JSONDatabase files{hub}); they need recipe {done.recipe}, named in {args.directory}/tunefleet.json: "
          "build with tunefleet.build_exported(mod, DIRECTORY, params=...)")
    return 0


def verify_budget(text: str) -> Budget | int:
    """``build --verify``: 0 (pure prediction), a candidate count or a wall time, checked before any work."""
    from tunefleet.delivery.zeroshot import parse_verify

    return parse_verify(text, name="--verify")


# -- parsers --------------------------------------------------------------------------------
def _add_best(sub: Subparsers) -> None:
    be = sub.add_parser("best", help="best measured schedule of a workload on a hardware class")
    be.add_argument("workload", help="structural hash (or a unique prefix)")
    be.add_argument("--hardware", default="x86", help="hardware class (default x86; see `tunefleet hardware list`)")
    be.add_argument("--top", type=at_least(1, "--top"), default=1, help="show this many best schedules (default 1)")
    be.add_argument("--json", action="store_true", help="print JSON instead of a table")
    be.add_argument("--zero-shot", action="store_true",
                    help="never measured on this class: show the current cost model's proposals (PREDICTED)")
    be.add_argument("--transfer", action="store_true",
                    help="never measured on this class: the best schedule of the most compatible class (TRANSFERRED)")
    be.add_argument("--verify", type=at_least(0, "--verify"), default=0, metavar="K",
                    help="with --zero-shot: measure the top K proposals; with --transfer: measure it (K >= 1)")
    be.set_defaults(handler=cmd_best)


def _add_build(sub: Subparsers) -> None:
    bu = sub.add_parser("build", help="compile a model with the best stored schedules and compare latency")
    bu.add_argument("model", help="stored model: name, id or sha256 prefix")
    bu.add_argument("--hardware", default="x86", help="hardware class (default x86; see `tunefleet hardware list`)")
    bu.add_argument("-o", "--output", default=None, help="write the compiled library to this file (default: not written)")
    bu.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bu.add_argument("--zero-shot", action="store_true",
                    help="workloads never measured on this class get the current cost model's best proposal")
    bu.add_argument("--top-k", type=at_least(1, "--top-k"), default=5, help="with --zero-shot: proposals stored per workload (default 5)")
    bu.add_argument("--verify", type=verify_budget, default=None, metavar="BUDGET",
                    help="with --zero-shot: measure proposals here within this budget in all, a candidate count "
                    "(40) or a wall time (90s, 2m: the proposals' search included), heaviest workloads' "
                    "best-scored first; each workload measured so is built with its best measured schedule; "
                    "0: pure prediction (default 90s)")
    bu.add_argument("--transfer", action="store_true",
                    help="workloads never measured on this class use the most compatible class's best schedule")
    bu.add_argument("--confirm-top", type=at_least(0, "--confirm-top"), default=None, metavar="N",
                    help="first re-time each workload's N fastest schedules side by side here and build with the "
                    "fastest re-timed one (default TUNEFLEET_CONFIRM_TOP, 0: build with the fastest records)")
    bu.set_defaults(handler=cmd_build)


def _add_export_db(sub: Subparsers) -> None:
    ex = sub.add_parser("export-db", help="write the best records as MetaSchedule JSON database files")
    ex.add_argument("directory", help="directory to write the JSONDatabase files to")
    ex.add_argument("--hardware", default="x86", help="hardware class (default x86; see `tunefleet hardware list`)")
    ex.add_argument("--top", type=at_least(1, "--top"), default=1, help="records per workload (default 1)")
    ex.set_defaults(handler=cmd_export_db)


#: This module's commands, each with what adds it to the parser (:func:`tunefleet.cli.app.build_parser`).
PARSERS: dict[str, AddParser] = {"best": _add_best, "build": _add_build, "export-db": _add_export_db}
