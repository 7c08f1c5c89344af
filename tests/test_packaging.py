"""Packaging: what the wheel ships, modules importing alone, and the imports ``bench/*.py`` make.

The distribution maps three source folders onto one package tree (pyproject.toml,
``[tool.setuptools] package-dir``)::

    tunefleet/  -> tunefleet
    tasks/      -> tunefleet.tasks
    flows/      -> tunefleet.flows

The editable install sees every module under those folders; a wheel (the image, a regular
install) only ships the packages listed in ``[tool.setuptools] packages``. Everything here is
discovered from the source tree, never listed by hand, so new subpackages are covered the day
they appear.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# package name -> source folder (pyproject.toml [tool.setuptools] package-dir)
PACKAGE_ROOTS: dict[str, Path] = {
    "tunefleet": REPO / "tunefleet",
    "tunefleet.tasks": REPO / "tasks",
    "tunefleet.flows": REPO / "flows",
}

# Alembic's folder: migration scripts and env.py are package data run by alembic, not modules.
MIGRATIONS = REPO / "tunefleet" / "db" / "migrations"

# Package data the code reads at run time (wheel paths are checked for every file under these).
DATA_FILES = [REPO / "flows" / "prefect.yaml"]
DATA_DIRS = [MIGRATIONS]

# Files next to pyproject.toml the build may need (readme, license, ...), copied when present.
BUILD_FILES = ["pyproject.toml", "setup.py", "setup.cfg", "MANIFEST.in", "README.md", "README.rst", "LICENSE",
               "LICENSE.txt", "NOTICE"]

IMPORT_TIMEOUT_S = 600


def _source_files() -> list[tuple[str, Path]]:
    """Every file under the three package folders as (path in the wheel, source path)."""
    out = []
    for package, root in PACKAGE_ROOTS.items():
        prefix = Path(*package.split("."))
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root)
            if not path.is_file() or "__pycache__" in rel.parts or path.suffix in (".pyc", ".pyo"):
                continue
            out.append(((prefix / rel).as_posix(), path))
    return out


def _expected_in_wheel() -> dict[str, Path]:
    """Wheel path -> source path: every ``.py`` module and the package data the code needs."""
    expected = {}
    for wheel_path, src in _source_files():
        if (src.suffix == ".py" or src in DATA_FILES
                or any(src.is_relative_to(d) for d in DATA_DIRS)):
            expected[wheel_path] = src
    return expected


def _module_name(wheel_path: str) -> str:
    parts = list(Path(wheel_path).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def discover_modules() -> list[str]:
    """Every importable module of the distribution (alembic's migrations folder excluded)."""
    names = set()
    for wheel_path, src in _source_files():
        if src.suffix == ".py" and not src.is_relative_to(MIGRATIONS):
            names.add(_module_name(wheel_path))
    return sorted(names)


# -- the wheel ships everything the editable install sees -----------------------------------------


def _build_wheel(tmp_path: Path) -> Path:
    """Build the wheel with this interpreter's pip (no new virtualenv), from a clean copy.

    A copy of the project files (no ``__pycache__``, no egg-info, no ``build/``) so that stale
    output of an earlier in-tree build can neither hide a missing module nor leave files behind.
    """
    src = tmp_path / "src"
    src.mkdir()
    for name in BUILD_FILES:
        if (REPO / name).is_file():
            shutil.copy2(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.egg-info")
    for root in PACKAGE_ROOTS.values():
        shutil.copytree(root, src / root.relative_to(REPO), ignore=ignore)
    out = tmp_path / "wheel"
    env = dict(os.environ, PIP_NO_INPUT="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-cache-dir", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env,
    )
    assert proc.returncode == 0, f"pip wheel failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    wheels = list(out.glob("tunefleet-*.whl"))
    assert len(wheels) == 1, f"expected one tunefleet wheel in {out}: {sorted(p.name for p in out.iterdir())}"
    return wheels[0]


def test_wheel_ships_every_module(tmp_path: Path) -> None:
    expected = _expected_in_wheel()
    assert "tunefleet/__init__.py" in expected and "tunefleet/tasks/__init__.py" in expected
    assert "tunefleet/flows/__init__.py" in expected

    with zipfile.ZipFile(_build_wheel(tmp_path)) as whl:
        shipped = {name for name in whl.namelist() if not name.endswith("/")}

    missing = sorted(set(expected) - shipped)
    if missing:
        packages = sorted({".".join(Path(p).parent.parts) for p in missing if p.endswith(".py")})
        lines = [f"  {_module_name(p) if p.endswith('.py') else p}  ({expected[p].relative_to(REPO)})"
                 for p in missing]
        pytest.fail(
            f"the wheel lacks {len(missing)} file(s) the editable install sees:\n" + "\n".join(lines)
            + f"\npackages involved: {', '.join(packages) or '(package data only)'}"
            + "\nlist the package in pyproject.toml [tool.setuptools] packages"
            + " (package data: [tool.setuptools.package-data])"
        )
    # and nothing that is not in the source tree (a module left behind by a move or a rename)
    stale = sorted(p for p in shipped if p.endswith(".py") and p not in expected)
    assert not stale, f"the wheel ships modules the source tree does not have: {stale}"


def wheel_in_a_virtualenv(tmp_path: Path) -> Path:
    """The wheel built from this tree, installed in a virtualenv of its own (``tmp_path/venv``);
    its ``bin`` folder, where its ``tunefleet`` console script is. Its dependencies come from this
    test's environment (a ``.pth`` line: nothing downloaded), whose editable tunefleet stays out (a
    ``.pth`` path's own ``.pth`` files are not read). Checks the package data ``tunefleet run``
    needs (migrations, the flows' prefect.yaml, the hub bundle, the shipped cost model, py.typed, the
    LICENSE) is in it:
    the CLI walk-through (tests/cli/test_cli_run.py) then runs the main job from this install."""
    import venv

    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
    assert {"tunefleet/py.typed", "tunefleet/data/hub/default.parquet", "tunefleet/data/costmodel/default.json",
            "tunefleet/db/migrations/versions/0011_api_tokens.py", "tunefleet/flows/prefect.yaml"} <= names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    deps = [p for p in sys.path if p.endswith("site-packages")]
    (site / "zz-test-dependencies.pth").write_text("\n".join(deps) + "\n")
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps",
                                "--no-index", str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr[-3000:]
    where = subprocess.run([str(py), "-c", "import tunefleet; print(tunefleet.__file__)"], cwd=tmp_path,
                           capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(site)), f"tunefleet imported from {where}, not the wheel"
    return env_dir / "bin"


# -- every module imports alone ------------------------------------------------------------------


#: Imports each module (argv[2], JSON) in a child forked from this process, which has loaded only
#: the third-party and standard-library packages the distribution imports (argv[1]): each child
#: starts with no module of ours loaded (argv[3]: our top-level packages), as a fresh interpreter
#: would, without loading TVM, PyTorch and Prefect again for every module. One JSON line a module.
_IMPORT_EACH_ALONE = r"""
import importlib, json, os, sys, time

for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception:  # the child that needs it reports it
        pass
ours = set(json.loads(sys.argv[3]))
early = sorted(m for m in sys.modules if m.split(".")[0] in ours)
assert not early, f"loaded before the fork: {early}"
for module in json.loads(sys.argv[2]):
    start = time.monotonic()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            importlib.import_module(module)
            error = ""
        except BaseException as exc:  # noqa: BLE001 - report whatever an import raises
            error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        os.write(write, error.encode()[:2000])
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as fh:
        error = fh.read()
    _, status = os.waitpid(pid, 0)
    rc = 1 if error else os.waitstatus_to_exitcode(status)
    print(json.dumps([module, rc, error, time.monotonic() - start]), flush=True)
"""


def _imported_roots(ours: set[str]) -> list[str]:
    """The top-level packages our modules import (anywhere in them), ours excepted."""
    roots = set()
    for _, src in _source_files():
        if src.suffix != ".py" or src.is_relative_to(MIGRATIONS):
            continue
        for node in ast.walk(ast.parse(src.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                roots.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots.add(node.module.split(".")[0])
    return sorted(roots - ours - {"__future__"})


def test_each_module_imports_alone(tmp_path: Path) -> None:
    """Each module with no other module of ours loaded before it: catches one that only imports
    after another did (a hidden import cycle, a missing import covered by import order).
    tunefleet.testing needs the test extras, which the suite has."""
    modules = discover_modules()
    assert {"tunefleet", "tunefleet.tasks", "tunefleet.flows", "tunefleet.tvm.bridge"} <= set(modules)
    assert not any(m.startswith("tunefleet.db.migrations") for m in modules)
    ours = {m.split(".")[0] for m in modules}

    # cwd outside the repository: imports resolve as they do for an installed tunefleet
    proc = subprocess.run([sys.executable, "-c", _IMPORT_EACH_ALONE, json.dumps(_imported_roots(ours)),
                           json.dumps(modules), json.dumps(sorted(ours))],
                          capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('["')]
    assert [m for m, *_ in results] == modules, proc.stderr[-3000:]

    failed = [(m, rc, last) for m, rc, last, _ in results if rc != 0]
    slowest = sorted(results, key=lambda r: -r[3])[:3]
    print(f"{len(modules)} modules imported alone; slowest: "
          + ", ".join(f"{m} {s:.1f}s" for m, _, _, s in slowest))
    assert not failed, (
        f"{len(failed)} of {len(modules)} module(s) fail to import alone:\n"
        + "\n".join(f"  {m} (exit {rc}): {last}" for m, rc, last in failed)
    )


# -- bench/*.py keep working ---------------------------------------------------------------------

_RESOLVE = r"""
import importlib, json, sys

failures = []
for where, module, names in json.load(sys.stdin):
    stmt = f"from {module} import {', '.join(names)}" if names else f"import {module}"
    try:
        mod = importlib.import_module(module)
    except BaseException as exc:  # noqa: BLE001 - report whatever an import raises
        failures.append(f"{where}: {stmt}: {type(exc).__name__}: {exc}")
        continue
    for name in names:
        if name == "*" or hasattr(mod, name):
            continue
        try:
            importlib.import_module(f"{module}.{name}")  # `from pkg import submodule`
        except ModuleNotFoundError as exc:
            if exc.name != f"{module}.{name}":
                failures.append(f"{where}: {stmt}: {module}.{name}: {type(exc).__name__}: {exc}")
            else:
                failures.append(f"{where}: {stmt}: {module} has no attribute or submodule {name!r}")
        except BaseException as exc:  # noqa: BLE001
            failures.append(f"{where}: {stmt}: {module}.{name}: {type(exc).__name__}: {exc}")
print(json.dumps(failures))
"""


def bench_imports() -> list[tuple[str, str, list[str]]]:
    """Every ``from tunefleet... import ...`` / ``import tunefleet...`` in bench/*.py, anywhere in the file."""
    found = []
    for path in sorted((REPO / "bench").glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                    node.module == "tunefleet" or node.module.startswith("tunefleet.")):
                found.append((where, node.module, [a.name for a in node.names]))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "tunefleet" or alias.name.startswith("tunefleet."):
                        found.append((where, alias.name, []))
    return sorted(found, key=lambda f: (f[0].split(":")[0], int(f[0].split(":")[1])))


def test_bench_imports_resolve(tmp_path: Path) -> None:
    imports = bench_imports()
    assert imports, "found no tunefleet import in bench/*.py: the parser is broken"
    proc = subprocess.run(
        [sys.executable, "-c", _RESOLVE], input=json.dumps(imports), capture_output=True, text=True,
        timeout=300, cwd=tmp_path,
    )
    assert proc.returncode == 0, f"the import checker itself failed:\n{proc.stderr[-3000:]}"
    failures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert not failures, (
        f"{len(failures)} import(s) of bench/*.py no longer resolve:\n" + "\n".join(f"  {f}" for f in failures)
    )
