"""``tunefleet token``: a token is printed once, listed without itself, revoked by id; bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.test_cli_config import error_line, run_cli


def test_token_create_list_and_revoke(tmp_path: Path) -> None:
    from tunefleet.config import load_settings
    from tunefleet.db import Database

    env = {"TUNEFLEET_HOME": str(tmp_path / "home")}
    made = run_cli("token", "create", "--team", "vision", "--scope", "write", "--expires", "30d", "--note", "ci", env=env)
    assert made.returncode == 0, made.stderr[-2000:]
    first, token, last = made.stdout.strip().splitlines()
    assert first.startswith("token 1 for team vision (write, expires ") and last.startswith("shown once")
    listed = run_cli("token", "list", "--json", env=env)
    [row] = json.loads(listed.stdout)
    assert (row["id"], row["team"], row["scope"], row["state"], row["note"]) == (1, "vision", "write", "live", "ci")
    assert token not in listed.stdout
    db = Database.from_settings(load_settings(home=tmp_path / "home"))
    try:
        assert db.authenticate(token) is not None
        revoked = run_cli("token", "revoke", "1", env=env)
        assert revoked.returncode == 0 and revoked.stdout.startswith("token 1 of team vision revoked at ")
        assert db.authenticate(token) is None
    finally:
        db.close()
    assert json.loads(run_cli("token", "list", "--json", env=env).stdout)[0]["state"] == "revoked"
    unknown = run_cli("token", "revoke", "7", env=env)
    assert unknown.returncode == 2 and error_line(unknown.stderr) == "tunefleet: error: unknown token id 7"
    bad = run_cli("token", "create", "--team", "vision", "--expires", "soon", env=env)
    assert bad.returncode == 2 and "invalid --expires: 'soon'" in error_line(bad.stderr)
    no_port = run_cli("serve", "--port", "0", env=env)
    assert no_port.returncode == 2 and "invalid --port: 0 (must be >= 1)" in error_line(no_port.stderr)
