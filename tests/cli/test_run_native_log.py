"""TVM's C++ warnings (written straight to fd 2) go to the run's log file, not across the live
line: in ``tunefleet run``'s own process and every process it starts, in the builder's pool
workers and in local tuning workers; what Python writes to ``sys.stderr`` (the CLI's error line,
a console on stderr, a worker's log line) stays where it was."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tunefleet.tvm.native_log import NATIVE_LOG_ENV, redirect_native_stderr

NATIVE = "[native] LOG(WARNING) written to fd 2"


def test_a_worker_sends_fd_2_to_the_file_and_keeps_pythons_stderr(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    code = ("import os, sys\n"
            "from tunefleet.tvm.native_log import redirect_native_stderr\n"
            "print('redirected:', redirect_native_stderr(), file=sys.stderr)\n"
            f"os.write(2, b'{NATIVE} by C\\n')\n"
            "print('a Python error line', file=sys.stderr)\n")
    env = {k: v for k, v in os.environ.items() if k != NATIVE_LOG_ENV}
    out = subprocess.run([sys.executable, "-c", code], env={**env, NATIVE_LOG_ENV: str(log)}, capture_output=True,
                         text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == ["redirected: True", "a Python error line"]
    assert log.read_text() == f"{NATIVE} by C\n"

    unset = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                           check=False)
    assert unset.stderr.splitlines() == ["redirected: False", f"{NATIVE} by C", "a Python error line"]


def test_a_log_file_that_cannot_be_opened_leaves_fd_2_alone(tmp_path: Path) -> None:
    assert redirect_native_stderr(tmp_path / "no such folder" / "run.log") is False


_FAKE_PIPELINE = f"""
import os, subprocess, sys
import tunefleet.flows.pipeline
from tunefleet.errors import TunefleetError

def pipeline(**parameters):
    os.write(2, b"{NATIVE} by the run's process\\n")  # extraction, the search, the build
    subprocess.run([sys.executable, "-c", "import os; os.write(2, b'{NATIVE} by a worker\\\\n')"], check=True)
    print("a warning Python writes", file=sys.stderr)
    raise TunefleetError("the fake pipeline stops here")

tunefleet.flows.pipeline.pipeline = pipeline
from tunefleet.cli.app import main
sys.exit(main(sys.argv[1:]))
"""


def test_run_sends_native_output_to_its_log_file_and_keeps_its_console_and_errors(tmp_path: Path) -> None:
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TUNEFLEET_", "PREFECT_"))}
    out = subprocess.run([sys.executable, "-c", _FAKE_PIPELINE, "run", "--model", "mlp", "--trials", "1", "--json"],
                         env={**env, "TUNEFLEET_HOME": str(home)}, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.strip().splitlines()[-1] == "tunefleet: error: the fake pipeline stops here"
    assert "a warning Python writes" in out.stderr
    assert "logs: " in out.stderr  # --json: the console writes to stderr, still the terminal's
    assert NATIVE not in out.stderr + out.stdout
    (log,) = (home / "logs").glob("run-*.log")
    text = log.read_text()
    assert f"{NATIVE} by the run's process\n" in text and f"{NATIVE} by a worker\n" in text
    assert "a warning Python writes" not in text


def test_a_build_worker_writes_native_output_to_the_log_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capfd: pytest.CaptureFixture[str]) -> None:
    from tunefleet.tvm.builder import PersistentBuilder

    log = tmp_path / "run.log"
    monkeypatch.setenv(NATIVE_LOG_ENV, str(log))
    # spawn: the worker has this environment (a fork server started earlier by another test would not)
    builder = PersistentBuilder(max_workers=1, start_method="spawn", eager=False, startup_timeout_s=300,
                                initializer=functools.partial(os.write, 2, f"{NATIVE} by a build worker\n".encode()))
    try:
        builder.warmup()
    finally:
        builder.shutdown()
    assert NATIVE not in capfd.readouterr().err
    assert log.read_text() == f"{NATIVE} by a build worker\n"


def test_a_tuning_worker_process_redirects_fd_2_before_its_log_line(tunefleet_home: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    from tunefleet.config import load_settings
    from tunefleet.engine.options import TuneOptions
    from tunefleet.engine.worker import tune_with_workers

    log = tmp_path / "run.log"
    monkeypatch.setenv(NATIVE_LOG_ENV, str(log))
    settings = load_settings()
    assert tune_with_workers(settings, "nosuch", TuneOptions.from_settings(settings)) == [1]
    assert "unknown hardware class 'nosuch'" in capfd.readouterr().err  # its one line, on Python's stderr
    assert log.exists() and "nosuch" not in log.read_text()  # fd 2 went to the file before the log line
