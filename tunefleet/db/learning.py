"""Learning artifacts: cost-model predictions, dataset versions and cost-model versions."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import delete, func, select, update

from tunefleet.db._base import sha256_text
from tunefleet.db.catalog import CatalogMixin
from tunefleet.db.models import CostModel, Dataset, HardwareClass, Prediction
from tunefleet.errors import NotFoundError


class LearningMixin(CatalogMixin):
    """What the cost models proposed, the datasets they learn from, and their versions."""

    # -- predictions ----------------------------------------------------------------------
    def add_predictions(
        self,
        workload_id: int,
        hardware_class_id: int,
        proposals: Sequence[tuple[str, float, list[Any] | None]],
        *,
        cost_model_id: int | None = None,
    ) -> int:
        """Store cost-model proposals (trace JSON, score, args_info), ranked by score."""
        ranked = sorted(proposals, key=lambda p: -p[1])
        rows = [
            {
                "workload_id": workload_id,
                "hardware_class_id": hardware_class_id,
                "cost_model_id": cost_model_id,
                "trace_json": trace,
                "trace_sha256": sha256_text(trace),
                "args_info": args,
                "score": float(score),
                "rank": rank,
            }
            for rank, (trace, score, args) in enumerate(ranked)
        ]
        if not rows:
            return 0
        with self.session() as s:
            stmt = self._insert(Prediction).on_conflict_do_nothing(
                index_elements=["workload_id", "hardware_class_id", "cost_model_id", "trace_sha256"]
            )
            return len(s.execute(stmt.returning(Prediction.id), rows).all())

    def best_predictions(self, workload_id: int, hardware_class_id: int, n: int = 5) -> list[Prediction]:
        """The ``n`` best-scored predictions of the cost model that predicted this workload last.

        Scores of different models are not comparable, so one model's proposals are returned.
        """
        where = (Prediction.workload_id == workload_id, Prediction.hardware_class_id == hardware_class_id)
        with self.session() as s:
            last = s.execute(select(Prediction.cost_model_id).where(*where).order_by(Prediction.id.desc()).limit(1)).first()
            if last is None:
                return []
            same_model = (Prediction.cost_model_id.is_(None) if last[0] is None
                          else Prediction.cost_model_id == last[0])
            stmt = select(Prediction).where(*where, same_model).order_by(Prediction.score.desc(), Prediction.id).limit(n)
            return list(s.scalars(stmt))

    def has_predictions(self, workload_id: int, hardware_class_id: int, cost_model_id: int | None) -> bool:
        """Whether this cost model already stored predictions for the workload on the class."""
        model = Prediction.cost_model_id.is_(None) if cost_model_id is None else Prediction.cost_model_id == cost_model_id
        with self.session() as s:
            stmt = select(Prediction.id).where(Prediction.workload_id == workload_id,
                                               Prediction.hardware_class_id == hardware_class_id, model).limit(1)
            return s.execute(stmt).first() is not None

    # -- datasets -------------------------------------------------------------------------
    def add_dataset(self, *, uri: str, manifest: dict[str, Any], row_count: int) -> Dataset:
        """Register the next dataset version."""
        with self.session() as s:
            version = int(s.scalar(select(func.coalesce(func.max(Dataset.version), 0))) or 0) + 1
            ds = Dataset(version=version, uri=uri, manifest=json.loads(json.dumps(manifest)), row_count=row_count)
            s.add(ds)
            s.flush()
            return ds

    def datasets(self) -> list[Dataset]:
        with self.session() as s:
            return list(s.scalars(select(Dataset).order_by(Dataset.version)))

    def update_dataset(self, dataset_id: int, *, uri: str, manifest: dict[str, Any], row_count: int) -> None:
        """Fill in a reserved dataset version once its files are written."""
        with self.session() as s:
            s.execute(update(Dataset).where(Dataset.id == dataset_id)
                      .values(uri=uri, manifest=manifest, row_count=row_count))

    def delete_dataset(self, dataset_id: int) -> None:
        """Remove a dataset version's row (an export that failed gives its reservation back)."""
        with self.session() as s:
            s.execute(delete(Dataset).where(Dataset.id == dataset_id))

    # -- cost models ----------------------------------------------------------------------
    def next_cost_model_version(self, hardware_class_id: int) -> int:
        """The version :meth:`add_cost_model` would give the class's next cost model now."""
        with self.session() as s:
            stmt = select(func.coalesce(func.max(CostModel.version), 0)).where(
                CostModel.hardware_class_id == hardware_class_id
            )
            return int(s.scalar(stmt) or 0) + 1

    def add_cost_model(
        self, *, hardware_class_id: int, artifact_uri: str, metrics: dict[str, Any], dataset_id: int | None = None
    ) -> CostModel:
        """Register the next cost-model version of a hardware class (not promoted)."""
        with self.session() as s:
            version = int(
                s.scalar(
                    select(func.coalesce(func.max(CostModel.version), 0)).where(
                        CostModel.hardware_class_id == hardware_class_id
                    )
                )
                or 0
            ) + 1
            cm = CostModel(
                hardware_class_id=hardware_class_id, version=version, dataset_id=dataset_id,
                metrics=metrics, artifact_uri=artifact_uri, promoted=False,
            )
            s.add(cm)
            s.flush()
            return cm

    def set_cost_model_uri(self, cost_model_id: int, uri: str) -> None:
        """Point a registered cost model at its artifact (a missing id changes nothing)."""
        with self.session() as s:
            row = s.get(CostModel, cost_model_id)
            if row is not None:
                row.artifact_uri = uri

    def promote_cost_model(self, cost_model_id: int) -> None:
        """Make a cost model the current one of its hardware class."""
        with self.session() as s:
            cm = s.get(CostModel, cost_model_id)
            if cm is None:
                raise NotFoundError(f"no cost model {cost_model_id}")
            s.execute(
                update(CostModel).where(CostModel.hardware_class_id == cm.hardware_class_id).values(promoted=False)
            )
            cm.promoted = True

    def current_cost_model(self, hardware_class_id: int) -> CostModel | None:
        with self.session() as s:
            stmt = select(CostModel).where(
                CostModel.hardware_class_id == hardware_class_id, CostModel.promoted.is_(True)
            )
            return s.scalars(stmt).one_or_none()

    def cost_model_version(self, hardware_class_id: int, version: int) -> CostModel | None:
        """One registered version of a class's cost model, or None."""
        with self.session() as s:
            stmt = select(CostModel).where(CostModel.hardware_class_id == hardware_class_id,
                                           CostModel.version == version)
            return s.scalars(stmt).one_or_none()

    def cost_models(self) -> list[tuple[CostModel, str]]:
        """Every registered cost model with its hardware class name, by class name then version."""
        with self.session() as s:
            stmt = (select(CostModel, HardwareClass.name).join(HardwareClass)
                    .order_by(HardwareClass.name, CostModel.version))
            return [(cm, name) for cm, name in s.execute(stmt).all()]
