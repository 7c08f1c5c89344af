"""Learning artifacts: cost-model predictions, dataset versions, cost-model versions, and the
registry of what in the artifact store the database points to (``artifacts``)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import delete, func, insert, select, update

from tunefleet.db._base import sha256_text
from tunefleet.db.catalog import CatalogMixin, lock_hardware_classes
from tunefleet.db.tables import (
    Artifact,
    CostModel,
    Dataset,
    DatasetRow,
    HardwareClass,
    Measurement,
    Prediction,
)
from tunefleet.errors import ConflictError, NotFoundError

_MARK_CHUNK = 5000  # dataset marks inserted per statement


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
        """Register the next dataset version (an export reserves its number with it)."""
        with self.session() as s:
            version = int(s.scalar(select(func.coalesce(func.max(Dataset.version), 0))) or 0) + 1
            ds = Dataset(version=version, uri=uri, manifest=json.loads(json.dumps(manifest)), row_count=row_count)
            s.add(ds)
            s.flush()
            return ds

    def datasets(self) -> list[Dataset]:
        with self.session() as s:
            return list(s.scalars(select(Dataset).order_by(Dataset.version)))

    def update_dataset(
        self,
        dataset_id: int,
        *,
        uri: str,
        manifest: dict[str, Any],
        row_count: int,
        marks: Mapping[int, str] | None = None,
        hardware_class_ids: Iterable[int] = (),
        artifact_key: str | None = None,
    ) -> None:
        """Register a reserved dataset version once its files are written, and mark what it took.

        One transaction: the version's URI and manifest, its files (``artifact_key``, in
        ``artifacts``) and the marks of its measurements — all of them or none.

        Parameters
        ----------
        marks
            ``{measurement id: outcome}`` of every measurement the export read (``row``,
            ``skipped`` or ``filtered``), recorded in the same transaction as the version.
        hardware_class_ids
            The classes of those measurements: locked first, so exports of a class are
            serialised here.
        artifact_key
            The store folder (ending in ``/``) or key of the version's files: registered, so
            ``tunefleet gc`` keeps them.

        Raises
        ------
        ConflictError
            When another version marked one of these measurements first; nothing is changed.
        NotFoundError
            When the version is not a reservation (any more): removed, or registered already.
        """
        with self.session() as s:
            lock_hardware_classes(s, hardware_class_ids)
            done = s.execute(update(Dataset).where(Dataset.id == dataset_id, Dataset.uri == "")
                             .values(uri=uri, manifest=manifest, row_count=row_count))
            if done.rowcount != 1:
                raise NotFoundError(f"dataset {dataset_id} is not a reserved version (removed or registered already)")
            if artifact_key is not None:
                self._add_artifact(s, "dataset", artifact_key, dataset_id=dataset_id)
            rows = [{"measurement_id": int(m), "dataset_id": dataset_id, "outcome": outcome}
                    for m, outcome in sorted((marks or {}).items())]
            for start in range(0, len(rows), _MARK_CHUNK):
                s.execute(insert(DatasetRow), rows[start:start + _MARK_CHUNK])

    def delete_dataset(self, dataset_id: int) -> None:
        """Remove a dataset version's row, its marks and its registered files (which become garbage)."""
        with self.session() as s:
            s.execute(delete(DatasetRow).where(DatasetRow.dataset_id == dataset_id))
            s.execute(delete(Artifact).where(Artifact.dataset_id == dataset_id))
            s.execute(delete(Dataset).where(Dataset.id == dataset_id))

    def abandon_dataset(self, dataset_id: int) -> Dataset | None:
        """Give back a reserved version whose export failed — unless it was registered after all.

        What a failed export calls instead of guessing: its registering commit may have gone
        through with only the acknowledgement lost. The reservation is removed only while it is
        one (no URI), under the row's lock, so a commit still in flight wins.

        Returns
        -------
        Dataset or None
            None when the reservation is removed (or was gone): nothing was registered, the
            export's files are garbage. The registered version when its commit went through.
        """
        with self.session() as s:
            gone = s.execute(delete(Dataset).where(Dataset.id == dataset_id, Dataset.uri == ""))
            if gone.rowcount:
                return None
            return s.get(Dataset, dataset_id)

    def _unexported(self, hardware_class_id: int | None) -> Any:
        stmt = select(Measurement).where(
            ~select(DatasetRow.measurement_id).where(DatasetRow.measurement_id == Measurement.id).exists()
        )
        if hardware_class_id is not None:
            stmt = stmt.where(Measurement.hardware_class_id == hardware_class_id)
        return stmt

    def unexported_measurements(
        self,
        hardware_class_id: int | None = None,
        *,
        after_id: int = 0,
        up_to_id: int | None = None,
        limit: int | None = None,
    ) -> list[Measurement]:
        """Committed measurements in no dataset version (not even as skipped), in id order.

        What the next export takes; after an export, what it missed. Optionally only ids in
        ``(after_id, up_to_id]`` and at most ``limit`` of them (for paging).
        """
        stmt = self._unexported(hardware_class_id).where(Measurement.id > after_id).order_by(Measurement.id)
        if up_to_id is not None:
            stmt = stmt.where(Measurement.id <= up_to_id)
        if limit is not None:
            stmt = stmt.limit(limit)
        with self.session() as s:
            return list(s.scalars(stmt))

    def unexported_window(self, hardware_class_id: int) -> tuple[int, int] | None:
        """The newest measurement id of a class and how many measurements up to it are unexported.

        Returns
        -------
        (newest id, count), or None when every measurement of the class is in a dataset version.
        """
        counted = self._unexported(hardware_class_id).with_only_columns(func.count())
        with self.session() as s:
            count = s.scalar(counted)
            if not count:
                return None
            newest = s.scalar(select(func.max(Measurement.id))
                              .where(Measurement.hardware_class_id == hardware_class_id))
            return int(newest), int(count)

    def dataset_marks(self, dataset_id: int) -> dict[int, str]:
        """``{measurement id: outcome}`` of the measurements one dataset version took."""
        with self.session() as s:
            stmt = select(DatasetRow.measurement_id, DatasetRow.outcome).where(DatasetRow.dataset_id == dataset_id)
            return {int(m): outcome for m, outcome in s.execute(stmt.order_by(DatasetRow.measurement_id))}

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
        """Register the next cost-model version of a hardware class (not promoted).

        The version is taken under the class's lock, so concurrent registrations of one class
        get distinct versions. An empty ``artifact_uri`` *reserves* the version for a model
        whose artifact is still to be written (see :meth:`finish_cost_model`).
        """
        with self.session() as s:
            lock_hardware_classes(s, [hardware_class_id])
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

    def finish_cost_model(
        self,
        cost_model_id: int,
        *,
        artifact_uri: str,
        metrics: dict[str, Any],
        promote: bool,
        expected_current: int | None,
        artifact_key: str | None = None,
    ) -> bool:
        """Register a reserved cost model: its artifact, its metrics and, maybe, its promotion.

        One transaction: the model's URI and metrics, its file (``artifact_key``, in
        ``artifacts``) and its promotion.

        Parameters
        ----------
        promote
            Make it the class's current model, if the current one is still ``expected_current``
            (the one it was compared against; None: there was none).
        artifact_key
            The store key of the model's file: registered, so ``tunefleet gc`` keeps it.

        Returns
        -------
        bool
            False when ``promote`` was asked but another model became current meanwhile: nothing
            is written, the caller decides again against the new current model.

        Raises
        ------
        NotFoundError
            When the model is not a reservation (any more): removed, or registered already.
        """
        with self.session() as s:
            cm = s.get(CostModel, cost_model_id)
            if cm is None:
                raise NotFoundError(f"no cost model {cost_model_id}")
            lock_hardware_classes(s, [cm.hardware_class_id])
            s.refresh(cm)  # as it is under the lock
            if cm.artifact_uri:
                raise NotFoundError(f"cost model v{cm.version} is not a reservation: it is registered already")
            if promote:
                current = s.scalar(select(CostModel.id).where(CostModel.hardware_class_id == cm.hardware_class_id,
                                                              CostModel.promoted.is_(True)))
                if current != expected_current:
                    return False
                s.execute(update(CostModel).where(CostModel.hardware_class_id == cm.hardware_class_id)
                          .values(promoted=False))
            s.execute(update(CostModel).where(CostModel.id == cost_model_id)
                      .values(artifact_uri=artifact_uri, metrics=metrics, promoted=promote))
            if artifact_key is not None:
                self._add_artifact(s, "cost_model", artifact_key, cost_model_id=cost_model_id)
            return True

    def delete_cost_model(self, cost_model_id: int) -> None:
        """Remove a cost model and its registered file (which becomes garbage); a missing id: nothing."""
        with self.session() as s:
            s.execute(delete(Artifact).where(Artifact.cost_model_id == cost_model_id))
            s.execute(delete(CostModel).where(CostModel.id == cost_model_id))

    def abandon_cost_model(self, cost_model_id: int) -> CostModel | None:
        """Give back a reserved cost model whose retrain failed — unless it was registered after all.

        As :meth:`abandon_dataset`: removed only while it is a reservation (no artifact URI), so a
        registration whose acknowledgement was lost (maybe a promotion) is never undone.

        Returns
        -------
        CostModel or None
            None when the reservation is removed (or was gone): the retrain's file is garbage.
            The registered model when its commit went through.
        """
        with self.session() as s:
            gone = s.execute(delete(CostModel).where(CostModel.id == cost_model_id, CostModel.artifact_uri == ""))
            if gone.rowcount:
                return None
            return s.get(CostModel, cost_model_id)

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
            if not cm.artifact_uri:
                raise NotFoundError(f"cost model v{cm.version} has no artifact (its retrain never finished); "
                                    "promote another version or retrain")
            lock_hardware_classes(s, [cm.hardware_class_id])
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

    # -- artifacts --------------------------------------------------------------------------
    def _add_artifact(self, s: Any, kind: str, key: str, **owner: int) -> Artifact:
        """Register ``key`` (a store key, or a folder ending in ``/``) in the session ``s``, for its owner."""
        found = s.scalar(select(Artifact).where(Artifact.key == key))
        if found is not None:
            raise ConflictError(f"artifact {key!r} is registered already (as a {found.kind}); write it under a new key")
        artifact = Artifact(kind=kind, key=key, **owner)
        s.add(artifact)
        s.flush()
        return artifact

    def artifacts(self, kind: str | None = None) -> list[Artifact]:
        """Every registered artifact (of one kind), by key: what ``tunefleet gc`` keeps.

        Register a new kind's artifacts with the owner's row, in one transaction, as
        :meth:`update_dataset` and :meth:`finish_cost_model` do (see
        :class:`~tunefleet.db.tables.Artifact`).
        """
        stmt = select(Artifact).order_by(Artifact.key)
        if kind is not None:
            stmt = stmt.where(Artifact.kind == kind)
        with self.session() as s:
            return list(s.scalars(stmt))
