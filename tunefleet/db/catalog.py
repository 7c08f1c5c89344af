"""Catalog: hardware classes, models, workloads and which models call which workloads."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from tunefleet.db._base import DatabaseBase, check_fits, is_hex
from tunefleet.db.tables import HardwareClass, Measurement, Model, ModelWorkload, Workload
from tunefleet.errors import NotFoundError, ParameterError


def lock_hardware_classes(s: Session, hardware_class_ids: Iterable[int]) -> None:
    """Serialise writes per hardware class until the transaction ends (planning, dataset exports,
    cost-model versions).

    A no-op UPDATE of the class row, first in the transaction: PostgreSQL holds its row lock
    (FOR NO KEY UPDATE, which tuning's foreign-key checks do not wait for) until commit, and on
    SQLite the first write takes the database's write lock, before anything is read. Ids in
    ascending order, so two transactions locking several classes never deadlock.
    """
    for hw_id in sorted(set(hardware_class_ids)):
        s.execute(update(HardwareClass).where(HardwareClass.id == hw_id)
                  .values(node_pool=HardwareClass.node_pool, updated_at=HardwareClass.updated_at))


def check_model_name(name: str) -> str:
    """``name``, or one :class:`~tunefleet.errors.ParameterError` line if the ``models`` table
    cannot hold it (what ``ingest --name`` and :meth:`CatalogMixin.add_model` refuse up front)."""
    return check_fits(Model.name, name, "model name")  # type: ignore[return-value]


def model_links(hardware_class_id: int | None = None) -> Any:
    """(model_id, workload_id, weight) links as a subquery: of one hardware class, or of any
    (a workload a model calls under several classes' recipes counts once, its largest weight)."""
    mw = ModelWorkload
    if hardware_class_id is not None:
        return (select(mw.model_id, mw.workload_id, mw.weight)
                .where(mw.hardware_class_id == hardware_class_id).subquery("links"))
    return (select(mw.model_id, mw.workload_id, func.max(mw.weight).label("weight"))
            .group_by(mw.model_id, mw.workload_id).subquery("links"))


@dataclass(frozen=True)
class LinkChange:
    """What replacing a model's workloads on one class changed."""

    linked: int
    unlinked: list[int]
    """Workloads the model no longer calls on the class (extracted under another recipe before)."""
    unlinked_measured: int
    """Measurements on the class of the unlinked workloads: tuning that no longer applies."""
    previous_recipes: list[str]


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
        layout: str | None = None,
        winograd: bool = False,
    ) -> HardwareClass:
        """Create or update a hardware class by name (a name or node pool longer than its column
        is one :class:`~tunefleet.errors.ParameterError` line, on every backend)."""
        check_fits(HardwareClass.name, name, "hardware class name")
        check_fits(HardwareClass.node_pool, node_pool, "hardware class node pool")
        check_fits(HardwareClass.layout, layout, "hardware class layout")
        values = {
            "layout": layout,
            "winograd": winograd,
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

    def claim_hardware_cpu(self, name: str, cpu: dict[str, Any], *, adopt: dict[str, Any] | None = None
                           ) -> dict[str, Any]:
        """Record ``cpu`` as the CPU of hardware class ``name`` unless one is recorded already
        (a compare-and-set under the class's row lock), with ``adopt``'s ``target`` and
        ``capabilities`` if given; the CPU the class records now."""
        with self.session() as s:
            hw_id = s.scalars(select(HardwareClass.id).where(HardwareClass.name == name)).one_or_none()
            if hw_id is None:
                raise NotFoundError(f"unknown hardware class {name!r}")
            lock_hardware_classes(s, [hw_id])
            hw = s.get(HardwareClass, hw_id, populate_existing=True)
            caps = dict(hw.capabilities or {})
            if caps.get("cpu") is None:
                if adopt is not None:
                    hw.target = adopt["target"]
                    caps.update(adopt["capabilities"])
                hw.capabilities = {**caps, "cpu": cpu}
                return cpu
            return dict(caps["cpu"])

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
        """Register a model by content hash; return (model, created). Same bytes → same row.

        A name longer than the ``models`` table holds is one :class:`~tunefleet.errors.ParameterError`
        line on every backend (:func:`check_model_name`)."""
        check_model_name(name)
        with self.session() as s:
            stmt = self._insert(Model).values(
                name=name, source=source, format=format, sha256=sha256, artifact_uri=artifact_uri,
                input_info=input_info or [], meta=meta or {},
            )
            res = s.execute(stmt.on_conflict_do_nothing(index_elements=["sha256"]))
            model = s.scalars(select(Model).where(Model.sha256 == sha256)).one()
            return model, bool(res.rowcount)

    def model(self, ref: int | str) -> Model:
        """A model by id, name (newest of that name) or sha256 prefix (>= 8 hex digits, in either
        case; anything else is not a prefix: ``%`` and ``_`` match themselves only)."""
        with self.session() as s:
            if isinstance(ref, int) or (isinstance(ref, str) and ref.isdigit()):
                found = s.get(Model, int(ref))
            else:
                found = s.scalars(select(Model).where(Model.name == ref).order_by(Model.id.desc()).limit(1)).first()
                if found is None and len(ref) >= 8 and is_hex(ref):
                    found = s.scalars(select(Model).where(Model.sha256.startswith(ref.lower(), autoescape=True))).first()
            if found is None:
                raise NotFoundError(f"no model {ref!r}; see `tunefleet models list`")
            return found

    def models(self) -> list[Model]:
        with self.session() as s:
            return list(s.scalars(select(Model).order_by(Model.id)))

    def note_step_seconds(self, model_id: int, hardware_class_id: int, step: str, seconds: float) -> None:
        """Remember how long a step of the model's pipeline on a class took here (``"extract"``,
        ``"build"``): the last time of each, under the model's ``meta["seconds"]``. The planner
        sizes the time it keeps for the build on them (:meth:`step_seconds`)."""
        with self.session() as s:
            model = s.get(Model, model_id)
            if model is None:
                raise NotFoundError(f"no model {model_id!r}; see `tunefleet models list`")
            seconds_by_class = dict((model.meta or {}).get("seconds") or {})
            seconds_by_class[str(hardware_class_id)] = {**seconds_by_class.get(str(hardware_class_id), {}),
                                                        step: round(float(seconds), 3)}
            model.meta = {**(model.meta or {}), "seconds": seconds_by_class}  # a new dict: the JSON column sees it

    def step_seconds(self, model_ids: Iterable[int], hardware_class_id: int) -> dict[str, float]:
        """Step -> the seconds it last took for all of ``model_ids`` on a class together (the sum),
        for the steps every one of them has a time of (:meth:`note_step_seconds`)."""
        ids = list(model_ids)
        with self.session() as s:
            metas = list(s.scalars(select(Model.meta).where(Model.id.in_(ids)))) if ids else []
        per_model = [((m or {}).get("seconds") or {}).get(str(hardware_class_id), {}) for m in metas]
        if not per_model or len(per_model) < len(set(ids)):
            return {}
        steps = set.intersection(*(set(p) for p in per_model))
        return {step: sum(float(p[step]) for p in per_model) for step in sorted(steps)}

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

    def link_model_workload(self, model_id: int, workload_id: int, weight: int, *,
                            hardware_class_id: int | None = None, recipe: str = "native") -> None:
        """Record that a model calls a workload ``weight`` times on a class (every class when
        None), extracted under ``recipe``; last write wins."""
        with self.session() as s:
            classes = ([hardware_class_id] if hardware_class_id is not None
                       else list(s.scalars(select(HardwareClass.id))))
            for hw_id in classes:
                stmt = self._insert(ModelWorkload).values(model_id=model_id, hardware_class_id=hw_id,
                                                          workload_id=workload_id, weight=weight, recipe=recipe)
                s.execute(stmt.on_conflict_do_update(index_elements=["model_id", "hardware_class_id", "workload_id"],
                                                     set_={"weight": weight, "recipe": recipe}))

    def set_model_workloads(self, model_id: int, hardware_class_id: int, recipe: str,
                            weights: dict[int, int]) -> LinkChange:
        """Make ``weights`` (workload id -> calls) the model's whole workload set on a class, extracted
        under ``recipe``: links it had that are not in it (another recipe's workloads) are removed,
        in the same transaction; their measurements stay (another model or recipe may use them)."""
        mw = ModelWorkload
        with self.session() as s:
            old = {wl: r for wl, r in s.execute(select(mw.workload_id, mw.recipe).where(
                mw.model_id == model_id, mw.hardware_class_id == hardware_class_id))}
            for wl, weight in weights.items():
                stmt = self._insert(mw).values(model_id=model_id, hardware_class_id=hardware_class_id,
                                               workload_id=wl, weight=weight, recipe=recipe)
                s.execute(stmt.on_conflict_do_update(index_elements=["model_id", "hardware_class_id", "workload_id"],
                                                     set_={"weight": weight, "recipe": recipe}))
            stale = sorted(set(old) - set(weights))
            measured = 0
            if stale:
                s.execute(delete(mw).where(mw.model_id == model_id, mw.hardware_class_id == hardware_class_id,
                                           mw.workload_id.in_(stale)))
                measured = int(s.scalar(select(func.count(Measurement.id)).where(
                    Measurement.hardware_class_id == hardware_class_id, Measurement.workload_id.in_(stale))) or 0)
        return LinkChange(len(weights), stale, measured, sorted({r for r in old.values() if r != recipe}))

    def model_recipes(self, model_id: int, hardware_class_id: int) -> list[str]:
        """The recipes the model's workloads on a class were extracted under (empty: not extracted)."""
        with self.session() as s:
            return sorted(s.scalars(select(ModelWorkload.recipe).distinct().where(
                ModelWorkload.model_id == model_id, ModelWorkload.hardware_class_id == hardware_class_id)))

    def workload(self, ref: int | str) -> Workload:
        """A workload by id or structural hash (a unique prefix of >= 6 hex digits works, in either
        case); a reference that is neither is one :class:`~tunefleet.errors.ParameterError` line."""
        with self.session() as s:
            if isinstance(ref, int):
                found = s.get(Workload, ref)
            else:
                found = s.scalars(select(Workload).where(Workload.structural_hash == ref)).one_or_none()
                if found is None and not is_hex(ref):
                    raise ParameterError(f"invalid workload {ref!r}: give its id or its structural hash (hex digits, "
                                         "or a prefix of at least 6); see `tunefleet workloads list`")
                if found is None and ref != ref.lower():
                    found = s.scalars(select(Workload).where(Workload.structural_hash == ref.lower())).one_or_none()
                if found is None and len(ref) >= 6:
                    matches = list(s.scalars(select(Workload).where(
                        Workload.structural_hash.startswith(ref.lower(), autoescape=True)).limit(2)))
                    if len(matches) > 1:
                        raise NotFoundError(f"workload prefix {ref!r} is ambiguous; give more digits")
                    found = matches[0] if matches else None
            if found is None:
                raise NotFoundError(f"no workload {ref!r}; see `tunefleet workloads list`")
            return found

    def workloads(self, model_id: int | None = None, hardware_class_id: int | None = None) -> list[tuple[Workload, int]]:
        """Workloads with their weight (total call count across models, or in one model), as
        extracted for one hardware class or for any."""
        links = model_links(hardware_class_id)
        with self.session() as s:
            weight = func.coalesce(func.sum(links.c.weight), 0)
            stmt = (
                select(Workload, weight)
                .outerjoin(links, links.c.workload_id == Workload.id)
                .group_by(Workload.id)
                .order_by(Workload.id)
            )
            if model_id is not None:
                stmt = stmt.where(links.c.model_id == model_id)
            elif hardware_class_id is not None:
                stmt = stmt.where(links.c.model_id.is_not(None))
            return [(wl, int(w)) for wl, w in s.execute(stmt)]

    def workload_weight(self, workload_id: int, hardware_class_id: int | None = None) -> int:
        """Total calls of a workload over every model that contains it (1 if none links it)."""
        links = model_links(hardware_class_id)
        with self.session() as s:
            total = s.scalar(select(func.sum(links.c.weight)).where(links.c.workload_id == workload_id))
        return int(total or 1)
