"""The cost models shipped with the package: version 0 of every hardware class without a model of its own.

Each is an ordinary tunefleet cost model (XGBoost's JSON,
:class:`~tunefleet.learning.costmodel.TrainedModel`) that ``bench/pretrain.py`` trains on the
tuning campaign's measurements; its metadata says on which CPUs, how many rows and workloads, and
what it scored on workloads held out by whole shape families (docs/learning.md has the table).
There is one per kind of vector code, because which schedule wins depends on it: a model trained
on one CPU's AVX-512 measurements ranks an AVX2-only CPU's candidates no better than chance, and
the reverse (docs/learning.md). ``avx2.json`` serves x86 classes whose target has AVX2 and no
AVX-512 (``x86-avx2``, the native class of an AVX2-only CPU); ``default.json`` every other class.

A class's own promoted model always wins over it. Where a class has none, the warm start, the
filter and zero-shot use this one (``TuneKnobs.pretrained_cost_model``,
``TUNEFLEET_PRETRAINED_COST_MODEL=false`` turns it off), including on classes it was not trained
on: the warm start's agreement check drops it in a shard whose measurements it misranks.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunefleet.errors import TunefleetError

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.learning.costmodel import TrainedModel
    from tunefleet.store import ArtifactStore

SHIPPED_MODEL = Path(__file__).resolve().parent.parent / "data" / "costmodel" / "default.json"
"""The shipped model of every class that :data:`SHIPPED_AVX2_MODEL` does not serve."""
SHIPPED_AVX2_MODEL = SHIPPED_MODEL.with_name("avx2.json")
"""The shipped model of x86 classes whose code has AVX2 and no AVX-512 (:func:`vector_code`)."""
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


def vector_code(target: Mapping[str, Any]) -> str:
    """``"avx2"`` for an x86 CPU target whose code has AVX2 and no AVX-512 (LLVM's features of its
    ``mcpu``), else ``"default"``: which shipped model serves the class (imports tvm)."""
    return _vector_code(json.dumps(dict(target), sort_keys=True))


@functools.cache
def _vector_code(target_json: str) -> str:
    from tvm.target import codegen

    from tunefleet.tvm.targets import make_target

    target = make_target(target_json)
    if target.kind.name != "llvm":
        return "default"
    has = functools.partial(codegen.target_has_features, target=target)
    return "avx2" if has("avx2") and not has("avx512f") else "default"


def model_file(code: str) -> Path:
    """The file of the shipped model for a kind of vector code (:func:`vector_code`)."""
    return SHIPPED_AVX2_MODEL if code == "avx2" else SHIPPED_MODEL


def shipped_path(target: Mapping[str, Any] | None = None) -> Path:
    """The file of the shipped model that serves a class of this target (no target: the default one)."""
    return model_file(vector_code(target)) if target is not None else SHIPPED_MODEL


def shipped_model(path: Path | None = None, *, target: Mapping[str, Any] | None = None) -> TrainedModel:
    """The shipped cost model (each file read once per process), as version 0 of no class in particular:
    the one at ``path``, else the one that serves a class of ``target`` (:func:`shipped_path`).

    Raises
    ------
    CostModelError
        When its file is missing or is not a tunefleet cost model (a broken installation).
    """
    return _load(path or shipped_path(target))


def current_or_shipped(db: Database, store: ArtifactStore, hardware: str, *, pretrained: bool = True
                       ) -> TrainedModel | None:
    """The class's current promoted cost model, else (``pretrained``) the shipped one that serves its
    target, else None.

    Raises as :func:`~tunefleet.learning.costmodel.load_cost_model` and :func:`shipped_model` do."""
    from tunefleet.learning.costmodel import load_cost_model

    model = load_cost_model(db, store, hardware)
    if model is None and pretrained:
        return shipped_model(target=db.hardware_class(hardware).target)
    return model


def shipped_summary(path: Path | None = None) -> dict[str, object]:
    """What the shipped model says of itself: its training data and held-out metrics."""
    meta = dict(shipped_model(path).meta)
    return {k: meta[k] for k in ("trained_on", "heldout", "n_train_rows", "n_train_workloads", "tvm_version")
            if k in meta}


__all__ = ["SHIPPED_AVX2_MODEL", "SHIPPED_MODEL", "SHIPPED_VERSION", "current_or_shipped", "model_file",
           "shipped_model", "shipped_path", "shipped_summary", "vector_code"]
