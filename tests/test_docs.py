"""The documentation: the MkDocs site builds in strict mode (so its links resolve), the README stays
short and its links point at files that exist, and the CLI guide names every command."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tunefleet.cli.app import build_parser

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 200

#: ``[text](target)``; images too. Fenced code blocks are removed first.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def test_mkdocs_build_strict(tmp_path: Path) -> None:
    """`mkdocs build --strict` fails on a broken link or anchor between pages, or a page left out."""
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (at most {MAX_README_LINES}): move material into a guide in docs/")


def test_readme_links_resolve() -> None:
    text = FENCE.sub("", README.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the README itself
        path = target.split("#", 1)[0]
        if not (ROOT / path).exists():
            broken.append(target)
    assert not broken, f"README.md links to files that do not exist: {broken}"


def _commands(parser: argparse.ArgumentParser, path: str) -> list[str]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                nested = _commands(child, f"{path} {name}")
                found.extend(nested or [f"{path} {name}"])
    return found


def test_cli_guide_lists_every_command() -> None:
    guide = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    missing = [c for c in _commands(build_parser(), "tunefleet") if f"`{c}`" not in guide]
    assert not missing, f"docs/cli.md does not list: {missing}"


@pytest.mark.slow
def test_the_python_guide_s_script_runs_as_written(tmp_path: Path) -> None:
    """docs/python.md's script, in a fresh home as a user would run it (tuning mlp: slow)."""
    import os

    text = (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
    script = re.search(r"^```python\n(.*?)^```", text, re.S | re.M)
    assert script is not None, "docs/python.md has no python block"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEFLEET_")}
    env["TUNEFLEET_HOME"] = str(tmp_path / "home")
    out = subprocess.run([sys.executable, "-c", script.group(1)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    measured = re.search(r"^(\d+) candidates measured; stopped: ", out.stdout, re.M)
    assert measured and 3 <= int(measured.group(1)) <= 24, out.stdout
    assert len(re.findall(r"^\S+ \(x\d+\): \d+\.\d us$", out.stdout, re.M)) == 3, out.stdout  # every workload tuned
    assert re.search(r"^tuned \d+\.\d{3} ms, untuned \d+\.\d{3} ms -> mlp-x86.so$", out.stdout, re.M), out.stdout
    assert (tmp_path / "mlp-x86.so").stat().st_size > 0
