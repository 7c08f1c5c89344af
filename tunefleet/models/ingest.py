"""Ingest models: store the bytes content-addressed, register the metadata, load them back.

Sources: a zoo name (``resnet18``, ``mlp``...), an ONNX file, a ``.pt2`` exported program, or an
``s3://`` URI inside the configured artifact store. Ingesting the same bytes again is a no-op
that returns the existing model. A file is imported into TVM before anything is stored, so a
corrupt file leaves nothing behind.

A model file is untrusted input: it is parsed, here and whenever :func:`load_model` loads it again
(for extraction and builds), in a child process that holds no secrets, under time and memory
limits (:func:`tunefleet.models.sandbox.parse_model`); this process only loads the Relax module the
child returns as TVM's JSON. The zoo's models are built here: they are tunefleet's own code.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunefleet.errors import NotSupportedError, TunefleetError

if TYPE_CHECKING:
    from tunefleet.db import Database
    from tunefleet.db.tables import Model
    from tunefleet.models.frontends import LoadedModel
    from tunefleet.store import ArtifactStore

log = logging.getLogger(__name__)

_SUFFIX = {"onnx": ".onnx", "pt2": ".pt2", "relax-nn": ".relax"}


@dataclass
class IngestResult:
    model: Model
    created: bool
    loaded: LoadedModel | None  # the imported module, when this call built it


def check_source(source: str) -> None:
    """Refuse, in milliseconds and without importing a frontend, a model source that cannot be
    ingested here: an unknown zoo name, a missing file, a URI scheme other than ``s3://``, or a
    model whose frontend needs an extra that is not installed (one line naming the extra)."""
    import importlib.util

    from tunefleet.models.frontends import MissingDependencyError

    def need(modules: tuple[str, ...], extra: str, what: str) -> None:
        missing = [m for m in modules if importlib.util.find_spec(m) is None]
        if missing:
            raise MissingDependencyError(f"{what} needs {', '.join(missing)}, which is not installed: "
                                         f"pip install 'tunefleet[{extra}]'")

    if source in _zoo_names():
        from tunefleet.models.zoo import get_zoo_entry

        if get_zoo_entry(source).requires == "torch":
            need(("torch", "transformers"), "torch", f"zoo model {source!r}")
        return
    if source.startswith("s3://"):
        return
    if "://" in source:
        raise NotSupportedError(f"not supported: model URI scheme of {source!r}; give a path, an s3:// URI or a zoo name")
    path = Path(source).expanduser()
    if not path.is_file():
        raise TunefleetError(f"{source}: no such file, and not a zoo model ({', '.join(sorted(_zoo_names()))})")
    if path.suffix.lower() == ".onnx":
        need(("onnx",), "onnx", f"{path.name} (ONNX)")
    elif path.suffix.lower() in (".pt2", ".pt", ".zip"):
        need(("torch",), "torch", f"{path.name} (torch.export)")


def _zoo_names() -> set[str]:
    from tunefleet.models.zoo import list_zoo

    return {e.name for e in list_zoo()}


def ingest(
    db: Database,
    store: ArtifactStore,
    source: str,
    *,
    name: str | None = None,
    batch_size: int = 1,
    image_size: int | None = None,
    seq_len: int | None = None,
) -> IngestResult:
    """Ingest a model from a zoo name, a file path or an ``s3://`` URI.

    A ``name`` the database cannot hold is refused first, in one line, before anything is built,
    read or stored (and a default name, the file's stem, before anything is stored)."""
    if name is not None:
        check_name(name)
    if source in _zoo_names():
        from tunefleet.models.zoo import build_zoo_model

        zm = build_zoo_model(source, batch_size=batch_size, image_size=image_size, seq_len=seq_len)
        meta = {"zoo": source, **zm.metadata}
        return _register(db, store, name or source, "zoo", zm.format, zm.source_bytes, zm.loaded, meta)
    if batch_size != 1 or image_size is not None or seq_len is not None:
        raise TunefleetError("--batch-size/--image-size/--seq-len apply to zoo models only; a file has its own shapes")
    if source.startswith("s3://"):
        try:
            key = store.key_from_uri(source)
        except TunefleetError as exc:
            raise NotSupportedError(f"not supported: {source} is outside the configured artifact store ({exc})") from None
        data, filename = store.get_bytes(key), key.rsplit("/", 1)[-1]
    elif "://" in source:
        raise NotSupportedError(f"not supported: model URI scheme of {source!r}; give a path, an s3:// URI or a zoo name")
    else:
        path = Path(source).expanduser()
        if not path.is_file():
            raise TunefleetError(f"{source}: no such file, and not a zoo model ({', '.join(sorted(_zoo_names()))})")
        data, filename = path.read_bytes(), path.name
    from tunefleet.models.sandbox import parse_model

    parsed = parse_model(data, filename)
    fmt, loaded = parsed.format, parsed.loaded(filename)
    meta = {"filename": filename, "inputs": [{"name": n, "shape": list(s), "dtype": d} for n, s, d in loaded.input_info]}
    return _register(db, store, name or Path(filename).stem, fmt, fmt, data, loaded, meta)


def check_name(name: str) -> str:
    """``name``, or one :class:`~tunefleet.errors.ParameterError` line if it is longer than a model's
    name may be (the ``models`` table's column; PostgreSQL would refuse it at the write and SQLite
    store it whole, so both refuse it here)."""
    from tunefleet.db import check_model_name

    return check_model_name(name)


def _register(db: Database, store: ArtifactStore, name: str, source: str, fmt: str, data: bytes,
              loaded: LoadedModel | None, meta: dict[str, Any]) -> IngestResult:
    check_name(name)
    sha = hashlib.sha256(data).hexdigest()
    key, _ = store.put_content_addressed(data, prefix="models", suffix=_SUFFIX.get(fmt, ""))
    input_info = [[n, list(s), d] for n, s, d in loaded.input_info] if loaded is not None else []
    model, created = db.add_model(name=name, source=source, format=fmt, sha256=sha, artifact_uri=store.uri(key),
                                  input_info=input_info, meta=meta)
    if created:
        log.info("ingested model %s (%s, %s, id %d)", name, fmt, sha[:12], model.id)
    else:
        log.info("model %s already ingested as id %d (%s)", name, model.id, sha[:12])
    return IngestResult(model, created, loaded)


def load_model(db: Database, store: ArtifactStore, model: Model) -> LoadedModel:
    """Import a registered model into TVM Relax again (zoo models are rebuilt and checked; a
    model file is parsed in a child process that holds no secrets, so the result has no PyTorch
    module)."""
    if model.source == "zoo":
        from tunefleet.models.zoo import build_zoo_model

        opts = dict(model.meta.get("options") or {})
        zm = build_zoo_model(model.meta["zoo"], **opts)
        if zm.sha256 != model.sha256:
            raise TunefleetError(
                f"zoo model {model.name} rebuilt with different bytes ({zm.sha256[:12]} != {model.sha256[:12]}); "
                "the torch/transformers version changed: ingest it again"
            )
        return zm.loaded
    from tunefleet.models.sandbox import parse_model

    data = store.get_bytes(store.key_from_uri(model.artifact_uri))
    filename = model.meta.get("filename", model.name)
    return parse_model(data, filename, "onnx" if model.format == "onnx" else "pt2").loaded(filename)
