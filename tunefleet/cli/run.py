"""``tunefleet run``: the whole pipeline on one model (ingest, extract, plan, tune, build)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from tunefleet.cli.common import at_least, zoo_options
from tunefleet.cli.environment import log_to_file, prefect_environment, preflight_run
from tunefleet.cli.interrupt import stop_on_ctrl_c
from tunefleet.cli.render import print_json, print_run_build, print_run_end, print_run_steps
from tunefleet.errors import TunefleetError

if TYPE_CHECKING:
    from pathlib import Path

    from tunefleet.cli.common import AddParser, Subparsers
    from tunefleet.config import Settings
    from tunefleet.db import Database
    from tunefleet.planning.spend import Spend


def _run_budget(args: argparse.Namespace, settings: Settings, started_at: float | None = None) -> Spend:
    """``run``'s spend: ``--budget``, else ``TUNEFLEET_BUDGET`` unless ``--trials`` is given."""
    from tunefleet.planning.spend import RUN, Spend

    return Spend.request(RUN, args.budget, trials=args.trials, started_at=started_at, name="--budget",
                         default=settings.budget)


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    """The ``pipeline`` flow on one model, in Prefect's ephemeral mode unless PREFECT_API_URL is set."""
    import time

    from rich.console import Console

    started = time.time()  # a duration budget is the wall time of this whole command
    if args.no_hub:
        # The flow's tasks and workers load their settings from the environment.
        os.environ["TUNEFLEET_HUB"] = "off"
        settings = settings.model_copy(update={"hub": "off"})
    if args.confirm_top is not None:
        os.environ["TUNEFLEET_CONFIRM_TOP"] = str(args.confirm_top)  # the build task loads its settings so
        settings = settings.model_copy(update={"confirm_top": args.confirm_top})
    db = preflight_run(args, settings, _run_budget)
    spend = _run_budget(args, settings, started)
    budget = spend.budget
    prefect_environment(settings, quiet=not args.verbose)
    from tunefleet.cli.progress import RunProgress
    from tunefleet.flows.pipeline import head_start, pipeline  # Prefect configures logging at import: after it
    from tunefleet.tvm.native_log import native_stderr_to

    log_path = log_to_file(settings, "run", verbose=args.verbose)
    # With --json, stdout carries the result alone: everything else goes to stderr.
    console = Console(stderr=args.json, width=None if (sys.stderr if args.json else sys.stdout).isatty() else 160)
    what = f"{args.trials} trials per workload" if budget is None else f"budget {budget.describe()}"
    console.rule(f"[bold]tunefleet run[/]: {args.model} on {args.hardware}, {what}")
    console.print(f"logs: {log_path}", highlight=False, soft_wrap=True)
    stop_on_ctrl_c(settings, _resume_command(args))
    # TVM's C++ warnings (fd 2, here and in every worker) go to the log file, not across the live
    # line; Python's stderr (this console with --json, error lines, tracebacks) stays on the terminal.
    # The model is ingested and extracted while Prefect's temporary server starts (head_start).
    with native_stderr_to(log_path), \
            RunProgress(settings, _model_name(args.model), args.hardware, console, ends_at=spend.ends_at), \
            head_start([args.model], [args.hardware], batch_size=args.batch_size, image_size=args.image_size,
                       seq_len=args.seq_len):
        result = pipeline(models=[args.model], hardware=[args.hardware], trials=args.trials,
                          budget=None if budget is None else str(budget), started_at=spend.started_at,
                          shard_trials=args.shard_trials, batch_size=args.batch_size, image_size=args.image_size,
                          seq_len=args.seq_len, seed=args.seed, output_dir=args.output_dir)
    return _run_summary(console, db, args, result, log_path, settings)


def _model_name(source: str) -> str:
    """The name a model is ingested under (a zoo name, or a file's stem)."""
    from pathlib import Path as _Path

    return source if "/" not in source and "." not in source else _Path(source).stem


def _resume_command(args: argparse.Namespace) -> str:
    spend = f"--trials {args.trials}" if getattr(args, "trials", None) is not None else \
        f"--budget {args.budget}" if getattr(args, "budget", None) is not None else ""
    return f"tunefleet run --model {args.model} --hardware {args.hardware}" + (f" {spend}" if spend else "")


def _run_summary(console: Any, db: Database, args: argparse.Namespace, result: dict[str, Any], log: Path,
                 settings: Settings) -> int:
    """The steps' results; a run where no shard succeeded is one error line, never a tuned table."""
    model = result["models"][0]
    tuned = result["tuned"][args.hardware]
    result["hub"] = result["builds"][0]["hub"]  # the build's: what tuning took from the hub
    if args.json:
        if not result["builds"][0]["tuned_workloads"]:
            raise TunefleetError(_no_success(db, args, model["model_id"], log))
        print_json(result)
        return 0 if not tuned["shards_failed"] else 1
    print_run_steps(console, result, args.hardware)
    console.print(f"hub: {result['hub']}", highlight=False, soft_wrap=True)
    console.print(f"cost model: {_cost_model_line(db, settings, args.hardware, tuned)}", highlight=False,
                  soft_wrap=True)
    if not result["builds"][0]["tuned_workloads"]:
        raise TunefleetError(_no_success(db, args, model["model_id"], log))
    print_run_build(console, result)
    print_run_end(console, result, args.hardware, _untuned_workloads(db, model["model_id"], args.hardware))
    return 0 if not tuned["shards_failed"] else 1


def _cost_model_line(db: Database, settings: Settings, hardware: str, tuned: dict[str, Any]) -> str:
    """Which cost model warm-started the run's shards, and in how many it was dropped."""
    own = db.current_cost_model(db.hardware_class(hardware).id)
    if not settings.warm_start:
        return "none (TUNEFLEET_WARM_START=false: stock MetaSchedule start)"
    if own is not None:
        which = f"{hardware}'s own v{own.version}"
    elif settings.pretrained_cost_model:
        which = (f"the one shipped with tunefleet (v0{_shipped_for(db, hardware)}; "
                 "TUNEFLEET_PRETRAINED_COST_MODEL=false turns it off)")
    else:
        return "none (TUNEFLEET_PRETRAINED_COST_MODEL=false and no model of the class: stock MetaSchedule start)"
    dropped = int(tuned.get("warm_start_dropped") or 0)
    return which + (f"; dropped in {dropped} of {tuned.get('shards_done', 0)} shard(s) whose measurements it misranked"
                    if dropped else "")


def _shipped_for(db: Database, hardware: str) -> str:
    """`` for x86 AVX2 code, trained on <CPUs>``: which shipped model serves the class (empty when unreadable)."""
    from tunefleet.learning.pretrained import model_file, shipped_summary, vector_code

    code = vector_code(db.hardware_class(hardware).target)
    try:
        on: Any = shipped_summary(model_file(code)).get("trained_on") or {}
    except TunefleetError:
        return ""  # a broken installation: the tuning log has said so
    return f"{' for x86 AVX2 code' if code == 'avx2' else ''}, trained on {', '.join(on.get('cpus') or ['?'])}"


def _untuned_workloads(db: Database, model_id: int, hardware: str) -> list[str]:
    hw = db.hardware_class(hardware)
    return [wl.name for wl, _ in db.workloads(model_id, hw.id) if not db.best_measurements(wl.id, hw.id, 1)]


def _no_success(db: Database, args: argparse.Namespace, model_id: int, log: Path) -> str:
    """One line: why no workload of the model was tuned, and the command that resumes."""
    from tunefleet.planning import shard_queue

    wl_ids = {wl.id for wl, _ in db.workloads(model_id, db.hardware_class(args.hardware).id)}
    mine = [s for s in shard_queue.list_shards(db, hardware=args.hardware) if s.workload_id in wl_ids]
    failed = [s for s in mine if s.state == shard_queue.FAILED]
    waiting = [s for s in mine if s.state in (shard_queue.PENDING, shard_queue.LEASED)]
    if failed:
        cause = (failed[0].error or "no error recorded").splitlines()[0][:200]
        return (f"no shard of {args.model} on {args.hardware} succeeded: {len(failed)} failed (first: {cause}); "
                f"log: {log}; resume with: tunefleet shards retry --hardware {args.hardware} && {_resume_command(args)}")
    return (f"no workload of {args.model} on {args.hardware} was tuned ({len(waiting)} shard(s) still pending or "
            f"leased); log: {log}; resume with: {_resume_command(args)}")


# -- parsers --------------------------------------------------------------------------------
def _add_run(sub: Subparsers) -> None:
    run = sub.add_parser("run", help="the whole pipeline on one model: ingest, extract, plan, tune, build")
    run.add_argument("--model", default="resnet18", help="zoo name, ONNX or .pt2 file (default resnet18)")
    run.add_argument("--hardware", default="x86", help="hardware class (default x86; see `tunefleet hardware list`)")
    spend = run.add_mutually_exclusive_group()
    spend.add_argument("--budget", default=None,
                       help="what to spend on the model: trials over all its workloads (2000) or the wall time of this "
                       "whole command (90s, 15m, 1h30m), split in rounds by latency share and recent improvement "
                       "(default TUNEFLEET_BUDGET, 15m)")
    spend.add_argument("--trials", type=at_least(1, "--trials"), default=None,
                       help="instead of a budget: a flat target of trials per workload (run again: nothing tuned twice)")
    run.add_argument("--shard-trials", type=at_least(1, "--shard-trials"), default=64, help="at most this many trials per shard (default 64)")
    run.add_argument("--seed", type=int, default=0, help="seed of the search (default 0)")
    run.add_argument("--no-hub", action="store_true",
                     help="do not import the hub bundle into this database (TUNEFLEET_HUB=off does the same); records "
                     "imported before still seed workloads new to the class (TUNEFLEET_TRANSFER=false stops that)")
    run.add_argument("--confirm-top", type=at_least(0, "--confirm-top"), default=None, metavar="N",
                     help="before the build, re-time each workload's N fastest schedules side by side and build with "
                     "the fastest re-timed one (default TUNEFLEET_CONFIRM_TOP, 0: build with the fastest records)")
    run.add_argument("-o", "--output-dir", default=None, help="write the tuned library here as <model>-<class>.so")
    run.add_argument("--json", action="store_true",
                     help="print the steps' results as JSON on stdout (the log path and the live line go to stderr)")
    zoo_options(run)
    run.set_defaults(handler=cmd_run)


#: This module's commands, each with what adds it to the parser (:func:`tunefleet.cli.app.build_parser`).
PARSERS: dict[str, AddParser] = {"run": _add_run}
