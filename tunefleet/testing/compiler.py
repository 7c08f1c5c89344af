"""A C++ compiler that a test can break: the node fault of the fault tests.

TVM's runner links every built module with the compiler ``CXX`` names (``load_module`` of a
``.tar``). Point ``CXX`` at :attr:`Compiler.path`, a script that runs the system's compiler until
:meth:`Compiler.break_it` ("the compiler made unavailable for one worker"), then fails like a
missing one, until :meth:`Compiler.repair`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

BROKEN_MESSAGE = "cxx: compiler not installed on this node"


class Compiler:
    """The script ``folder / "cxx"``, working when made."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "cxx"
        real = shutil.which("g++") or shutil.which("c++") or shutil.which("cc")
        if real is None:
            raise RuntimeError("no C++ compiler on this machine")
        self.real = real
        self.repair()

    def repair(self) -> None:
        self.path.write_text(f'#!/bin/sh\nexec "{self.real}" "$@"\n')
        self.path.chmod(0o755)

    def break_it(self) -> None:
        self.path.write_text(f'#!/bin/sh\necho "{BROKEN_MESSAGE}" >&2\nexit 127\n')
