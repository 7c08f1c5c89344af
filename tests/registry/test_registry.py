"""The schedule registry (``tunefleet serve``) with uvicorn on a loopback port, on PostgreSQL and
the S3 store (SeaweedFS): tokens, a consumer that builds with a model's database, bundles with
their SHA-256, submissions, size limits and the audit lines."""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import logging
import threading
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.onnx_models import tiny_onnx
from tunefleet import api
from tunefleet.testing.ports import free_port


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` under uvicorn on a free loopback port, in a thread; its base URL."""
    import time

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{server.config.port}"
    finally:
        server.should_exit = True
        thread.join(10)


def _settings(home: Path, db_url: str, s3: Any, **more: Any) -> Any:
    from tunefleet.config import load_settings
    from tunefleet.testing.seaweedfs import unique_bucket_name

    return load_settings(home=home, database_url=db_url, store="s3", s3_endpoint=s3.endpoint,
                         s3_access_key=s3.access_key, s3_secret_key=s3.secret_key,
                         s3_bucket=unique_bucket_name("registry"), **{"hub": "off", **more})


def _measure_every_workload(ctx: Any, model: Any, hardware: str = "x86") -> None:
    """Commit one real schedule (a design space of MetaSchedule's) of each of the model's workloads."""
    import tvm
    from tvm.s_tir import meta_schedule as ms

    from tunefleet.db import NewMeasurement
    from tunefleet.hardware import claim_for_this_cpu
    from tunefleet.learning.hub import tvm_version
    from tunefleet.tvm.builder import import_tensor_intrinsics
    from tunefleet.tvm.targets import make_target
    from tunefleet.tvm.traces import to_python, trace_json_of

    import_tensor_intrinsics()
    db = ctx.db
    hw = claim_for_this_cpu(db, hardware)
    target = make_target(hw.target)
    for wl, _ in db.workloads(model.id, hw.id):
        mod = tvm.ir.load_json(wl.tir_json)
        space = ms.TuneContext(mod, target=target, space_generator="post-order-apply",
                               task_name=wl.name).generate_design_space()[0]
        args = to_python([a.as_json() for a in ms.arg_info.ArgInfo.from_prim_func(mod["main"])])
        db.commit_measurements([NewMeasurement(wl.id, hw.id, trace_json_of(space), run_secs=[1e-5] * 3,
                                               args_info=args, tvm_version=tvm_version(),
                                               target=json.dumps(hw.target))])


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, pg_server: Any,
             seaweedfs: Any) -> Iterator[tuple[Any, str, Any]]:  # noqa: F811
    """A PostgreSQL database with mlp measured on x86, the registry serving it (1 MiB upload
    limit), for the module's tests (each makes its own tokens); (the context, the registry's URL,
    the S3 server)."""
    from tunefleet.registry.app import create_app

    name = pg_server.create_database()
    settings = _settings(tmp_path_factory.mktemp("server"), pg_server.url(name), seaweedfs, registry_max_upload_mb=1)
    ctx = api.connect(settings)
    model = api.ingest(ctx, "mlp").model
    api.extract(ctx, model, "x86")
    _measure_every_workload(ctx, model)
    app = create_app(settings)
    try:
        with serving(app) as url:
            yield ctx, url, seaweedfs
    finally:
        app.state.ctx.close()
        ctx.close()
        pg_server.drop_database(name)


def _get(url: str, token: str | None = None, **kw: Any) -> httpx.Response:
    return httpx.get(url, headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=60, **kw)


def _post(url: str, token: str | None, content: bytes, **kw: Any) -> httpx.Response:
    return httpx.post(url, content=content, headers={"Authorization": f"Bearer {token}"} if token else {},
                      timeout=120, **kw)


def test_a_consumer_with_a_read_token_builds_with_a_model_s_database(registry: tuple[Any, str, Any],
                                                                     tmp_path: Path) -> None:
    from tunefleet.models.ingest import load_model

    ctx, url, _ = registry
    read, _ = ctx.db.create_token("vision", "read")
    assert _get(f"{url}/healthz").json() == {"status": "ok"} and _get(f"{url}/readyz").status_code == 200
    paths = _get(f"{url}/openapi.json").json()["paths"]
    assert {"/v1/models/{model}/database", "/v1/hub/{hardware}.parquet", "/v1/models", "/v1/hub"} <= set(paths)

    classes = _get(f"{url}/v1/hardware", read).json()
    assert {c["name"] for c in classes} >= {"x86", "x86-avx2"} and not any(c["hub"] for c in classes)
    best = _get(f"{url}/v1/models/mlp/best", read, params={"hardware": "x86"}).json()
    assert len(best) == 3 and all(len(w["schedules"]) == 1 for w in best)
    one = _get(f"{url}/v1/workloads/{best[0]['workload'][:12]}/best", read, params={"hardware": "x86"}).json()
    assert one[0]["measurement_id"] == best[0]["schedules"][0]["measurement_id"]
    assert _get(f"{url}/v1/workloads/{'0' * 32}/best", read).status_code == 404

    fetched = _get(f"{url}/v1/models/mlp/database", read, params={"hardware": "x86"})
    assert fetched.status_code == 200 and fetched.headers["x-tunefleet-recipe"] == "nhwc+prepack+fastmath+fold+winograd"
    directory = tmp_path / "msdb"
    zipfile.ZipFile(io.BytesIO(fetched.content)).extractall(directory)
    assert sorted(p.name for p in directory.iterdir()) == ["database_tuning_record.json", "database_workload.json",
                                                           "tunefleet.json"]
    # the consumer: tunefleet and TVM, no database, no settings
    frontend = load_model(ctx.db, ctx.store, ctx.db.model("mlp"))
    built = api.build_exported(frontend.mod, directory, params=frontend.params)
    assert len(built.hits) == 3


def test_tokens_missing_wrong_expired_revoked_or_read_only_get_401_or_403(registry: tuple[Any, str, Any],
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    from sqlalchemy import text

    from tunefleet.db.tables import utcnow

    ctx, url, _ = registry
    read, read_row = ctx.db.create_token("vision", "read")
    gone, gone_row = ctx.db.create_token("vision", "read")
    old, _ = ctx.db.create_token("speech", "read", expires_at=utcnow().replace(year=utcnow().year + 1))
    with ctx.db.session() as s:
        s.execute(text("UPDATE api_tokens SET expires_at = :t WHERE team = 'speech'"), {"t": utcnow()})
    ctx.db.revoke_token(gone_row.id)
    for token in (None, "tf_not-a-token", read[:-2], old, gone):
        r = _get(f"{url}/v1/hardware", token)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", token
        assert list(r.json()) == ["detail"]  # nothing else
    assert httpx.get(f"{url}/v1/hardware", headers={"Authorization": f"Basic {read}"}).status_code == 401

    caplog.set_level(logging.INFO, logger="tunefleet.registry.audit")
    imports = len(ctx.db.hub_imports())
    refused = _post(f"{url}/v1/hub", read, b"not a bundle")
    assert refused.status_code == 403 and "may only read" in refused.json()["detail"]
    assert len(ctx.db.hub_imports()) == imports and not caplog.records  # refused before the route ran
    assert _get(f"{url}/v1/hardware", read).status_code == 200
    assert {t.id: t for t in ctx.db.api_tokens()}[read_row.id].last_used_at is not None


def test_bundles_travel_with_their_sha256_and_a_writer_uploads_and_submits(
        registry: tuple[Any, str, Any], pg_server: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from tunefleet.errors import ConfigError, ParameterError
    from tunefleet.learning.hub import SHA256_HEADER

    ctx, url, s3 = registry
    read, _ = ctx.db.create_token("vision", "read")
    write, write_row = ctx.db.create_token("platform", "write")
    listed = _get(f"{url}/v1/hub", read).json()
    assert {"class": "x86", "bundle": "/v1/hub/x86.parquet", "measurements": 3} in listed
    bundle = _get(f"{url}/v1/hub/x86.parquet", read)
    assert bundle.status_code == 200 and bundle.headers[SHA256_HEADER] == hashlib.sha256(bundle.content).hexdigest()
    assert _get(f"{url}/v1/hub/x86-avx2.parquet", read).status_code == 404  # nothing measured there

    # another database imports it over HTTP with its read token (checked against the SHA-256)
    databases = [pg_server.create_database(), pg_server.create_database()]
    # (its TUNEFLEET_HUB names the registry's bundle: the database's first use fetches it)
    other = api.connect(_settings(tmp_path / "client", pg_server.url(databases[0]), s3, registry_token=read,
                                  hub=f"{url}/v1/hub/x86.parquet"))
    no_token = api.connect(_settings(tmp_path / "anon", pg_server.url(databases[1]), s3))
    try:
        [first] = other.db.hub_imports()
        assert first.source == f"{url}/v1/hub/x86.parquet" and first.counts["records_new"] == 3
        again = api.hub_import(other, f"{url}/v1/hub/x86.parquet")  # the same file, or made again: nothing new
        assert not again.new or again.counts["records_new"] == 0
        with pytest.raises(ConfigError, match=r"refused .* \(401\): set TUNEFLEET_REGISTRY_TOKEN .* \(none is set\)"):
            api.hub_import(no_token, f"{url}/v1/hub/x86.parquet")
        with _serving_bytes(bundle.content, {SHA256_HEADER: "0" * 64}) as tampered:
            with pytest.raises(ParameterError, match=r"SHA-256 .* is not the registry's 000000000000.*refused"):
                api.hub_import(other, tampered)
        with _serving_bytes(bundle.content, {}) as unchecked:
            with pytest.raises(ParameterError, match=r"sent no X-Tunefleet-Sha256 header: refused"):
                api.hub_import(other, unchecked)
    finally:
        other.close()
        no_token.close()
        for name in databases:
            pg_server.drop_database(name)

    caplog.set_level(logging.INFO, logger="tunefleet.registry.audit")
    uploaded = _post(f"{url}/v1/hub", write, bundle.content)
    assert uploaded.status_code == 200 and uploaded.json()["new"] is True
    too_big = _post(f"{url}/v1/hub", write, b"\0" * (1024 * 1024 + 1))
    assert too_big.status_code == 413 and "over the registry's limit" in too_big.json()["detail"]
    submitted = _post(f"{url}/v1/models", write, tiny_onnx(), params={"name": "tiny", "trials": 16})
    assert submitted.status_code == 200, submitted.text
    body = submitted.json()
    assert (body["model"], body["created"], body["hardware"]) == ("tiny", True, "x86")
    assert body["workloads"] >= 1 and body["new_shards"] == body["workloads"] and body["new_trials"] == 16 * body["workloads"]
    again = _post(f"{url}/v1/models", write, tiny_onnx(), params={"name": "tiny", "trials": 16}).json()
    assert (again["created"], again["new_shards"]) == (False, 0)  # the same model: nothing planned twice
    bad = _post(f"{url}/v1/models", write, b"garbage" * 10, params={"name": "broken"})
    assert bad.status_code == 400 and "\n" not in bad.json()["detail"]
    lines = [r.getMessage() for r in caplog.records if r.name == "tunefleet.registry.audit"]
    assert len(lines) == 4 and all(f"team=platform token={write_row.id} POST /v1/" in line for line in lines)
    assert "refused" in lines[-1] and "new_shards" in lines[1]


@contextmanager
def _serving_bytes(data: bytes, headers: dict[str, str]) -> Iterator[str]:
    """A plain HTTP server that answers every GET with ``data`` and ``headers`` (a registry gone wrong)."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            for key, value in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1/hub/x86.parquet"
    finally:
        server.shutdown()
