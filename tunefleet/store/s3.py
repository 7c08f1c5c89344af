"""The cluster artifact store: an S3 bucket (MinIO, SeaweedFS, AWS...) through the minio SDK."""

from __future__ import annotations

import io
import logging
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, BinaryIO

from tunefleet.config import mask_url
from tunefleet.errors import ArtifactStoreError, ArtifactStoreUnavailableError, one_line
from tunefleet.store.base import CHUNK_SIZE, ArtifactStore, StoredObject, check_key, check_prefix

if TYPE_CHECKING:
    import pyarrow.fs
    from minio import Minio
    from minio.error import S3Error

logger = logging.getLogger(__name__)

#: Part size of multipart uploads (streams of unknown length, large objects).
PART_SIZE = 16 * 1024 * 1024
#: S3 allows at most this many parts per multipart upload.
_MAX_PARTS = 10_000
#: Longest validity of a presigned URL that S3 (SigV4) accepts.
MAX_URL_EXPIRY_S = 7 * 24 * 3600

_CREDENTIAL_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "InvalidToken",
        "ExpiredToken",
        "AuthorizationHeaderMalformed",
    }
)
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NoSuchObject", "NotFound", "ResourceNotFound"})
_BUCKET_RACE_CODES = frozenset({"BucketAlreadyOwnedByYou", "BucketAlreadyExists"})
_CONNECTION_PREFIX = re.compile(r"^\w*Connection(?:Pool)?\(host=[^)]*\):\s*")


class S3Store(ArtifactStore):
    """Artifacts as objects in an S3 bucket, under an optional key prefix.

    Key ``a/b.bin`` is the object ``{prefix}a/b.bin`` of ``bucket``. The bucket is created
    when missing, which also checks the endpoint and the credentials at construction time.

    Parameters
    ----------
    endpoint
        ``host:port`` of the S3 service, without a scheme.
    access_key, secret_key
        Credentials.
    bucket
        Bucket name; created if missing.
    prefix
        Key prefix inside the bucket (``""`` or e.g. ``"tunefleet/prod"``).
    secure
        Use HTTPS.
    region
        Bucket region; None lets the SDK ask the service (pyarrow then assumes us-east-1).
    timeout_s
        Connect and read timeout of each HTTP request, in seconds.
    retries
        Retries of a failed request (connection errors, timeouts, HTTP 500/502/503/504).
        The worst case for an unreachable endpoint is about ``timeout_s * (retries + 1)``;
        a refused connection fails at once.

    Raises
    ------
    ArtifactStoreError
        When the endpoint cannot be reached, rejects the credentials, or the bucket cannot be
        created.
    """

    def __init__(
        self,
        endpoint: str,
        access_key: str,
        secret_key: str,
        bucket: str,
        *,
        prefix: str = "",
        secure: bool = False,
        region: str | None = None,
        timeout_s: float = 10.0,
        retries: int = 2,
        connect_timeout_s: float = 2.5,
    ) -> None:
        if "://" in endpoint or "/" in endpoint or "@" in endpoint or not endpoint:
            raise ArtifactStoreError(f"invalid S3 endpoint {mask_url(endpoint)!r}: give host:port without a scheme, "
                                     "path or credentials (those are the access and secret keys)")
        if timeout_s <= 0:
            raise ArtifactStoreError(f"invalid S3 timeout {timeout_s!r}: must be positive")
        if retries < 0:
            raise ArtifactStoreError(f"invalid S3 retry count {retries!r}: must be >= 0")
        prefix = prefix.strip("/")
        if prefix:
            check_prefix(prefix + "/")
            prefix += "/"
        self.endpoint = endpoint
        self.bucket = bucket
        self.prefix = prefix
        self.secure = secure
        self.region = region
        self.timeout_s = float(timeout_s)
        # Worst case on a silent host: (retries + 1) x connect timeout + backoff, < 10 s by default.
        self.connect_timeout_s = min(float(connect_timeout_s), self.timeout_s)
        self.retries = int(retries)
        self._access_key = access_key
        self._secret_key = secret_key
        self._client = self._make_client()
        self._ensure_bucket()

    # -- setup ------------------------------------------------------------------------------
    def _make_client(self) -> Minio:
        import certifi
        import urllib3
        from minio import Minio
        from minio.helpers import check_bucket_name

        try:
            check_bucket_name(self.bucket, strict=True)
        except ValueError:
            raise ArtifactStoreError(
                f"invalid S3 bucket name {self.bucket!r}: use 3-63 lowercase letters, digits, '-' and '.'"
            ) from None
        http = urllib3.PoolManager(
            timeout=urllib3.Timeout(connect=self.connect_timeout_s, read=self.timeout_s),
            maxsize=16,
            cert_reqs="CERT_REQUIRED",
            ca_certs=os.environ.get("SSL_CERT_FILE") or certifi.where(),
            # The SDK's default (5 min timeouts, 5 retries) stalls for minutes on a dead
            # endpoint. Retry a little, then let the S3 error (or the last one) through.
            retries=urllib3.Retry(
                total=self.retries,
                connect=self.retries,
                read=0,  # a hung server must not multiply the read timeout (and PUTs are not idempotent)
                status=self.retries,
                backoff_factor=0.2,
                status_forcelist=(500, 502, 503, 504),
                raise_on_status=False,
                respect_retry_after_header=False,
            ),
        )
        try:
            return Minio(
                self.endpoint,
                access_key=self._access_key or None,
                secret_key=self._secret_key or None,
                secure=self.secure,
                region=self.region,
                http_client=http,
            )
        except ValueError as exc:
            raise ArtifactStoreError(f"invalid S3 endpoint {self.endpoint!r}: {exc}") from None

    def _ensure_bucket(self) -> None:
        from minio.error import S3Error

        with self._errors("check the bucket"):
            if self._client.bucket_exists(self.bucket):
                return
            try:
                self._client.make_bucket(self.bucket, location=self.region)
            except S3Error as exc:
                if exc.code not in _BUCKET_RACE_CODES:
                    raise
            else:
                logger.info("created bucket %s at S3 %s", self.bucket, self.endpoint)

    @property
    def location(self) -> str:
        return f"s3://{self.bucket}/{self.prefix} at {self.endpoint}"

    def _object(self, key: str) -> str:
        return self.prefix + check_key(key)

    # -- error translation ------------------------------------------------------------------
    @contextmanager
    def _errors(self, action: str, key: str | None = None) -> Iterator[None]:
        """Turn SDK and transport errors into one-line :class:`ArtifactStoreError`."""
        from xml.etree.ElementTree import ParseError

        from minio.error import InvalidResponseError, S3Error, ServerError
        from urllib3.exceptions import HTTPError as TransportError
        from urllib3.exceptions import MaxRetryError

        try:
            yield
        except S3Error as exc:
            raise self._s3_error(exc, action, key) from None
        except (InvalidResponseError, ServerError, ParseError) as exc:
            raise ArtifactStoreUnavailableError(
                f"S3 at {self.endpoint} gave an unexpected response when asked to {action}"
                f"{'' if key is None else f' {key!r}'}: {one_line(exc)}"
            ) from None
        except TransportError as exc:
            reason = exc.reason if isinstance(exc, MaxRetryError) and exc.reason is not None else exc
            text = _CONNECTION_PREFIX.sub("", one_line(reason))
            attempts = self.retries + 1
            raise ArtifactStoreUnavailableError(
                f"cannot reach S3 at {self.endpoint} within {self.timeout_s:g}s "
                f"({attempts} attempt{'s' if attempts > 1 else ''}): {text}"
            ) from None

    def _s3_error(self, exc: S3Error, action: str, key: str | None) -> ArtifactStoreError:
        detail = f"{exc.code}: {one_line(exc.message)}"
        if exc.code in _NOT_FOUND_CODES and key is not None:
            return self._not_found(key)
        if exc.code in _CREDENTIAL_CODES:
            return ArtifactStoreError(
                f"S3 at {self.endpoint} rejected the credentials for bucket {self.bucket}: {detail}"
            )
        if exc.code == "NoSuchBucket":
            return ArtifactStoreError(f"bucket {self.bucket} does not exist at S3 {self.endpoint}: {detail}")
        target = "" if key is None else f" {key!r}"
        return ArtifactStoreError(f"S3 at {self.endpoint} failed to {action}{target} in bucket {self.bucket}: {detail}")

    # -- writing ----------------------------------------------------------------------------
    def put_stream(
        self,
        key: str,
        stream: BinaryIO,
        length: int | None = None,
        content_type: str | None = None,
    ) -> str:
        name = self._object(key)
        if length is None:
            size, part_size = -1, PART_SIZE
        else:
            if length < 0:
                raise ArtifactStoreError(f"invalid length {length} for {key!r}: must be >= 0")
            size, part_size = length, max(PART_SIZE, -(-length // _MAX_PARTS))
        with self._errors("store", key):
            try:
                self._client.put_object(
                    self.bucket,
                    name,
                    stream,
                    size,
                    content_type=content_type or "application/octet-stream",
                    part_size=part_size,
                )
            except OSError as exc:  # the SDK raises IOError when the stream ends early
                raise ArtifactStoreError(f"cannot store {key!r} in {self.location}: {one_line(exc)}") from None
        logger.debug("stored %s in %s", key, self.location)
        return self.uri(key)

    # -- reading ----------------------------------------------------------------------------
    def get_bytes(self, key: str) -> bytes:
        name = self._object(key)
        with self._errors("read", key):
            response = self._client.get_object(self.bucket, name)
            try:
                data = response.read()
            except BaseException:
                response.close()
                raise
            finally:
                response.release_conn()
        return data

    def open(self, key: str) -> BinaryIO:
        name = self._object(key)
        with self._errors("read", key):
            response = self._client.get_object(self.bucket, name)
        return io.BufferedReader(_ResponseReader(response, self, key), CHUNK_SIZE)  # type: ignore[return-value]

    def exists(self, key: str) -> bool:
        from minio.error import S3Error

        name = self._object(key)
        with self._errors("look up", key):
            try:
                self._client.stat_object(self.bucket, name)
            except S3Error as exc:
                if exc.code in _NOT_FOUND_CODES:
                    return False
                raise
        return True

    def list(self, prefix: str = "") -> Iterator[str]:
        return iter([obj.key for obj in self._listing(prefix)])

    def list_objects(self, prefix: str = "") -> Iterator[StoredObject]:
        return iter(self._listing(prefix))

    def _listing(self, prefix: str) -> list[StoredObject]:
        import datetime as dt

        check_prefix(prefix)
        cut = len(self.prefix)
        found: list[StoredObject] = []
        with self._errors("list", prefix or None):
            for obj in self._client.list_objects(self.bucket, prefix=self.prefix + prefix, recursive=True):
                name = obj.object_name
                if name is None or name.endswith("/"):
                    continue  # directory markers (pyarrow creates them; SeaweedFS lists them)
                modified = obj.last_modified or dt.datetime.now(dt.timezone.utc)
                if modified.tzinfo is None:
                    modified = modified.replace(tzinfo=dt.timezone.utc)
                found.append(StoredObject(name[cut:], int(obj.size or 0), modified))
        # SeaweedFS lists depth-first ("a/b" before "a.txt"), not in S3's byte order.
        found.sort(key=lambda o: o.key)
        return found

    def delete(self, key: str) -> None:
        from minio.error import S3Error

        name = self._object(key)
        with self._errors("delete", key):
            try:
                self._client.remove_object(self.bucket, name)
            except S3Error as exc:
                if exc.code not in _NOT_FOUND_CODES:
                    raise
        logger.debug("deleted %s from %s", key, self.location)

    def stat(self, key: str) -> int:
        name = self._object(key)
        with self._errors("look up", key):
            info = self._client.stat_object(self.bucket, name)
        return int(info.size or 0)

    # -- addressing -------------------------------------------------------------------------
    def url(self, key: str, expires_s: int = 3600) -> str:
        if not 1 <= expires_s <= MAX_URL_EXPIRY_S:
            raise ArtifactStoreError(f"invalid URL expiry {expires_s}s: must be between 1 and {MAX_URL_EXPIRY_S}")
        name = self._object(key)
        with self._errors("sign a URL for", key):
            return self._client.presigned_get_object(self.bucket, name, expires=timedelta(seconds=expires_s))

    def uri(self, key: str) -> str:
        return f"s3://{self.bucket}/{self._object(key)}"

    def key_from_uri(self, uri: str) -> str:
        base = f"s3://{self.bucket}/{self.prefix}"
        if not uri.startswith(base):
            raise ArtifactStoreError(f"{uri!r} is not inside {base}")
        return check_key(uri[len(base) :])

    def filesystem(self) -> tuple[pyarrow.fs.FileSystem, str]:
        import pyarrow.fs

        fs = pyarrow.fs.S3FileSystem(
            access_key=self._access_key or None,
            secret_key=self._secret_key or None,
            region=self.region or "us-east-1",
            endpoint_override=self.endpoint,
            scheme="https" if self.secure else "http",
            connect_timeout=self.timeout_s,
            request_timeout=self.timeout_s,
            retry_strategy=pyarrow.fs.AwsStandardS3RetryStrategy(max_attempts=self.retries + 1),
        )
        base = f"{self.bucket}/{self.prefix}".rstrip("/")
        return fs, base


class _ResponseReader(io.RawIOBase):
    """A streamed GET body; closing it releases (or drops) the HTTP connection."""

    def __init__(self, response: Any, store: S3Store, key: str) -> None:
        super().__init__()
        self._response = response
        self._store = store
        self._key = key
        self._eof = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        with self._store._errors("read", self._key):
            n = self._response.readinto(buffer)
        if n == 0 and len(buffer) > 0:
            self._eof = True
        return n

    def close(self) -> None:
        if not self.closed:
            try:
                if not self._eof:
                    self._response.close()  # unread body: the connection cannot be reused
            finally:
                self._response.release_conn()
                super().close()
