"""S3-specific behaviour: failures a user can act on, in bounded time, and building from settings."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tunefleet.config import Settings
from tunefleet.errors import ArtifactStoreError
from tunefleet.store import LocalStore, S3Store, open_store
from tunefleet.store.s3 import PART_SIZE
from tunefleet.testing.seaweedfs import SeaweedFSServer, free_ports
from tunefleet.testing.seaweedfs import unique_bucket_name as fresh_bucket

pytestmark = pytest.mark.timeout(60)

#: The brief: an S3 failure must surface within this many seconds.
DEADLINE_S = 10.0


def _one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message, message
    return message


def test_wrong_secret_key_is_reported_as_rejected_credentials(seaweedfs: SeaweedFSServer) -> None:
    start = time.monotonic()
    with pytest.raises(ArtifactStoreError) as info:
        S3Store(seaweedfs.endpoint, seaweedfs.access_key, "not-the-secret", fresh_bucket())
    elapsed = time.monotonic() - start
    message = _one_line(info.value)
    assert f"S3 at {seaweedfs.endpoint} rejected the credentials" in message
    assert "not-the-secret" not in message
    assert elapsed < DEADLINE_S


def test_unknown_access_key_is_reported_as_rejected_credentials(seaweedfs: SeaweedFSServer) -> None:
    with pytest.raises(ArtifactStoreError, match="rejected the credentials"):
        S3Store(seaweedfs.endpoint, "nobody", seaweedfs.secret_key, fresh_bucket())


def test_unreachable_endpoint_fails_fast() -> None:
    (port,) = free_ports(1)  # nothing listens there
    endpoint = f"127.0.0.1:{port}"
    start = time.monotonic()
    with pytest.raises(ArtifactStoreError) as info:
        S3Store(endpoint, "key", "secret", "artifacts")  # default timeout and retries
    elapsed = time.monotonic() - start
    message = _one_line(info.value)
    assert message.startswith(f"cannot reach S3 at {endpoint} within 10s")
    assert "refused" in message.lower()
    assert elapsed < DEADLINE_S


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """A TCP port that accepts connections and never answers."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def test_silent_endpoint_times_out_instead_of_hanging(silent_endpoint: str) -> None:
    start = time.monotonic()
    with pytest.raises(ArtifactStoreError) as info:
        S3Store(silent_endpoint, "key", "secret", "artifacts", timeout_s=1.0, retries=1)
    elapsed = time.monotonic() - start
    message = _one_line(info.value)
    assert message.startswith(f"cannot reach S3 at {silent_endpoint} within 1s (2 attempts)")
    assert 1.0 <= elapsed < DEADLINE_S


class _BadGatewayHandler(BaseHTTPRequestHandler):
    """A reverse proxy with no S3 behind it."""

    def _page(self) -> None:
        body = b"<html><body>502 Bad Gateway</body></html>"
        self.send_response(502)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_PUT = _page

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib signature
        pass


def test_proxy_without_s3_behind_it_gives_a_clear_error() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BadGatewayHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"127.0.0.1:{server.server_address[1]}"
    try:
        start = time.monotonic()
        with pytest.raises(ArtifactStoreError) as info:
            S3Store(endpoint, "key", "secret", "artifacts")
        message = _one_line(info.value)
        assert message.startswith(f"S3 at {endpoint} gave an unexpected response"), message
        assert "502" in message
        assert time.monotonic() - start < DEADLINE_S
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"endpoint": "http://127.0.0.1:9000"}, "invalid S3 endpoint"),
        ({"bucket": "Not_A_Bucket"}, "invalid S3 bucket name"),
        ({"prefix": "a/../b"}, "invalid artifact key prefix"),
        ({"timeout_s": 0}, "invalid S3 timeout"),
    ],
)
def test_invalid_arguments_fail_before_any_request(kwargs: dict[str, object], expected: str) -> None:
    arguments: dict[str, object] = {
        "endpoint": "127.0.0.1:1",
        "access_key": "key",
        "secret_key": "secret",
        "bucket": "artifacts",
    }
    arguments.update(kwargs)
    with pytest.raises(ArtifactStoreError, match=expected):
        S3Store(**arguments)  # type: ignore[arg-type]


def test_stream_of_unknown_length_is_uploaded_in_parts(seaweedfs: SeaweedFSServer) -> None:
    bucket = fresh_bucket()
    store = S3Store(seaweedfs.endpoint, seaweedfs.access_key, seaweedfs.secret_key, bucket)

    class Unsized:  # only read(): no length, no seek
        def __init__(self, size: int) -> None:
            self.left = size

        def read(self, n: int = -1) -> bytes:
            n = self.left if n < 0 else min(n, self.left)
            self.left -= n
            return b"z" * n

    store.put_stream("parts.bin", Unsized(PART_SIZE + 1))  # type: ignore[arg-type]
    info = seaweedfs.client().stat_object(bucket, "parts.bin")
    assert info.size == PART_SIZE + 1
    assert info.etag is not None and info.etag.endswith("-2"), info.etag  # a 2-part upload


@pytest.fixture
def isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No TUNEFLEET_* variable or config file leaks into Settings()."""
    for name in list(os.environ):
        if name.startswith("TUNEFLEET_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TUNEFLEET_HOME", str(tmp_path / "home"))
    return tmp_path


def test_open_store_builds_a_local_store(isolated_env: Path) -> None:
    store = open_store(Settings(store="local", store_path=isolated_env / "artifacts"))
    assert isinstance(store, LocalStore)
    assert store.root == (isolated_env / "artifacts").resolve()
    assert store.put_bytes("a/b", b"1") == (isolated_env / "artifacts" / "a" / "b").resolve().as_uri()

    default = open_store(Settings())
    assert isinstance(default, LocalStore)
    assert default.root == (isolated_env / "home" / "artifacts").resolve()


def test_open_store_builds_an_s3_store(isolated_env: Path, seaweedfs: SeaweedFSServer) -> None:
    bucket = fresh_bucket("settings")
    settings = Settings(
        store="s3",
        s3_endpoint=seaweedfs.endpoint,
        s3_access_key=seaweedfs.access_key,
        s3_secret_key=seaweedfs.secret_key,
        s3_bucket=bucket,
        s3_timeout_s=5,
        s3_retries=1,
    )
    store = open_store(settings)
    assert isinstance(store, S3Store)
    assert (store.bucket, store.prefix, store.timeout_s, store.retries) == (bucket, "", 5.0, 1)
    assert store.put_bytes("x/y.bin", b"data") == f"s3://{bucket}/x/y.bin"
    assert seaweedfs.client().get_object(bucket, "x/y.bin").read() == b"data"  # no prefix

    prefixed = open_store(settings.model_copy(update={"s3_prefix": "/team/a/"}))
    assert prefixed.put_bytes("x/y.bin", b"other") == f"s3://{bucket}/team/a/x/y.bin"
    assert list(prefixed.list()) == ["x/y.bin"]
    assert list(store.list()) == ["team/a/x/y.bin", "x/y.bin"]


def test_open_store_with_wrong_secret_fails_clearly(isolated_env: Path, seaweedfs: SeaweedFSServer) -> None:
    settings = Settings(
        store="s3",
        s3_endpoint=seaweedfs.endpoint,
        s3_access_key=seaweedfs.access_key,
        s3_secret_key="wrong",
        s3_bucket=fresh_bucket(),
    )
    with pytest.raises(ArtifactStoreError, match="rejected the credentials"):
        open_store(settings)


def test_silent_endpoint_with_default_settings_fails_within_10s(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The defaults themselves (not tuned-down test values) bound a hung S3 endpoint to < 10 s."""
    import socket
    import time

    from tunefleet.config import load_settings
    from tunefleet.errors import ArtifactStoreError
    from tunefleet.store import open_store

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        port = listener.getsockname()[1]
        settings = load_settings(home=tmp_path, store="s3", s3_endpoint=f"127.0.0.1:{port}", s3_access_key="k",
                                 s3_secret_key="s")
        start = time.monotonic()
        with pytest.raises(ArtifactStoreError):
            open_store(settings)
        assert time.monotonic() - start < 10
