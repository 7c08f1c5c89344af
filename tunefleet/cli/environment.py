"""The process around a long command: Prefect's environment, the log file, ``run``'s preflight."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tunefleet.cli.common import open_db
from tunefleet.errors import ConfigError, NotFoundError
from tunefleet.vocab import HUB_POOL

if TYPE_CHECKING:
    from pathlib import Path

    from tunefleet.config import Settings
    from tunefleet.db import Database


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
    if "PREFECT_API_URL" not in os.environ:
        # The temporary server's task-run recorder writes each task run's row from its events into
        # the server's SQLite file; at the end of a flow it sometimes waits out SQLite's lock with
        # the server's other writers for the full 60-second busy timeout, and the flow waits with
        # it (measured in docs/orchestration.md). Nothing reads those rows: the steps return their
        # results to the flow, flow runs and artifacts are written through the API as before.
        os.environ.setdefault("PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED", "false")
    if not ({"PREFECT_HOME", "PREFECT_API_URL", "PREFECT_PROFILES_PATH"} & set(os.environ)) and \
            not (Path.home() / ".prefect" / "profiles.toml").exists():
        home = Path(settings.home) / "prefect"
        home.mkdir(parents=True, exist_ok=True)
        os.environ["PREFECT_HOME"] = str(home)


def preflight_run(args: argparse.Namespace, settings: Settings,
                  check_budget: Callable[[argparse.Namespace, Settings], Any]) -> Database:
    """Everything ``run`` can check before a server or worker starts, in about a second: the
    model (a zoo name, or a file, and the extras it needs), the options, the database (one connect
    timeout, no retries) and the hardware class. Returns the open database.

    Parameters
    ----------
    args : argparse.Namespace
        ``run``'s arguments.
    settings : Settings
        The effective configuration.
    check_budget : callable
        ``run``'s budget of ``args`` and ``settings`` (:func:`tunefleet.cli.run._run_budget`),
        called for the error a bad budget raises; passed in, since ``run`` imports this module.

    Returns
    -------
    Database
    """
    from tunefleet.engine.options import TuneOptions
    from tunefleet.errors import ParameterError
    from tunefleet.hardware import claim_for_this_cpu
    from tunefleet.models.ingest import check_source
    from tunefleet.tvm.compiler import missing_compiler

    check_source(args.model)
    for name in ("trials", "shard_trials"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ParameterError(f"invalid --{name.replace('_', '-')}: {getattr(args, name)} (must be >= 1)")
    check_budget(args, settings)
    TuneOptions.from_settings(settings, seed=args.seed)
    if (why := missing_compiler()) is not None:  # before anything is ingested or tuned
        raise ConfigError(why)
    db = open_db(settings)
    known = {h.name: h.target for h in db.hardware_classes() if h.node_pool != HUB_POOL}  # hub classes are never tuned
    if args.hardware not in known:
        from tunefleet.hardware import hardware_names

        names = sorted(set(known) | hardware_names(settings))
        if args.hardware not in names:
            raise NotFoundError(f"unknown hardware class {args.hardware!r}; known: {', '.join(names)}")
    else:
        claim_for_this_cpu(db, args.hardware, record=False)
    return db


def log_to_file(settings: Settings, command: str, *, verbose: bool) -> Path:
    """Send tunefleet's, Prefect's and the libraries' logs to a file under ``TUNEFLEET_HOME/logs``
    (the console keeps warnings and errors, everything with ``-v``); its path.

    Parameters
    ----------
    settings : Settings
        Where the tunefleet home is.
    command : str
        The command, the start of the file's name (``run-20250101-120000.log``).
    verbose : bool
        Log DEBUG to the file, and leave the console's handlers' levels alone.

    Returns
    -------
    pathlib.Path
    """
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
