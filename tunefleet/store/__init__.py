"""The artifact store: models, datasets and cost models, addressed by key.

One interface (:class:`ArtifactStore`), two backends: :class:`LocalStore` (a directory, the
embedded default) and :class:`S3Store` (any S3 service). :func:`open_store` builds the one the
settings ask for. Heavy dependencies (minio, pyarrow) are imported only when used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunefleet.errors import ConfigError
from tunefleet.store.base import ArtifactStore, StoredObject, check_key, content_key
from tunefleet.store.local import LocalStore
from tunefleet.store.s3 import S3Store

if TYPE_CHECKING:
    from tunefleet.config import Settings

__all__ = ["ArtifactStore", "LocalStore", "S3Store", "StoredObject", "check_key", "content_key", "open_store"]


def open_store(settings: Settings) -> ArtifactStore:
    """Build the artifact store that ``settings`` describe.

    Parameters
    ----------
    settings
        ``store="local"`` uses ``settings.effective_store_path``; ``store="s3"`` uses the
        ``s3_*`` settings (endpoint, credentials, bucket, prefix, TLS, region, timeout,
        retries).

    Returns
    -------
    ArtifactStore
        A ready store; an S3 bucket is created if missing.

    Raises
    ------
    ArtifactStoreError
        When the store cannot be reached or used (e.g. S3 rejects the credentials).
    ConfigError
        For an unknown store kind.
    """
    if settings.store == "local":
        return LocalStore(settings.effective_store_path)
    if settings.store == "s3":
        return S3Store(
            settings.s3_endpoint,
            settings.s3_access_key,
            settings.s3_secret_key.get_secret_value(),
            settings.s3_bucket,
            prefix=settings.s3_prefix,
            secure=settings.s3_secure,
            region=settings.s3_region,
            timeout_s=settings.s3_timeout_s,
            retries=settings.s3_retries,
            connect_timeout_s=settings.s3_connect_timeout_s,
        )
    raise ConfigError(f"invalid setting TUNEFLEET_STORE: unknown store {settings.store!r}; use local or s3")
