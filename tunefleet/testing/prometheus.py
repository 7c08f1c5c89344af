"""A real Prometheus and Pushgateway (Debian packages ``prometheus``, ``prometheus-pushgateway``) on loopback.

Both start in well under a second on free ports, in temporary directories, logging to files.
Prometheus scrapes the given targets every ``scrape_interval`` with ``honor_labels: true`` (what
a Pushgateway needs: the pushed ``job``/grouping labels are kept).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from tunefleet.testing.ports import free_port

HOST = "127.0.0.1"


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (OSError, ValueError):
        return False


def _binary(name: str) -> str:
    path = shutil.which(name)
    if not path:
        raise RuntimeError(f"{name} not found on PATH; install the Debian packages: "
                           "apt-get install -y prometheus prometheus-pushgateway")
    return path


class _Server:
    """A child process on a free loopback port, in a temporary directory, logging to a file."""

    name = "server"

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"tunefleet-{self.name}-"))
        self.log_path = self.dir / "log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> None:
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT, cwd=self.dir,
                                         start_new_session=True)
        try:
            wait_until(lambda: self.proc is not None and self.proc.poll() is None and _http_ok(self.url + "/-/ready"),
                       timeout, f"{self.name} on {self.url}")
        except TimeoutError as exc:
            self.stop()
            raise RuntimeError(f"{self.name} did not become ready: {exc}\n{self.log_tail()}") from None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> _Server:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class PushgatewayServer(_Server):
    """``prometheus-pushgateway`` on loopback; :attr:`address` is what ``FleetMetrics.push`` takes."""

    name = "pushgateway"

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def command(self) -> list[str]:
        return [_binary("prometheus-pushgateway"), f"--web.listen-address={self.address}",
                f"--persistence.file={self.dir / 'metrics'}"]


class PrometheusServer(_Server):
    """``prometheus`` on loopback scraping the given targets every ``scrape_interval`` (honor_labels on)."""

    name = "prometheus"

    def __init__(self, targets: list[str], scrape_interval: str = "1s") -> None:
        super().__init__()
        self.targets = targets
        self.scrape_interval = scrape_interval

    def command(self) -> list[str]:
        config = self.dir / "prometheus.yml"
        # JSON is YAML: no YAML library needed to write the config.
        config.write_text(json.dumps({
            "global": {"scrape_interval": self.scrape_interval, "evaluation_interval": self.scrape_interval},
            "scrape_configs": [{"job_name": "pushgateway", "honor_labels": True,
                                "static_configs": [{"targets": self.targets}]}],
        }, indent=2))
        return [_binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={self.dir / 'data'}",
                f"--web.listen-address={HOST}:{self.port}", "--log.level=warn"]

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query; raises on an error answer."""
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        if body.get("status") != "success":
            raise RuntimeError(f"query {promql!r} failed: {body}")
        return list(body["data"]["result"])
