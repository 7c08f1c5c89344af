"""bench/winograd_partition.py: its parser (the trace rewrite it times is tests/tvm/test_partition.py's)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # bench/ is scripts, not a package

import winograd_partition


def test_a_home_without_a_database_and_no_calls_are_the_parser_s_errors(capsys: pytest.CaptureFixture[str],
                                                                        tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        winograd_partition.parse_args(["--home", str(tmp_path)])
    assert "no tunefleet.db there" in capsys.readouterr().err
    (tmp_path / "tunefleet.db").write_bytes(b"")
    assert winograd_partition.parse_args(["--home", str(tmp_path), "--workload", "ab12"]).workload == ["ab12"]
    with pytest.raises(SystemExit):
        winograd_partition.parse_args(["--home", str(tmp_path), "--calls", "0"])
    assert "--calls must be at least 1" in capsys.readouterr().err
