"""TVM's kernels run on the hardware class's threads, not on TVM's guess of half the hardware
threads (a 2-core VM without SMT got one thread: the run's own table said the tuned resnet18 took
1.9x what the bench measured)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

# A parallel kernel, then the size of the pool that ran it: in a fresh process, since the pool
# is the process's.
_SCRIPT = textwrap.dedent(
    """
    import numpy as np, tvm, tvm_ffi
    from tvm import te
    from tunefleet.tvm.threads import use_threads
    print(use_threads(2))
    n = 1 << 16
    a = te.placeholder((n,), name="a")
    b = te.compute((n,), lambda i: a[i] * 2.0, name="b")
    f = tvm.build(te.create_prim_func([a, b]).with_attr("global_symbol", "main"), target="llvm")
    x = tvm.runtime.tensor(np.ones(n, "float32"))
    f(x, tvm.runtime.tensor(np.zeros(n, "float32")))
    print(tvm_ffi.get_global_func("runtime.NumThreads")())
    """
)


def _run(env: dict[str, str]) -> list[str]:
    out = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_use_threads_sizes_tvms_pool_unless_the_user_did() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TVM_NUM_THREADS", "OMP_NUM_THREADS")}
    assert _run(env) == ["2", "2"]
    assert _run({**env, "TVM_NUM_THREADS": "1"}) == ["1", "1"]  # the user's choice wins
