"""The cost model shipped with the package: version 0 of every hardware class without a model of its own.

``tunefleet/data/costmodel/default.json`` is an ordinary tunefleet cost model (XGBoost's JSON,
:class:`~tunefleet.learning.costmodel.TrainedModel`) that ``bench/pretrain.py`` trains on the
tuning campaign's measurements; its metadata says on which CPUs, how many rows and workloads, and
what it scored on workloads held out by whole shape families (docs/learning.md has the table).

A class's own promoted model always wins over it. Where a class has none, the warm start, the
filter and zero-shot use this one (``TuneKnobs.pretrained_cost_model``,
``TUNEFLEET_PRETRAINED_COST_MODEL=false`` turns it off), including on classes it was not trained
on: the warm start's agreement check drops it in a shard whose measurements it misranks.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from tunefleet.errors import TunefleetError

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.learning.costmodel import TrainedModel
    from tunefleet.store import ArtifactStore

SHIPPED_MODEL = Path(__file__).resolve().parent.parent / "data" / "costmodel" / "default.json"
SHIPPED_VERSION = 0
"""The version a class reports while it uses the shipped model (its own start at 1)."""


@functools.cache
def _load(path: Path) -> TrainedModel:
    from tunefleet.learning.costmodel import CostModelError, TrainedModel

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CostModelError(f"the cost model shipped with tunefleet cannot be read ({exc.strerror}: {path}); "
                             "reinstall tunefleet, or set TUNEFLEET_PRETRAINED_COST_MODEL=false") from None
    try:
        model = TrainedModel.from_bytes(data)
    except TunefleetError as exc:
        raise CostModelError(f"the cost model shipped with tunefleet is unusable ({exc}): {path}; reinstall "
                             "tunefleet, or set TUNEFLEET_PRETRAINED_COST_MODEL=false") from None
    model.version = SHIPPED_VERSION
    return model


def shipped_model(path: Path | None = None) -> TrainedModel:
    """The shipped cost model (read once per process), as version 0 of no class in particular.

    Raises
    ------
    CostModelError
        When its file is missing or is not a tunefleet cost model (a broken installation).
    """
    return _load(path or SHIPPED_MODEL)


def current_or_shipped(db: Database, store: ArtifactStore, hardware: str, *, pretrained: bool = True
                       ) -> TrainedModel | None:
    """The class's current promoted cost model, else (``pretrained``) the shipped one, else None.

    Raises as :func:`~tunefleet.learning.costmodel.load_cost_model` and :func:`shipped_model` do."""
    from tunefleet.learning.costmodel import load_cost_model

    model = load_cost_model(db, store, hardware)
    if model is None and pretrained:
        return shipped_model()
    return model


def shipped_summary(path: Path | None = None) -> dict[str, object]:
    """What the shipped model says of itself: its training data and held-out metrics."""
    meta = dict(shipped_model(path).meta)
    return {k: meta[k] for k in ("trained_on", "heldout", "n_train_rows", "n_train_workloads", "tvm_version")
            if k in meta}


__all__ = ["SHIPPED_MODEL", "SHIPPED_VERSION", "current_or_shipped", "shipped_model", "shipped_summary"]
