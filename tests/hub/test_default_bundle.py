"""The hub bundle shipped with tunefleet (``tunefleet/data/hub/default.parquet``, the campaign's:
docs/campaign.md): inside its package-data budget, valid for this TVM, and made under the current
extraction recipe — a recipe change that leaves it stale fails here (regenerate it then)."""

from __future__ import annotations

from typing import Any

import pyarrow.parquet as pq

from tunefleet import api
from tunefleet.learning import hub

#: Issue 32: at most 20 MB of package data for the bundle.
MAX_BYTES = 20_000_000


def test_the_default_bundle_ships_within_its_budget() -> None:
    assert hub.DEFAULT_BUNDLE.is_file(), f"no default hub bundle at {hub.DEFAULT_BUNDLE}"
    assert hub.DEFAULT_BUNDLE.stat().st_size <= MAX_BYTES
    meta = pq.read_schema(hub.DEFAULT_BUNDLE).metadata
    assert meta[b"format"] == hub.FORMAT.encode() and meta[b"version"] == str(hub.FORMAT_VERSION).encode()


def test_a_new_database_imports_the_default_bundle_and_the_zoo_starts_from_it(make_home: Any) -> None:
    ctx = make_home("fresh", hub="default")
    [done] = ctx.db.hub_imports()
    result = hub.import_bundle(ctx.db, hub.DEFAULT_BUNDLE)
    assert not result.new  # imported on first use, once
    table = pq.read_table(hub.DEFAULT_BUNDLE, columns=["workload_hash", "class_name"])
    assert done.counts["records_new"] == table.num_rows  # nothing skipped: this TVM, known recipes, sound traces
    model = api.ingest(ctx, "mlp").model
    api.extract(ctx, model, "x86")
    hw = ctx.db.hardware_class("x86")
    report = hub.hub_report(ctx.db, [wl.id for wl, _ in ctx.db.workloads(model.id, hw.id)], hw.id)
    assert (report.workloads, report.from_hub) == (3, 3), "the bundle predates the current recipe: regenerate it"


def test_resnet18_under_the_winograd_recipe_starts_from_the_bundle_s_winograd_records(tmp_path: Any) -> None:
    """The bundle's Winograd records (one CPU's) match the Winograd workloads extraction writes now:
    a change to the Winograd compute that leaves them stale fails here (carry them over with
    bench/rekey_winograd.py, or regenerate the bundle)."""
    from tunefleet.config import load_settings

    ctx = api.connect(load_settings(home=tmp_path, hub="default", hardware={"x86": {"winograd": True}}))
    try:
        model = api.ingest(ctx, "resnet18").model
        assert api.extract(ctx, model, "x86").recipe.endswith("+winograd")
        hw = ctx.db.hardware_class("x86")
        workloads = [wl for wl, _ in ctx.db.workloads(model.id, hw.id)]
        ids = [wl.id for wl in workloads]
        # the 3x3 stride-1 convolutions of the 56, 28 and 14 stages
        assert sum("conv2d_winograd" in wl.name for wl in workloads) == 6
        report = hub.hub_report(ctx.db, ids, hw.id)
        assert (report.workloads, report.from_hub) == (len(ids), len(ids)), "regenerate or rekey the bundle"
    finally:
        ctx.close()
