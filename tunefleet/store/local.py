"""The embedded artifact store: a directory on the local filesystem."""

from __future__ import annotations

import datetime as dt
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO
from urllib.parse import urlparse
from urllib.request import url2pathname

from tunefleet.errors import ArtifactStoreError
from tunefleet.store.base import ArtifactStore, StoredObject, check_key, check_prefix, copy_stream

if TYPE_CHECKING:
    import pyarrow.fs

logger = logging.getLogger(__name__)

#: Name prefix of in-flight temporary files; they are never listed.
TMP_PREFIX = ".tunefleet-tmp-"


class LocalStore(ArtifactStore):
    """Artifacts as files under ``root``; ``key`` ``a/b.bin`` is the file ``root/a/b.bin``.

    Writes are atomic: content goes to a temporary file in the target directory, is flushed
    to disk, and is renamed over the target with :func:`os.replace`, so readers see either
    the old or the new object, never a partial one.

    Parameters
    ----------
    root
        The artifact directory; created (with parents) if missing.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().resolve()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ArtifactStoreError(f"cannot create the artifact directory {self.root}: {exc.strerror or exc}") from None

    @property
    def location(self) -> str:
        return f"local store {self.root}"

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    # -- writing ----------------------------------------------------------------------------
    def put_stream(
        self,
        key: str,
        stream: BinaryIO,
        length: int | None = None,
        content_type: str | None = None,
    ) -> str:
        path = self._path(key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ArtifactStoreError(
                f"cannot store {key!r} in {self.location}: a parent of it is already an artifact"
            ) from None
        except OSError as exc:
            raise ArtifactStoreError(f"cannot store {key!r} in {self.location}: {exc.strerror or exc}") from None
        if path.is_dir():
            raise ArtifactStoreError(f"cannot store {key!r} in {self.location}: other artifacts live under it")

        fd, tmp_name = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as tmp:
                size = copy_stream(stream, tmp, length)
                tmp.flush()
                os.fsync(tmp.fileno())
            os.chmod(tmp_name, 0o644)
            os.replace(tmp_name, path)
        except BaseException as exc:
            try:
                os.unlink(tmp_name)
            except FileNotFoundError:
                pass
            if isinstance(exc, OSError):
                raise ArtifactStoreError(f"cannot store {key!r} in {self.location}: {exc.strerror or exc}") from None
            raise
        logger.debug("stored %s (%d bytes) in %s", key, size, self.location)
        return self.uri(key)

    # -- reading ----------------------------------------------------------------------------
    def open(self, key: str) -> BinaryIO:
        path = self._path(key)
        try:
            return path.open("rb")
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise self._not_found(key) from None
        except OSError as exc:
            raise ArtifactStoreError(f"cannot read {key!r} from {self.location}: {exc.strerror or exc}") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def list(self, prefix: str = "") -> Iterator[str]:
        check_prefix(prefix)
        directory, _, _ = prefix.rpartition("/")
        start = self.root.joinpath(*directory.split("/")) if directory else self.root
        keys: list[str] = []
        if start.is_dir():
            for dirpath, dirnames, filenames in os.walk(start):
                rel_dir = os.path.relpath(dirpath, self.root)
                base = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
                # Prune directories that cannot hold a matching key.
                dirnames[:] = [d for d in dirnames if _may_match(base + d + "/", prefix)]
                for name in filenames:
                    if name.startswith(TMP_PREFIX):
                        continue
                    key = base + name
                    if key.startswith(prefix):
                        keys.append(key)
        keys.sort()  # code-point order == UTF-8 byte order, as S3 lists
        return iter(keys)

    def list_objects(self, prefix: str = "") -> Iterator[StoredObject]:
        found = []
        for key in self.list(prefix):
            try:
                info = self._path(key).stat()
            except FileNotFoundError:
                continue  # deleted since it was listed
            except OSError as exc:
                raise ArtifactStoreError(f"cannot look up {key!r} in {self.location}: {exc.strerror or exc}") from None
            found.append(StoredObject(key, info.st_size, dt.datetime.fromtimestamp(info.st_mtime, dt.timezone.utc)))
        return iter(found)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except (FileNotFoundError, NotADirectoryError):
            return
        except IsADirectoryError:
            return  # a "directory" is not an artifact
        except OSError as exc:
            raise ArtifactStoreError(f"cannot delete {key!r} from {self.location}: {exc.strerror or exc}") from None
        logger.debug("deleted %s from %s", key, self.location)

    def stat(self, key: str) -> int:
        path = self._path(key)
        try:
            info = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise self._not_found(key) from None
        if not path.is_file():
            raise self._not_found(key)
        return info.st_size

    # -- addressing -------------------------------------------------------------------------
    def url(self, key: str, expires_s: int = 3600) -> str:
        return self._path(key).as_uri()

    def uri(self, key: str) -> str:
        return self._path(key).as_uri()

    def key_from_uri(self, uri: str) -> str:
        parsed = urlparse(uri)
        if parsed.scheme != "file" or parsed.netloc not in {"", "localhost"}:
            raise ArtifactStoreError(f"{uri!r} is not a file:// URI of {self.location}")
        path = Path(url2pathname(parsed.path))  # url2pathname unquotes
        try:
            rel = path.relative_to(self.root)
        except ValueError:
            raise ArtifactStoreError(f"{uri!r} is not inside {self.location}") from None
        return check_key(rel.as_posix())

    def filesystem(self) -> tuple[pyarrow.fs.FileSystem, str]:
        import pyarrow.fs

        return pyarrow.fs.LocalFileSystem(), str(self.root)


def _may_match(directory: str, prefix: str) -> bool:
    """Whether keys under ``directory`` (ending in '/') can start with ``prefix``."""
    return directory.startswith(prefix) or prefix.startswith(directory)
