"""How many threads TVM's kernels run on in this process: the hardware class's, not TVM's guess.

Without ``TVM_NUM_THREADS``, TVM 0.27 sizes its thread pool at half of
``std::thread::hardware_concurrency()`` on x86, assuming every core has two hardware threads. A
cloud VM whose vCPUs are cores (``lscpu``: one thread per core) then runs every kernel on half its
cores: on the 2-core development VM a tuned resnet18 ran 1.9x slower in ``tunefleet run``'s own
timing than in the bench, which sets the variable (docs/performance.md). The class's target says
how many cores its code is for (``num-cores``); :func:`use_threads` makes this process (and the
measurement workers it starts, which take its threading variables) run on that many.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

_THREAD_VAR = "TVM_NUM_THREADS"
_BIG_CORES = 1  # TVM's threading::ThreadGroup::kBig, the mode its pool starts in


def class_threads(target: Mapping[str, Any]) -> int:
    """The threads a hardware class's code runs on: its target's ``num-cores``, else the cores this
    process may use (``os.sched_getaffinity``: cgroup and taskset limits respected)."""
    return int(target.get("num-cores") or len(os.sched_getaffinity(0)))


def use_threads(threads: int) -> int:
    """Run TVM's kernels in this process on ``threads`` threads from now on.

    A ``TVM_NUM_THREADS`` the user set wins (a deployment may want fewer). Otherwise the variable
    is set, so worker processes started later take it, and the pool of this process, which TVM
    may have started already, is reconfigured.

    Returns
    -------
    int
        The thread count in force.
    """
    import tvm_ffi

    chosen = os.environ.get(_THREAD_VAR)
    if chosen is not None:
        return int(chosen)
    os.environ[_THREAD_VAR] = str(threads)
    tvm_ffi.get_global_func("runtime.config_threadpool")(_BIG_CORES, threads)
    log.debug("TVM runs its kernels on %d threads (%s)", threads, _THREAD_VAR)
    return threads
