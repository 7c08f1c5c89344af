"""The layers of tunefleet hold: import-linter's contracts (pyproject.toml), no import loop, and
the orchestration packages (``tasks/``, ``flows/``) that import-linter cannot see on disk."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_are_kept() -> None:
    lint = Path(sys.executable).with_name("lint-imports")
    out = subprocess.run([str(lint), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "BROKEN" not in out.stdout and "KEPT" in out.stdout


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of a directed graph, those with more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_no_modules_import_each_other_in_a_loop() -> None:
    """Module-level and function-level imports alike (type-checking-only imports never run)."""
    import grimp

    graph = grimp.build_graph("tunefleet", exclude_type_checking_imports=True, cache_dir=None)
    # a package's __init__ importing its own submodules is not a loop between modules
    edges = {m: {t for t in graph.find_modules_directly_imported_by(m)
                 if not (m.startswith(t + ".") or t.startswith(m + "."))} for m in graph.modules}
    loops = _strongly_connected(edges)
    assert not loops, "modules that import each other in a loop: " + "; ".join(" <-> ".join(c) for c in loops)


def _imports(folder: Path) -> list[tuple[str, int, str]]:
    """(file, line, imported module) for every tunefleet import in a folder, in functions too."""
    out = []
    for path in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tunefleet"):
                out.append((path.name, node.lineno, node.module))
            elif isinstance(node, ast.Import):
                out += [(path.name, node.lineno, a.name) for a in node.names if a.name.startswith("tunefleet")]
    return out


_ENTRY_POINTS = ("tunefleet.cli", "tunefleet.cluster.deploy", "tunefleet.testing")


@pytest.mark.parametrize(("folder", "forbidden"), [
    # Prefect tasks wrap the core; flows chain tasks. Neither reaches up to the CLI or the deployer,
    # and tasks never start flows.
    ("tasks", ("tunefleet.flows", *_ENTRY_POINTS)),
    ("flows", _ENTRY_POINTS),
])
def test_orchestration_packages_import_downward(folder: str, forbidden: tuple[str, ...]) -> None:
    bad = [f"{folder}/{f}:{line} imports {mod}" for f, line, mod in _imports(REPO / folder)
           if any(mod == x or mod.startswith(x + ".") for x in forbidden)]
    assert not bad, bad


def test_only_entry_points_import_the_orchestration_packages() -> None:
    """The core never imports Prefect's tasks or flows; only the CLI and the deployer start them."""
    bad = []
    for path in sorted((REPO / "tunefleet").rglob("*.py")):
        module = ".".join(path.relative_to(REPO).with_suffix("").parts)
        if module.startswith(_ENTRY_POINTS):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            bad += [f"{module}:{node.lineno} imports {n}" for n in names
                    if n.startswith(("tunefleet.tasks", "tunefleet.flows"))]
    assert not bad, bad
