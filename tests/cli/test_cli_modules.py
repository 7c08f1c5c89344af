"""The shape of the `tunefleet.cli` package: small modules, every command added once, a fast start,
and the commands reach the core's connect/ingest/tune/build through `tunefleet.api`."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tunefleet.cli

CLI = Path(tunefleet.cli.__file__).parent
MAX_LINES = 500

#: Imports the command modules leave to `tunefleet.api` (connect, ingest, tune, build).
VIA_API = {("tunefleet.context", "Context"), ("tunefleet.models.ingest", "ingest"),
           ("tunefleet.engine.worker", "drain"), ("tunefleet.engine.worker", "tune_with_workers"),
           ("tunefleet.delivery.build", "build_model")}


def test_no_cli_module_exceeds_500_lines() -> None:
    long = {p.name: n for p in sorted(CLI.glob("*.py")) if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_every_command_is_added_once_in_the_help_order() -> None:
    from tunefleet.cli.app import COMMANDS, MODULES

    names = [name for module in MODULES for name in module.PARSERS]
    assert len(names) == len(set(names)), names
    assert sorted(COMMANDS) == sorted(names)


def _runtime_imports(tree: ast.AST) -> list[tuple[str, str]]:
    """(module, name) of every ``from ... import`` outside ``if TYPE_CHECKING:`` blocks."""
    found: list[tuple[str, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return
        if isinstance(node, ast.ImportFrom) and node.module:
            found.extend((node.module, a.name) for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def test_commands_connect_ingest_tune_and_build_through_the_api() -> None:
    bad = [f"{p.name}: from {mod} import {name}" for p in sorted(CLI.glob("*.py"))
           for mod, name in _runtime_imports(ast.parse(p.read_text())) if (mod, name) in VIA_API]
    assert not bad, bad


def test_help_loads_no_heavy_library() -> None:
    """`tunefleet --help` builds every command's parser: the libraries load in the commands."""
    code = ("import sys; from tunefleet.cli.app import build_parser; build_parser(); "
            "print(sorted(m for m in ('tvm', 'torch', 'onnx', 'prefect', 'sqlalchemy', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
