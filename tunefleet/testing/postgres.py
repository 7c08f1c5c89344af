"""A real PostgreSQL server for tests, started from Debian's binaries.

initdb and postgres refuse to run as root, so when we are root the server runs as the
``postgres`` OS user (see RECIPES). TCP connections from 127.0.0.1 need a password
(scram-sha-256) so wrong credentials can be tested; the local socket is trusted.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from tunefleet.testing.ports import free_port

PASSWORD = "tunefleet-test"


def find_pg_bin() -> Path:
    """Directory holding initdb/pg_ctl, newest version first."""
    env = os.environ.get("TUNEFLEET_PG_BIN")
    candidates = [env] if env else sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    for cand in candidates:
        if cand and (Path(cand) / "initdb").exists():
            return Path(cand)
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    raise RuntimeError("PostgreSQL server binaries not found: apt-get install -y postgresql (or set TUNEFLEET_PG_BIN)")


class PostgresServer:
    """Start a throw-away PostgreSQL cluster on a free loopback port.

    Parameters
    ----------
    fsync:
        Keep fsync on (benchmarks) or off (tests, faster).
    """

    def __init__(self, *, fsync: bool = False, extra_conf: dict[str, str] | None = None) -> None:
        self.fsync = fsync
        self.extra_conf = extra_conf or {}
        self.port = 0
        self.dir: Path | None = None
        self._as_postgres = os.geteuid() == 0

    # -- helpers ----------------------------------------------------------------------------
    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = list(args)
        if self._as_postgres:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=120)

    def url(self, database: str = "postgres", *, password: str = PASSWORD, driver: str = "psycopg2") -> str:
        return f"postgresql+{driver}://postgres:{password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str | None = None) -> str:
        """Create a fresh database; return its name."""
        name = name or f"t_{uuid.uuid4().hex[:12]}"
        self.psql(f'CREATE DATABASE "{name}"')
        return name

    def drop_database(self, name: str) -> None:
        self.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def psql(self, sql: str, database: str = "postgres") -> str:
        assert self.dir is not None
        psql = self.bin / "psql"
        out = self._run(str(psql), "-h", str(self.dir), "-p", str(self.port), "-U", "postgres", "-d", database,
                        "-v", "ON_ERROR_STOP=1", "-At", "-c", sql)
        return out.stdout

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> PostgresServer:
        self.bin = find_pg_bin()
        self.dir = Path(tempfile.mkdtemp(prefix="tf-pg-"))
        os.chmod(self.dir, 0o700)
        if self._as_postgres:
            shutil.chown(self.dir, "postgres", "postgres")
        data = self.dir / "data"
        pwfile = self.dir / "pw"
        pwfile.write_text(PASSWORD + "\n")
        if self._as_postgres:
            shutil.chown(pwfile, "postgres", "postgres")
        self._run(str(self.bin / "initdb"), "-D", str(data), "-U", "postgres", "--auth-local=trust",
                  "--auth-host=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync")
        self.port = free_port()
        opts = [f"-p {self.port}", f"-k {self.dir}", "-c listen_addresses=127.0.0.1",
                f"-c fsync={'on' if self.fsync else 'off'}", "-c max_connections=100"]
        if not self.fsync:
            opts += ["-c synchronous_commit=off", "-c full_page_writes=off"]
        opts += [f"-c {k}={v}" for k, v in self.extra_conf.items()]
        res = self._run(str(self.bin / "pg_ctl"), "-D", str(data), "-l", str(self.dir / "log"), "-w", "-t", "60",
                        "-o", " ".join(opts), "start", check=False)
        if res.returncode != 0:
            log = (self.dir / "log").read_text(errors="replace")[-2000:] if (self.dir / "log").exists() else ""
            raise RuntimeError(f"PostgreSQL failed to start: {res.stderr.strip()} {log}")
        deadline = time.monotonic() + 30
        while True:
            if self._run(str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port), check=False).returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("PostgreSQL did not become ready within 30 s")
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        if self.dir is None:
            return
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop", check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir = None

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
