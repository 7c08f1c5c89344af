"""``tunefleet config show`` and ``tunefleet db upgrade|downgrade|current``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tunefleet.cli.common import open_db
from tunefleet.cli.render import print_json, table

if TYPE_CHECKING:
    from tunefleet.cli.common import AddParser, Subparsers
    from tunefleet.config import Settings


# -- config ---------------------------------------------------------------------------------
def cmd_config_show(args: argparse.Namespace, settings: Settings) -> int:
    masked = settings.masked()
    if args.json:
        print_json(masked)
    else:
        table("tunefleet configuration", ["setting", "value"], [(f"TUNEFLEET_{k.upper()}", v) for k, v in masked.items()])
    return 0


# -- db -------------------------------------------------------------------------------------
def cmd_db_upgrade(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.db import current_revision, upgrade

    db = open_db(settings, check_schema=False)
    upgrade(db.engine, args.revision)
    print(f"database schema at revision {current_revision(db.engine)}")
    return 0


def cmd_db_downgrade(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.db import current_revision, downgrade

    db = open_db(settings, check_schema=False)
    downgrade(db.engine, args.revision)
    print(f"database schema at revision {current_revision(db.engine) or 'base (empty)'}")
    return 0


def cmd_db_current(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.db import current_revision, head_revision

    db = open_db(settings, check_schema=False)
    current = current_revision(db.engine)
    print(f"current: {current or 'none (empty database)'}  head: {head_revision()}")
    return 0


# -- parsers --------------------------------------------------------------------------------
def _add_config(sub: Subparsers) -> None:
    config = sub.add_parser("config", help="show the effective configuration").add_subparsers(dest="sub", required=True)
    show = config.add_parser("show", help="print settings with secrets masked")
    show.add_argument("--json", action="store_true", help="print JSON instead of a table")
    show.set_defaults(handler=cmd_config_show)


def _add_db(sub: Subparsers) -> None:
    db = sub.add_parser("db", help="database schema").add_subparsers(dest="sub", required=True)
    up = db.add_parser("upgrade", help="migrate the schema to the newest (or given) revision")
    up.add_argument("revision", nargs="?", default="head", help="Alembic revision to migrate to (default head, the newest)")
    up.set_defaults(handler=cmd_db_upgrade)
    down = db.add_parser("downgrade", help="migrate the schema down to a revision ('base' empties it)")
    down.add_argument("revision", help="Alembic revision to migrate down to ('base' removes every table)")
    down.set_defaults(handler=cmd_db_downgrade)
    cur = db.add_parser("current", help="print the schema revision")
    cur.set_defaults(handler=cmd_db_current)


#: This module's commands, each with what adds it to the parser (:func:`tunefleet.cli.app.build_parser`).
PARSERS: dict[str, AddParser] = {"config": _add_config, "db": _add_db}
