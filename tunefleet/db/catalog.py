"""Catalog: hardware classes, models, workloads and which models call which workloads."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from tunefleet.db._base import DatabaseBase
from tunefleet.db.models import HardwareClass, Model, ModelWorkload, Workload
from tunefleet.errors import NotFoundError


class CatalogMixin(DatabaseBase):
    """What is tuned, and for which hardware."""

    # -- hardware classes -----------------------------------------------------------------
    def upsert_hardware_class(
        self,
        name: str,
        target: dict[str, Any],
        node_pool: str,
        *,
        watts_per_core: float = 0.0,
        idle_watts: float = 0.0,
        watts_per_gpu: float = 0.0,
        price_per_hour: float = 0.0,
        capabilities: dict[str, Any] | None = None,
    ) -> HardwareClass:
        """Create or update a hardware class by name."""
        values = {
            "target": target,
            "node_pool": node_pool,
            "watts_per_core": watts_per_core,
            "idle_watts": idle_watts,
            "watts_per_gpu": watts_per_gpu,
            "price_per_hour": price_per_hour,
            "capabilities": capabilities or {},
        }
        with self.session() as s:
            stmt = self._insert(HardwareClass).values(name=name, **values)
            s.execute(stmt.on_conflict_do_nothing(index_elements=["name"]))
            hw = s.scalars(select(HardwareClass).where(HardwareClass.name == name)).one()
            changed = {k: v for k, v in values.items() if getattr(hw, k) != v}
            for key, value in changed.items():
                setattr(hw, key, value)
            return hw

    def hardware_class(self, ref: int | str) -> HardwareClass:
        """A hardware class by name (or by id)."""
        with self.session() as s:
            if isinstance(ref, int):
                hw = s.get(HardwareClass, ref)
            else:
                hw = s.scalars(select(HardwareClass).where(HardwareClass.name == ref)).one_or_none()
            if hw is None:
                known = ", ".join(s.scalars(select(HardwareClass.name).order_by(HardwareClass.name))) or "none"
                raise NotFoundError(f"unknown hardware class {ref!r} (known: {known})")
            return hw

    def hardware_classes(self) -> list[HardwareClass]:
        with self.session() as s:
            return list(s.scalars(select(HardwareClass).order_by(HardwareClass.name)))

    def _hardware_id(self, name: str) -> int:
        """Hardware class id by name, cached (classes are upserted by name, ids never change)."""
        hw_id = self._hw_ids.get(name)
        if hw_id is None:
            hw_id = self._hw_ids[name] = self.hardware_class(name).id
        return hw_id

    # -- models ---------------------------------------------------------------------------
    def add_model(
        self,
        *,
        name: str,
        source: str,
        format: str,
        sha256: str,
        artifact_uri: str,
        input_info: list[Any] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> tuple[Model, bool]:
        """Register a model by content hash; return (model, created). Same bytes → same row."""
        with self.session() as s:
            stmt = self._insert(Model).values(
                name=name, source=source, format=format, sha256=sha256, artifact_uri=artifact_uri,
                input_info=input_info or [], meta=meta or {},
            )
            res = s.execute(stmt.on_conflict_do_nothing(index_elements=["sha256"]))
            model = s.scalars(select(Model).where(Model.sha256 == sha256)).one()
            return model, bool(res.rowcount)

    def model(self, ref: int | str) -> Model:
        """A model by id, name (newest of that name) or sha256 prefix (>= 8 chars)."""
        with self.session() as s:
            if isinstance(ref, int) or (isinstance(ref, str) and ref.isdigit()):
                found = s.get(Model, int(ref))
            else:
                found = s.scalars(select(Model).where(Model.name == ref).order_by(Model.id.desc()).limit(1)).first()
                if found is None and len(ref) >= 8:
                    found = s.scalars(select(Model).where(Model.sha256.startswith(ref))).first()
            if found is None:
                raise NotFoundError(f"no model {ref!r}; see `tunefleet models list`")
            return found

    def models(self) -> list[Model]:
        with self.session() as s:
            return list(s.scalars(select(Model).order_by(Model.id)))

    # -- workloads ------------------------------------------------------------------------
    def add_workload(
        self, *, structural_hash: str, name: str, op_kind: str, flops: float, tir_json: str
    ) -> tuple[Workload, bool]:
        """Store a workload once by structural hash; return (workload, created)."""
        with self.session() as s:
            stmt = self._insert(Workload).values(
                structural_hash=structural_hash, name=name, op_kind=op_kind, flops=flops, tir_json=tir_json
            )
            res = s.execute(stmt.on_conflict_do_nothing(index_elements=["structural_hash"]))
            wl = s.scalars(select(Workload).where(Workload.structural_hash == structural_hash)).one()
            return wl, bool(res.rowcount)

    def link_model_workload(self, model_id: int, workload_id: int, weight: int) -> None:
        """Record that a model calls a workload ``weight`` times (last write wins)."""
        with self.session() as s:
            stmt = self._insert(ModelWorkload).values(model_id=model_id, workload_id=workload_id, weight=weight)
            s.execute(
                stmt.on_conflict_do_update(index_elements=["model_id", "workload_id"], set_={"weight": weight})
            )

    def workload(self, ref: int | str) -> Workload:
        """A workload by id or structural hash (a unique prefix of >= 6 hex digits works)."""
        with self.session() as s:
            if isinstance(ref, int):
                found = s.get(Workload, ref)
            else:
                found = s.scalars(select(Workload).where(Workload.structural_hash == ref)).one_or_none()
                if found is None and len(ref) >= 6:
                    matches = list(s.scalars(select(Workload).where(Workload.structural_hash.startswith(ref)).limit(2)))
                    if len(matches) > 1:
                        raise NotFoundError(f"workload prefix {ref!r} is ambiguous; give more digits")
                    found = matches[0] if matches else None
            if found is None:
                raise NotFoundError(f"no workload {ref!r}; see `tunefleet workloads list`")
            return found

    def workloads(self, model_id: int | None = None) -> list[tuple[Workload, int]]:
        """Workloads with their weight (total call count across models, or in one model)."""
        with self.session() as s:
            weight = func.coalesce(func.sum(ModelWorkload.weight), 0)
            stmt = (
                select(Workload, weight)
                .outerjoin(ModelWorkload, ModelWorkload.workload_id == Workload.id)
                .group_by(Workload.id)
                .order_by(Workload.id)
            )
            if model_id is not None:
                stmt = stmt.where(ModelWorkload.model_id == model_id)
            return [(wl, int(w)) for wl, w in s.execute(stmt)]

    def workload_weight(self, workload_id: int) -> int:
        """Total calls of a workload over every model that contains it (1 if none links it)."""
        with self.session() as s:
            total = s.scalar(select(func.sum(ModelWorkload.weight)).where(ModelWorkload.workload_id == workload_id))
        return int(total or 1)
