"""The schedule hub: ``hub export``, ``hub import``, ``hub merge`` and ``hub list``."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

from tunefleet import api
from tunefleet.cli.common import at_least
from tunefleet.cli.render import print_json, table

if TYPE_CHECKING:
    from tunefleet.cli.common import AddParser, Subparsers
    from tunefleet.config import Settings


def cmd_hub_export(args: argparse.Namespace, settings: Settings) -> int:
    from rich.console import Console

    with Console(stderr=True).status(f"exporting the best records to {args.output}"):
        result = api.hub_export(api.connect(settings), args.output, hardware=args.hardware or None, model=args.model,
                                top_k=args.top_k)
    return _print(result, as_json=args.json)


def cmd_hub_import(args: argparse.Namespace, settings: Settings) -> int:
    from rich.console import Console

    with Console(stderr=True).status(f"importing {args.source}"):
        result = api.hub_import(api.connect(settings), args.source)
    return _print(result, as_json=args.json)


def cmd_hub_merge(args: argparse.Namespace, settings: Settings) -> int:
    from rich.console import Console

    with Console(stderr=True).status(f"merging {len(args.sources)} bundle(s) into {args.output}"):
        result = api.hub_merge(api.connect(settings), args.output, args.sources, exclude=args.exclude_workload or None,
                               top_k=args.top_k)
    return _print(result, as_json=args.json)


def _print(result: Any, *, as_json: bool) -> int:
    """A hub command's result: its one line, or every field as JSON."""
    if as_json:
        print_json(dataclasses.asdict(result))
    else:
        print(result.line())
    return 0


def cmd_hub_list(args: argparse.Namespace, settings: Settings) -> int:
    db = api.connect(settings).db
    imports = db.hub_imports()
    classes = [(hw, db.count_measurements(hardware_class_id=hw.id)) for hw in db.hub_classes()]
    if args.json:
        print_json({"imports": [{"source": i.source, "sha256": i.sha256, "created_at": i.bundle_created_at,
                                 "imported_at": i.imported_at, "tvm": i.tvm_version, "counts": i.counts,
                                 "summary": i.summary} for i in imports],
                    "classes": [{"name": hw.name, "class": (hw.capabilities.get("hub") or {}).get("class"),
                                 "cpu": (hw.capabilities.get("cpu") or {}).get("model"), "target": hw.target,
                                 "records": n} for hw, n in classes]})
        return 0
    table("hub bundles imported", ["imported", "bundle made", "records new", "skipped", "tvm", "source"],
          [(i.imported_at.isoformat(sep=" ", timespec="seconds"), i.bundle_created_at, i.counts.get("records_new"),
            sum(v for k, v in i.counts.items() if k.startswith("skipped_")), i.tvm_version, i.source) for i in imports])
    table("hub classes (records tuned elsewhere; tuning here starts from them)", ["name", "tuned as", "on CPU", "records"],
          [(hw.name, (hw.capabilities.get("hub") or {}).get("class"), (hw.capabilities.get("cpu") or {}).get("model"), n)
           for hw, n in classes])
    return 0


def _add_hub(sub: Subparsers) -> None:
    hub = sub.add_parser("hub", help="carry the best schedules between databases (hub bundles)").add_subparsers(
        dest="sub", required=True)
    ex = hub.add_parser("export", help="write the best records of every measured workload as a hub bundle")
    ex.add_argument("output", help="the bundle file to write (.parquet), or an s3:// URI of the artifact store")
    ex.add_argument("--hardware", action="append", metavar="CLASS",
                    help="only this hardware class (repeatable; default: every class but the hub classes)")
    ex.add_argument("--model", default=None, help="only this stored model's workloads (name, id or sha256 prefix)")
    ex.add_argument("--top-k", type=at_least(1, "--top-k"), default=None,
                    help="records per workload and class (default 5)")
    ex.add_argument("--json", action="store_true", help="print JSON instead of a line")
    ex.set_defaults(handler=cmd_hub_export)
    im = hub.add_parser("import", help="load a hub bundle: validated, all or nothing, idempotent")
    im.add_argument("source", help="a bundle file, an s3:// URI of the artifact store, or a schedule registry's "
                    "https://.../v1/hub/CLASS.parquet (TUNEFLEET_REGISTRY_TOKEN; checked against its SHA-256)")
    im.add_argument("--json", action="store_true", help="print JSON instead of a line")
    im.set_defaults(handler=cmd_hub_import)
    mg = hub.add_parser("merge", help="write one bundle of several (e.g. one per CPU): the best records of each "
                        "workload, class and CPU")
    mg.add_argument("output", help="the bundle file to write (.parquet), or an s3:// URI of the artifact store")
    mg.add_argument("sources", nargs="+", metavar="SOURCE", help="bundles: files, s3:// URIs or registry URLs")
    mg.add_argument("--exclude-workload", action="append", metavar="PATTERN",
                    help="leave out the records of workloads whose name matches (fnmatch; repeatable)")
    mg.add_argument("--top-k", type=at_least(1, "--top-k"), default=None,
                    help="records per workload, class and CPU (default 5)")
    mg.add_argument("--json", action="store_true", help="print JSON instead of a line")
    mg.set_defaults(handler=cmd_hub_merge)
    ls = hub.add_parser("list", help="the bundles imported and the hub classes their records live under")
    ls.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ls.set_defaults(handler=cmd_hub_list)


#: This module's commands, each with what adds it to the parser (:func:`tunefleet.cli.app.build_parser`).
PARSERS: dict[str, AddParser] = {"hub": _add_hub}
