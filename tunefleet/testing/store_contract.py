"""The artifact store contract: one test suite every :class:`ArtifactStore` backend must pass.

Shipped with the package (like Optuna's storage test case) so that any backend, in this
repository or outside it, is checked by the same specification. Use it by subclassing
:class:`StoreContract` in a test module and providing a function-scoped ``store`` fixture
that yields an *empty* store (parametrise it to cover several backends)::

    from tunefleet.testing.store_contract import StoreContract

    class TestStoreContract(StoreContract):
        pass

Class names not starting with ``Test`` are not collected, so importing this module alone
runs nothing.
"""

from __future__ import annotations

import hashlib
import io
import random
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tunefleet.errors import ArtifactNotFoundError, ArtifactStoreError, NotFoundError
from tunefleet.store.base import ArtifactStore

MiB = 1024 * 1024

#: Keys every backend must reject, each with a reason.
BAD_KEYS = {
    "empty": "",
    "absolute": "/etc/passwd",
    "parent": "a/../b",
    "only-parent": "..",
    "dot-segment": "./a",
    "double-slash": "a//b",
    "trailing-slash": "a/",
    "backslash": "a\\b",
    "newline": "a\nb",
    "too-long": "k" * 1025,
}

#: Keys whose byte-wise order differs from a depth-first directory walk.
ORDER_KEYS = ["a.txt", "a/b", "a/c/d", "a-b", "a0", "ab/x", "a b/y", "A", "b", "é/z"]


class _GeneratedStream(io.RawIOBase):
    """A non-seekable stream of ``size`` pseudo-random bytes, hashed as it is read."""

    def __init__(self, size: int, seed: int = 0) -> None:
        super().__init__()
        self._left = size
        self._rng = random.Random(seed)
        self._buffer = b""
        self.sha256 = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if not self._buffer and self._left:
            self._buffer = self._rng.randbytes(min(MiB, self._left))
            self._left -= len(self._buffer)
            self.sha256.update(self._buffer)
        n = min(len(buffer), len(self._buffer))
        buffer[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n


def _streamed_sha256(store: ArtifactStore, key: str) -> tuple[str, int]:
    digest = hashlib.sha256()
    size = 0
    with store.open(key) as stream:
        while chunk := stream.read(MiB):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


class StoreContract:
    """Behaviour every artifact store backend guarantees. Needs a ``store`` fixture."""

    # -- round trips ------------------------------------------------------------------------
    def test_bytes_round_trip(self, store: ArtifactStore) -> None:
        uri = store.put_bytes("models/m.bin", b"\x00\x01payload", content_type="application/x-test")
        assert uri == store.uri("models/m.bin")
        assert store.get_bytes("models/m.bin") == b"\x00\x01payload"
        assert store.stat("models/m.bin") == 9

        store.put_bytes("models/m.bin", b"replaced")
        assert store.get_bytes("models/m.bin") == b"replaced"

        store.put_bytes("empty", b"")
        assert store.get_bytes("empty") == b""
        assert store.stat("empty") == 0

    def test_stream_round_trip(self, store: ArtifactStore) -> None:
        data = bytes(range(256)) * 4096  # 1 MiB
        store.put_stream("known.bin", io.BytesIO(data), length=len(data))
        store.put_stream("unknown.bin", _GeneratedStream(3 * MiB + 7, seed=1))

        with store.open("known.bin") as stream:
            assert stream.read(10) == data[:10]
            assert stream.read() == data[10:]
        reference = _GeneratedStream(3 * MiB + 7, seed=1).read()
        assert store.get_bytes("unknown.bin") == reference

    def test_put_stream_with_length_stores_exactly_length_bytes(self, store: ArtifactStore) -> None:
        store.put_stream("head.bin", io.BytesIO(b"0123456789"), length=4)
        assert store.get_bytes("head.bin") == b"0123"

    def test_put_stream_shorter_than_length_fails_and_stores_nothing(self, store: ArtifactStore) -> None:
        with pytest.raises(ArtifactStoreError):
            store.put_stream("short.bin", io.BytesIO(b"abc"), length=10)
        assert not store.exists("short.bin")

    def test_partially_read_stream_can_be_closed(self, store: ArtifactStore) -> None:
        store.put_bytes("big.bin", b"x" * (2 * MiB))
        for _ in range(3):  # connections are released or dropped, never leaked
            stream = store.open("big.bin")
            assert stream.read(5) == b"xxxxx"
            stream.close()
        assert store.get_bytes("big.bin") == b"x" * (2 * MiB)

    # -- content addressing -----------------------------------------------------------------
    def test_content_addressed_put(self, store: ArtifactStore) -> None:
        data = b"an onnx model, say"
        sha = hashlib.sha256(data).hexdigest()

        key, digest = store.put_content_addressed(data, prefix="models", suffix=".onnx")
        assert digest == sha
        assert key == f"models/{sha[:2]}/{sha}.onnx"
        assert store.get_bytes(key) == data

        from_stream = store.put_content_addressed(io.BytesIO(data), prefix="models", suffix=".onnx")
        assert from_stream == (key, sha)

        default_key, _ = store.put_content_addressed(b"other")
        assert default_key.startswith("blobs/")

    def test_content_addressed_put_is_idempotent(self, store: ArtifactStore, monkeypatch: pytest.MonkeyPatch) -> None:
        stream = _GeneratedStream(2 * MiB, seed=2)
        key, sha = store.put_content_addressed(stream, prefix="blobs/nested")
        assert sha == stream.sha256.hexdigest()
        assert key == f"blobs/nested/{sha[:2]}/{sha}"

        def no_rewrite(*args: object, **kwargs: object) -> str:
            raise AssertionError("an existing content-addressed object was rewritten")

        monkeypatch.setattr(store, "put_stream", no_rewrite)
        monkeypatch.setattr(store, "put_bytes", no_rewrite)
        again = store.put_content_addressed(_GeneratedStream(2 * MiB, seed=2), prefix="blobs/nested")
        assert again == (key, sha)
        assert list(store.list("blobs/")) == [key]

    # -- existence, deletion, listing -------------------------------------------------------
    def test_exists_and_delete(self, store: ArtifactStore) -> None:
        assert not store.exists("d/x")
        store.put_bytes("d/x", b"1")
        assert store.exists("d/x")
        assert not store.exists("d")  # a "directory" is not an artifact
        store.delete("d/x")
        assert not store.exists("d/x")
        store.delete("d/x")  # deleting a missing key is fine
        store.delete("never/was")
        assert list(store.list()) == []

    def test_list_is_sorted_and_filters_by_string_prefix(self, store: ArtifactStore) -> None:
        for key in ORDER_KEYS:
            store.put_bytes(key, b"k")
        listed = store.list()
        assert isinstance(listed, Iterator)
        assert list(listed) == sorted(ORDER_KEYS, key=lambda k: k.encode())
        assert list(store.list("a/")) == ["a/b", "a/c/d"]
        assert list(store.list("a")) == ["a b/y", "a-b", "a.txt", "a/b", "a/c/d", "a0", "ab/x"]
        assert list(store.list("a/c")) == ["a/c/d"]
        assert list(store.list("nothing/")) == []

    def test_list_returns_every_key_past_1000(self, store: ArtifactStore) -> None:
        keys = [f"many/{i:05d}" for i in range(1100)]
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(lambda k: store.put_bytes(k, b""), keys))
        store.put_bytes("many-not/x", b"")
        store.put_bytes("before", b"")
        assert list(store.list("many/")) == keys
        assert len(list(store.list())) == 1102

    # -- errors -----------------------------------------------------------------------------
    def test_missing_key_raises_not_found_naming_key_and_store(self, store: ArtifactStore) -> None:
        for call in (store.get_bytes, store.open, store.stat):
            with pytest.raises(ArtifactNotFoundError) as info:
                call("no/such/key.bin")
            message = str(info.value)
            assert "no/such/key.bin" in message
            assert store.location in message
            assert "\n" not in message
            assert isinstance(info.value, ArtifactStoreError)
            assert isinstance(info.value, NotFoundError)

    @pytest.mark.parametrize("key", list(BAD_KEYS.values()), ids=list(BAD_KEYS))
    def test_bad_keys_are_rejected(self, store: ArtifactStore, key: str) -> None:
        operations = (
            lambda: store.put_bytes(key, b"x"),
            lambda: store.put_stream(key, io.BytesIO(b"x")),
            lambda: store.get_bytes(key),
            lambda: store.open(key),
            lambda: store.exists(key),
            lambda: store.stat(key),
            lambda: store.delete(key),
            lambda: store.uri(key),
            lambda: store.url(key),
        )
        for operation in operations:
            with pytest.raises(ArtifactStoreError) as info:
                operation()
            assert not isinstance(info.value, ArtifactNotFoundError)
            assert "\n" not in str(info.value)
            assert "invalid artifact key" in str(info.value)
        assert list(store.list()) == []

    def test_bad_list_prefix_is_rejected(self, store: ArtifactStore) -> None:
        for prefix in ("/abs", "../up", "a//b"):
            with pytest.raises(ArtifactStoreError, match="invalid artifact key prefix"):
                list(store.list(prefix))

    # -- addressing -------------------------------------------------------------------------
    def test_url_can_be_fetched(self, store: ArtifactStore) -> None:
        store.put_bytes("share/report.json", b'{"ok": true}', content_type="application/json")
        url = store.url("share/report.json", expires_s=600)
        with urllib.request.urlopen(url, timeout=10) as response:  # no store credentials
            assert response.read() == b'{"ok": true}'

    def test_uri_round_trip(self, store: ArtifactStore) -> None:
        key = "odd names/a+b=c%20d/é #1.bin"
        uri = store.put_bytes(key, b"odd")
        assert store.key_from_uri(uri) == key
        assert store.get_bytes(key) == b"odd"
        assert list(store.list("odd names/")) == [key]
        for foreign in ("s3://some-other-bucket/x", "file:///somewhere/else/x", "https://example.com/x"):
            with pytest.raises(ArtifactStoreError):
                store.key_from_uri(foreign)

    def test_pyarrow_filesystem_round_trip(self, store: ArtifactStore) -> None:
        import pyarrow as pa  # a core dependency: missing is a failure, not a skip
        import pyarrow.dataset as ds
        import pyarrow.parquet as pq

        table = pa.table({"workload": ["w1", "w2", "w3"], "run_s": [0.5, 0.25, 0.125]})

        fs, base = store.filesystem()
        fs.create_dir(f"{base}/ds", recursive=True)  # a no-op marker on S3, needed locally
        pq.write_table(table, f"{base}/ds/x.parquet", filesystem=fs)
        assert "ds/x.parquet" in list(store.list("ds/"))
        assert pq.read_table(f"{base}/ds/x.parquet", filesystem=fs).equals(table)
        assert pq.read_table(io.BytesIO(store.get_bytes("ds/x.parquet"))).equals(table)

        # write_dataset creates directories (empty marker objects on S3): never listed as keys.
        ds.write_dataset(table, f"{base}/ds2", format="parquet", filesystem=fs)
        assert list(store.list("ds2")) == ["ds2/part-0.parquet"]

        # And the other way round: a key stored through the store is a file for pyarrow.
        sink = io.BytesIO()
        pq.write_table(table, sink)
        store.put_bytes("ds3/y.parquet", sink.getvalue())
        assert ds.dataset(f"{base}/ds3", filesystem=fs, format="parquet").to_table().equals(table)

    # -- large objects ----------------------------------------------------------------------
    def test_large_stream_of_unknown_length(self, store: ArtifactStore) -> None:
        size = 50 * MiB + 12345  # more than three 16 MiB parts on S3
        stream = _GeneratedStream(size, seed=3)
        store.put_stream("large/blob.bin", stream)
        assert store.stat("large/blob.bin") == size
        assert _streamed_sha256(store, "large/blob.bin") == (stream.sha256.hexdigest(), size)
