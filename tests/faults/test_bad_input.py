"""Bad input is refused up front, as one line, and alike on SQLite and PostgreSQL (issue 34, item 6).

Before these checks: ``--lease-s inf`` leased a shard that never expired on SQLite and was an
``OverflowError`` traceback on PostgreSQL; a model name over its column's 200 characters was stored
whole on SQLite and a ``DataError`` traceback on PostgreSQL; ``metrics serve --port 65536`` or a bad
``--addr`` was a traceback; and ``%`` or ``_`` in a sha256 prefix matched any character. The CLI
cases are driven as a user does (a real subprocess of ``tunefleet.cli.app``), the database cases
on both backends.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest

from tests.cli.test_cli_config import error_line, run_cli
from tunefleet.config import MAX_LEASE_S, load_settings
from tunefleet.db import Database
from tunefleet.engine.options import TuneOptions
from tunefleet.errors import ConfigError, NotFoundError, ParameterError
from tunefleet.planning import shard_queue
from tunefleet.vocab import LEASED, PENDING

LONG = "m" * 201  # one character over the models.name column (String(200))


# -- flags: one line, before the database is opened -------------------------------------------
@pytest.mark.parametrize(("args", "named"), [
    (["tune", "--lease-s", "inf"], "invalid lease_s: inf (Input should be a finite number)"),
    (["tune", "--lease-s", "nan"], "invalid lease_s: nan (Input should be a finite number)"),
    (["tune", "--lease-s", "1e9"], f"invalid lease_s: 1000000000.0 (Input should be less than or equal to {MAX_LEASE_S:g}"),
    (["tune", "--warm-start-min-agreement", "nan"], "invalid warm_start_min_agreement: nan"),
    (["metrics", "serve", "--port", "65536"], "invalid --port: 65536 (must be <= 65535)"),
    (["metrics", "serve", "--port", "99999999999999999999"], "invalid --port: 99999999999999999999 (must be <= 65535)"),
    (["metrics", "serve", "--addr", "not an address"], "invalid --addr: 'not an address'"),
    (["metrics", "serve", "--addr", "256.1.1.1"], "invalid --addr: '256.1.1.1'"),
    (["metrics", "serve", "--addr", "192.0.2.1"], "invalid --addr: '192.0.2.1'"),  # TEST-NET-1: no host has it
    (["costmodel", "retrain", "--holdout", "nan"], "invalid --holdout: nan (must be between 0 and 1, exclusive)"),
    (["costmodel", "retrain", "--holdout", "inf"], "invalid --holdout: inf (must be between 0 and 1, exclusive)"),
    (["costmodel", "retrain", "--holdout", "1"], "invalid --holdout: 1 (must be between 0 and 1, exclusive)"),
    (["costmodel", "retrain", "--holdout", "lots"], "invalid --holdout: 'lots' (not a number)"),
    (["ingest", "mlp", "--name", LONG], "invalid model name: 201 characters (at most 200)"),
])
def test_bad_flags_are_one_line_before_the_database(tmp_path, args: list[str], named: str) -> None:  # type: ignore[no-untyped-def]
    out = run_cli(*args, env={"TUNEFLEET_HOME": str(tmp_path)}, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert named in error_line(out.stderr)
    assert not (tmp_path / "tunefleet.db").exists(), "refused before the database was opened"


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("TUNEFLEET_LEASE_S", "inf", "Input should be a finite number"),
    ("TUNEFLEET_LEASE_S", "nan", "Input should be a finite number"),
    ("TUNEFLEET_LEASE_S", "1e9", f"Input should be less than or equal to {MAX_LEASE_S:g}"),
    ("TUNEFLEET_DB_STATEMENT_TIMEOUT_S", "inf", "Input should be a finite number"),
    ("TUNEFLEET_DB_STATEMENT_TIMEOUT_S", "1e12", "Input should be less than or equal to 86400"),
    ("TUNEFLEET_PREEMPT_MIN_GAIN_US_PER_KJ", "inf", "Input should be a finite number"),
    ("TUNEFLEET_DB_CONNECT_TIMEOUT_S", "nan", "Input should be a finite number"),
])
def test_non_finite_and_absurd_settings_are_one_line(tunefleet_home, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
                                                     variable: str, value: str, says: str) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as err:
        load_settings()
    assert str(err.value) == f"invalid setting {variable}: {says}"


def test_an_infinite_lease_setting_is_refused_by_the_cli(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = run_cli("config", "show", env={"TUNEFLEET_HOME": str(tmp_path), "TUNEFLEET_LEASE_S": "inf"}, timeout=60)
    assert out.returncode == 2
    assert error_line(out.stderr) == "tunefleet: error: invalid setting TUNEFLEET_LEASE_S: Input should be a finite number"


@pytest.mark.parametrize("lease_s", [math.inf, -math.inf, math.nan, MAX_LEASE_S + 1])
def test_tuning_options_refuse_non_finite_and_absurd_leases(lease_s: float) -> None:
    """What every entry point builds (CLI flags, flow parameters, bench arguments)."""
    with pytest.raises(ParameterError, match=r"^invalid lease_s: "):
        TuneOptions.validated(lease_s=lease_s)
    assert TuneOptions.validated(lease_s=MAX_LEASE_S).lease_s == MAX_LEASE_S


# -- the database: the same answer on both backends -------------------------------------------
@pytest.fixture
def db(db_url: str) -> Iterator[Database]:
    database = Database(db_url)
    hw = database.upsert_hardware_class("x86", {"kind": "llvm", "num-cores": 2}, "x86")
    wl, _ = database.add_workload(structural_hash="00ab", name="dense", op_kind="dense", flops=1.0, tir_json="{}")
    database.add_shards(hw.id, [(wl.id, 8, 1.0)])
    yield database
    database.close()


@pytest.mark.parametrize("lease_s", [math.inf, math.nan, MAX_LEASE_S + 1])
def test_a_lease_that_would_never_expire_is_refused_on_both_backends(db: Database, lease_s: float) -> None:
    """SQLite stored no expiry at all (the lease never expired), PostgreSQL raised OverflowError."""
    with pytest.raises(ParameterError, match=r"^invalid lease_s: "):
        shard_queue.lease(db, "x86", "w1", lease_s=lease_s)
    assert [s.state for s in shard_queue.list_shards(db)] == [PENDING]
    shard = shard_queue.lease(db, "x86", "w1", lease_s=30)
    assert shard is not None and shard.state == LEASED and shard.lease_expires_at is not None
    with pytest.raises(ParameterError, match=r"^invalid lease_s: "):
        shard_queue.heartbeat(db, shard.id, "w1", lease_s=lease_s)
    assert shard_queue.get_shard(db, shard.id).lease_expires_at == shard.lease_expires_at


def test_a_model_name_longer_than_its_column_is_one_line_on_both_backends(db: Database) -> None:
    """PostgreSQL raised DataError (a traceback) and SQLite stored the name whole."""
    with pytest.raises(ParameterError) as err:
        db.add_model(name=LONG, source="zoo", format="x", sha256="a" * 64, artifact_uri="u")
    assert str(err.value).startswith("invalid model name: 201 characters (at most 200)")
    assert "\n" not in str(err.value)
    assert db.models() == []
    fits, created = db.add_model(name=LONG[:200], source="zoo", format="x", sha256="a" * 64, artifact_uri="u")
    assert created and fits.name == LONG[:200]


def test_ingest_refuses_a_long_name_before_building_or_storing_anything(db: Database, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tunefleet.models.ingest import ingest
    from tunefleet.store import LocalStore

    store = LocalStore(tmp_path / "artifacts")
    with pytest.raises(ParameterError, match=r"^invalid model name: 201 characters \(at most 200\)"):
        ingest(db, store, "mlp", name=LONG)
    assert db.models() == []
    assert not any((tmp_path / "artifacts").rglob("*.*")), "nothing stored"


@pytest.mark.parametrize(("field", "value", "limit"), [("name", "h" * 65, 64), ("node_pool", "p" * 129, 128)])
def test_hardware_class_names_longer_than_their_columns_are_one_line(db: Database, field: str, value: str,
                                                                     limit: int) -> None:
    spec = {"name": "tpu", "node_pool": "tpu", field: value}
    with pytest.raises(ParameterError, match=rf"^invalid hardware class {field.replace('_', ' ')}: "
                                             rf"{len(value)} characters \(at most {limit}\)"):
        db.upsert_hardware_class(spec["name"], {"kind": "llvm"}, spec["node_pool"])
    assert [h.name for h in db.hardware_classes()] == ["x86"]


@pytest.mark.parametrize("ref", ["%%%%%%%%", "________", "%" * 64, "a%", "a_______"])
def test_wildcards_in_a_model_prefix_match_nothing(db: Database, ref: str) -> None:
    """A sha256 prefix is hex digits: ``%`` and ``_`` matched any model before."""
    model, _ = db.add_model(name="m", source="zoo", format="x", sha256="ab" * 32, artifact_uri="u")
    with pytest.raises(NotFoundError, match=r"^no model "):
        db.model(ref)
    assert db.model("abababab").id == model.id and db.model("ABABABAB").id == model.id


@pytest.mark.parametrize("ref", ["%%%%%%", "______", "00%", "0_ab", "00ab%"])
def test_a_workload_prefix_that_is_not_hex_is_refused(db: Database, ref: str) -> None:
    with pytest.raises(ParameterError, match=r"^invalid workload "):
        db.workload(ref)
    assert db.workload("00ab").name == "dense"  # the hash itself, and
    assert db.workload("00AB").name == "dense"  # in capitals


def test_releasing_a_host_s_leases_does_not_match_another_host_by_wildcard(db: Database) -> None:
    """``release_leases("node_1:...")`` (Ctrl-C) must not give back ``nodeX1``'s leases: ``_`` in a
    hostname was a one-character wildcard."""
    other = shard_queue.lease(db, "x86", "nodeX1:7:cafe")
    assert other is not None
    assert db.release_leases("node_1") == []
    assert shard_queue.get_shard(db, other.id).state == LEASED
    assert db.release_leases("nodeX1") == [other.id]
