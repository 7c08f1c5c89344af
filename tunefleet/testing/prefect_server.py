"""A real Prefect server (on its own PostgreSQL database) and process workers, for tests and benches.

Example
-------
>>> with PostgresServer() as pg, PrefectServer(pg.url(pg.create_database(), driver="asyncpg")) as server:  # doctest: +SKIP
...     with server.worker("tunefleet-x86", env={"TUNEFLEET_HOME": home}) as worker:
...         ...  # server.env() has PREFECT_API_URL for clients
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType

from tunefleet.testing.ports import free_port

HOST = "127.0.0.1"


def _prefect_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "prefect", *args]


class PrefectServer:
    """``prefect server start`` on a free loopback port; its database is ``database_url`` (asyncpg) or SQLite.

    Parameters
    ----------
    database_url:
        ``postgresql+asyncpg://...`` for a PostgreSQL-backed server; None for SQLite in its home.
    startup_timeout_s:
        How long to wait for ``/api/health``.
    """

    def __init__(self, database_url: str | None = None, *, startup_timeout_s: float = 120.0,
                 extra_env: Mapping[str, str] | None = None) -> None:
        self.database_url = database_url
        self.startup_timeout_s = startup_timeout_s
        self.extra_env = dict(extra_env or {})
        self.port = 0
        self.home: Path | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def api_url(self) -> str:
        return f"http://{HOST}:{self.port}/api"

    @property
    def ui_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def env(self, **extra: str) -> dict[str, str]:
        """An environment for Prefect clients and workers of this server."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update({
            "PREFECT_API_URL": self.api_url,
            # the UI served on this port must call this port's API (it defaults to port 4200)
            "PREFECT_UI_API_URL": self.api_url,
            "PREFECT_HOME": str(self.home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_LOGGING_EXTRA_LOGGERS": "tunefleet",
            "PREFECT_LOGGING_TO_API_WHEN_MISSING_FLOW": "ignore",
        })
        env.update(extra)
        return env

    def start(self) -> PrefectServer:
        self._tmp = tempfile.TemporaryDirectory(prefix="tunefleet-prefect-")
        self.home = Path(self._tmp.name)
        self.port = free_port()
        env = self.env(**self.extra_env)
        env.pop("PREFECT_API_URL")
        if self.database_url:
            env["PREFECT_API_DATABASE_CONNECTION_URL"] = self.database_url
        log = open(self.home / "server.log", "wb")  # noqa: SIM115 - lives as long as the server
        self._proc = subprocess.Popen(_prefect_cmd("server", "start", "--host", HOST, "--port", str(self.port)),
                                      env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"prefect server exited with {self._proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"prefect server not healthy within {self.startup_timeout_s:.0f}s")

    def log_tail(self, n: int = 4000) -> str:
        assert self.home is not None
        path = self.home / "server.log"
        return path.read_text(errors="replace")[-n:] if path.exists() else ""

    def stop(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait(timeout=10)
        self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> PrefectServer:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    @contextlib.contextmanager
    def worker(self, pool: str, *, env: Mapping[str, str] | None = None, log_path: Path | None = None,
               limit: int | None = None) -> Iterator[Worker]:
        """A ``prefect worker start --pool POOL`` process for this server, stopped afterwards."""
        w = Worker(self, pool, env=env, log_path=log_path, limit=limit).start()
        try:
            yield w
        finally:
            w.kill()


class Worker:
    """A Prefect worker process; :meth:`kill` takes its flow-run and builder processes with it."""

    def __init__(self, server: PrefectServer, pool: str, *, env: Mapping[str, str] | None = None,
                 log_path: Path | None = None, limit: int | None = None) -> None:
        self.server, self.pool = server, pool
        self.env = server.env(**dict(env or {}))
        assert server.home is not None
        self.log_path = log_path or server.home / f"worker-{pool}-{time.monotonic_ns()}.log"
        self.limit = limit
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        args = ["worker", "start", "--pool", self.pool]
        if self.limit:
            args += ["--limit", str(self.limit)]
        log = open(self.log_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(_prefect_cmd(*args), env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=str(self.server.home))
        return self

    def log_tail(self, n: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n:] if self.log_path.exists() else ""

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the worker and every process below it, as when its node dies.

        Prefect starts each flow run in a session of its own, so the process group is not
        enough: the descendants are collected first, then all are signalled.
        """
        import psutil

        if self.proc is None:
            return
        try:
            procs = [psutil.Process(self.proc.pid)]
            procs += procs[0].children(recursive=True)
        except psutil.NoSuchProcess:
            procs = []
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.send_signal(sig)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        psutil.wait_procs(procs, timeout=30)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=30)
        self.proc = None


@contextlib.contextmanager
def flow_harness(startup_timeout_s: float = 120.0) -> Iterator[None]:
    """Prefect's test harness, with flow and task results persisted in a temporary directory.

    ``flow(..., return_state=True).result()`` reads the state the engine holds, unless the API
    answered the final state proposal with a state of its own (a busy harness server retried a
    request and rejected its duplicate): that state carries no data, only a reference to a
    persisted result, so without persistence the result is lost (``MissingResult``).
    """
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH, PREFECT_RESULTS_PERSIST_BY_DEFAULT, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    with tempfile.TemporaryDirectory(prefix="tunefleet-prefect-results-") as storage, \
            prefect_test_harness(server_startup_timeout=int(startup_timeout_s)), \
            temporary_settings(updates={PREFECT_RESULTS_PERSIST_BY_DEFAULT: True,
                                        PREFECT_LOCAL_STORAGE_PATH: storage}):
        yield
