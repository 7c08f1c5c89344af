"""``tunefleet deploy``: a Prefect work pool per hardware class, and the deployments."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from tunefleet import api
from tunefleet.cli.environment import prefect_environment
from tunefleet.vocab import HUB_POOL

if TYPE_CHECKING:
    from tunefleet.cli.common import AddParser, Subparsers
    from tunefleet.config import Settings


def cmd_deploy(args: argparse.Namespace, settings: Settings) -> int:
    prefect_environment(settings)
    from tunefleet.cluster.deploy import deploy

    ctx = api.connect(settings)
    # Hub classes hold imported records, tuned elsewhere: no pool, no worker ever measures them.
    classes = [ctx.db.hardware_class(n) for n in args.hardware] if args.hardware else \
        [h for h in ctx.db.hardware_classes() if h.node_pool != HUB_POOL]
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


def _add_deploy(sub: Subparsers) -> None:
    dep = sub.add_parser("deploy", help="create a Prefect work pool per hardware class and register the deployments")
    dep.add_argument("--pool-type", choices=["process", "kubernetes"], default="process",
                     help="work pool type: local processes or Kubernetes Jobs (default process)")
    dep.add_argument("--hardware", action="append", default=None,
                     help="hardware class to create a pool for (repeatable; default: every class)")
    dep.add_argument("--concurrency", type=int, default=None,
                     help="at most this many tuning tasks at once per hardware class (a Prefect tag limit; default none)")
    dep.set_defaults(handler=cmd_deploy)


#: This module's commands, each with what adds it to the parser (:func:`tunefleet.cli.app.build_parser`).
PARSERS: dict[str, AddParser] = {"deploy": _add_deploy}
