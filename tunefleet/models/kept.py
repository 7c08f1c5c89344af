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
bytes is loaded afresh; an extraction also by the target and the recipe's name. An entry is made
once even when two threads ask for it at once: ``tunefleet run`` begins the ingest and the
extraction in a thread of its own while Prefect's server starts (:func:`head_start`), and the
pipeline's steps then wait for what that thread is making rather than make it again. A failure is
not kept: the next caller makes the entry itself, and fails on its own.
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.db.tables import Model
    from tunefleet.models.frontends import LoadedModel
    from tunefleet.models.ingest import IngestResult
    from tunefleet.recipes import Recipe
    from tunefleet.store import ArtifactStore
    from tunefleet.tvm.extract import ExtractedWorkload

T = TypeVar("T")

log = logging.getLogger(__name__)


class _Entry:
    """One kept value, or the making of it: threads that ask while it is made wait for it."""

    def __init__(self) -> None:
        self.made: Future[Any] = Future()
        self.seconds: float | None = None
        """How long making it took (None for a value handed over, :func:`keep_loaded`)."""


_KEPT: ContextVar[dict[tuple[Any, ...], _Entry] | None] = ContextVar("tunefleet_kept_models", default=None)
_LOCK = threading.Lock()


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
    while True:
        with _LOCK:
            entry = memo.get(key)
            mine = entry is None
            if entry is None:
                entry = memo[key] = _Entry()
        if mine:
            break
        try:
            return entry.made.result()  # type: ignore[no-any-return]
        except Exception:  # noqa: S112 - the maker's failure is not kept: make it here, fail on its own
            continue
    started = time.perf_counter()
    try:
        value = make()
    except BaseException as exc:
        with _LOCK:
            memo.pop(key, None)  # not kept: the next caller tries again (a transient error may pass)
        entry.made.set_exception(exc)
        raise
    entry.seconds = time.perf_counter() - started
    entry.made.set_result(value)
    return value


def _seconds(key: tuple[Any, ...]) -> float | None:
    memo = _KEPT.get()
    entry = memo.get(key) if memo is not None else None
    return entry.seconds if entry is not None else None


def keep_loaded(model: Model, loaded: LoadedModel | None) -> None:
    """Keep what the ingest step imported (``loaded``) as ``model``'s loaded form, when keeping."""
    memo = _KEPT.get()
    if memo is None or loaded is None:
        return
    with _LOCK:
        if ("load", model.id, model.sha256) not in memo:
            entry = memo[("load", model.id, model.sha256)] = _Entry()
            entry.made.set_result(loaded)


def ingested(db: Database, store: ArtifactStore, source: str, *, batch_size: int = 1, image_size: int | None = None,
             seq_len: int | None = None) -> IngestResult:
    """:func:`tunefleet.models.ingest.ingest`, once per source and shape options while keeping; its
    import is kept as the model's loaded form (:func:`keep_loaded`)."""
    from tunefleet.models.ingest import ingest

    def make() -> IngestResult:
        res = ingest(db, store, source, batch_size=batch_size, image_size=image_size, seq_len=seq_len)
        keep_loaded(res.model, res.loaded)
        return res

    return _kept(("ingest", source, batch_size, image_size, seq_len), make)


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
    found = _kept(_extract_key(model, target, recipe),
                  lambda: extract_workloads(loaded.mod, target, params=loaded.params, recipe=recipe))
    return loaded, found


def extraction_seconds(model: Model, target: Any, recipe: Recipe) -> float | None:
    """How long the kept extraction of ``model`` for ``target`` under ``recipe`` took to make,
    whichever thread made it (None outside :func:`keeping_models`, or before it is made)."""
    return _seconds(_extract_key(model, target, recipe))


def _extract_key(model: Model, target: Any, recipe: Recipe) -> tuple[Any, ...]:
    return ("extract", model.id, model.sha256, str(target), recipe.name)


@contextmanager
def head_start(begin: Callable[[], None]) -> Iterator[None]:
    """Keep models (:func:`keeping_models`) and run ``begin`` in a thread of its own meanwhile.

    ``tunefleet run`` begins its pipeline's ingest and extraction so while Prefect starts its
    temporary server (a subprocess the main thread only waits for): the steps then take what
    ``begin`` kept (:func:`ingested`, :func:`extracted`), or wait for it. ``begin`` only saves
    time: what it raises is logged, and the step that needs the entry makes it again and reports
    its own error. The block's end waits for the thread at most :data:`HEAD_START_JOIN_S` (it has
    ended by then unless the block failed early): a process that exits while the thread is inside
    TVM's C++ code may crash on its way out instead of reporting the block's error."""
    def run() -> None:
        try:
            begin()
        except BaseException as exc:  # the step that needs it fails the same way, on its own
            log.debug("head start stopped: %s", exc, exc_info=True)

    with keeping_models():
        thread = threading.Thread(target=contextvars.copy_context().run, args=(run,), name="tunefleet-head-start",
                                  daemon=True)
        thread.start()
        try:
            yield
        finally:
            thread.join(HEAD_START_JOIN_S)


HEAD_START_JOIN_S = 60.0
"""How long the end of a :func:`head_start` block waits for its thread (a daemon past that)."""
