"""The ``tunefleet`` command line.

Kept light: only the standard library and tunefleet's own small modules load at start; the
database, TVM and Prefect are imported by the commands that need them. A
:class:`~tunefleet.errors.TunefleetError` prints as one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tunefleet import __version__
from tunefleet.context import Context
from tunefleet.errors import NotFoundError, TunefleetError

if TYPE_CHECKING:
    from pathlib import Path

    from tunefleet.config import Settings
    from tunefleet.db import Database
    from tunefleet.engine.options import TuneOptions

log = logging.getLogger("tunefleet")

Handler = Callable[[argparse.Namespace, "Settings"], int | None]


def _open_db(settings: Settings, *, check_schema: bool = True) -> Database:
    from tunefleet.db import Database

    return Database.from_settings(settings, check_schema=check_schema)


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=True, default=str))


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        table.add_row(*("" if v is None else str(v) for v in row))
    Console(width=None if sys.stdout.isatty() else 160).print(table)


def at_least(minimum: int, flag: str) -> Callable[[str], int]:
    """An argparse ``type``: an integer >= ``minimum``; anything else is one
    :class:`~tunefleet.errors.ParameterError` line naming ``flag``, before any work (flags that
    are :class:`~tunefleet.config.TuneKnobs` fields are checked by the options instead)."""
    from tunefleet.errors import ParameterError

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ParameterError(f"invalid {flag}: {text!r} (not an integer)") from None
        if value < minimum:
            raise ParameterError(f"invalid {flag}: {value} (must be >= {minimum})")
        return value

    return parse


# -- config ---------------------------------------------------------------------------------
def cmd_config_show(args: argparse.Namespace, settings: Settings) -> int:
    masked = settings.masked()
    if args.json:
        _print_json(masked)
    else:
        _table("tunefleet configuration", ["setting", "value"], [(f"TUNEFLEET_{k.upper()}", v) for k, v in masked.items()])
    return 0


# -- db -------------------------------------------------------------------------------------
def cmd_db_upgrade(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.db import current_revision, upgrade

    db = _open_db(settings, check_schema=False)
    upgrade(db.engine, args.revision)
    print(f"database schema at revision {current_revision(db.engine)}")
    return 0


def cmd_db_downgrade(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.db import current_revision, downgrade

    db = _open_db(settings, check_schema=False)
    downgrade(db.engine, args.revision)
    print(f"database schema at revision {current_revision(db.engine) or 'base (empty)'}")
    return 0


def cmd_db_current(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.db import current_revision, head_revision

    db = _open_db(settings, check_schema=False)
    current = current_revision(db.engine)
    print(f"current: {current or 'none (empty database)'}  head: {head_revision()}")
    return 0


# -- models, workloads, hardware ------------------------------------------------------------
def cmd_ingest(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.models.ingest import ingest

    ctx = Context(settings)
    res = ingest(ctx.db, ctx.store, args.source, name=args.name, batch_size=args.batch_size,
                 image_size=args.image_size, seq_len=args.seq_len)
    verb = "ingested" if res.created else "already ingested"
    print(f"{verb}: model {res.model.id} {res.model.name} ({res.model.format}, sha256 {res.model.sha256[:16]})")
    return 0


def cmd_models_list(args: argparse.Namespace, settings: Settings) -> int:
    ctx = Context(settings)
    rows = [(m.id, m.name, m.source, m.format, m.sha256[:12], json.dumps(m.input_info), m.created_at.isoformat(timespec="seconds"))
            for m in ctx.db.models()]
    if args.json:
        _print_json([dict(zip(["id", "name", "source", "format", "sha256", "inputs", "created"], r)) for r in rows])
    else:
        _table("models", ["id", "name", "source", "format", "sha256", "inputs", "created"], rows)
    return 0


def cmd_workloads_list(args: argparse.Namespace, settings: Settings) -> int:
    ctx = Context(settings)
    model_id = ctx.db.model(args.model).id if args.model else None
    rows = [(w.structural_hash, w.name, w.op_kind, f"{w.flops:.3g}", weight) for w, weight in ctx.db.workloads(model_id)]
    if args.json:
        _print_json([dict(zip(["hash", "name", "op_kind", "flops", "weight"], r)) for r in rows])
    else:
        _table("workloads", ["hash", "name", "op kind", "FLOPs", "weight"], rows)
    return 0


def cmd_hardware_list(args: argparse.Namespace, settings: Settings) -> int:
    ctx = Context(settings)
    classes = ctx.db.hardware_classes()
    if args.json:
        _print_json([{"name": h.name, "target": h.target, "node_pool": h.node_pool, "watts_per_core": h.watts_per_core,
                      "idle_watts": h.idle_watts, "watts_per_gpu": h.watts_per_gpu, "price_per_hour": h.price_per_hour,
                      "capabilities": h.capabilities} for h in classes])
    else:
        _table("hardware classes", ["name", "target", "node pool", "W/core", "idle W", "W/GPU", "price/h"],
               [(h.name, json.dumps(h.target), h.node_pool, h.watts_per_core, h.idle_watts, h.watts_per_gpu,
                 h.price_per_hour) for h in classes])
    return 0


# -- pipeline steps -------------------------------------------------------------------------
def cmd_extract(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.models.workloads import extract

    ctx = Context(settings)
    res = extract(ctx.db, ctx.store, ctx.db.model(args.model), args.hardware)
    print(f"model {res.model_id} on {res.hardware}: {res.workloads} workloads ({res.new_workloads} new)")
    return 0


def cmd_plan(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.planning import shard_queue

    ctx = Context(settings)
    if args.budget is not None:
        from tunefleet.budget import Budget

        Budget.parse(args.budget, name="--budget")  # a bad text is refused before anything changes
    _warn_recipes(ctx.db, args.hardware, args.model)
    if args.reset_plateaus:
        n = ctx.db.reset_plateaus(ctx.db.hardware_class(args.hardware).id)
        print(f"reset the plateau state of {n} workload(s) on {args.hardware}")
    if args.budget is not None:
        from tunefleet.planning.rounds import plan_once

        model_ids = [ctx.db.model(args.model).id] if args.model else None
        res = plan_once(ctx.db, args.hardware, args.budget, model_ids, shard_trials=args.shard_trials,
                        batch=tune_options(args, settings).trials_per_iter, energy_aware=settings.energy_aware)
        print(f"planned {len(res.shards)} new shard(s), {sum(s.trials for s in res.shards)} trials of a budget of "
              f"{args.budget} ({res.outstanding} planned and not tuned in all), over {len(res.workloads)} workload(s) "
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
    :class:`~tunefleet.config.TuneKnobs` field that was given, then ``--cold`` and ``--efficient``."""
    from tunefleet.config import TuneKnobs
    from tunefleet.engine.options import TuneOptions

    given = {name: getattr(args, name, None) for name in TuneKnobs.model_fields}
    options = TuneOptions.from_settings(settings, **given)
    if getattr(args, "cold", False):
        options = options.replace(warm_start=False)
    return options.efficient() if getattr(args, "efficient", False) else options


def _tune_budget(args: argparse.Namespace, ctx: Context, options: TuneOptions) -> tuple[Any, Any]:
    """``tune --budget``: (the rounds of a model's budget, or None; the deadline, or None)."""
    import time

    from tunefleet.budget import Budget
    from tunefleet.errors import ParameterError
    from tunefleet.planning.rounds import Deadline, Rounds

    if args.budget is None:
        if args.model:
            raise ParameterError("--model needs --budget (tune drains the whole queue of the class otherwise)")
        return None, None
    budget = Budget.parse(args.budget, name="--budget")
    if args.model:
        rounds = Rounds(args.hardware, [ctx.db.model(args.model).id], budget, started_at=time.time(),
                        batch=options.trials_per_iter, energy_aware=options.energy_aware)
        return rounds, rounds.deadline
    if budget.seconds is None:
        raise ParameterError(f"invalid --budget: {args.budget!r} is a number of trials; give --model to spend it on, "
                             "or a duration (e.g. 15m) to stop tuning at")
    return None, Deadline(time.time() + budget.seconds)


def cmd_tune(args: argparse.Namespace, settings: Settings) -> int:
    from rich.console import Console

    from tunefleet.cli.progress import RunProgress
    from tunefleet.engine.worker import drain, tune_with_workers

    options = tune_options(args, settings)
    ctx = Context(settings)
    ctx.db.hardware_class(args.hardware)
    rounds, deadline = _tune_budget(args, ctx, options)
    # With --json, stdout carries the result alone: the log path and the live line go to stderr.
    console = Console(stderr=args.json, width=None if (sys.stderr if args.json else sys.stdout).isatty() else 160)
    console.print(f"logs: {log_to_file(settings, 'tune', verbose=args.verbose)}", highlight=False, soft_wrap=True)
    stop_on_ctrl_c(settings, f"tunefleet tune --hardware {args.hardware}")
    model = ctx.db.model(args.model).name if rounds is not None else None
    ends_at = deadline.at if deadline is not None else None
    with RunProgress(settings, model, args.hardware, console, ends_at=ends_at):  # read from the database
        if args.workers > 1:
            codes = tune_with_workers(settings, args.hardware, options, workers=args.workers,
                                      max_shards=args.max_shards, refill=rounds, deadline=deadline)
        else:
            summary = drain(ctx.db, args.hardware, options, max_shards=args.max_shards, store=ctx.store,
                            refill=rounds, deadline=deadline)
    if args.workers > 1:
        spent = None
        if rounds is not None:  # counted in the database: every worker's trials
            rounds.stopped = rounds.why_over(ctx.db) or "the workers ended"
            spent = rounds.summary(ctx.db)
        if args.json:
            _print_json({"hardware": args.hardware, "worker_exit_codes": codes, "budget": spent})
        else:
            print(f"workers exited with {codes}" + (f"; {_budget_line(spent)}" if spent else ""))
        return 0 if not any(codes) else 1
    if args.json:
        from dataclasses import asdict

        _print_json({**asdict(summary), "seconds_per_candidate": summary.per_candidate()})
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
          + (f"; {_budget_line(summary.budget)}" if summary.budget else
             f"; stopped: {summary.stopped}" if summary.stopped else ""))
    if (split := summary.per_candidate()) is not None:
        print(_split_line(split))
    return 0 if not summary.shards_failed else 1


def _split_line(split: dict[str, float]) -> str:
    """Seconds per measured candidate and where they went (search, build, run, the rest)."""
    return (f"{split['total']:.2f} s per measured candidate: search {split['search']:.2f}, build {split['build']:.2f}, "
            f"run {split['run']:.2f}, other {split['other']:.2f} (shard starts, commits)")


def _budget_line(spent: dict[str, Any]) -> str:
    """``budget 15m: spent 1234 trials and 14:12 in 9 round(s); stopped: deadline: reached``."""
    from tunefleet.budget import format_duration

    return (f"budget {spent['budget']}: spent {spent['trials']} trials and {format_duration(round(spent['seconds']))} "
            f"in {spent['rounds']} round(s); stopped: {spent['stopped']}")


def cmd_best(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.delivery.best import best

    if args.verify and not (args.zero_shot or args.transfer):
        raise TunefleetError("--verify needs --zero-shot or --transfer")
    if args.zero_shot and args.transfer:
        raise TunefleetError("--zero-shot and --transfer exclude each other")
    ctx = Context(settings)
    unmeasured = not ctx.db.best_measurements(ctx.db.workload(args.workload).id, ctx.db.hardware_class(args.hardware).id, 1)
    if args.zero_shot and unmeasured:
        return _best_predicted(ctx, args)
    if args.transfer and unmeasured:
        return _best_transferred(ctx, args)
    found = best(ctx.db, args.workload, args.hardware, n=args.top)
    if args.json:
        _print_json([b.as_dict() for b in found])
    else:
        _table(f"best schedules of {found[0].workload} on {args.hardware}",
               ["rank", "mean run (ms)", "untuned (ms)", "measurement", "measured at", "tvm"],
               [(i + 1, f"{b.mean_run_s * 1e3:.4f}", f"{b.untuned_s * 1e3:.4f}" if b.untuned_s else "-",
                 b.measurement_id, b.measured_at, b.tvm_version) for i, b in enumerate(found)])
    return 0


def _best_predicted(ctx: Context, args: argparse.Namespace) -> int:
    """`best --zero-shot` for a workload never measured on the class: the cost model's proposals."""
    from tunefleet.delivery.best import best
    from tunefleet.delivery.zeroshot import predict_workloads

    wl = ctx.db.workload(args.workload)
    top_k = max(args.top, args.verify, 1)
    res = predict_workloads(ctx.db, ctx.store, args.hardware, [wl.id], top_k=top_k, verify=args.verify)
    if args.verify:  # measured now: answer with measurements, like any measured workload
        found = best(ctx.db, wl.structural_hash, args.hardware, n=args.top)
        if args.json:
            _print_json([{**b.as_dict(), "source": "measured (zero-shot verified)"} for b in found])
        else:
            _table(f"best of {args.verify} zero-shot proposals of {wl.structural_hash} on {args.hardware}, measured",
                   ["rank", "mean run (ms)", "untuned (ms)", "measurement"],
                   [(i + 1, f"{b.mean_run_s * 1e3:.4f}", f"{b.untuned_s * 1e3:.4f}" if b.untuned_s else "-",
                     b.measurement_id) for i, b in enumerate(found)])
        return 0
    preds = ctx.db.best_predictions(wl.id, ctx.db.hardware_class(args.hardware).id, args.top)
    item = res.workloads[0]
    if args.json:
        _print_json([{"workload": wl.structural_hash, "hardware": args.hardware, "source": "predicted",
                      "cost_model_version": res.cost_model_version, "rank": i + 1, "score": p.score,
                      "trace_json": p.trace_json, "search_seconds": item.seconds} for i, p in enumerate(preds)])
    else:
        _table(f"zero-shot schedules of {wl.structural_hash} on {args.hardware}: PREDICTED by cost model "
               f"v{res.cost_model_version}, not measured",
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
        _print_json([found.as_dict()])
        return 0
    _table(f"best schedule of {found.workload} for {args.hardware}: TRANSFERRED from {found.source_hardware}",
           ["source class", "compatibility", "mean run there (ms)", "measured here (ms)", "source measurement"],
           [(found.source_hardware, f"{found.compatibility:.2f}", f"{found.source_mean_run_s * 1e3:.4f}",
             f"{found.verified_mean_run_s * 1e3:.4f}" if found.verified_mean_run_s else "not measured (--verify 1)",
             found.source_measurement_id)])
    return 0


def _report_table(report: Any) -> None:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    rows = [("untuned (default schedules)", ms(report.untuned_ms), "1.00x" if report.untuned_ms else "-")]
    if report.tuned_ms is not None:
        speed = f"{report.untuned_ms / report.tuned_ms:.2f}x" if report.untuned_ms else "-"
        label = f"tunefleet tuned ({report.tuned_workloads}/{report.workloads} workloads tuned"
        label += f", {report.predicted_workloads} zero-shot" if report.predicted_workloads else ""
        label += f", {report.transferred_workloads} transferred)" if report.transferred_workloads else ")"
        rows.append((label, ms(report.tuned_ms), speed))
    if report.torch_ms is not None:
        speed = f"{report.untuned_ms / report.torch_ms:.2f}x" if report.untuned_ms else "-"
        rows.append((f"PyTorch eager ({report.threads} threads)", ms(report.torch_ms), speed))
    if report.onnxruntime_ms is not None:
        speed = f"{report.untuned_ms / report.onnxruntime_ms:.2f}x" if report.untuned_ms else "-"
        rows.append((f"onnxruntime ({report.threads} threads)", ms(report.onnxruntime_ms), speed))
    _table(f"{report.model} on {report.hardware}: latency (median)", ["build", "latency (ms)", "speed-up vs untuned"], rows)
    if report.recipe:
        print(f"recipe {report.recipe}: {report.database_hits} of {report.workloads} functions built from the database"
              + (f", {report.prepacked_weights} weight(s) prepacked at build time" if report.prepacked_weights else ""))
    if report.default_workloads:
        print(f"{report.default_workloads} of {report.workloads} workloads had no record and kept the default schedule")
    if report.predicted_workloads:
        print(f"{report.predicted_workloads} of {report.workloads} workloads used a zero-shot prediction (not measured)"
              + (f"; search {report.zero_shot_s_per_task:.1f}s per task" if report.zero_shot_s_per_task else ""))
    if report.verified:
        print(f"{report.verified} zero-shot proposals were measured (--verify)")
    if report.transferred_workloads:
        print(f"{report.transferred_workloads} of {report.workloads} workloads used a schedule TRANSFERRED from a "
              "compatible class (its latency was measured there, not here)")
    for note in report.notes:
        print(note)
    if report.output:
        print(f"wrote {report.output}")


def cmd_build(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.delivery.build import build_model

    ctx = Context(settings)
    if args.verify and not args.zero_shot:
        raise TunefleetError("--verify needs --zero-shot")
    from rich.console import Console

    model = ctx.db.model(args.model)
    # A spinner on a terminal (stderr, so --json stays clean): extraction, compiling and timing take minutes.
    with Console(stderr=True).status(f"building {model.name} for {args.hardware} with the best stored schedules"):
        report = build_model(ctx.db, ctx.store, model, args.hardware, output=args.output,
                             zero_shot=args.zero_shot, top_k=max(args.top_k, args.verify), verify=args.verify,
                             transfer=args.transfer)
    if args.json:
        _print_json(report.as_dict())
    else:
        _report_table(report)
    return 0


def cmd_export_db(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.delivery.best import export_json_database

    ctx = Context(settings)
    n_wl, n_rec = export_json_database(ctx.db, args.hardware, args.directory, top_k=args.top)
    print(f"wrote {n_rec} record(s) for {n_wl} workload(s) to {args.directory} (MetaSchedule JSONDatabase files)")
    return 0


def prefect_environment(settings: Settings, *, quiet: bool = False) -> None:
    """Environment Prefect reads at import: no analytics, tunefleet's logs in run logs, and a home.

    ``quiet``: Prefect's console shows warnings and errors only (its INFO logs go to the log file
    :func:`log_to_file` adds).

    Without a Prefect server (no PREFECT_API_URL) and no Prefect profile of the user's own,
    Prefect's ephemeral database goes under the tunefleet home rather than ``~/.prefect``.
    """
    import os
    from pathlib import Path

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")  # Prefect's client telemetry (and its notice at import)
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "tunefleet")
    os.environ.setdefault("PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW", "ignore")  # CLI logs outside runs
    # Prefect waits 20 s for its ephemeral server; the first start in a fresh environment (byte-
    # compiling, creating and migrating its database) took longer on a loaded 2-core CI machine.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    if quiet:
        os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "WARNING")
    if not ({"PREFECT_HOME", "PREFECT_API_URL", "PREFECT_PROFILES_PATH"} & set(os.environ)) and \
            not (Path.home() / ".prefect" / "profiles.toml").exists():
        home = Path(settings.home) / "prefect"
        home.mkdir(parents=True, exist_ok=True)
        os.environ["PREFECT_HOME"] = str(home)


def preflight_run(args: argparse.Namespace, settings: Settings) -> Database:
    """Everything ``run`` can check before a server or worker starts, in about a second: the
    model (a zoo name, or a file, and the extras it needs), the options, the database (one connect
    timeout, no retries) and the hardware class. Returns the open database."""
    from tunefleet.engine.options import TuneOptions
    from tunefleet.errors import ParameterError
    from tunefleet.hardware import check_runs_here
    from tunefleet.models.ingest import check_source

    check_source(args.model)
    for name in ("trials", "shard_trials"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ParameterError(f"invalid --{name.replace('_', '-')}: {getattr(args, name)} (must be >= 1)")
    _run_budget(args, settings)
    TuneOptions.from_settings(settings, seed=args.seed)
    db = _open_db(settings)
    known = {h.name: h.target for h in db.hardware_classes()}
    if args.hardware not in known:
        from tunefleet.hardware import hardware_names

        names = sorted(set(known) | hardware_names(settings))
        if args.hardware not in names:
            raise NotFoundError(f"unknown hardware class {args.hardware!r}; known: {', '.join(names)}")
    else:
        check_runs_here(args.hardware, known[args.hardware])
    return db


def log_to_file(settings: Settings, command: str, *, verbose: bool) -> Path:
    """Send tunefleet's, Prefect's and the libraries' logs to a file under ``TUNEFLEET_HOME/logs``
    (the console keeps warnings and errors, everything with ``-v``); its path."""
    import time as _time
    from pathlib import Path as _Path

    folder = _Path(settings.home) / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{command}-{_time.strftime('%Y%m%d-%H%M%S')}.log"
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.setLevel(logging.DEBUG if verbose else logging.INFO)
    root = logging.getLogger()
    root.addHandler(handler)
    for h in root.handlers:
        if h is not handler and not verbose:
            h.setLevel(max(h.level, logging.WARNING))
    logging.getLogger("tunefleet").setLevel(logging.DEBUG if verbose else logging.INFO)
    return path


def _run_budget(args: argparse.Namespace, settings: Settings) -> Any:
    """``run``'s budget: ``--budget``, else ``TUNEFLEET_BUDGET`` unless ``--trials`` is given (None then)."""
    from tunefleet.budget import Budget

    if args.trials is not None:
        return None
    return Budget.parse(args.budget if args.budget is not None else settings.budget,
                        name="--budget" if args.budget is not None else "TUNEFLEET_BUDGET")


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    """The ``pipeline`` flow on one model, in Prefect's ephemeral mode unless PREFECT_API_URL is set."""
    import time

    from rich.console import Console

    started = time.time()  # a duration budget is the wall time of this whole command
    db = preflight_run(args, settings)
    budget = _run_budget(args, settings)
    prefect_environment(settings, quiet=not args.verbose)
    from tunefleet.cli.progress import RunProgress
    from tunefleet.flows.pipeline import pipeline  # Prefect configures logging at import: after it

    log_path = log_to_file(settings, "run", verbose=args.verbose)
    # With --json, stdout carries the result alone: everything else goes to stderr.
    console = Console(stderr=args.json, width=None if (sys.stderr if args.json else sys.stdout).isatty() else 160)
    spend = f"{args.trials} trials per workload" if budget is None else f"budget {budget.describe()}"
    console.rule(f"[bold]tunefleet run[/]: {args.model} on {args.hardware}, {spend}")
    console.print(f"logs: {log_path}", highlight=False, soft_wrap=True)
    stop_on_ctrl_c(settings, _resume_command(args))
    ends_at = started + budget.seconds if budget is not None and budget.seconds is not None else None
    with RunProgress(settings, _model_name(args.model), args.hardware, console, ends_at=ends_at):
        result = pipeline(models=[args.model], hardware=[args.hardware], trials=args.trials,
                          budget=None if budget is None else str(budget), started_at=started,
                          shard_trials=args.shard_trials, batch_size=args.batch_size, image_size=args.image_size,
                          seq_len=args.seq_len, seed=args.seed, output_dir=args.output_dir)
    return _run_summary(console, db, args, result, log_path)


def _model_name(source: str) -> str:
    """The name a model is ingested under (a zoo name, or a file's stem)."""
    from pathlib import Path as _Path

    return source if "/" not in source and "." not in source else _Path(source).stem


def _resume_command(args: argparse.Namespace) -> str:
    spend = f"--trials {args.trials}" if getattr(args, "trials", None) is not None else \
        f"--budget {args.budget}" if getattr(args, "budget", None) is not None else ""
    return f"tunefleet run --model {args.model} --hardware {args.hardware}" + (f" {spend}" if spend else "")


def stop_on_ctrl_c(settings: Settings, resume: str) -> None:
    """From now on Ctrl-C (SIGINT) stops this command at once and cleanly: this process's shard
    leases are given back (no lease is spent), its child processes (builder and runner workers,
    Prefect's temporary server) are stopped, and the command that resumes is printed; exit 130.

    A KeyboardInterrupt raised into MetaSchedule's C++ search or Prefect's engine is not a clean
    stop (either may swallow it or crash), so the handler finishes the process itself. Committed
    measurements are kept (each batch commits in one transaction); the batch in flight is lost.
    """
    import os
    import signal

    from tunefleet.engine.worker import owner_token

    owner_token()  # made now, before any child starts, so the children's owners share it

    def stop(signum: int, frame: object) -> None:
        # Whatever fails in here, the process exits: an exception escaping a signal handler is
        # raised into whatever the main thread runs, which may retry instead of stopping.
        try:
            _stop_children_and_give_back(settings, resume)
        finally:
            os._exit(130)

    signal.signal(signal.SIGINT, stop)


def _stop_children_and_give_back(settings: Settings, resume: str) -> None:
    """Ctrl-C's work before the exit: give this process tree's leases back, stop the children."""
    import os

    import psutil

    from tunefleet.db import Database
    from tunefleet.engine.worker import worker_owner

    children = psutil.Process().children(recursive=True)
    owners = [worker_owner(pid) for pid in (os.getpid(), *(c.pid for c in children))]
    try:
        db = Database.from_settings(settings, check_schema=False)
        released = f"{sum(len(db.release_leases(owner)) for owner in owners)} shard lease(s) given back"
    except Exception as exc:  # noqa: BLE001 - the leases then expire on their own
        from tunefleet.config import mask_secrets

        released = f"leases not given back ({mask_secrets(str(exc).splitlines()[0])}); they expire by themselves"
    for child in children:
        with contextlib.suppress(psutil.Error):  # a child may exit between listing and signalling
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=5)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    print(f"tunefleet: stopped; {released}; resume with: {resume}", file=sys.stderr, flush=True)


def _run_summary(console: Any, db: Database, args: argparse.Namespace, result: dict[str, Any], log: Path) -> int:
    """The steps' results; a run where no shard succeeded is one error line, never a tuned table."""
    from types import SimpleNamespace

    model, ex, pl = result["models"][0], result["extracted"][0], result["planned"][0]
    tuned = result["tuned"][args.hardware]
    if args.json:
        if not result["builds"][0]["tuned_workloads"]:
            raise TunefleetError(_no_success(db, args, model["model_id"], log))
        _print_json(result)
        return 0 if not tuned["shards_failed"] else 1
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
        console.print(f"   {_split_line(tuned['seconds_per_candidate'])}", highlight=False)
    build = SimpleNamespace(**result["builds"][0])
    if not build.tuned_workloads:
        raise TunefleetError(_no_success(db, args, model["model_id"], log))
    for row in result["energy"]:
        wasted = "-" if row["wasted_pct"] is None else f"{row['wasted_pct']:.1f}%"
        console.print(f"   energy: {row['joules']:,.0f} J ({row['kwh']:.6f} kWh, source {row['sources']}), "
                      f"{row['cost']:.4f} in node time, {wasted} wasted on candidates that did not improve")
    console.print("5/5 build:")
    _report_table(build)
    untuned = _untuned_workloads(db, model["model_id"], args.hardware)
    if untuned:
        console.print(f"not tuned (no successful measurement; default schedule): {', '.join(untuned)}", highlight=False)
    total = result.get("budget")
    if total:
        from tunefleet.budget import format_duration

        reserve = total["build_reserve_s"].get(args.hardware)
        console.print(f"budget {total['budget']}: spent {total['trials']} trials and {format_duration(round(total['seconds']))} "
                      f"of wall time in {total['rounds']} round(s); stopped: {total['stopped'].get(args.hardware)}"
                      + (f"; build {total['build_s']:.0f}s (reserved {reserve:.0f}s)" if reserve and total["build_s"]
                         else ""), highlight=False)
    return 0 if not tuned["shards_failed"] else 1


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


def cmd_report_energy(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.energy.accounting import energy_report

    ctx = Context(settings)
    rows = energy_report(ctx.db, model=args.model, hardware=args.hardware)
    if args.json:
        _print_json([r.as_dict() for r in rows])
    elif not rows:
        print("no measurements yet")
    else:
        _table("tuning energy and cost per model and hardware class",
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

    ctx = Context(settings)
    model = ctx.db.model(args.model)
    output = args.output or f"{model.name}-{args.hardware}-tuning.png"
    chart = tuning_figure(ctx.db, model, args.hardware, output, top=args.top)
    print(f"wrote {chart.path}")
    return 0


def cmd_dataset_export(args: argparse.Namespace, settings: Settings) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tunefleet.learning.dataset import export

    ctx = Context(settings)
    with Progress(TextColumn("export"), BarColumn(), MofNCompleteColumn(), TextColumn("measurements"),
                  TimeElapsedColumn()) as bar:
        task = bar.add_task("", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        version = export(ctx.db, ctx.store, hardware=args.hardware, progress=progress)
    if version is None:
        print("nothing new to export: every measurement is in a dataset version already")
        return 0
    counts = ", ".join(f"{hw}: {n}" for hw, n in sorted(version.row_counts.items()))
    print(f"dataset v{version.version}: {version.row_count} rows ({counts}) at {version.uri}")
    return 0


def cmd_dataset_list(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.learning.dataset import list_versions

    versions = list_versions(Context(settings).db)
    if args.json:
        _print_json([{"version": v.version, "uri": v.uri, "created_at": v.created_at, "rows": v.row_count,
                      "complete": v.complete, "row_counts": v.row_counts, "parents": v.parents,
                      "measurement_ids": v.measurement_ids} for v in versions])
        return 0
    _table("dataset versions", ["version", "rows", "per hardware class", "measurement ids", "complete", "created", "uri"],
           [(v.version, v.row_count, ", ".join(f"{k}: {n}" for k, n in sorted(v.row_counts.items())),
             f"{v.measurement_ids['min']}-{v.measurement_ids['max']}" if v.measurement_ids else "-",
             "yes" if v.complete else "no", v.created_at, v.uri) for v in versions])
    return 0


def _metric(m: dict[str, Any] | None, key: str) -> str:
    return "-" if not m or m.get(key) is None else f"{m[key]:.3f}"


def cmd_costmodel_retrain(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.learning.costmodel import retrain

    ctx = Context(settings)
    res = retrain(ctx.db, ctx.store, args.hardware, objective=args.objective, seed=args.seed,
                  holdout_fraction=args.holdout, holdout_models=args.holdout_model or None)
    m = res.metrics
    rows = [("new model v%d" % res.version, *(_metric(m["heldout"], k) for k in ("pairwise_accuracy", "peak@1", "peak@5", "r2")))]
    if m.get("current_on_heldout"):
        rows.append(("current model", *(_metric(m["current_on_heldout"], k) for k in ("pairwise_accuracy", "peak@1", "peak@5", "r2"))))
    for name, base in (m.get("baselines") or {}).items():
        rows.append((f"{name} ranking", *(_metric(base, k) for k in ("pairwise_accuracy", "peak@1", "peak@5", "r2"))))
    split = m.get("split", {})
    _table(f"cost model for {args.hardware}: held-out workloads {split.get('test_workloads', '?')} "
           f"(trained on {split.get('train_workloads', '?')})", ["model", "pairwise acc", "peak@1", "peak@5", "R2"], rows)
    print(f"{'promoted' if res.promoted else 'NOT promoted'}: {res.reason} ({res.artifact_uri})")
    return 0


def cmd_costmodel_list(args: argparse.Namespace, settings: Settings) -> int:
    ctx = Context(settings)
    data = [{"hardware": hw, "version": cm.version, "promoted": cm.promoted, "created_at": cm.created_at,
             "objective": cm.metrics.get("objective"), "heldout": cm.metrics.get("heldout"),
             "reason": cm.metrics.get("reason"), "uri": cm.artifact_uri} for cm, hw in ctx.db.cost_models()]
    if args.json:
        _print_json(data)
        return 0
    _table("cost models", ["hardware", "version", "current", "objective", "pairwise acc", "peak@1", "created", "reason"],
           [(d["hardware"], d["version"], "yes" if d["promoted"] else "", d["objective"],
             _metric(d["heldout"], "pairwise_accuracy"), _metric(d["heldout"], "peak@1"), d["created_at"], d["reason"])
            for d in data])
    return 0


def cmd_costmodel_promote(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.learning.costmodel import promote_version

    ctx = Context(settings)
    row = promote_version(ctx.db, args.hardware, args.version)
    print(f"cost model v{row.version} is now the current model of {args.hardware} ({row.artifact_uri})")
    return 0


def cmd_metrics_serve(args: argparse.Namespace, settings: Settings) -> int:
    """A long-running exporter of the fleet gauges (per-model energy and cost, shard states)."""
    import time

    from tunefleet.energy.accounting import publish_fleet_metrics
    from tunefleet.energy.metrics import FleetMetrics

    ctx = Context(settings)
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


def cmd_deploy(args: argparse.Namespace, settings: Settings) -> int:
    prefect_environment(settings)
    from tunefleet.cluster.deploy import deploy

    ctx = Context(settings)
    classes = [ctx.db.hardware_class(n) for n in args.hardware] if args.hardware else ctx.db.hardware_classes()
    res = deploy({h.name: h.node_pool for h in classes}, pool_type=args.pool_type, concurrency=args.concurrency)
    from tunefleet.config import mask_url

    print(f"Prefect server {mask_url(res.api_url)}")
    if res.pools_created:
        print(f"created work pool(s): {', '.join(res.pools_created)} ({args.pool_type})")
    if res.pools_updated:
        print(f"updated work pool(s): {', '.join(res.pools_updated)} ({args.pool_type})")
    for tag, limit in res.concurrency_limits.items():
        print(f"concurrency limit {tag}: {limit}")
    print(f"registered {len(res.deployments)} deployment(s): {', '.join(res.deployments)}")
    print("start a worker per pool, e.g.: prefect worker start --pool tunefleet-x86")
    return 0


def _zoo_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--batch-size", type=int, default=1, help="zoo models: batch size")
    p.add_argument("--image-size", type=int, default=None, help="zoo image models: height = width")
    p.add_argument("--seq-len", type=int, default=None, help="bert-base: sequence length")


def cmd_shards_list(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.planning import shard_queue

    ctx = Context(settings)
    rows = shard_queue.list_shards(ctx.db, hardware=args.hardware, state=args.state)
    names = {h.id: h.name for h in ctx.db.hardware_classes()}
    data = [{"id": r.id, "workload_id": r.workload_id, "hardware": names.get(r.hardware_class_id), "trials": r.trials,
             "priority": r.priority, "state": r.state, "attempts": f"{r.leases}/{r.max_leases}",
             "owner": r.lease_owner, "error": (r.error or "")[:80]} for r in rows]
    if args.json:
        _print_json(data)
    else:
        _table("shards", list(data[0].keys()) if data else ["id"], [list(d.values()) for d in data])
    return 0


def cmd_shards_retry(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.planning import shard_queue

    ids = shard_queue.retry(Context(settings).db, args.ids or None, hardware=args.hardware)
    print(f"requeued {len(ids)} shard(s)")
    return 0


def cmd_shards_cancel(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.planning import shard_queue

    ids = shard_queue.cancel(Context(settings).db, args.ids or None, hardware=args.hardware)
    print(f"cancelled {len(ids)} shard(s)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tunefleet", description="Tuned tensor programs at fleet scale.")
    parser.add_argument("--version", action="version", version=f"tunefleet {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    config = sub.add_parser("config", help="show the effective configuration").add_subparsers(dest="sub", required=True)
    show = config.add_parser("show", help="print settings with secrets masked")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.set_defaults(handler=cmd_config_show)

    db = sub.add_parser("db", help="database schema").add_subparsers(dest="sub", required=True)
    up = db.add_parser("upgrade", help="migrate the schema to the newest (or given) revision")
    up.add_argument("revision", nargs="?", default="head", help="Alembic revision to migrate to (default head, the newest)")
    up.set_defaults(handler=cmd_db_upgrade)
    down = db.add_parser("downgrade", help="migrate the schema down to a revision ('base' empties it)")
    down.add_argument("revision", help="Alembic revision to migrate down to ('base' removes every table)")
    down.set_defaults(handler=cmd_db_downgrade)
    cur = db.add_parser("current", help="print the schema revision")
    cur.set_defaults(handler=cmd_db_current)

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
    run.add_argument("-o", "--output-dir", default=None, help="write the tuned library here as <model>-<class>.so")
    run.add_argument("--json", action="store_true",
                     help="print the steps' results as JSON on stdout (the log path and the live line go to stderr)")
    _zoo_options(run)
    run.set_defaults(handler=cmd_run)

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

    ds = sub.add_parser("dataset", help="measurements as versioned Parquet datasets").add_subparsers(
        dest="sub", required=True)
    dse = ds.add_parser("export", help="export the measurements not in any version yet as the next version")
    dse.add_argument("--hardware", default=None, help="only this hardware class")
    dse.set_defaults(handler=cmd_dataset_export)
    dsl = ds.add_parser("list", help="dataset versions")
    dsl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    dsl.set_defaults(handler=cmd_dataset_list)

    cm = sub.add_parser("costmodel", help="XGBoost cost models trained on the datasets").add_subparsers(
        dest="sub", required=True)
    cmr = cm.add_parser("retrain", help="train on the dataset versions; promote only if better on held-out workloads")
    cmr.add_argument("--hardware", default="x86", help="hardware class to train for (default x86)")
    cmr.add_argument("--objective", choices=["reg:squarederror", "rank:pairwise"], default="reg:squarederror",
                     help="XGBoost objective (default reg:squarederror)")
    cmr.add_argument("--holdout", type=float, default=0.2, help="fraction of workloads held out (default 0.2)")
    cmr.add_argument("--seed", type=int, default=0, help="seed of the held-out split and of XGBoost (default 0)")
    cmr.add_argument("--holdout-model", action="append", metavar="MODEL",
                     help="hold out the workloads only this model has (repeatable) instead of --holdout")
    cmr.set_defaults(handler=cmd_costmodel_retrain)
    cml = cm.add_parser("list", help="registered cost models and their held-out metrics")
    cml.add_argument("--json", action="store_true", help="print JSON instead of a table")
    cml.set_defaults(handler=cmd_costmodel_list)
    cmp = cm.add_parser("promote", help="make a registered version the current model of its class (an override)")
    cmp.add_argument("version", type=int, help="registered version number (see `tunefleet costmodel list`)")
    cmp.add_argument("--hardware", default="x86", help="hardware class of the model (default x86)")
    cmp.set_defaults(handler=cmd_costmodel_promote)

    met = sub.add_parser("metrics", help="Prometheus metrics").add_subparsers(dest="sub", required=True)
    mse = met.add_parser("serve", help="serve the fleet's gauges from the database on /metrics")
    mse.add_argument("--port", type=at_least(0, "--port"), default=9464, help="TCP port to listen on (default 9464)")
    mse.add_argument("--addr", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    mse.add_argument("--interval", type=at_least(1, "--interval"), default=15, help="seconds between refreshes from the database (default 15)")
    mse.set_defaults(handler=cmd_metrics_serve)

    dep = sub.add_parser("deploy", help="create a Prefect work pool per hardware class and register the deployments")
    dep.add_argument("--pool-type", choices=["process", "kubernetes"], default="process",
                     help="work pool type: local processes or Kubernetes Jobs (default process)")
    dep.add_argument("--hardware", action="append", default=None,
                     help="hardware class to create a pool for (repeatable; default: every class)")
    dep.add_argument("--concurrency", type=int, default=None,
                     help="at most this many tuning tasks at once per hardware class (a Prefect tag limit; default none)")
    dep.set_defaults(handler=cmd_deploy)

    ing = sub.add_parser("ingest", help="store a model (zoo name, ONNX file, .pt2 file or s3:// URI)")
    ing.add_argument("source", help="zoo name, path to an ONNX or .pt2 file, or s3://bucket/key")
    ing.add_argument("--name", default=None, help="name to store the model under (default the zoo name or the file's stem)")
    _zoo_options(ing)
    ing.set_defaults(handler=cmd_ingest)

    ext = sub.add_parser("extract", help="extract and store a model's workloads for a hardware class")
    ext.add_argument("model", help="stored model: name, id or sha256 prefix")
    ext.add_argument("--hardware", default="x86", help="hardware class (default x86; see `tunefleet hardware list`)")
    ext.set_defaults(handler=cmd_extract)

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
    tu.add_argument("--json", action="store_true",
                    help="print the summary as JSON on stdout (the log path and the live line go to stderr)")
    tu.add_argument("--efficient", action="store_true",
                    help="plateau preemption, cost-model filtering (half of each round) and energy-aware leasing "
                    "(TUNEFLEET_PREEMPT, _FILTER_FRACTION, _ENERGY_AWARE set them one by one; the adaptive parallel "
                    "runner is TUNEFLEET_PARALLEL_MEASURE=true)")
    tu.set_defaults(handler=cmd_tune)

    for noun, handler in (("models", cmd_models_list), ("workloads", cmd_workloads_list), ("hardware", cmd_hardware_list)):
        grp = sub.add_parser(noun, help=f"{noun} in the database").add_subparsers(dest="sub", required=True)
        ls = grp.add_parser("list", help={"models": "list the ingested models",
                                           "workloads": "list the stored workloads and their call counts",
                                           "hardware": "list the hardware classes: target, node pool, power, price"}[noun])
        ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
        if noun == "workloads":
            ls.add_argument("--model", default=None, help="only this model's workloads (name, id or sha256 prefix)")
        ls.set_defaults(handler=handler)

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

    bu = sub.add_parser("build", help="compile a model with the best stored schedules and compare latency")
    bu.add_argument("model", help="stored model: name, id or sha256 prefix")
    bu.add_argument("--hardware", default="x86", help="hardware class (default x86; see `tunefleet hardware list`)")
    bu.add_argument("-o", "--output", default=None, help="write the compiled library to this file (default: not written)")
    bu.add_argument("--json", action="store_true", help="print JSON instead of a table")
    bu.add_argument("--zero-shot", action="store_true",
                    help="workloads never measured on this class get the current cost model's best proposal")
    bu.add_argument("--top-k", type=at_least(1, "--top-k"), default=5, help="with --zero-shot: proposals stored per workload (default 5)")
    bu.add_argument("--verify", type=at_least(0, "--verify"), default=0, metavar="K",
                    help="with --zero-shot: measure the top K proposals of each such workload here")
    bu.add_argument("--transfer", action="store_true",
                    help="workloads never measured on this class use the most compatible class's best schedule")
    bu.set_defaults(handler=cmd_build)

    ex = sub.add_parser("export-db", help="write the best records as MetaSchedule JSON database files")
    ex.add_argument("directory", help="directory to write the JSONDatabase files to")
    ex.add_argument("--hardware", default="x86", help="hardware class (default x86; see `tunefleet hardware list`)")
    ex.add_argument("--top", type=at_least(1, "--top"), default=1, help="records per workload (default 1)")
    ex.set_defaults(handler=cmd_export_db)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # a flag's type may refuse its value (a ParameterError)
        from tunefleet.config import load_settings

        settings = load_settings()
        level = logging.DEBUG if args.verbose else getattr(logging, settings.log_level)
        if args.handler in (cmd_run, cmd_tune) and not args.verbose:
            level = max(level, logging.WARNING)  # their INFO logs go to a log file (log_to_file)
        from rich.console import Console
        from rich.logging import RichHandler

        # Logs go to stderr so that --json output on stdout stays parseable.
        handler_ = RichHandler(show_path=False, console=Console(stderr=True))
        logging.basicConfig(level=level, format="%(message)s", handlers=[handler_])
        logging.getLogger("alembic").setLevel(logging.WARNING)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # Prefect's client logs every request at INFO
        # MetaSchedule logs every design space and batch at INFO: keep it for --verbose.
        logging.getLogger("tvm").setLevel(logging.DEBUG if args.verbose else logging.WARNING)
        handler: Handler = args.handler
        return int(handler(args, settings) or 0)
    except TunefleetError as exc:
        from tunefleet.config import mask_secrets

        print(f"tunefleet: error: {mask_secrets(str(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tunefleet: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
