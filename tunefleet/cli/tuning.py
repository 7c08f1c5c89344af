"""The queue of work: ``plan``, ``tune`` and ``shards list|retry|cancel``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from tunefleet import api
from tunefleet.cli.common import at_least
from tunefleet.cli.environment import log_to_file
from tunefleet.cli.interrupt import stop_on_ctrl_c
from tunefleet.cli.render import budget_line, print_json, split_line, table

if TYPE_CHECKING:
    from tunefleet.cli.common import AddParser, Subparsers
    from tunefleet.config import Settings
    from tunefleet.context import Context
    from tunefleet.db import Database
    from tunefleet.engine.options import TuneOptions


def cmd_plan(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.planning import shard_queue
    from tunefleet.planning.spend import PLAN, Spend

    ctx = api.connect(settings)
    model_ids = [ctx.db.model(args.model).id] if args.model else None
    # A bad budget, or a duration, is refused before anything changes.
    spend = Spend.request(PLAN, args.budget, trials=args.trials, model_ids=model_ids, name="--budget")
    _warn_recipes(ctx.db, args.hardware, args.model)
    if args.reset_plateaus:
        n = ctx.db.reset_plateaus(ctx.db.hardware_class(args.hardware).id)
        print(f"reset the plateau state of {n} workload(s) on {args.hardware}")
    if spend.budget is not None:
        from tunefleet.planning.rounds import plan_once

        res = plan_once(ctx.db, args.hardware, spend.budget, model_ids, shard_trials=args.shard_trials,
                        batch=tune_options(args, settings).trials_per_iter, energy_aware=settings.energy_aware)
        print(f"planned {len(res.shards)} new shard(s), {sum(s.trials for s in res.shards)} trials of a budget of "
              f"{spend.budget} ({res.outstanding} planned and not tuned in all), over {len(res.workloads)} workload(s) "
              f"on {args.hardware}" + (f"; {res.stop}" if res.stop else ""))
        return 0
    created, view = shard_queue.plan(ctx.db, args.hardware, target_trials=args.trials, shard_trials=args.shard_trials,
                                     model=args.model)
    preempted = sum(v.preempted for v in view)
    print(f"planned {len(created)} new shard(s), {sum(s.trials for s in created)} trials, "
          f"over {len(view)} workload(s) on {args.hardware}"
          + (f"; {preempted} preempted workload(s) skipped (--reset-plateaus to tune them again)" if preempted else ""))
    return 0


def _warn_recipes(db: Database, hardware: str, model: str | None) -> None:
    """Say (on stderr) when a model's workloads on the class are missing or of another recipe."""
    from tunefleet.models.workloads import recipe_warning

    hw = db.hardware_class(hardware)
    ids = [db.model(model).id] if model else [m.id for m in db.models() if db.model_recipes(m.id, hw.id)]
    for model_id in ids:
        if (line := recipe_warning(db, model_id, hardware)) is not None:
            print(f"tunefleet: warning: {line}", file=sys.stderr)


def tune_options(args: argparse.Namespace, settings: Settings) -> TuneOptions:
    """The run's tuning options: the settings, overridden by every flag named like a
    :class:`~tunefleet.config.TuneKnobs` field that was given, then ``--cold`` and ``--efficient``.

    Parameters
    ----------
    args : argparse.Namespace
        A command's arguments (those it lacks leave the settings' values).
    settings : Settings
        The effective configuration.

    Returns
    -------
    TuneOptions
    """
    from tunefleet.config import TuneKnobs
    from tunefleet.engine.options import TuneOptions

    given = {name: getattr(args, name, None) for name in TuneKnobs.model_fields}
    options = TuneOptions.from_settings(settings, **given)
    if getattr(args, "cold", False):
        options = options.replace(warm_start=False)
    return options.efficient() if getattr(args, "efficient", False) else options


def _tune_budget(args: argparse.Namespace, ctx: Context, options: TuneOptions) -> tuple[Any, Any]:
    """``tune --budget``: (the rounds of a model's budget, or None; the deadline, or None)."""
    from tunefleet.planning.spend import TUNE, Spend

    model_ids = [ctx.db.model(args.model).id] if args.model else None
    spend = Spend.request(TUNE, args.budget, model_ids=model_ids, name="--budget")
    return spend.tuning(args.hardware, batch=options.trials_per_iter, energy_aware=options.energy_aware)


def cmd_tune(args: argparse.Namespace, settings: Settings) -> int:
    from rich.console import Console

    from tunefleet.cli.progress import RunProgress
    from tunefleet.tvm import without_torch  # noqa: F401  # before anything imports TVM: tuning needs no torch
    from tunefleet.tvm.native_log import native_stderr_to

    options = tune_options(args, settings)
    ctx = api.connect(settings)
    ctx.db.hardware_class(args.hardware)
    rounds, deadline = _tune_budget(args, ctx, options)
    # With --json, stdout carries the result alone: the log path and the live line go to stderr.
    console = Console(stderr=args.json, width=None if (sys.stderr if args.json else sys.stdout).isatty() else 160)
    log_path = log_to_file(settings, "tune", verbose=args.verbose)
    console.print(f"logs: {log_path}", highlight=False, soft_wrap=True)
    stop_on_ctrl_c(settings, f"tunefleet tune --hardware {args.hardware}")
    model = ctx.db.model(args.model).name if rounds is not None else None
    ends_at = deadline.at if deadline is not None else None
    # TVM's C++ warnings to the log file, as in `run` (tunefleet.tvm.native_log).
    with native_stderr_to(log_path), RunProgress(settings, model, args.hardware, console, ends_at=ends_at):
        if args.workers > 1:
            codes = api.tune_with_workers(ctx, args.hardware, options, workers=args.workers,
                                          max_shards=args.max_shards, rounds=rounds, deadline=deadline)
        else:
            summary = api.tune(ctx, args.hardware, options, max_shards=args.max_shards, rounds=rounds,
                               deadline=deadline)
    if args.workers > 1:
        spent = None
        if rounds is not None:  # counted in the database: every worker's trials
            # The workers ran the rounds in their own processes: the database says why they ended.
            rounds.stopped = rounds.why_over(ctx.db) or "the workers ended"
            spent = rounds.summary(ctx.db)
        if args.json:
            print_json({"hardware": args.hardware, "worker_exit_codes": codes, "budget": spent})
        else:
            print(f"workers exited with {codes}" + (f"; {budget_line(spent)}" if spent else ""))
        return 0 if not any(codes) else 1
    if args.json:
        from dataclasses import asdict

        print_json({**asdict(summary), "seconds_per_candidate": summary.per_candidate()})
        return 0 if not summary.shards_failed else 1
    print(f"{summary.shards_done} shard(s) done, {summary.shards_failed} failed; {summary.measured} candidates "
          f"measured ({summary.errors} errors, {summary.skipped_known} already known"
          + (f", {summary.filtered} filtered, {summary.preempted} shard(s) preempted" if args.efficient or
             summary.filtered or summary.preempted else "")
          + (f", filtering stopped in {summary.filter_stopped} shard(s) whose measurements the cost model did not "
             "rank" if summary.filter_stopped else "")
          + (f", the warm start dropped in {summary.warm_start_dropped} shard(s) whose measurements it misranked"
             if summary.warm_start_dropped else "")
          + f") in {summary.seconds:.0f}s"
          + (f"; {budget_line(summary.budget)}" if summary.budget else
             f"; stopped: {summary.stopped}" if summary.stopped else ""))
    if (split := summary.per_candidate()) is not None:
        print(split_line(split))
    return 0 if not summary.shards_failed else 1


def cmd_shards_list(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.planning import shard_queue

    ctx = api.connect(settings)
    rows = shard_queue.list_shards(ctx.db, hardware=args.hardware, state=args.state)
    names = {h.id: h.name for h in ctx.db.hardware_classes()}
    data = [{"id": r.id, "workload_id": r.workload_id, "hardware": names.get(r.hardware_class_id), "trials": r.trials,
             "priority": r.priority, "state": r.state, "attempts": f"{r.leases}/{r.max_leases}",
             "owner": r.lease_owner, "error": (r.error or "")[:80]} for r in rows]
    if args.json:
        print_json(data)
    else:
        table("shards", list(data[0].keys()) if data else ["id"], [list(d.values()) for d in data])
    return 0


def cmd_shards_retry(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.planning import shard_queue

    ids = shard_queue.retry(api.connect(settings).db, args.ids or None, hardware=args.hardware)
    print(f"requeued {len(ids)} shard(s)")
    return 0


def cmd_shards_cancel(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.planning import shard_queue

    ids = shard_queue.cancel(api.connect(settings).db, args.ids or None, hardware=args.hardware)
    print(f"cancelled {len(ids)} shard(s)")
    return 0


# -- parsers --------------------------------------------------------------------------------
def _add_plan(sub: Subparsers) -> None:
    pl = sub.add_parser("plan", help="cut untuned work into shards")
    pl.add_argument("--hardware", default="x86", help="hardware class (default x86; see `tunefleet hardware list`)")
    pl_spend = pl.add_mutually_exclusive_group(required=True)
    pl_spend.add_argument("--trials", type=at_least(1, "--trials"), help="target trials per workload")
    pl_spend.add_argument("--budget", default=None,
                          help="a number of trials to split over the workloads at once (every workload a minimum, the "
                          "rest by expected gain); trials planned and not tuned count against it")
    pl.add_argument("--shard-trials", type=at_least(1, "--shard-trials"), default=64, help="at most this many trials per shard (default 64)")
    pl.add_argument("--model", default=None, help="only this model's workloads")
    pl.add_argument("--reset-plateaus", action="store_true",
                    help="forget which workloads were preempted on this class, so they are planned again")
    pl.set_defaults(handler=cmd_plan)


def _add_tune(sub: Subparsers) -> None:
    tu = sub.add_parser("tune", help="tune pending shards of a hardware class with local workers")
    tu.add_argument("--hardware", default="x86", help="hardware class (default x86; see `tunefleet hardware list`)")
    tu.add_argument("--workers", type=at_least(1, "--workers"), default=1,
                    help="local worker processes (default 1: tune in this process)")
    tu.add_argument("--max-shards", type=at_least(1, "--max-shards"), default=None,
                    help="stop after this many shards (default: until no shard is pending)")
    tu.add_argument("--budget", default=None,
                    help="a wall time (90s, 15m, 1h30m) to stop draining at (a shard in flight stops before a batch "
                    "that would end later); with --model, that model's budget (trials or a wall time) in rounds")
    tu.add_argument("--model", default=None,
                    help="with --budget: plan that model's budget in rounds as the queue empties (name, id or sha256 "
                    "prefix)")
    tu.add_argument("--seed", type=int, default=None, help="seed of the search (default TUNEFLEET_SEED, else random)")
    tu.add_argument("--lease-s", type=float, default=None,
                    help="lease length in seconds; heartbeats renew it every third (default TUNEFLEET_LEASE_S, 120)")
    tu.add_argument("--trials-per-iter", type=int, default=None,
                    help="candidates measured per batch (default TUNEFLEET_TRIALS_PER_ITER, 64)")
    tu.add_argument("--warm-start-min-agreement", type=float, default=None, metavar="SHARE",
                    help="drop the warm start in a shard once the cost model orders fewer than this share of pairs "
                    "of its measured candidates right; 0: never (default TUNEFLEET_WARM_START_MIN_AGREEMENT, 0.6)")
    tu.add_argument("--no-transfer", dest="transfer", action="store_false", default=None,
                    help="do not seed a workload this class never measured with a compatible class's best schedule")
    tu.add_argument("--no-warm-start-shapes", dest="warm_start_shapes", action="store_false", default=None,
                    help="do not seed a workload this class never measured with schedules of its other shapes")
    tu.add_argument("--cold", action="store_true",
                    help="do not warm-start from the current cost model (TUNEFLEET_WARM_START=false does the same)")
    tu.add_argument("--no-pretrained", dest="pretrained_cost_model", action="store_false", default=None,
                    help="a class without a promoted cost model tunes without one, not with the shipped one "
                    "(TUNEFLEET_PRETRAINED_COST_MODEL=false does the same)")
    tu.add_argument("--json", action="store_true",
                    help="print the summary as JSON on stdout (the log path and the live line go to stderr)")
    tu.add_argument("--efficient", action="store_true",
                    help="plateau preemption, cost-model filtering (half of each round) and energy-aware leasing "
                    "(TUNEFLEET_PREEMPT, _FILTER_FRACTION, _ENERGY_AWARE set them one by one; the adaptive parallel "
                    "runner is TUNEFLEET_PARALLEL_MEASURE=true)")
    tu.set_defaults(handler=cmd_tune)


def _add_shards(sub: Subparsers) -> None:
    sh = sub.add_parser("shards", help="list, retry or cancel shards").add_subparsers(dest="sub", required=True)
    shl = sh.add_parser("list", help="list shards with their state, attempts and lease owner")
    shl.add_argument("--hardware", default=None, help="only this hardware class (default every class)")
    shl.add_argument("--state", default=None,
                     help="only shards in this state: pending, leased, done, failed or cancelled (default all)")
    shl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    shl.set_defaults(handler=cmd_shards_list)
    for verb, handler in (("retry", cmd_shards_retry), ("cancel", cmd_shards_cancel)):
        p = sh.add_parser(verb, help={"retry": "put failed or cancelled shards back to pending",
                                      "cancel": "cancel pending, leased or failed shards"}[verb])
        p.add_argument("ids", nargs="*", type=int,
                       help="shard ids (default: every shard in a state the command applies to)")
        p.add_argument("--hardware", default=None, help="only this hardware class (default every class)")
        p.set_defaults(handler=handler)


#: This module's commands, each with what adds it to the parser (:func:`tunefleet.cli.app.build_parser`).
PARSERS: dict[str, AddParser] = {"plan": _add_plan, "tune": _add_tune, "shards": _add_shards}
