"""The ``tunefleet`` command line.

Kept light: only the standard library and tunefleet's own small modules load at start; the
database, TVM and Prefect are imported by the commands that need them. A
:class:`~tunefleet.errors.TunefleetError` prints as one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tunefleet import __version__
from tunefleet.errors import TunefleetError

if TYPE_CHECKING:
    from tunefleet.config import Settings
    from tunefleet.db import Database

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
    Console().print(table)


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tunefleet", description="Tuned tensor programs at fleet scale.")
    parser.add_argument("--version", action="version", version=f"tunefleet {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    config = sub.add_parser("config", help="show the effective configuration").add_subparsers(dest="sub", required=True)
    show = config.add_parser("show", help="print settings with secrets masked")
    show.add_argument("--json", action="store_true")
    show.set_defaults(handler=cmd_config_show)

    db = sub.add_parser("db", help="database schema").add_subparsers(dest="sub", required=True)
    up = db.add_parser("upgrade", help="migrate the schema to the newest (or given) revision")
    up.add_argument("revision", nargs="?", default="head")
    up.set_defaults(handler=cmd_db_upgrade)
    down = db.add_parser("downgrade", help="migrate the schema down to a revision ('base' empties it)")
    down.add_argument("revision")
    down.set_defaults(handler=cmd_db_downgrade)
    cur = db.add_parser("current", help="print the schema revision")
    cur.set_defaults(handler=cmd_db_current)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        from tunefleet.config import load_settings

        settings = load_settings()
        level = logging.DEBUG if args.verbose else getattr(logging, settings.log_level)
        from rich.logging import RichHandler

        logging.basicConfig(level=level, format="%(message)s", handlers=[RichHandler(show_path=False)])
        logging.getLogger("alembic").setLevel(logging.WARNING)
        handler: Handler = args.handler
        return int(handler(args, settings) or 0)
    except TunefleetError as exc:
        print(f"tunefleet: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tunefleet: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
