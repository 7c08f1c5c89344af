"""Learning from the measurements: ``dataset export|list``, ``costmodel retrain|list|promote``, and
``gc``, which deletes the files of exports and retrains the database never registered."""

from __future__ import annotations

import argparse
import datetime as dt
from typing import TYPE_CHECKING, Any

from tunefleet import api
from tunefleet.cli.common import between, duration
from tunefleet.cli.render import print_json, table

if TYPE_CHECKING:
    from tunefleet.cli.common import AddParser, Subparsers
    from tunefleet.config import Settings


def cmd_dataset_export(args: argparse.Namespace, settings: Settings) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from tunefleet.learning.dataset import export

    ctx = api.connect(settings)
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

    versions = list_versions(api.connect(settings).db)
    if args.json:
        print_json([{"version": v.version, "uri": v.uri, "created_at": v.created_at, "rows": v.row_count,
                     "complete": v.complete, "row_counts": v.row_counts, "parents": v.parents,
                     "measurement_ids": v.measurement_ids} for v in versions])
        return 0
    table("dataset versions", ["version", "rows", "per hardware class", "measurement ids", "complete", "created", "uri"],
          [(v.version, v.row_count, ", ".join(f"{k}: {n}" for k, n in sorted(v.row_counts.items())),
            f"{v.measurement_ids['min']}-{v.measurement_ids['max']}" if v.measurement_ids else "-",
            "yes" if v.complete else "no", v.created_at, v.uri) for v in versions])
    return 0


def _metric(m: dict[str, Any] | None, key: str) -> str:
    return "-" if not m or m.get(key) is None else f"{m[key]:.3f}"


def cmd_costmodel_retrain(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.learning.costmodel import retrain

    ctx = api.connect(settings)
    res = retrain(ctx.db, ctx.store, args.hardware, objective=args.objective, seed=args.seed,
                  holdout_fraction=args.holdout, holdout_models=args.holdout_model or None)
    m = res.metrics
    keys = ("pairwise_accuracy", "pairwise_by_workload", "peak@1", "peak@5", "r2")
    rows = [("new model v%d" % res.version, *(_metric(m["heldout"], k) for k in keys))]
    if m.get("current_on_heldout"):
        rows.append(("current model", *(_metric(m["current_on_heldout"], k) for k in keys)))
    for name, base in (m.get("baselines") or {}).items():
        rows.append((f"{name} ranking", *(_metric(base, k) for k in keys)))
    split = m.get("split", {})
    table(f"cost model for {args.hardware}: held-out workloads {split.get('test_workloads', '?')} "
          f"(trained on {split.get('train_workloads', '?')})",
          ["model", "pairwise acc", "by workload", "peak@1", "peak@5", "R2"], rows)
    print(f"{'promoted' if res.promoted else 'NOT promoted'}: {res.reason} ({res.artifact_uri})")
    return 0


def cmd_costmodel_list(args: argparse.Namespace, settings: Settings) -> int:
    ctx = api.connect(settings)
    data = [{"hardware": hw, "version": cm.version, "promoted": cm.promoted, "created_at": cm.created_at,
             "objective": cm.metrics.get("objective"), "heldout": cm.metrics.get("heldout"),
             "reason": cm.metrics.get("reason"), "uri": cm.artifact_uri} for cm, hw in ctx.db.cost_models()]
    if settings.pretrained_cost_model:
        data.extend(_shipped_rows())
    if args.json:
        print_json(data)
        return 0
    table("cost models", ["hardware", "version", "current", "objective", "pairwise acc", "peak@1", "created", "reason"],
          [(d["hardware"], d["version"], "yes" if d["promoted"] else "fallback" if d.get("shipped") else "", d["objective"],
            _metric(d["heldout"], "pairwise_accuracy"), _metric(d["heldout"], "peak@1"), d["created_at"], d["reason"])
           for d in data])
    return 0


def _shipped_rows() -> list[dict[str, Any]]:
    """The shipped cost models as rows of `costmodel list`: version 0 of every class without its own,
    one for x86 AVX2 code and one for every other class."""
    from tunefleet.errors import TunefleetError
    from tunefleet.learning.pretrained import SHIPPED_VERSION, model_file, shipped_model, shipped_summary

    rows = []
    for code, serves in (("avx2", "(x86 AVX2 code, without its own)"), ("default", "(any other without its own)")):
        path = model_file(code)
        row: dict[str, Any] = {"hardware": serves, "version": SHIPPED_VERSION, "promoted": False, "shipped": True,
                               "uri": path.as_uri()}
        try:
            model, summary = shipped_model(path), shipped_summary(path)
        except TunefleetError as exc:
            rows.append({**row, "created_at": None, "objective": None, "heldout": None, "reason": str(exc)})
            continue
        on: Any = summary.get("trained_on") or {}
        rows.append({**row, "created_at": model.meta.get("created_at"), "objective": model.objective,
                     "heldout": summary.get("heldout"),
                     "reason": f"shipped with tunefleet: {on.get('rows', '?')} measurements of "
                               f"{on.get('workloads', '?')} workloads on {', '.join(on.get('cpus') or ['?'])}"})
    return rows


def cmd_costmodel_promote(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.learning.costmodel import promote_version

    ctx = api.connect(settings)
    row = promote_version(ctx.db, args.hardware, args.version)
    print(f"cost model v{row.version} is now the current model of {args.hardware} ({row.artifact_uri})")
    return 0


def cmd_gc(args: argparse.Namespace, settings: Settings) -> int:
    from tunefleet.learning.artifacts import collect

    ctx = api.connect(settings)
    found = collect(ctx.db, ctx.store, grace=args.grace, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    if args.json:
        print_json({"dry_run": found.dry_run, "grace_s": found.grace.total_seconds(), "registered": found.registered,
                    "deleted": [_unit(u) for u in found.deleted], "kept_young": [_unit(u) for u in found.young]})
        return 0
    for unit in found.deleted:
        print(f"{verb} {unit.name} ({unit.kind}: {len(unit.keys)} file(s), {_size(unit.size)}, "
              f"last written {_when(unit.modified)})")
    done = "to delete" if args.dry_run else "deleted"
    print(f"gc: {len(found.deleted)} unregistered artifact(s) {done} ({_size(sum(u.size for u in found.deleted))}), "
          f"{len(found.young)} kept (written within the grace period of {_duration_text(found.grace)}), "
          f"{found.registered} registered in {ctx.store.location}")
    return 0


def _unit(unit: Any) -> dict[str, Any]:
    return {"name": unit.name, "kind": unit.kind, "keys": unit.keys, "bytes": unit.size, "modified": unit.modified}


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


def _when(moment: dt.datetime | None) -> str:
    return "-" if moment is None else moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


grace_period = duration("--grace")
"""An argparse ``type``: ``--grace``'s duration (``1d``, ``12h``, ``1d12h``, ``30m``, ``90s`` or ``0``)."""


def _duration_text(period: dt.timedelta) -> str:
    seconds = int(period.total_seconds())
    d, rest = divmod(seconds, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return "".join(f"{n}{u}" for n, u in ((d, "d"), (h, "h"), (m, "m"), (s, "s")) if n) or "0"


# -- parsers --------------------------------------------------------------------------------
def _add_dataset(sub: Subparsers) -> None:
    ds = sub.add_parser("dataset", help="measurements as versioned Parquet datasets").add_subparsers(
        dest="sub", required=True)
    dse = ds.add_parser("export", help="export the measurements not in any version yet as the next version")
    dse.add_argument("--hardware", default=None, help="only this hardware class")
    dse.set_defaults(handler=cmd_dataset_export)
    dsl = ds.add_parser("list", help="dataset versions")
    dsl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    dsl.set_defaults(handler=cmd_dataset_list)


def _add_costmodel(sub: Subparsers) -> None:
    cm = sub.add_parser("costmodel", help="XGBoost cost models trained on the datasets").add_subparsers(
        dest="sub", required=True)
    cmr = cm.add_parser("retrain", help="train on the dataset versions; promote only if better on held-out workloads")
    cmr.add_argument("--hardware", default="x86", help="hardware class to train for (default x86)")
    cmr.add_argument("--objective", choices=["reg:squarederror", "rank:pairwise"], default="reg:squarederror",
                     help="XGBoost objective (default reg:squarederror)")
    cmr.add_argument("--holdout", type=between(0, 1, "--holdout"), default=0.2,
                     help="fraction of workloads held out, between 0 and 1 (default 0.2)")
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


def _add_gc(sub: Subparsers) -> None:
    gc = sub.add_parser("gc", help="delete artifacts (dataset files, cost models) the database never registered, "
                                   "once older than a grace period")
    gc.add_argument("--grace", type=grace_period, default=dt.timedelta(days=1), metavar="DURATION",
                    help="delete only what was last written longer ago than this: 1d, 12h, 30m, 0 ... (default 1d; "
                         "longer than any export or retrain runs)")
    gc.add_argument("--dry-run", action="store_true", help="print what would be deleted, delete nothing")
    gc.add_argument("--json", action="store_true", help="print JSON instead of lines")
    gc.set_defaults(handler=cmd_gc)


#: This module's commands, each with what adds it to the parser (:func:`tunefleet.cli.app.build_parser`).
PARSERS: dict[str, AddParser] = {"dataset": _add_dataset, "costmodel": _add_costmodel, "gc": _add_gc}
