"""TLS to PostgreSQL and S3 is on by default in the chart (issue 34, round two, item 7).

The rendered settings are checked offline, like the rest of tests/helm; then the URLs the chart's
Secret holds connect to a real PostgreSQL that speaks TLS with a certificate a test CA signed
(psycopg2 for tunefleet, asyncpg for the Prefect server), verifying it against the CA the chart
points PGSSLROOTCERT at, and refuse a server that a CA they do not trust signed, or one without TLS.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helm.offline import (
    REQUIRED,
    by_kind_name,
    flow_run_jobs,
    merge,
    objects,
    pod_specs,
    pools_spec,
    render,
    validate_strict,
)

NAMESPACE = "tuning"
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
WITH_CAS = merge(REQUIRED, {"database": {"caCert": {"configMap": "pg-ca"}},
                            "s3": {"caCert": {"secret": "minio-ca", "key": "bundle.pem"}}})


def rendered(values: dict[str, Any]) -> list[dict[str, Any]]:
    return objects(render(values, namespace=NAMESPACE))


def secret_urls(objs: list[dict[str, Any]]) -> dict[str, str]:
    secret = by_kind_name(objs)[("Secret", "tunefleet")]
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items() if k.endswith("database-url")}


def config(objs: list[dict[str, Any]]) -> dict[str, str]:
    return dict(by_kind_name(objs)[("ConfigMap", "tunefleet-config")]["data"])


# -- rendered settings -----------------------------------------------------------------------------

def test_tls_is_on_by_default_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    from sqlalchemy.engine import make_url

    from tunefleet.config import load_settings

    objs = rendered(REQUIRED)
    urls = secret_urls(objs)
    assert make_url(urls["database-url"]).query == {"sslmode": "verify-full"}
    assert make_url(urls["prefect-database-url"]).query == {"ssl": "verify-full"}
    migrate = by_kind_name(objs)[("Secret", "tunefleet-migrate")]
    assert base64.b64decode(migrate["data"]["database-url"]).decode() == urls["database-url"]
    data = config(objs)
    assert data["PGSSLROOTCERT"] == SYSTEM_BUNDLE, "verify-full needs a CA: the image's trust store by default"
    assert data["TUNEFLEET_S3_SECURE"] == "true" and "SSL_CERT_FILE" not in data
    server = by_kind_name(objs)[("Deployment", "tunefleet-prefect-server")]
    env = {e["name"]: e for e in server["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PGSSLROOTCERT"]["value"] == SYSTEM_BUNDLE, "the server reads no ConfigMap: its own entry"
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("TUNEFLEET_DATABASE_URL", urls["database-url"])
    assert load_settings().s3_secure is True


def test_ca_bundles_from_a_configmap_or_a_secret_reach_every_pod_that_needs_them_offline() -> None:
    objs = rendered(WITH_CAS)
    assert validate_strict(objs, ("1.33",)) == len(objs)
    data = config(objs)
    assert data["PGSSLROOTCERT"] == "/etc/tunefleet/tls/database/ca.crt"
    assert data["SSL_CERT_FILE"] == "/etc/tunefleet/tls/s3/bundle.pem"
    database = {"name": "database-ca", "configMap": {"name": "pg-ca", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
    store = {"name": "s3-ca", "secret": {"secretName": "minio-ca",
                                         "items": [{"key": "bundle.pem", "path": "bundle.pem"}]}}
    needs = {"Job/tunefleet-db-upgrade": [database], "Job/tunefleet-deploy": [database, store],
             "Deployment/tunefleet-prefect-server": [database], "Deployment/tunefleet-registry": [database, store]}
    for label, spec in pod_specs(objs):
        volumes = [v for v in spec["volumes"] if v["name"].endswith("-ca")]
        assert volumes == needs.get(label, []), label  # workers open neither
        mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
        for volume in volumes:
            mount = mounts[volume["name"]]
            assert mount["readOnly"] is True
            assert mount["mountPath"] == {"database-ca": "/etc/tunefleet/tls/database",
                                          "s3-ca": "/etc/tunefleet/tls/s3"}[volume["name"]]
    for hw, job in flow_run_jobs(pools_spec(objs), NAMESPACE).items():
        pod = job["spec"]["template"]["spec"]
        assert [v for v in pod["volumes"] if v["name"].endswith("-ca")] == [database, store], hw
        mounts = {m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
        assert {"/etc/tunefleet/tls/database", "/etc/tunefleet/tls/s3"} <= mounts
        validate_strict([job], ("1.33",))


@pytest.mark.parametrize(("sslmode", "query", "root"), [
    ("require", {"sslmode": "require"}, None),  # a root file would make libpq verify: only with a CA given
    ("verify-ca", {"sslmode": "verify-ca"}, SYSTEM_BUNDLE),
    ("disable", {"sslmode": "disable"}, None),
    ("", {}, None),
])
def test_the_sslmode_reaches_both_urls_offline(sslmode: str, query: dict[str, str], root: str | None) -> None:
    from sqlalchemy.engine import make_url

    objs = rendered(merge(REQUIRED, {"database": {"sslmode": sslmode}}))
    urls = secret_urls(objs)
    assert make_url(urls["database-url"]).query == query
    asyncpg = make_url(urls["prefect-database-url"]).query
    assert asyncpg == ({"ssl": sslmode} if sslmode in {"require", "verify-ca", "verify-full"} else {})
    assert config(objs).get("PGSSLROOTCERT") == root


def test_a_ca_from_two_places_fails_naming_the_field_offline() -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match="/database/caCert"):
        render(merge(REQUIRED, {"database": {"caCert": {"configMap": "a", "secret": "b"}}}))


# -- a real PostgreSQL with TLS ----------------------------------------------------------------------

def _ca(name: str) -> tuple[Any, Any]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def _server_cert(ca_key: Any, ca_cert: Any) -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_cert.subject).public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                              serialization.NoEncryption()))


@pytest.fixture(scope="module")
def tls_postgres() -> Iterator[tuple[Any, Path, Path]]:
    """A PostgreSQL with ssl=on (a test CA signed its certificate); the CA's file, and another CA's."""
    from cryptography.hazmat.primitives import serialization

    from tunefleet.testing.postgres import PostgresServer

    files = Path(tempfile.mkdtemp(prefix="tunefleet-pg-tls-"))
    os.chmod(files, 0o755)  # the server may run as the postgres user
    ca_key, ca_cert = _ca("tunefleet test CA")
    _, other_cert = _ca("someone else's CA")
    cert, key = _server_cert(ca_key, ca_cert)
    (files / "server.crt").write_bytes(cert)
    (files / "server.key").write_bytes(key)
    os.chmod(files / "server.key", 0o600)
    if os.geteuid() == 0:
        for name in ("server.crt", "server.key"):
            shutil.chown(files / name, "postgres", "postgres")
    (files / "ca.crt").write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    (files / "other-ca.crt").write_bytes(other_cert.public_bytes(serialization.Encoding.PEM))
    server = PostgresServer(extra_conf={"ssl": "on", "ssl_cert_file": str(files / "server.crt"),
                                        "ssl_key_file": str(files / "server.key")})
    with server:
        yield server, files / "ca.crt", files / "other-ca.crt"
    shutil.rmtree(files, ignore_errors=True)


def chart_urls(port: int) -> tuple[dict[str, str], dict[str, str]]:
    """The chart's database URLs for the test server, and its ConfigMap."""
    from tunefleet.testing.postgres import PASSWORD

    objs = rendered(merge(REQUIRED, {
        "database": {"host": "127.0.0.1", "port": port, "name": "postgres", "user": "postgres",
                     "caCert": {"configMap": "pg-ca"}},
        "secrets": {"databasePassword": PASSWORD},
        "prefect": {"server": {"database": {"name": "postgres"}}}}))
    return secret_urls(objs), config(objs)


def _psycopg2_ssl(url: str) -> bool:
    from sqlalchemy import create_engine, text

    engine = create_engine(url, connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as conn:
            return bool(conn.execute(text("select ssl from pg_stat_ssl where pid = pg_backend_pid()")).scalar())
    finally:
        engine.dispose()


def _asyncpg_ssl(url: str) -> bool:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import create_async_engine

    async def query() -> bool:
        engine = create_async_engine(url)
        try:
            async with engine.connect() as conn:
                result = await conn.execute(text("select ssl from pg_stat_ssl where pid = pg_backend_pid()"))
                return bool(result.scalar())
        finally:
            await engine.dispose()

    return asyncio.run(query())


def test_the_charts_urls_verify_a_tls_postgresql_against_its_ca(tls_postgres: tuple[Any, Path, Path],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    server, ca, other = tls_postgres
    urls, data = chart_urls(server.port)
    assert data["PGSSLROOTCERT"] == "/etc/tunefleet/tls/database/ca.crt"
    monkeypatch.setenv("PGSSLROOTCERT", str(ca))  # where the pod mounts the ConfigMap pg-ca
    assert _psycopg2_ssl(urls["database-url"]) is True
    assert _asyncpg_ssl(urls["prefect-database-url"]) is True, "the Prefect server's driver verifies too"
    monkeypatch.setenv("PGSSLROOTCERT", str(other))  # a server that CA did not sign: refused
    with pytest.raises(Exception, match="certificate verify failed"):
        _psycopg2_ssl(urls["database-url"])
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        _asyncpg_ssl(urls["prefect-database-url"])


def test_the_default_refuses_a_postgresql_without_tls(pg_server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    urls, data = chart_urls(pg_server.port)
    monkeypatch.setenv("PGSSLROOTCERT", data["PGSSLROOTCERT"] if Path(data["PGSSLROOTCERT"]).exists() else "/dev/null")
    with pytest.raises(Exception, match="server does not support SSL"):
        _psycopg2_ssl(urls["database-url"])
