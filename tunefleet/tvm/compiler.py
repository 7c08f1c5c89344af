"""The C/C++ compiler TVM links with: whether this machine has it.

A module of its own so that ``run``'s preflight asks without importing MetaSchedule
(:mod:`tunefleet.tvm.probe` does, and calls this too).
"""

from __future__ import annotations

import os
import shutil


def missing_compiler() -> str | None:
    """Why TVM cannot link what it builds here, in one line (None: it can). Every candidate the
    runner loads and every exported model are linked with a C/C++ compiler: the one ``CXX`` (or
    ``CC``) names, else the first of g++, gcc, clang++, clang, c++, cc on ``PATH`` (TVM's own
    lookup, :func:`tvm.support.cc.get_cc`)."""
    from tvm.support.cc import get_cc

    found = get_cc()
    if found is None:
        return ("no C/C++ compiler on PATH: TVM links every tuned candidate and the built model with one "
                "(g++, clang++ or cc; or name it in CXX); install one, e.g. `apt-get install g++`")
    if shutil.which(found) is None:
        named = "CXX" if os.environ.get("CXX") else "CC"
        return f"the C/C++ compiler {named} names, {found!r}, is not there: TVM links every tuned candidate with it"
    return None


__all__ = ["missing_compiler"]
