"""The database URLs the chart composes authenticate with any password: rendered offline, each
round-trips through SQLAlchemy's URL parser (what tunefleet and Prefect read them with)."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from tests.helm.offline import REQUIRED, merge, objects, render

PASSWORDS = [
    "p a+ss/w@rd%",  # space and plus: urlquery alone turns the space into a "+" read back as a literal "+"
    "two  spaces and a trailing one ",
    "+leading+plus+",
    "%20 looks encoded %2B",
    "colon:question?hash#amp&semi;eq=",
    "~tilde_dash-dot.",
    "ünïcödé €",
]


def secret_data(values: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Every Secret the chart renders (its own and the migration hook's copy), decoded."""
    return {o["metadata"]["name"]: {k: base64.b64decode(v).decode() for k, v in o["data"].items()}
            for o in objects(render(values, namespace="tuning")) if o["kind"] == "Secret"}


@pytest.mark.parametrize("password", PASSWORDS)
def test_database_urls_round_trip_any_password_offline(password: str) -> None:
    secrets = secret_data(merge(REQUIRED, {"secrets": {"databasePassword": password},
                                           "database": {"user": "tune fleet+ops"}}))
    urls = {"tunefleet": secrets["tunefleet"]["database-url"],
            "tunefleet-migrate": secrets["tunefleet-migrate"]["database-url"],
            "prefect": secrets["tunefleet"]["prefect-database-url"]}
    for name, rendered in urls.items():
        url = make_url(rendered)
        assert url.password == password, (name, rendered)
        assert url.username == "tune fleet+ops", (name, rendered)
        assert (url.host, url.port) == ("postgres.db.svc", 5432), (name, rendered)
        assert " " not in rendered, (name, rendered)


def test_rendered_url_authenticates_with_postgresql(pg_server) -> None:  # type: ignore[no-untyped-def]
    """The URL of the chart's Secret logs a role with such a password in to a real PostgreSQL
    (scram-sha-256 over TCP): the password reaches the server byte for byte."""
    from sqlalchemy import create_engine, text

    user, password = "tune fleet+ops", PASSWORDS[0]
    pg_server.psql(f"""DROP ROLE IF EXISTS "{user}"; CREATE ROLE "{user}" LOGIN PASSWORD '{password}'""")

    def login(secret: str) -> str:
        rendered = secret_data(merge(REQUIRED, {  # the test server speaks no TLS (test_tls_offline.py does)
            "secrets": {"databasePassword": secret},
            "database": {"host": "127.0.0.1", "port": pg_server.port, "name": "postgres", "user": user,
                         "sslmode": "disable"}}))
        engine = create_engine(rendered["tunefleet"]["database-url"], connect_args={"connect_timeout": 5})
        try:
            with engine.connect() as conn:
                return str(conn.execute(text("select current_user")).scalar())
        finally:
            engine.dispose()

    assert login(password) == user
    with pytest.raises(Exception, match="password authentication failed"):
        login(password.replace(" ", "+"))  # what the chart used to send
