"""The artifact store interface: one small API over a local directory or an S3 bucket.

Keys are relative, ``/``-separated paths (``models/ab/ab12...onnx``). Every backend validates
them the same way (:func:`check_key`), lists them in the same (byte-wise sorted) order, and
reports a missing key with :class:`~tunefleet.errors.ArtifactNotFoundError`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import logging
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, BinaryIO

from tunefleet.errors import ArtifactNotFoundError, ArtifactStoreError

if TYPE_CHECKING:
    import pyarrow.fs

logger = logging.getLogger(__name__)

#: Chunk size used when copying and hashing streams.
CHUNK_SIZE = 1024 * 1024

#: S3's limit on the length of an object name, in UTF-8 bytes.
MAX_KEY_BYTES = 1024


def _key_problem(key: object, *, allow_empty: bool = False, allow_trailing_slash: bool = False) -> str | None:
    """Say what is wrong with ``key``, or return None when it is a valid key."""
    if not isinstance(key, str):
        return f"must be a string, not {type(key).__name__}"
    if not key:
        return None if allow_empty else "must not be empty"
    if key.startswith("/"):
        return "must be relative (no leading '/')"
    if "\\" in key:
        return "must use '/' as separator (no '\\')"
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in key):
        return "must not contain control characters"
    if len(key.encode("utf-8", errors="surrogatepass")) > MAX_KEY_BYTES:
        return f"must be at most {MAX_KEY_BYTES} bytes long"
    body = key[:-1] if allow_trailing_slash and key.endswith("/") else key
    for part in body.split("/"):
        if part == "":
            return "must not contain empty path segments ('//' or a trailing '/')"
        if part in {".", ".."}:
            return f"must not contain '{part}' segments"
    return None


def check_key(key: str) -> str:
    """Validate an artifact key and return it unchanged.

    Parameters
    ----------
    key
        A relative, ``/``-separated path such as ``"models/ab/abcd.onnx"``.

    Returns
    -------
    str
        The same key.

    Raises
    ------
    ArtifactStoreError
        When the key is empty, absolute, contains ``..``/``.``/empty segments, a backslash or
        control characters, or is longer than 1024 bytes.
    """
    problem = _key_problem(key)
    if problem is not None:
        raise ArtifactStoreError(f"invalid artifact key {key!r}: {problem}")
    return key


def check_prefix(prefix: str) -> str:
    """Validate a listing prefix (``""``, ``"runs/"``, ``"runs/a"``) and return it unchanged.

    Raises
    ------
    ArtifactStoreError
        When the prefix would not be the start of a valid key.
    """
    problem = _key_problem(prefix, allow_empty=True, allow_trailing_slash=True)
    if problem is not None:
        raise ArtifactStoreError(f"invalid artifact key prefix {prefix!r}: {problem}")
    return prefix


def content_key(sha256: str, prefix: str = "blobs", suffix: str = "") -> str:
    """The key a content-addressed blob with this digest is stored under.

    Parameters
    ----------
    sha256
        Hex digest of the content.
    prefix
        Leading key segment(s), e.g. ``"models"``.
    suffix
        Appended to the digest, e.g. ``".onnx"``.

    Returns
    -------
    str
        ``f"{prefix}/{sha256[:2]}/{sha256}{suffix}"``, validated.
    """
    return check_key(f"{prefix}/{sha256[:2]}/{sha256}{suffix}")


@dataclass(frozen=True)
class StoredObject:
    """One object of :meth:`ArtifactStore.list_objects`: its key, its size and when it was written."""

    key: str
    size: int
    modified: dt.datetime
    """When the object was last written, timezone-aware (UTC): the backend's clock (S3's server's)."""


class ArtifactStore(ABC):
    """Where artifacts (models, datasets, cost models) live, addressed by key.

    Implementations: :class:`~tunefleet.store.LocalStore` (a directory) and
    :class:`~tunefleet.store.S3Store` (an S3 bucket, optionally under a prefix). Both are
    checked by the same contract suite, :mod:`tunefleet.testing.store_contract`.
    """

    # -- description ------------------------------------------------------------------------
    @property
    @abstractmethod
    def location(self) -> str:
        """Human-readable location of the store, used in error messages."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location})"

    # -- writing ----------------------------------------------------------------------------
    def put_bytes(self, key: str, data: bytes, content_type: str | None = None) -> str:
        """Store ``data`` under ``key``, replacing any previous object.

        Parameters
        ----------
        key
            Artifact key (see :func:`check_key`).
        data
            The content.
        content_type
            MIME type recorded by backends that keep one (S3); ignored locally.

        Returns
        -------
        str
            The artifact URI (see :meth:`uri`).
        """
        return self.put_stream(key, io.BytesIO(data), length=len(data), content_type=content_type)

    @abstractmethod
    def put_stream(
        self,
        key: str,
        stream: BinaryIO,
        length: int | None = None,
        content_type: str | None = None,
    ) -> str:
        """Store the content read from ``stream`` under ``key``.

        Parameters
        ----------
        key
            Artifact key.
        stream
            A readable binary stream; read to its end, or for ``length`` bytes when given.
            It need not be seekable.
        length
            Number of bytes to store, or None when unknown (S3 then uploads in parts).
        content_type
            MIME type recorded by backends that keep one.

        Returns
        -------
        str
            The artifact URI.

        Raises
        ------
        ArtifactStoreError
            When the stream ends before ``length`` bytes, or the backend fails.
        """

    def put_content_addressed(
        self,
        data: bytes | BinaryIO,
        prefix: str = "blobs",
        suffix: str = "",
        content_type: str | None = None,
    ) -> tuple[str, str]:
        """Store content under a key derived from its SHA-256, once.

        A stream is hashed while it is spooled to a temporary file, so a large object is
        never held in memory. If an object already exists under the derived key it is not
        rewritten.

        Parameters
        ----------
        data
            The content, as bytes or a readable binary stream.
        prefix
            Leading key segment(s).
        suffix
            Appended to the digest (e.g. ``".onnx"``).
        content_type
            MIME type recorded by backends that keep one.

        Returns
        -------
        tuple[str, str]
            ``(key, sha256)`` with ``key == f"{prefix}/{sha256[:2]}/{sha256}{suffix}"``.
        """
        if isinstance(data, (bytes, bytearray, memoryview)):
            payload = bytes(data)
            sha = hashlib.sha256(payload).hexdigest()
            key = content_key(sha, prefix, suffix)
            if self.exists(key):
                logger.debug("content-addressed %s already in %s", key, self.location)
            else:
                self.put_bytes(key, payload, content_type=content_type)
            return key, sha

        check_prefix(f"{prefix}/")
        digest = hashlib.sha256()
        size = 0
        with tempfile.TemporaryFile(prefix="tunefleet-spool-") as spool:
            while chunk := data.read(CHUNK_SIZE):
                digest.update(chunk)
                spool.write(chunk)
                size += len(chunk)
            sha = digest.hexdigest()
            key = content_key(sha, prefix, suffix)
            if self.exists(key):
                logger.debug("content-addressed %s already in %s", key, self.location)
            else:
                spool.seek(0)
                self.put_stream(key, spool, length=size, content_type=content_type)  # type: ignore[arg-type]
        return key, sha

    # -- reading ----------------------------------------------------------------------------
    def get_bytes(self, key: str) -> bytes:
        """Return the whole content stored under ``key``.

        Raises
        ------
        ArtifactNotFoundError
            When there is no object under ``key``.
        """
        with self.open(key) as stream:
            return stream.read()

    @abstractmethod
    def open(self, key: str) -> BinaryIO:
        """Open the object under ``key`` for reading; the caller closes the stream.

        Raises
        ------
        ArtifactNotFoundError
            When there is no object under ``key``.
        """

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether an object is stored under ``key``."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[str]:
        """All keys starting with ``prefix`` (a string prefix, not only a directory).

        Returns
        -------
        Iterator[str]
            Keys in byte-wise (UTF-8) sorted order, however many there are.
        """

    @abstractmethod
    def list_objects(self, prefix: str = "") -> Iterator[StoredObject]:
        """As :meth:`list`, with each object's size and last-modified time (what ``tunefleet gc``
        needs to tell an old unregistered file from one a running export is still writing).

        Returns
        -------
        Iterator[StoredObject]
            In the order of :meth:`list`.
        """

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete the object under ``key``; deleting a missing key is not an error."""

    @abstractmethod
    def stat(self, key: str) -> int:
        """Size in bytes of the object under ``key``.

        Raises
        ------
        ArtifactNotFoundError
            When there is no object under ``key``.
        """

    # -- addressing -------------------------------------------------------------------------
    @abstractmethod
    def url(self, key: str, expires_s: int = 3600) -> str:
        """A URL from which the object can be fetched without store credentials.

        S3: a presigned GET URL valid for ``expires_s`` seconds. Local: a ``file://`` URL.
        The key's existence is not checked.
        """

    @abstractmethod
    def uri(self, key: str) -> str:
        """The stable identifier of ``key`` in this store (``file:///...`` or ``s3://...``)."""

    @abstractmethod
    def key_from_uri(self, uri: str) -> str:
        """The key that :meth:`uri` turned into ``uri``.

        Raises
        ------
        ArtifactStoreError
            When ``uri`` does not point into this store.
        """

    @abstractmethod
    def filesystem(self) -> tuple[pyarrow.fs.FileSystem, str]:
        """A pyarrow filesystem and base path addressing the same objects as this store.

        A file written at ``f"{base}/{key}"`` through the filesystem is visible as ``key``
        through the store, so Parquet datasets can be written and read with pyarrow.
        ``pyarrow.dataset.write_dataset`` creates the directories it needs; before writing a
        single file with ``pyarrow.parquet.write_table`` call
        ``fs.create_dir(parent, recursive=True)`` (a local filesystem needs it; on S3 it
        makes an empty marker object, which :meth:`list` never reports).
        """

    # -- helpers for implementations --------------------------------------------------------
    def _not_found(self, key: str) -> ArtifactNotFoundError:
        return ArtifactNotFoundError(f"no artifact {key!r} in {self.location}")


def copy_stream(src: BinaryIO, dst: BinaryIO, length: int | None) -> int:
    """Copy ``src`` to ``dst``: everything, or exactly ``length`` bytes.

    Returns
    -------
    int
        Number of bytes copied.

    Raises
    ------
    ArtifactStoreError
        When ``length`` is given and ``src`` ends early.
    """
    if length is None:
        copied = 0
        while chunk := src.read(CHUNK_SIZE):
            dst.write(chunk)
            copied += len(chunk)
        return copied
    remaining = length
    while remaining > 0:
        chunk = src.read(min(CHUNK_SIZE, remaining))
        if not chunk:
            raise ArtifactStoreError(f"stream ended after {length - remaining} of {length} bytes")
        dst.write(chunk)
        remaining -= len(chunk)
    return length
