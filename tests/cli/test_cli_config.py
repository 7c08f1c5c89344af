"""`tunefleet config` and `tunefleet db`, driven as a user does (a real subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tunefleet.config import load_settings
from tunefleet.errors import ConfigError

from tests.conftest import NO_HUB


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEFLEET_")}
    full_env.update({**NO_HUB, **(env or {})})
    return subprocess.run([sys.executable, "-m", "tunefleet.cli.app", *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout)


def error_line(stderr: str) -> str:
    """The CLI's error: exactly one line, the last one on stderr (logs may precede it)."""
    lines = stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("tunefleet: error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], stderr
    return errors[0]


def test_defaults_are_embedded(tunefleet_home) -> None:  # type: ignore[no-untyped-def]
    settings = load_settings()
    assert settings.effective_database_url == f"sqlite:///{tunefleet_home / 'tunefleet.db'}"
    assert settings.effective_store_path == tunefleet_home / "artifacts"
    assert settings.store == "local"
    assert settings.db_connect_timeout_s <= 10 and settings.s3_timeout_s <= 10


def test_config_file_then_env_precedence(tunefleet_home, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    tunefleet_home.mkdir(parents=True)
    (tunefleet_home / "config.toml").write_text('store = "s3"\ns3_bucket = "from-file"\ns3_timeout_s = 3\n')
    monkeypatch.setenv("TUNEFLEET_S3_BUCKET", "from-env")
    settings = load_settings()
    assert (settings.store, settings.s3_bucket, settings.s3_timeout_s) == ("s3", "from-env", 3.0)


def test_invalid_value_names_the_setting(tunefleet_home, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TUNEFLEET_S3_TIMEOUT_S", "soon")
    with pytest.raises(ConfigError, match="^invalid setting TUNEFLEET_S3_TIMEOUT_S: "):
        load_settings()
    monkeypatch.setenv("TUNEFLEET_S3_TIMEOUT_S", "1000")
    with pytest.raises(ConfigError, match="TUNEFLEET_S3_TIMEOUT_S: Input should be less than or equal to 120"):
        load_settings()


def test_unknown_key_in_config_file(tunefleet_home) -> None:  # type: ignore[no-untyped-def]
    tunefleet_home.mkdir(parents=True)
    (tunefleet_home / "config.toml").write_text('databse_url = "sqlite://"\n')
    with pytest.raises(ConfigError, match="unknown setting TUNEFLEET_DATABSE_URL"):
        load_settings()


def test_config_show_masks_secrets(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {
        "TUNEFLEET_HOME": str(tmp_path),
        "TUNEFLEET_DATABASE_URL": "postgresql+psycopg2://tf:hunter2@db.example:5432/tf",
        "TUNEFLEET_S3_SECRET_KEY": "s3cr3t-value",
    }
    out = run_cli("config", "show", "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert "hunter2" not in out.stdout and "s3cr3t-value" not in out.stdout
    assert "postgresql+psycopg2://tf:***@db.example:5432/tf" in out.stdout
    assert '"s3_secret_key": "********"' in out.stdout


def test_invalid_setting_fails_at_startup_with_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = run_cli("config", "show", env={"TUNEFLEET_HOME": str(tmp_path), "TUNEFLEET_STORE": "ftp"})
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tunefleet: error: invalid setting TUNEFLEET_STORE:")


def test_db_upgrade_current_downgrade(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tunefleet.db import head_revision

    env = {"TUNEFLEET_HOME": str(tmp_path)}
    head = head_revision()  # not a number written here: migrations from parallel branches are renumbered
    assert "none (empty database)" in run_cli("db", "current", env=env).stdout
    assert f"revision {head}" in run_cli("db", "upgrade", env=env).stdout
    assert "revision 0001" in run_cli("db", "downgrade", "0001", env=env).stdout
    out = run_cli("db", "upgrade", env=env)
    assert out.returncode == 0 and f"revision {head}" in out.stdout


def test_unreachable_database_is_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tunefleet.testing.ports import free_port

    env = {"TUNEFLEET_HOME": str(tmp_path),
           "TUNEFLEET_DATABASE_URL": f"postgresql+psycopg2://u:p@127.0.0.1:{free_port()}/x"}
    out = run_cli("db", "current", env=env)
    assert out.returncode == 2
    assert "cannot connect to database" in error_line(out.stderr)


def test_tune_flags_named_like_knobs_reach_the_options(tunefleet_home, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every `tune` flag whose name is a TuneKnobs field overrides that setting for the run; the
    rest of the knobs come from the settings; a bad value is one line naming the knob."""
    from tunefleet.cli.app import build_parser
    from tunefleet.cli.tuning import tune_options
    from tunefleet.config import load_settings
    from tunefleet.errors import ParameterError

    monkeypatch.setenv("TUNEFLEET_TRIALS_PER_ITER", "7")
    monkeypatch.setenv("TUNEFLEET_WARM_START_MIN_AGREEMENT", "0.7")
    settings = load_settings()
    parse = build_parser().parse_args
    plain = tune_options(parse(["tune"]), settings)
    assert (plain.trials_per_iter, plain.warm_start_min_agreement, plain.transfer, plain.lease_s) == (7, 0.7, True, 120.0)
    given = tune_options(parse(["tune", "--warm-start-min-agreement", "0.2", "--no-transfer", "--lease-s", "30",
                                "--cold", "--efficient"]), settings)
    assert (given.warm_start_min_agreement, given.transfer, given.lease_s, given.warm_start) == (0.2, False, 30.0, False)
    assert given.preempt and given.energy_aware and given.filter_fraction == 0.5 and given.trials_per_iter == 7
    with pytest.raises(ParameterError, match=r"^invalid lease_s: -1\.0 \(Input should be greater than or equal to 3\)$"):
        tune_options(parse(["tune", "--lease-s", "-1"]), settings)


def test_search_population_follows_the_round_size(tunefleet_home, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tunefleet.config import load_settings
    from tunefleet.engine.options import TuneOptions
    from tunefleet.errors import ParameterError

    auto = TuneOptions.from_settings(load_settings())
    assert [auto.population(n) for n in (1, 8, 16, 32, 64, 128, 256)] == [64, 64, 64, 128, 256, 512, 512]
    monkeypatch.setenv("TUNEFLEET_SEARCH_POPULATION", "300")
    assert TuneOptions.from_settings(load_settings()).population(8) == 300
    with pytest.raises(ParameterError, match="invalid search_population: 8"):
        TuneOptions.validated(search_population=8)
