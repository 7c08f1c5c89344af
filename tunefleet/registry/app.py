"""The schedule registry's HTTP application (FastAPI): what the fleet tuned, for consumers that have
neither the database's credentials nor tunefleet's storage.

Every ``/v1`` route needs ``Authorization: Bearer <token>`` (``tunefleet token create``): a
missing, unknown, expired or revoked token gets 401 and nothing else; a ``read`` token on a write
route gets 403. Each write is logged as one audit line (logger ``tunefleet.registry.audit``:
the team, the token's id, the route, the outcome). A request body larger than the
``registry_max_upload_mb`` setting gets 413 before it is read. The OpenAPI schema is at
``/openapi.json`` (the interactive docs at ``/docs``).

Read routes: the hardware classes; a workload's best records; a model's best schedules and its
MetaSchedule database (a zip of ``export-db``'s files: build with
:func:`tunefleet.api.build_exported`); a class's hub bundle with its SHA-256 (what
``tunefleet hub import https://...`` checks). Write routes: submit a model for tuning (it is
stored, extracted and planned as shards that the fleet's workers then tune) and upload a bundle.
The work runs in the request (FastAPI's thread pool): a submission returns when its shards exist.
"""

# No ``from __future__ import annotations``: FastAPI reads the routes' annotations, and the
# dependencies they name (``Reader``, ``Writer``) are local to create_app.
import hashlib
import io
import logging
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse, Response

from tunefleet import api
from tunefleet.db.tables import ApiToken
from tunefleet.errors import ConflictError, NotFoundError, NotSupportedError, ParameterError, TunefleetError
from tunefleet.version import __version__

if TYPE_CHECKING:
    from tunefleet.config import Settings

log = logging.getLogger(__name__)
audit = logging.getLogger("tunefleet.registry.audit")

FORMATS = ("onnx", "pt2")


def status_of(exc: TunefleetError) -> int:
    """What one of tunefleet's errors is in HTTP: 404 unknown, 400 bad input (a parameter, a corrupt
    or unsupported model, a bad target), 409 a conflict, 503 transient (try again), else 500."""
    from tunefleet.errors import TransientError
    from tunefleet.models.frontends import ModelFormatError
    from tunefleet.models.zoo import InvalidOptionError

    if isinstance(exc, NotFoundError):
        return 404
    if isinstance(exc, ConflictError):
        return 409
    if isinstance(exc, TransientError):
        return 503
    if isinstance(exc, (ParameterError, NotSupportedError, ModelFormatError, InvalidOptionError)) \
            or type(exc).__name__ in ("InvalidTargetError", "ExtractionError", "SandboxError"):
        return 400
    return 500


def create_app(settings: "Settings") -> FastAPI:
    """The registry on the database and artifact store of ``settings`` (one context, shared)."""
    from tunefleet.db.tokens import grants

    ctx = api.connect(settings)
    limit = int(settings.registry_max_upload_mb * 1024 * 1024)
    app = FastAPI(title="tunefleet schedule registry", version=__version__,
                  description="The fleet's tuned schedules, hub bundles and tuning submissions.")
    app.state.ctx = ctx

    @app.exception_handler(TunefleetError)
    def _error(request: Request, exc: TunefleetError) -> JSONResponse:
        from tunefleet.config import mask_secrets

        text = str(exc).splitlines()
        return JSONResponse({"detail": mask_secrets(text[0]) if text else type(exc).__name__},
                            status_code=status_of(exc))

    @app.middleware("http")
    async def _size_limit(request: Request, call_next: Callable[[Request], Any]) -> Any:
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            return JSONResponse({"detail": f"request body of {int(length)} bytes is over the registry's limit of "
                                           f"{limit} bytes (registry_max_upload_mb)"}, status_code=413)
        return await call_next(request)

    def token(request: Request) -> ApiToken:
        """The request's live token (401 otherwise)."""
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        row = ctx.db.authenticate(value.strip()) if scheme.lower() == "bearer" and value.strip() else None
        if row is None:
            raise HTTPException(401, "a live bearer token is needed (tunefleet token create)",
                                headers={"WWW-Authenticate": "Bearer"})
        return row

    def reader(row: Annotated[ApiToken, Depends(token)]) -> ApiToken:
        return row

    def writer(row: Annotated[ApiToken, Depends(token)]) -> ApiToken:
        if not grants(row.scope, "write"):
            raise HTTPException(403, f"token {row.id} of team {row.team} may only read")
        return row

    Reader = Annotated[ApiToken, Depends(reader)]
    Writer = Annotated[ApiToken, Depends(writer)]

    async def body(request: Request) -> bytes:
        """The request body, at most ``limit`` bytes (a body sent without a length is cut off too)."""
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise HTTPException(413, f"request body over the registry's limit of {limit} bytes "
                                         "(registry_max_upload_mb)")
            chunks.append(chunk)
        return b"".join(chunks)

    def audited(row: ApiToken, what: str, outcome: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        try:
            result = outcome()
        except Exception as exc:
            audit.info("audit: team=%s token=%d %s -> refused: %s", row.team, row.id, what,
                       str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            raise
        audit.info("audit: team=%s token=%d %s -> %s", row.team, row.id, what, result)
        return result

    # -- probes ---------------------------------------------------------------------------------
    @app.get("/healthz", tags=["probes"])
    def healthz() -> dict[str, str]:
        """The process is up (liveness)."""
        return {"status": "ok"}

    @app.get("/readyz", tags=["probes"])
    def readyz() -> JSONResponse:
        """The database answers (readiness)."""
        try:
            ctx.db.hardware_classes()
        except TunefleetError as exc:
            return JSONResponse({"status": "database unavailable", "detail": str(exc).splitlines()[0]},
                                status_code=503)
        return JSONResponse({"status": "ok"})

    # -- reading --------------------------------------------------------------------------------
    @app.get("/v1/hardware", tags=["read"])
    def hardware(_: Reader) -> list[dict[str, Any]]:
        """The hardware classes: name, target, node pool, the CPU a CPU class belongs to, and whether
        it holds imported hub records (``hub``)."""
        from tunefleet.models.workloads import class_recipe
        from tunefleet.vocab import HUB_POOL

        return [{"name": hw.name, "target": hw.target, "node_pool": hw.node_pool, "recipe": class_recipe(hw).name,
                 "cpu": (hw.capabilities or {}).get("cpu"), "hub": hw.node_pool == HUB_POOL}
                for hw in ctx.db.hardware_classes()]

    @app.get("/v1/workloads/{workload}/best", tags=["read"])
    def workload_best(workload: str, _: Reader, hardware: str = "x86",
                      n: Annotated[int, Query(ge=1, le=100)] = 1) -> list[dict[str, Any]]:
        """A workload's ``n`` best measured schedules on a class (its structural hash or a prefix)."""
        return [b.as_dict() for b in api.best(ctx, workload, hardware, n=n)]

    @app.get("/v1/models/{model}/best", tags=["read"])
    def model_best(model: str, _: Reader, hardware: str = "x86",
                   n: Annotated[int, Query(ge=1, le=100)] = 1) -> list[dict[str, Any]]:
        """Every workload of a stored model (name, id or sha256 prefix) with its best schedules on a
        class; a workload never measured there has none."""
        return [w.as_dict() for w in api.best_for(ctx, _model_ref(model), hardware, n=n)]

    @app.get("/v1/models/{model}/database", tags=["read"], response_class=Response,
             responses={200: {"content": {"application/zip": {}}}})
    def model_database(model: str, _: Reader, hardware: str = "x86",
                       top: Annotated[int, Query(ge=1, le=100)] = 1) -> Response:
        """A model's MetaSchedule database on a class: a zip of ``export-db``'s files (the two JSON
        files and ``tunefleet.json``, which names the recipe they need); the recipe is in the
        ``X-Tunefleet-Recipe`` header too. Unzip it and build with
        ``tunefleet.build_exported(mod, DIRECTORY, params=...)``."""
        from tunefleet.delivery.best import export_json_database

        stored = ctx.db.model(_model_ref(model))
        hw = ctx.db.hardware_class(hardware)
        ids = {wl.id for wl, _ in ctx.db.workloads(stored.id, hw.id)}
        if not ids:
            raise NotFoundError(f"model {stored.name} has no workloads on {hardware}: extract it first")
        with tempfile.TemporaryDirectory(prefix="tunefleet-registry-") as tmp:
            done = export_json_database(ctx.db, hardware, tmp, top_k=top, workload_ids=ids)
            data = _zip(Path(tmp))
        return Response(data, media_type="application/zip", headers={
            "Content-Disposition": f'attachment; filename="{stored.name}-{hardware}-msdb.zip"',
            "X-Tunefleet-Recipe": done.recipe, "X-Tunefleet-Records": str(done.records)})

    @app.get("/v1/hub", tags=["read"])
    def hub_classes(_: Reader) -> list[dict[str, Any]]:
        """The classes whose hub bundle can be fetched (``/v1/hub/{class}.parquet``): those with a
        measurement of their own."""
        from tunefleet.vocab import HUB_POOL

        return [{"class": hw.name, "bundle": f"/v1/hub/{hw.name}.parquet",
                 "measurements": ctx.db.count_measurements(hardware_class_id=hw.id)}
                for hw in ctx.db.hardware_classes() if hw.node_pool != HUB_POOL]

    @app.get("/v1/hub/{hardware}.parquet", tags=["read"], response_class=Response,
             responses={200: {"content": {"application/vnd.apache.parquet": {}}}})
    def hub_bundle(hardware: str, _: Reader, top_k: Annotated[int | None, Query(ge=1, le=100)] = None) -> Response:
        """A class's hub bundle (the best records of every workload it measured), with its SHA-256
        in the ``X-Tunefleet-Sha256`` header."""
        from tunefleet.learning.hub import DEFAULT_TOP_K, SHA256_HEADER, export_bundle

        ctx.db.hardware_class(hardware)  # 404 for an unknown class
        data, summary = export_bundle(ctx.db, hardware=[hardware], top_k=top_k or DEFAULT_TOP_K)
        if not summary["classes"]:
            raise NotFoundError(f"nothing measured on {hardware} yet: no bundle")
        return Response(data, media_type="application/vnd.apache.parquet", headers={
            SHA256_HEADER: hashlib.sha256(data).hexdigest(),
            "Content-Disposition": f'attachment; filename="{hardware}.parquet"'})

    # -- writing --------------------------------------------------------------------------------
    @app.post("/v1/models", tags=["write"])
    def submit_model(row: Writer, data: Annotated[bytes, Depends(body)], name: str,
                     format: Annotated[str, Query(pattern=f"^({'|'.join(FORMATS)})$")] = "onnx",  # noqa: A002 - the API's word
                     hardware: str = "x86", trials: Annotated[int, Query(ge=1, le=100_000)] = 64) -> dict[str, Any]:
        """Submit a model for tuning: the body is the model file (ONNX, or a ``.pt2`` exported
        program, parsed in a sandbox); it is stored (once per content), its workloads extracted for
        ``hardware`` and planned as shards of up to ``trials`` trials each, which the fleet's
        workers tune. Submitting the same model again plans only what is missing."""
        from tunefleet.planning import shard_queue

        def work() -> dict[str, Any]:
            if not data:
                raise ParameterError("empty body: send the model file")
            with tempfile.TemporaryDirectory(prefix="tunefleet-submit-") as tmp:
                path = Path(tmp) / f"{_safe_name(name)}.{format}"
                path.write_bytes(data)
                ingested = api.ingest(ctx, str(path), name=_safe_name(name))
            extracted = api.extract(ctx, ingested.model, hardware)
            created, _ = shard_queue.plan(ctx.db, hardware, target_trials=trials, model=ingested.model.id)
            return {"model_id": ingested.model.id, "model": ingested.model.name, "created": ingested.created,
                    "sha256": ingested.model.sha256, "hardware": hardware, "workloads": extracted.workloads,
                    "new_shards": len(created), "new_trials": sum(s.trials for s in created)}

        return audited(row, f"POST /v1/models name={name} hardware={hardware} trials={trials}", work)

    @app.post("/v1/hub", tags=["write"])
    def upload_bundle(row: Writer, data: Annotated[bytes, Depends(body)]) -> dict[str, Any]:
        """Upload a hub bundle (the body): validated, loaded in one transaction, idempotent."""
        def work() -> dict[str, Any]:
            with tempfile.TemporaryDirectory(prefix="tunefleet-upload-") as tmp:
                path = Path(tmp) / "bundle.parquet"
                path.write_bytes(data)
                done = api.hub_import(ctx, path)
            return {"sha256": done.sha256, "new": done.new, "classes": list(done.classes), "counts": done.counts}

        return audited(row, f"POST /v1/hub ({len(data)} bytes)", work)

    return app


def _model_ref(model: str) -> int | str:
    return int(model) if model.isdigit() else model


def _safe_name(name: str) -> str:
    import re

    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip(".-")[:100]
    if not cleaned:
        raise ParameterError(f"invalid name: {name!r}")
    return cleaned


def _zip(directory: Path) -> bytes:
    sink = io.BytesIO()
    with zipfile.ZipFile(sink, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(directory.iterdir()):
            zf.write(path, path.name)
    return sink.getvalue()


def serve(settings: "Settings", host: str, port: int) -> None:
    """Run the registry with uvicorn until interrupted (``tunefleet serve``)."""
    import uvicorn

    uvicorn.run(create_app(settings), host=host, port=port, log_level="info", access_log=True)


__all__ = ["FORMATS", "create_app", "serve", "status_of"]
