"""The schedule registry: ``serve`` (the HTTP service) and ``token`` (its bearer tokens)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tunefleet import api
from tunefleet.cli.common import at_least, duration
from tunefleet.cli.render import print_json, table

if TYPE_CHECKING:
    import datetime as dt

    from tunefleet.cli.common import AddParser, Subparsers
    from tunefleet.config import Settings


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.registry.app import serve

    serve(settings, args.host, args.port)
    return 0


def cmd_token_create(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.db.tables import utcnow

    expires = utcnow() + args.expires if args.expires else None
    token, row = api.connect(settings).db.create_token(args.team, args.scope, expires_at=expires, note=args.note)
    if args.json:
        print_json({"id": row.id, "team": row.team, "scope": row.scope, "expires_at": row.expires_at, "token": token})
    else:
        print(f"token {row.id} for team {row.team} ({row.scope}"
              + (f", expires {row.expires_at:%Y-%m-%d %H:%M} UTC" if row.expires_at else ", no expiry") + "):")
        print(token)
        print("shown once: the database keeps only its SHA-256")
    return 0


def cmd_token_list(args: argparse.Namespace, settings: Settings) -> int:
    from functools import partial

    from tunefleet.db.tables import utcnow
    from tunefleet.db.tokens import token_state

    rows = api.connect(settings).db.api_tokens()
    state = partial(token_state, now=utcnow())

    if args.json:
        print_json([{"id": t.id, "team": t.team, "scope": t.scope, "state": state(t), "note": t.note,
                     "created_at": t.created_at, "expires_at": t.expires_at, "revoked_at": t.revoked_at,
                     "last_used_at": t.last_used_at} for t in rows])
        return 0

    def when(moment: dt.datetime | None) -> str:
        return f"{moment:%Y-%m-%d %H:%M}" if moment is not None else "-"

    table("registry tokens (times UTC)", ["id", "team", "scope", "state", "created", "expires", "last used", "note"],
          [(t.id, t.team, t.scope, state(t), when(t.created_at), when(t.expires_at), when(t.last_used_at), t.note)
           for t in rows])
    return 0


def cmd_token_revoke(args: argparse.Namespace, settings: Settings) -> int:
    row = api.connect(settings).db.revoke_token(args.id)
    print(f"token {row.id} of team {row.team} revoked at {row.revoked_at:%Y-%m-%d %H:%M:%S} UTC")
    return 0


def _add_serve(sub: Subparsers) -> None:
    sv = sub.add_parser("serve", help="run the schedule registry: the fleet's schedules and hub bundles over HTTP")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 in a pod)")
    sv.add_argument("--port", type=at_least(1, "--port", at_most=65535), default=8080, help="port (default 8080)")
    sv.set_defaults(handler=cmd_serve)


def _add_token(sub: Subparsers) -> None:
    tk = sub.add_parser("token", help="the schedule registry's bearer tokens").add_subparsers(
        dest="token_command", required=True, metavar="ACTION")
    cr = tk.add_parser("create", help="a new token for a team (printed once)")
    cr.add_argument("--team", required=True, help="the team the token belongs to (named in the audit lines)")
    cr.add_argument("--scope", choices=("read", "write"), default="read",
                    help="read: fetch schedules, databases and bundles; write: also submit models and upload bundles")
    cr.add_argument("--expires", type=duration("--expires"), default=None, metavar="DURATION",
                    help="lifetime such as 90d or 12h (default: no expiry)")
    cr.add_argument("--note", default="", help="a note kept with the token (what it is for)")
    cr.add_argument("--json", action="store_true", help="print JSON instead of lines")
    cr.set_defaults(handler=cmd_token_create)
    ls = tk.add_parser("list", help="every token: team, scope, live / expired / revoked, last use")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(handler=cmd_token_list)
    rv = tk.add_parser("revoke", help="revoke a token now (it answers 401 from then on)")
    rv.add_argument("id", type=at_least(1, "id"), help="the token's id (token list)")
    rv.set_defaults(handler=cmd_token_revoke)


PARSERS: dict[str, AddParser] = {"serve": _add_serve, "token": _add_token}
