"""Hub bundles in the database: reading a class's best records out, loading a bundle's in.

A bundle's records become measurements of *hub classes*: one hardware class per class and CPU
they were tuned on, in the node pool :data:`~tunefleet.vocab.HUB_POOL` (never leased, never
measured). An import is one transaction (a bundle is loaded whole or not at all) and idempotent
twice over: a bundle file already imported is not read again, and a record already present (the
candidate key of ``measurements``) is not inserted again.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import select

from tunefleet.db.catalog import CatalogMixin
from tunefleet.db.tables import HardwareClass, HubImport, Measurement, ModelWorkload, Workload, utcnow
from tunefleet.vocab import DEFAULT_TRACE_SHA256, HUB_POOL

#: Rows per INSERT statement of an import (bounded statements on both backends).
IMPORT_CHUNK = 500


class HubMixin(CatalogMixin):
    """Hub classes, their records, and the bundles imported."""

    def hub_classes(self) -> list[HardwareClass]:
        """The hub classes (imported records live under them), by name."""
        with self.session() as s:
            return list(s.scalars(select(HardwareClass).where(HardwareClass.node_pool == HUB_POOL)
                                  .order_by(HardwareClass.name)))

    def hub_imports(self) -> list[HubImport]:
        """The bundles imported into this database, oldest first."""
        with self.session() as s:
            return list(s.scalars(select(HubImport).order_by(HubImport.id)))

    def hub_import_of(self, sha256: str) -> HubImport | None:
        with self.session() as s:
            return s.scalars(select(HubImport).where(HubImport.sha256 == sha256)).one_or_none()

    def hub_export_records(self, hardware_class_id: int, k: int, workload_ids: Iterable[int] | None = None
                           ) -> list[dict[str, Any]]:
        """The ``k`` fastest distinct successful schedules of every workload measured on a class
        (or of ``workload_ids``), ranked as :meth:`best_measurements` ranks them, with their
        workload and the recipe the class extracted it under."""
        m = Measurement.__table__
        with self.session() as s:
            measured = select(m.c.workload_id).where(m.c.hardware_class_id == hardware_class_id,
                                                     m.c.mean_run_s.is_not(None)).distinct()
            ids = set(s.scalars(measured))
            if workload_ids is not None:
                ids &= set(workload_ids)
            recipes = dict(s.execute(select(ModelWorkload.workload_id, ModelWorkload.recipe)
                                     .where(ModelWorkload.hardware_class_id == hardware_class_id)).all())
            out: list[dict[str, Any]] = []
            for wl_id in sorted(ids):
                wl = s.get(Workload, wl_id)
                # ranked as a build ranks them: a re-timed schedule by its latest measurement
                for rank, row in enumerate(self.best_measurements(wl_id, hardware_class_id, k)):  # type: ignore[attr-defined]
                    out.append({"workload_hash": wl.structural_hash, "workload_name": wl.name, "op_kind": wl.op_kind,
                                "flops": float(wl.flops or 0.0), "tir_json": wl.tir_json,
                                "recipe": recipes.get(wl_id, ""), "rank": rank,
                                "trace_json": row.trace_json, "trace_sha256": row.trace_sha256,
                                "args_info": row.args_info, "run_secs": [float(x) for x in row.run_secs or []],
                                "mean_run_s": float(row.mean_run_s), "tvm_version": row.tvm_version,
                                "measured_at": row.created_at})
            return out

    def hub_import(self, *, sha256: str, source: str, format_version: int, tvm_version: str,
                   bundle_created_at: dt.datetime | None, summary: dict[str, Any], classes: Sequence[dict[str, Any]],
                   workloads: Sequence[dict[str, Any]], records: Sequence[dict[str, Any]],
                   counts: dict[str, Any]) -> tuple[HubImport, bool]:
        """Load a validated bundle in one transaction; (the import's row, whether it is new).

        ``classes``: the hub classes' ``name``, ``target``, ``capabilities``; ``workloads``: the
        ``workloads`` columns; ``records``: measurement columns plus ``class_name`` and
        ``workload_hash``. ``counts`` (what validation skipped) is completed with what was added.
        A bundle whose ``sha256`` was imported already returns that import, adding nothing.
        """
        with self.session() as s:
            done = s.scalars(select(HubImport).where(HubImport.sha256 == sha256)).one_or_none()
            if done is not None:
                return done, False
            created_classes = 0
            for spec in classes:
                res = s.execute(self._insert(HardwareClass).values(
                    name=spec["name"], target=spec["target"], node_pool=HUB_POOL,
                    capabilities=spec["capabilities"], layout=spec.get("layout"),
                ).on_conflict_do_nothing(index_elements=["name"]))
                created_classes += int(bool(res.rowcount))
            names = [spec["name"] for spec in classes]
            class_ids = dict(s.execute(select(HardwareClass.name, HardwareClass.id).where(HardwareClass.name.in_(names))).all())
            # executemany with RETURNING counts only the rows inserted (as commit_measurements does)
            new_workloads = 0
            wl_stmt = self._insert(Workload).on_conflict_do_nothing(index_elements=["structural_hash"])
            for chunk in _chunks(workloads):
                new_workloads += len(s.execute(wl_stmt.returning(Workload.id), list(chunk)).all())
            hashes = sorted({r["workload_hash"] for r in records})
            workload_ids: dict[str, int] = {}
            for chunk in _chunks(hashes):
                workload_ids.update(s.execute(select(Workload.structural_hash, Workload.id)
                                              .where(Workload.structural_hash.in_(list(chunk)))).all())
            new_records = 0
            m_stmt = self._insert(Measurement).on_conflict_do_nothing(
                index_elements=["workload_id", "hardware_class_id", "trace_sha256", "attempt"])
            for chunk in _chunks(records):
                values = [{"workload_id": workload_ids[r["workload_hash"]], "hardware_class_id": class_ids[r["class_name"]],
                           "trace_json": r["trace_json"], "trace_sha256": r["trace_sha256"], "repeat": 0,
                           "args_info": r["args_info"], "run_secs": r["run_secs"], "mean_run_s": r["mean_run_s"],
                           "measure_mode": "hub", "tvm_version": r["tvm_version"], "target": r["target"],
                           "created_at": r["measured_at"] or utcnow()} for r in chunk]
                new_records += len(s.execute(m_stmt.returning(Measurement.id), values).all())
            counts = {**counts, "classes_created": created_classes, "workloads_new": new_workloads,
                      "records_new": new_records, "records_present": len(records) - new_records}
            row = HubImport(sha256=sha256, source=source, format_version=format_version, tvm_version=tvm_version,
                            bundle_created_at=bundle_created_at, summary=summary, counts=counts)
            s.add(row)
            s.flush()
            return row, True

    def hub_origins(self, workload_ids: Iterable[int]) -> dict[tuple[int, str], tuple[str, dict[str, Any]]]:
        """Which schedules of these workloads a hub bundle holds: (workload id, trace sha256) ->
        (the hub class's name, its capabilities), the fastest hub record's class when several do."""
        ids = sorted(set(workload_ids))
        m = Measurement.__table__
        out: dict[tuple[int, str], tuple[str, dict[str, Any]]] = {}
        with self.session() as s:
            for chunk in _chunks(ids):
                rows = s.execute(select(m.c.workload_id, m.c.trace_sha256, HardwareClass.name, HardwareClass.capabilities)
                                 .join(HardwareClass, HardwareClass.id == m.c.hardware_class_id)
                                 .where(HardwareClass.node_pool == HUB_POOL, m.c.workload_id.in_(list(chunk)),
                                        m.c.mean_run_s.is_not(None))
                                 .order_by(m.c.mean_run_s.desc())).all()
                for row in rows:  # slowest first: the fastest record's class is written last
                    out[(row.workload_id, row.trace_sha256)] = (row.name, dict(row.capabilities or {}))
        return out


    def hub_replays(self, workload_ids: Iterable[int], hardware_class_id: int) -> dict[int, dict[str, Any]]:
        """For each of these workloads that a hub class holds records of: what this class measured
        of them (``measured``, ``failed``: no run time, ``slower``: slower than this class's
        default schedule), the default schedule's run time here (``default_s``) and the hub
        classes they came from (``sources``)."""
        ids = sorted(set(workload_ids))
        m = Measurement.__table__
        out: dict[int, dict[str, Any]] = {}
        with self.session() as s:
            for chunk in _chunks(ids):
                hub_rows = s.execute(select(m.c.workload_id, m.c.trace_sha256, HardwareClass.name)
                                     .join(HardwareClass, HardwareClass.id == m.c.hardware_class_id)
                                     .where(HardwareClass.node_pool == HUB_POOL, m.c.workload_id.in_(list(chunk)),
                                            m.c.trace_sha256 != DEFAULT_TRACE_SHA256)).all()
                for row in hub_rows:  # the default schedule is measured here anyway: not the hub's
                    entry = out.setdefault(row.workload_id, {"hashes": set(), "sources": set()})
                    entry["hashes"].add(row.trace_sha256)
                    entry["sources"].add(row.name)
                if not hub_rows:
                    continue
                local = s.execute(select(m.c.workload_id, m.c.trace_sha256, m.c.mean_run_s)
                                  .where(m.c.hardware_class_id == hardware_class_id,
                                         m.c.workload_id.in_(sorted({r.workload_id for r in hub_rows})))).all()
                for row in local:
                    entry = out[row.workload_id]
                    if row.trace_sha256 == DEFAULT_TRACE_SHA256 and row.mean_run_s is not None:
                        entry["default_s"] = row.mean_run_s
                    if row.trace_sha256 in entry["hashes"]:
                        entry.setdefault("runs", []).append(row.mean_run_s)
        for entry in out.values():
            runs, default_s = entry.pop("runs", []), entry.get("default_s")
            entry.update(measured=len(runs), failed=sum(r is None for r in runs),
                         slower=sum(r is not None and default_s is not None and r > default_s for r in runs),
                         records=len(entry.pop("hashes")), sources=sorted(entry["sources"]))
        return out


def _chunks(items: Sequence[Any]) -> Iterable[Sequence[Any]]:
    for start in range(0, len(items), IMPORT_CHUNK):
        yield items[start:start + IMPORT_CHUNK]


__all__ = ["IMPORT_CHUNK", "HubMixin"]
