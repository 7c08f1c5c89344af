"""A process that only tunes loads TVM without PyTorch (tunefleet.tvm.without_torch)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

#: In a fresh interpreter, as a tuning worker starts: TVM without torch, the builder's fork server
#: too (its worker writes which of the two it has loaded), then torch imported and used after TVM.
_SCRIPT = r"""
import functools, sys
import tunefleet.tvm.without_torch
assert "tvm" in sys.modules and "torch" not in sys.modules, sorted(m for m in sys.modules if "torch" in m)[:5]
from tunefleet.tvm.builder import PersistentBuilder
probe = "open(PROBE, 'w').write(' '.join(m for m in ('torch', 'tvm') if m in __import__('sys').modules))"
with PersistentBuilder(max_workers=1, initializer=functools.partial(exec, probe.replace("PROBE", repr(sys.argv[1])))) as b:
    b.warmup()
import torch
import tvm
x = torch.arange(4, dtype=torch.float32)
print(tvm.runtime.from_dlpack(x).numpy().sum())
"""


def test_a_tuning_process_and_its_builders_load_tvm_without_torch(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    out = subprocess.run([sys.executable, "-c", _SCRIPT, str(probe)], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert probe.read_text() == "tvm"  # the fork server's worker: TVM loaded, torch not
    assert out.stdout.strip().splitlines()[-1] == "6.0"  # torch imports after TVM, and the two share tensors


def test_nothing_changes_where_torch_is_loaded_already() -> None:
    script = ("import sys, torch; import tunefleet.tvm.without_torch; "
              "assert sys.modules['torch'] is torch and 'tvm' in sys.modules")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
