"""What the database knows: ``ingest``, ``extract`` and ``models|workloads|hardware list``."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from tunefleet import api
from tunefleet.cli.common import zoo_options
from tunefleet.cli.render import print_json, table

if TYPE_CHECKING:
    from tunefleet.cli.common import AddParser, Handler, Subparsers
    from tunefleet.config import Settings


def _model_name(text: str) -> str:
    """An argparse ``type`` for ``ingest --name``: a name the database can hold, else one line."""
    from tunefleet.models.ingest import check_name

    return check_name(text)


def cmd_ingest(args: argparse.Namespace, settings: Settings) -> int:
    ctx = api.connect(settings)
    res = api.ingest(ctx, args.source, name=args.name, batch_size=args.batch_size, image_size=args.image_size,
                     seq_len=args.seq_len)
    verb = "ingested" if res.created else "already ingested"
    print(f"{verb}: model {res.model.id} {res.model.name} ({res.model.format}, sha256 {res.model.sha256[:16]})")
    return 0


def cmd_models_list(args: argparse.Namespace, settings: Settings) -> int:
    ctx = api.connect(settings)
    rows = [(m.id, m.name, m.source, m.format, m.sha256[:12], json.dumps(m.input_info), m.created_at.isoformat(timespec="seconds"))
            for m in ctx.db.models()]
    if args.json:
        print_json([dict(zip(["id", "name", "source", "format", "sha256", "inputs", "created"], r)) for r in rows])
    else:
        table("models", ["id", "name", "source", "format", "sha256", "inputs", "created"], rows)
    return 0


def cmd_workloads_list(args: argparse.Namespace, settings: Settings) -> int:
    ctx = api.connect(settings)
    model_id = ctx.db.model(args.model).id if args.model else None
    rows = [(w.structural_hash, w.name, w.op_kind, f"{w.flops:.3g}", weight) for w, weight in ctx.db.workloads(model_id)]
    if args.json:
        print_json([dict(zip(["hash", "name", "op_kind", "flops", "weight"], r)) for r in rows])
    else:
        table("workloads", ["hash", "name", "op kind", "FLOPs", "weight"], rows)
    return 0


def cmd_hardware_list(args: argparse.Namespace, settings: Settings) -> int:
    ctx = api.connect(settings)
    classes = ctx.db.hardware_classes()
    if args.json:
        print_json([{"name": h.name, "target": h.target, "node_pool": h.node_pool, "watts_per_core": h.watts_per_core,
                     "idle_watts": h.idle_watts, "watts_per_gpu": h.watts_per_gpu, "price_per_hour": h.price_per_hour,
                     "capabilities": h.capabilities} for h in classes])
    else:
        table("hardware classes", ["name", "target", "node pool", "W/core", "idle W", "W/GPU", "price/h"],
              [(h.name, json.dumps(h.target), h.node_pool, h.watts_per_core, h.idle_watts, h.watts_per_gpu,
                h.price_per_hour) for h in classes])
    return 0


def cmd_extract(args: argparse.Namespace, settings: Settings) -> int:
    ctx = api.connect(settings)
    res = api.extract(ctx, args.model, args.hardware)
    print(f"model {res.model_id} on {res.hardware}: {res.workloads} workloads ({res.new_workloads} new)")
    return 0


# -- parsers --------------------------------------------------------------------------------
def _add_ingest(sub: Subparsers) -> None:
    ing = sub.add_parser("ingest", help="store a model (zoo name, ONNX file, .pt2 file or s3:// URI)")
    ing.add_argument("source", help="zoo name, path to an ONNX or .pt2 file, or s3://bucket/key")
    ing.add_argument("--name", type=_model_name, default=None,
                     help="name to store the model under, at most 200 characters (default the zoo name or the file's stem)")
    zoo_options(ing)
    ing.set_defaults(handler=cmd_ingest)


def _add_extract(sub: Subparsers) -> None:
    ext = sub.add_parser("extract", help="extract and store a model's workloads for a hardware class")
    ext.add_argument("model", help="stored model: name, id or sha256 prefix")
    ext.add_argument("--hardware", default="x86", help="hardware class (default x86; see `tunefleet hardware list`)")
    ext.set_defaults(handler=cmd_extract)


_LIST_HELP = {"models": "list the ingested models",
              "workloads": "list the stored workloads and their call counts",
              "hardware": "list the hardware classes: target, node pool, power, price"}


def _add_list(noun: str) -> AddParser:
    """What adds ``tunefleet <noun> list``."""
    def add(sub: Subparsers) -> None:
        # looked up when the parser is built, so that a test's stand-in for a command is used
        handler: Handler = {"models": cmd_models_list, "workloads": cmd_workloads_list,
                            "hardware": cmd_hardware_list}[noun]
        grp = sub.add_parser(noun, help=f"{noun} in the database").add_subparsers(dest="sub", required=True)
        ls = grp.add_parser("list", help=_LIST_HELP[noun])
        ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
        if noun == "workloads":
            ls.add_argument("--model", default=None, help="only this model's workloads (name, id or sha256 prefix)")
        ls.set_defaults(handler=handler)

    return add


#: This module's commands, each with what adds it to the parser (:func:`tunefleet.cli.app.build_parser`).
PARSERS: dict[str, AddParser] = {"ingest": _add_ingest, "extract": _add_extract, "models": _add_list("models"),
                                 "workloads": _add_list("workloads"), "hardware": _add_list("hardware")}
