"""Ctrl-C always ends the command, even when giving leases back or stopping children fails.

An exception escaping the SIGINT handler is raised into whatever the main thread runs; code that
retries on errors (as Prefect's task retries do) then carries on instead of stopping. The
stand-in below retries on every exception, so only an exit from the handler itself ends it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_SCRIPT = textwrap.dedent(
    """
    import time
    import psutil
    import tunefleet.cli.interrupt as cli
    from tunefleet.config import Settings

    class Exited:  # a child that exits between being listed and being signalled
        pid = 2 ** 22 + 1
        def terminate(self):
            raise psutil.NoSuchProcess(self.pid)
        kill = terminate

    psutil.Process.children = lambda self, recursive=False: [Exited()]
    psutil.wait_procs = lambda procs, timeout=None: ([], list(procs))
    cli.stop_on_ctrl_c(Settings(), "tunefleet run --model mlp")
    print("ready", flush=True)
    while True:
        try:
            time.sleep(0.05)
        except Exception:  # a retrying caller
            pass
    """
)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_exits_when_a_child_is_already_gone(tmp_path: Path, signum: int, code: int) -> None:
    env = dict(os.environ, TUNEFLEET_HOME=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == code
        assert "resume with: tunefleet run --model mlp" in proc.communicate()[1]
    finally:
        proc.kill()
        proc.communicate()
