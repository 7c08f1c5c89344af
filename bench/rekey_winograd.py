"""Carry a hub bundle's Winograd records over to the workloads this tunefleet extracts.

Usage::

    python bench/rekey_winograd.py tunefleet/data/hub/default.parquet --output /tmp/default.parquet
    python bench/rekey_winograd.py bench/data/campaign-<cpu>.parquet --output ... --check-ranks 3

Since the Winograd transforms' matrices are written nested by row (``tunefleet.tvm.extract.
_sparse_const_matrix``), the Winograd workloads' TIR, and so their structural hashes, differ from
those of the records tuned before; the kernels compile to the same machine code. This script
extracts ``--models`` (default resnet18: the only zoo model with Winograd records) under the
Winograd recipe in a throwaway home of this machine's ``x86`` class, and gives each record of a
Winograd workload (``fused_conv2d_winograd...``) of that class's target the new workload of the
same name, after checking that:

1. the new workload takes the same arguments as the old one, and its FLOP count is the same;
2. the record's trace replays on the new workload;
3. for the best ``--check-ranks`` records of each workload, the trace builds to the same assembly
   on the old and the new workload (so its stored run times hold).

A record that fails a check stops the script (nothing written). Records of other targets (another
CPU's class: run the script on that CPU), and of Winograd workloads ``--models`` no longer has
(resnet18's 7x7 stage, since Winograd needs 16 output tiles), are left as they are and counted.
The bundle keeps its metadata (``created_at``, origin); its summary gains a ``rekeyed`` entry.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

def extract_new(models: list[str], home: Path) -> tuple[str, dict[str, dict[str, Any]]]:
    """This machine's ``x86`` target (as a bundle writes it) and the Winograd workloads of ``models``
    extracted under the Winograd recipe in a new home, by name."""
    from tunefleet import api
    from tunefleet.config import load_settings

    ctx = api.connect(load_settings(home=home, hub="off", hardware={"x86": {"winograd": True}}))
    try:
        hw = ctx.db.hardware_class("x86")
        found = {}
        for name in models:
            model = api.ingest(ctx, name).model
            api.extract(ctx, model, "x86")
            found.update({wl.name: {"hash": wl.structural_hash, "tir_json": wl.tir_json, "flops": wl.flops}
                          for wl, _ in ctx.db.workloads(model.id, hw.id) if "conv2d_winograd" in wl.name})
        return json.dumps(hw.target, sort_keys=True), found
    finally:
        ctx.close()


def args_of(mod: Any) -> str:
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    return json.dumps([a.as_json() for a in ArgInfo.from_prim_func(mod["main"])])


def assembly(mod: Any, trace_json: str, target: Any) -> str:
    """The sha256 of the assembly ``trace_json`` builds to on ``mod`` (comments and file names left out)."""
    from tvm import s_tir
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build

    sch = s_tir.Schedule(mod)
    s_tir.schedule.Trace.apply_json_to_schedule(json.loads(trace_json), sch)
    rt = default_build(sch.mod, target, None)
    asm = rt.imports[0].inspect_source("asm") if rt.imports else rt.inspect_source("asm")
    return hashlib.sha256(re.sub(r"\s*#.*|\.file.*|\.ident.*", "", asm).encode()).hexdigest()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bundle", help="the hub bundle to read")
    parser.add_argument("--output", required=True, help="where to write the rekeyed bundle")
    parser.add_argument("--models", default="resnet18", help="zoo models whose Winograd workloads to extract (comma-separated)")
    parser.add_argument("--check-ranks", type=int, default=1,
                        help="build the best N records of each workload on the old and the new workload and compare their assembly")
    args = parser.parse_args(argv)

    import pyarrow as pa
    import pyarrow.parquet as pq
    import tvm
    from tvm import s_tir
    from tunefleet.tvm.builder import import_tensor_intrinsics

    import_tensor_intrinsics()
    start = time.monotonic()
    table = pq.read_table(args.bundle)
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    with tempfile.TemporaryDirectory(prefix="rekey-") as tmp:
        target_json, new = extract_new(args.models.split(","), Path(tmp))
    print(f"extracted {len(new)} Winograd workloads of {args.models} for this x86 target", flush=True)
    target = tvm.target.Target(json.loads(target_json))
    rows = table.to_pylist()
    old_mods: dict[str, Any] = {}
    new_mods = {name: tvm.ir.load_json(w["tir_json"]) for name, w in new.items()}
    rekeyed, other_targets, checked, workloads, gone = 0, 0, 0, set(), set()
    for row in rows:
        if "conv2d_winograd" not in (row["workload_name"] or ""):
            continue
        if json.dumps(json.loads(row["target"]), sort_keys=True) != target_json:
            other_targets += 1
            continue
        name = row["workload_name"]
        if name not in new:  # not extracted as Winograd now (WINOGRAD_MIN_TILES), or another model's
            gone.add(name)
            continue
        if row["workload_hash"] == new[name]["hash"]:
            continue  # already the new workload
        mod = new_mods[name]
        old = old_mods.setdefault(row["workload_hash"], tvm.ir.load_json(row["tir_json"]))
        if args_of(old) != args_of(mod):
            raise SystemExit(f"rekey: error: {name}: the new workload takes other arguments ({args_of(mod)} against "
                             f"{args_of(old)})")
        if abs(float(row["flops"] or 0) - float(new[name]["flops"])) > 1e-6 * max(1.0, float(new[name]["flops"])):
            raise SystemExit(f"rekey: error: {name}: FLOPs {row['flops']} against the new workload's {new[name]['flops']}")
        sch = s_tir.Schedule(mod)
        s_tir.schedule.Trace.apply_json_to_schedule(json.loads(row["trace_json"]), sch)  # raises if it does not replay
        if row["rank"] < args.check_ranks:
            if assembly(old, row["trace_json"], target) != assembly(mod, row["trace_json"], target):
                raise SystemExit(f"rekey: error: {name} rank {row['rank']}: the trace builds to other machine code on "
                                 "the new workload; its run times would not hold")
            checked += 1
        workloads.add(name)
        row.update(workload_hash=new[name]["hash"], tir_json=new[name]["tir_json"])
        rekeyed += 1
    summary = json.loads(meta.get("summary") or "{}")
    summary.setdefault("rekeyed", []).append(
        {"what": "Winograd transforms nested by row", "records": rekeyed, "workloads": len(workloads),
         "assembly_checked": checked, "target": json.loads(target_json)})
    meta["summary"] = json.dumps(summary, sort_keys=True)
    out = pa.Table.from_pylist(rows, schema=table.schema).replace_schema_metadata(meta)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(out, args.output, compression="zstd")
    print(f"wrote {args.output}: {rekeyed} records of {len(workloads)} Winograd workloads rekeyed ({checked} built to "
          f"identical assembly on both), {other_targets} of other targets left as they were; records of "
          f"{len(gone)} workload(s) {args.models} does not have as Winograd now left as they were "
          f"({', '.join(sorted(gone)) or 'none'}); "
          f"{os.path.getsize(args.output) / 1e6:.2f} MB, {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
