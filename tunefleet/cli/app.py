"""The ``tunefleet`` command line: the parser, assembled from the command modules, and :func:`main`.

Kept light: only the standard library and tunefleet's own small modules load at start; the
database, TVM and Prefect are imported by the commands that need them. A
:class:`~tunefleet.errors.TunefleetError` prints as one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tunefleet.version import __version__
from tunefleet.cli import catalog, cluster, config_db, delivery, hub, learning, registry, reports, run, tuning
from tunefleet.errors import TunefleetError

if TYPE_CHECKING:
    from tunefleet.cli.common import AddParser, Handler

#: The command modules; each names its commands and what adds them (``PARSERS``).
MODULES = (config_db, catalog, tuning, run, delivery, hub, registry, learning, reports, cluster)

#: The order ``tunefleet --help`` lists the commands in.
COMMANDS = ("config", "db", "run", "report", "dataset", "costmodel", "gc", "metrics", "deploy", "ingest", "extract",
            "plan", "tune", "models", "workloads", "hardware", "shards", "best", "build", "export-db", "hub", "serve",
            "token")


def build_parser() -> argparse.ArgumentParser:
    """The ``tunefleet`` parser: the global flags, then every command of :data:`MODULES`.

    Returns
    -------
    argparse.ArgumentParser
        Each command's parser sets ``handler``, the function that runs it.
    """
    parser = argparse.ArgumentParser(prog="tunefleet", description="Tuned tensor programs at fleet scale.")
    parser.add_argument("--version", action="version", version=f"tunefleet {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    adders: dict[str, AddParser] = {name: add for module in MODULES for name, add in module.PARSERS.items()}
    for name in COMMANDS:
        adders[name](sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one ``tunefleet`` command.

    Parameters
    ----------
    argv : Sequence[str], optional
        The arguments after ``tunefleet`` (default ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status: the command's (0 on success), 2 after a
        :class:`~tunefleet.errors.TunefleetError` (one line on stderr, secrets masked), 130 on
        Ctrl-C.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)  # a flag's type may refuse its value (a ParameterError)
        from tunefleet.config import load_settings

        settings = load_settings()
        level = logging.DEBUG if args.verbose else getattr(logging, settings.log_level)
        if args.handler in (run.cmd_run, tuning.cmd_tune) and not args.verbose:
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
