"""Bad input is refused up front, as one line naming what was wrong, and a database write that
lost a race is one line too: driven as a user does (a real subprocess), the race in-process."""

from __future__ import annotations

import pytest

from tests.cli.test_cli_config import error_line, run_cli


@pytest.mark.parametrize(("args", "named"), [
    (["tune", "--lease-s", "1"], "invalid lease_s: 1.0 (Input should be greater than or equal to 3)"),
    (["tune", "--lease-s", "2.9"], "invalid lease_s: 2.9"),
    (["tune", "--trials-per-iter", "0"], "invalid trials_per_iter: 0"),
    (["tune", "--trials-per-iter", "-4"], "invalid trials_per_iter: -4"),
    (["best", "0123abcd", "--top", "-1"], "invalid --top: -1 (must be >= 1)"),
    (["best", "0123abcd", "--zero-shot", "--top", "0"], "invalid --top: 0 (must be >= 1)"),
    (["export-db", "{tmp}/out", "--top", "-2"], "invalid --top: -2 (must be >= 1)"),
    (["report", "tuning", "mlp", "--top", "-1"], "invalid --top: -1 (must be >= 1)"),
    (["build", "mlp", "--zero-shot", "--top-k", "0"], "invalid --top-k: 0 (must be >= 1)"),
    (["best", "0123abcd", "--top", "many"], "invalid --top: 'many' (not an integer)"),
    (["best", "0123abcd", "--zero-shot", "--verify", "-1"], "invalid --verify: -1 (must be >= 0)"),
    (["build", "mlp", "--zero-shot", "--verify", "-3"], "invalid --verify: -3 (must be >= 0)"),
    (["build", "mlp", "--zero-shot", "--verify", "soon"], "invalid --verify: 'soon' (give a trial count"),
    (["run", "mlp", "--trials", "0"], "invalid --trials: 0 (must be >= 1)"),
    (["run", "mlp", "--shard-trials", "-1"], "invalid --shard-trials: -1 (must be >= 1)"),
    (["plan", "--trials", "-5"], "invalid --trials: -5 (must be >= 1)"),
    (["plan", "--trials", "8", "--shard-trials", "0"], "invalid --shard-trials: 0 (must be >= 1)"),
    (["tune", "--workers", "0"], "invalid --workers: 0 (must be >= 1)"),
    (["tune", "--max-shards", "0"], "invalid --max-shards: 0 (must be >= 1)"),
    (["metrics", "serve", "--interval", "0"], "invalid --interval: 0 (must be >= 1)"),
    (["metrics", "serve", "--port", "-1"], "invalid --port: -1 (must be >= 0)"),
])
def test_bad_flags_are_refused_up_front_in_one_line(tmp_path, args: list[str], named: str) -> None:  # type: ignore[no-untyped-def]
    out = run_cli(*(a.format(tmp=tmp_path) for a in args), env={"TUNEFLEET_HOME": str(tmp_path)})
    assert out.returncode == 2, out.stderr
    assert named in error_line(out.stderr)
    assert not (tmp_path / "tunefleet.db").exists(), "refused before the database was opened"


def test_lease_below_three_seconds_is_refused_as_a_setting(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Heartbeats renew a lease every third of it, at most once a second: a shorter lease expires
    between two heartbeats."""
    out = run_cli("config", "show", env={"TUNEFLEET_HOME": str(tmp_path), "TUNEFLEET_LEASE_S": "1"})
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0] == ("tunefleet: error: invalid setting TUNEFLEET_LEASE_S: "
                                            "Input should be greater than or equal to 3"), out.stderr
    ok = run_cli("config", "show", "--json", env={"TUNEFLEET_HOME": str(tmp_path), "TUNEFLEET_LEASE_S": "3"})
    assert ok.returncode == 0 and '"lease_s": 3.0' in ok.stdout


def test_options_validator_refuses_short_leases() -> None:
    from tunefleet.engine.options import TuneOptions
    from tunefleet.errors import ParameterError

    assert TuneOptions.validated(lease_s=3).lease_s == 3.0
    with pytest.raises(ParameterError, match=r"^invalid lease_s: 0\.5 \(Input should be greater than or equal to 3\)$"):
        TuneOptions.validated(lease_s=0.5)
    with pytest.raises(ParameterError, match=r"^invalid trials_per_iter: 0 "):
        TuneOptions.validated(trials_per_iter=0)


def test_a_write_that_lost_a_race_is_one_line(tunefleet_home, capsys) -> None:  # type: ignore[no-untyped-def]
    """Two `dataset export`s at once reserve the same version: the loser prints one line, exit 2."""
    from sqlalchemy.engine import Engine

    from tests.db.test_db_conflicts import RACED_DATASET, inserted_just_before
    from tunefleet.cli.app import main
    from tunefleet.config import load_settings
    from tunefleet.context import Context
    from tunefleet.db import NewMeasurement

    ctx = Context(load_settings())
    hw = ctx.db.hardware_class("x86")
    wl, _ = ctx.db.add_workload(structural_hash="0" * 32, name="raced", op_kind="dense", flops=1.0, tir_json="{}")
    ctx.db.commit_measurements([NewMeasurement(wl.id, hw.id, "[]", [1e-4, 1e-4])])
    ctx.close()
    with inserted_just_before(Engine, "datasets", RACED_DATASET) as fired:
        code = main(["dataset", "export"])
    err = capsys.readouterr().err
    assert fired and code == 2, err
    assert "Traceback" not in err and "IntegrityError" not in err
    assert "conflicted with a concurrent one" in error_line(err) and "run it again" in error_line(err)
