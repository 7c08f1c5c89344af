"""Passwords never reach output: `config show`, every error line and the messages the database,
the Pushgateway and the settings raise mask them, wherever a URL carries one (user-info or a
``password=`` query parameter). The CLI is driven as a user does (a real subprocess)."""

from __future__ import annotations

import base64
import http.server
import threading
from collections.abc import Iterator

import pytest

from tests.cli.test_cli_config import error_line, run_cli
from tunefleet.config import mask_secrets, mask_url

SECRET = "hunter2"


@pytest.mark.parametrize(("url", "masked"), [
    ("postgresql+psycopg2://tf:hunter2@db:5432/tf", "postgresql+psycopg2://tf:***@db:5432/tf"),
    ("postgresql://tf@db/tf?password=hunter2", "postgresql://tf@db/tf?password=***"),
    ("postgresql://tf@db/tf?sslmode=require&password=hunter2&connect_timeout=3",
     "postgresql://tf@db/tf?sslmode=require&password=***&connect_timeout=3"),
    ("postgresql://tf:hunter2@db/tf?sslpassword=hunter2", "postgresql://tf:***@db/tf?sslpassword=***"),
    ("postgresql://tf:hun/ter2@db/tf", "postgresql://tf:***@db/tf"),  # how SQLAlchemy reads it
    ("postgresql://tf:hun@ter2@db/tf", "postgresql://tf:***@db/tf"),
    ("postgresql://tf:p%40ss%20w@db/tf", "postgresql://tf:***@db/tf"),
    ("https://user:hunter2@push.example:9091", "https://user:***@push.example:9091"),
    ("user:hunter2@minio:9000", "user:***@minio:9000"),  # no scheme: an S3 endpoint, a mistyped URL
    ("sqlite:////tmp/tunefleet.db", "sqlite:////tmp/tunefleet.db"),
    ("postgresql://tf@db:5432/tf", "postgresql://tf@db:5432/tf"),
    ("minio.minio.svc:9000", "minio.minio.svc:9000"),
    ("http://push.example:9091/path", "http://push.example:9091/path"),
])
def test_mask_url(url: str, masked: str) -> None:
    assert mask_url(url) == masked


def test_mask_secrets_in_free_text() -> None:
    text = ("database postgresql://u:hunter2@h/db?password=hunter2 failed; push to https://a:hunter2@p:9091/x "
            "refused; dsn host=h password=hunter2 user=u; quoted password='hunter2 x'")
    masked = mask_secrets(text)
    assert SECRET not in masked
    assert "postgresql://u:***@h/db?password=***" in masked and "https://a:***@p:9091/x" in masked
    assert "password=*** user=u" in masked and "password=***" in masked.split("quoted ")[1]
    assert mask_secrets("password authentication failed for user \"u\"") == "password authentication failed for user \"u\""


def test_config_show_masks_every_credential(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {
        "TUNEFLEET_HOME": str(tmp_path),
        "TUNEFLEET_DATABASE_URL": "postgresql+psycopg2://tf@db.example:5432/tf?sslmode=require&password=hunter2",
        "TUNEFLEET_METRICS_PUSHGATEWAY": "https://user:hunter2@push.example:9091",
        "TUNEFLEET_S3_SECRET_KEY": "hunter2-s3",
    }
    for flags in (["--json"], []):
        out = run_cli("config", "show", *flags, env=env)
        assert out.returncode == 0, out.stderr
        assert SECRET not in out.stdout + out.stderr
    assert "postgresql+psycopg2://tf@db.example:5432/tf?sslmode=require&password=***" in out.stdout
    assert "https://user:***@push.example:9091" in out.stdout


def test_s3_endpoint_with_credentials_is_refused_without_echoing_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = run_cli("config", "show", env={"TUNEFLEET_HOME": str(tmp_path),
                                         "TUNEFLEET_S3_ENDPOINT": "minio:hunter2@minio.example:9000"})
    assert out.returncode == 2
    line = error_line(out.stderr)
    assert line.startswith("tunefleet: error: invalid setting TUNEFLEET_S3_ENDPOINT:") and "TUNEFLEET_S3_SECRET_KEY" in line
    assert SECRET not in out.stderr


@pytest.mark.parametrize("url", [
    "postgresql+psycopg2://u@127.0.0.1:{port}/x?password=hunter2",
    "postgresql+psycopg2://u:hunter2@127.0.0.1:{port}/x?sslpassword=hunter2",
    "postgresql+psycopg2://u:hunter2@127.0.0.1:notaport/x",
    "u:hunter2@127.0.0.1/x",
])
def test_database_errors_mask_the_password(tmp_path, url: str) -> None:  # type: ignore[no-untyped-def]
    from tunefleet.testing.ports import free_port

    out = run_cli("db", "current", env={"TUNEFLEET_HOME": str(tmp_path),
                                        "TUNEFLEET_DATABASE_URL": url.format(port=free_port())})
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert "database" in error_line(out.stderr).lower()
    assert SECRET not in out.stderr


def test_every_error_line_is_masked(tunefleet_home, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """Whatever a TunefleetError says, the line the CLI prints carries no password."""
    from tunefleet.cli import app as cli_main
    from tunefleet.cli import config_db
    from tunefleet.errors import TunefleetError

    def leaky(args, settings):  # type: ignore[no-untyped-def]
        raise TunefleetError("cannot reach postgresql://u:hunter2@db/x?password=hunter2 (dsn password=hunter2)")

    monkeypatch.setattr(config_db, "cmd_config_show", leaky)
    assert cli_main.main(["config", "show"]) == 2
    err = capsys.readouterr().err
    assert SECRET not in err and "postgresql://u:***@db/x?password=***" in error_line(err)


@pytest.fixture
def gateway() -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A stand-in Pushgateway on loopback that records each push's path and Authorization header."""
    seen: list[dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            seen.append({"path": self.path, "auth": self.headers.get("Authorization", "")})
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_port}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_pushgateway_credentials_authenticate_and_stay_out_of_errors(gateway) -> None:  # type: ignore[no-untyped-def]
    from tunefleet.energy.metrics import FleetMetrics, PushgatewayError
    from tunefleet.testing.ports import free_port

    address, seen = gateway
    FleetMetrics().push(f"http://user:hunter2@{address}", grouping_key={"shard": "1"})
    assert seen and seen[0]["path"].startswith("/metrics/job/tunefleet")
    assert seen[0]["auth"] == "Basic " + base64.b64encode(b"user:hunter2").decode()
    with pytest.raises(PushgatewayError) as exc:
        FleetMetrics().push(f"http://user:hunter2@127.0.0.1:{free_port()}", grouping_key={"shard": "1"}, timeout=2)
    assert SECRET not in str(exc.value) and "http://user:***@127.0.0.1:" in str(exc.value)


def test_s3_store_refuses_credentials_in_its_endpoint_without_echoing_them() -> None:
    from tunefleet.errors import ArtifactStoreError
    from tunefleet.store import S3Store

    with pytest.raises(ArtifactStoreError, match="invalid S3 endpoint") as exc:
        S3Store("minio:hunter2@127.0.0.1:9", "minio", "x", "bucket", timeout_s=1, retries=0, connect_timeout_s=1)
    assert SECRET not in str(exc.value) and "minio:***@127.0.0.1:9" in str(exc.value)
