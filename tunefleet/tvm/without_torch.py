"""Import TVM without the PyTorch import it does not need: importing this module does it.

``tvm_ffi`` (under ``import tvm``) imports ``torch`` eagerly, only to avoid a symbol clash on
Windows, and loads torch's optional DLPack extension if torch is there. A process that builds and
times kernels never uses torch, yet paid for it: importing torch takes most of ``import tvm``'s
time and memory (docs/performance.md, "Before the first trial"). Every process that tunes pays it at least
twice (its own import and the builder's fork server), and a restarted worker pays it again.

So the processes that only tune (the fork server of :mod:`tunefleet.tvm.builder`, the workers
of ``tunefleet tune``) import this module first: TVM is imported with ``import torch`` made to
fail, then torch is importable again, at its usual cost, should something need it later (a build
that times PyTorch eager imports it then, and torch and TVM work together as usual: the DLPack
protocol does not need the extension). Where torch or TVM is loaded already, nothing changes.
"""

from __future__ import annotations

import sys


def import_tvm() -> None:
    """Import ``tvm``, without ``torch`` unless either is imported already."""
    block = "tvm" not in sys.modules and "torch" not in sys.modules
    if block:
        sys.modules["torch"] = None  # type: ignore[assignment]  # `import torch` raises ImportError
    try:
        import tvm  # noqa: F401
    finally:
        if block and sys.modules.get("torch", ...) is None:
            del sys.modules["torch"]


import_tvm()
