"""Smoke test of the TVM install: ``tvm.ir.save_json`` must not crash.

apache-tvm-ffi 0.1.15.post2 (what pip picks for apache-tvm 0.27.0.post1) segfaults in
``tvm.ir.save_json`` and kills tuning at once; pyproject pins 0.1.14.post1. The check runs in a
subprocess so a segfault fails this test (non-zero exit) instead of killing pytest.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent(
    """
    import importlib.metadata as md
    import tvm, tvm_ffi
    from tvm.relax.frontend import nn

    print("apache-tvm", md.version("apache-tvm"), "apache-tvm-ffi", md.version("apache-tvm-ffi"),
          flush=True)

    class Tiny(nn.Module):
        def __init__(self):
            self.fc = nn.Linear(4, 8)
        def forward(self, x):
            return nn.relu(self.fc(x))

    mod, _ = Tiny().export_tvm({"forward": {"x": nn.spec.Tensor((1, 4), "float32")}})
    mod = tvm.relax.transform.LegalizeOps()(mod)
    text = tvm.ir.save_json(mod)
    assert tvm_ffi.structural_equal(tvm.ir.load_json(text), mod)
    print("save_json ok", len(text), flush=True)
    """
)


def test_save_json_does_not_crash() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, (
        f"tvm.ir.save_json failed with exit code {proc.returncode} (-11 = segfault: check that "
        f"apache-tvm-ffi is pinned to 0.1.14.post1)\nstdout: {proc.stdout[-2000:]}\n"
        f"stderr: {proc.stderr[-2000:]}"
    )
    assert "save_json ok" in proc.stdout
