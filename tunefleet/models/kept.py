"""A stored model kept loaded and extracted for the rest of one pipeline run.

``tunefleet run`` ingests a model, extracts its workloads, tunes them for most of its budget, then
builds the model. Each step used to load the model on its own: the extract step rebuilt the zoo
model the ingest step had just built, and the build loaded and extracted it again after tuning,
time a duration budget keeps from tuning (docs/performance.md, "Where a run's time goes").
Within :func:`keeping_models` (the ``pipeline`` flow's body), a stored model is loaded once
(:func:`loaded_model`, or handed over by the pipeline's ingest step: :func:`keep_loaded`), extracted once per
target and recipe (:func:`extracted`), and the weights folded into its convolutions once
(:func:`tunefleet.tvm.extract.reusing_folded_weights`). Outside such a block nothing is kept: a
standalone ``extract`` or ``build`` holds no copy of a model's weights after it ends, and a
pipeline holds one (two with folded weights) until its build is done.

A kept entry is keyed by the model's id and content hash, so a model ingested again with other
bytes is loaded afresh; an extraction also by the target and the recipe's name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.db.tables import Model
    from tunefleet.models.frontends import LoadedModel
    from tunefleet.recipes import Recipe
    from tunefleet.store import ArtifactStore
    from tunefleet.tvm.extract import ExtractedWorkload

T = TypeVar("T")

_KEPT: ContextVar[dict[tuple[Any, ...], Any] | None] = ContextVar("tunefleet_kept_models", default=None)


@contextmanager
def keeping_models() -> Iterator[None]:
    """Within this block, models are loaded and extracted once (see the module docstring)."""
    from tunefleet.tvm.extract import reusing_folded_weights

    if _KEPT.get() is not None:  # nested: the outer block keeps them
        yield
        return
    token = _KEPT.set({})
    try:
        with reusing_folded_weights():
            yield
    finally:
        _KEPT.reset(token)


def _kept(key: tuple[Any, ...], make: Callable[[], T]) -> T:
    memo = _KEPT.get()
    if memo is None:
        return make()
    if key not in memo:
        memo[key] = make()
    return memo[key]  # type: ignore[no-any-return]


def keep_loaded(model: Model, loaded: LoadedModel | None) -> None:
    """Keep what the ingest step imported (``loaded``) as ``model``'s loaded form, when keeping."""
    memo = _KEPT.get()
    if memo is not None and loaded is not None:
        memo.setdefault(("load", model.id, model.sha256), loaded)


def loaded_model(db: Database, store: ArtifactStore, model: Model) -> LoadedModel:
    """:func:`tunefleet.models.ingest.load_model`, once per model while keeping."""
    from tunefleet.models.ingest import load_model

    return _kept(("load", model.id, model.sha256), lambda: load_model(db, store, model))


def extracted(db: Database, store: ArtifactStore, model: Model, target: Any,
              recipe: Recipe) -> tuple[LoadedModel, list[ExtractedWorkload]]:
    """The model loaded (:func:`loaded_model`) and its workloads for ``target`` under ``recipe``
    (:func:`tunefleet.tvm.extract.extract_workloads`), each once per model while keeping."""
    from tunefleet.tvm.extract import extract_workloads

    loaded = loaded_model(db, store, model)
    found = _kept(("extract", model.id, model.sha256, str(target), recipe.name),
                  lambda: extract_workloads(loaded.mod, target, params=loaded.params, recipe=recipe))
    return loaded, found
