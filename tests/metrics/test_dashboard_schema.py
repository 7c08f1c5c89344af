"""The committed dashboards type-check against Grafana's own TypeScript schema (@grafana/schema,
the 11.6 line pinned in dashboards/schema_check/package.json), offline, with ``tsc``.

``dashboards/schema_check/emit.py`` writes each dashboard JSON as a typed object literal
(``check.ts``); ``tsc -p dashboards/schema_check`` checks it. Needs ``node`` and ``npm`` on PATH;
``npm ci`` runs once when ``node_modules`` is missing or holds other versions than the pins.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from .conftest import REPO, load_script

pytestmark = pytest.mark.slow

CHECK_DIR = REPO / "dashboards" / "schema_check"
EMIT = CHECK_DIR / "emit.py"
NODE_MODULES = CHECK_DIR / "node_modules"
TSC = NODE_MODULES / "typescript" / "bin" / "tsc"
#: ``check.ts(12,5): error TS2322: ...`` (tsc without a terminal prints no colours/context).
ERROR_RE = re.compile(r"^(?P<file>[^\s(][^(]*)\(\d+,\d+\): error (?P<code>TS\d+): ", re.M)


def _load_emit() -> ModuleType:
    return load_script(EMIT, "tunefleet_dashboards_schema_check_emit")


def _installed_matches_pins() -> bool:
    pins = json.loads((CHECK_DIR / "package.json").read_text())["devDependencies"]
    for package, version in pins.items():
        manifest = NODE_MODULES / package / "package.json"
        if not manifest.is_file() or json.loads(manifest.read_text()).get("version") != version:
            return False
    return True


@pytest.fixture(scope="module")
def tsc() -> list[str]:
    """The command that runs the pinned TypeScript compiler; installs the pins with ``npm ci`` first
    when needed."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        missing = " and ".join(n for n, p in (("node", node), ("npm", npm)) if not p)
        pytest.fail(f"{missing} not on PATH: install Node.js >= 18 with npm (Debian: apt-get install nodejs npm)", pytrace=False)
    if not _installed_matches_pins():
        started = time.perf_counter()
        result = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund"], cwd=CHECK_DIR, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, f"npm ci failed in {CHECK_DIR}:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
        print(f"npm ci: {time.perf_counter() - started:.1f}s")
        assert _installed_matches_pins(), "npm ci installed other versions than package.json pins"
    return [node, str(TSC)]


def _run_tsc(tsc: list[str], project: Path) -> subprocess.CompletedProcess[str]:
    # --pretty false: plain "file(line,col): error TSxxxx: ..." lines whatever the terminal.
    return subprocess.run(
        [*tsc, "-p", str(project), "--pretty", "false"],
        cwd=project if project.is_dir() else project.parent,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_COLOR": "1"},
    )


def test_committed_dashboards_pass_grafana_schema(tsc: list[str], record_property: Any) -> None:
    started = time.perf_counter()
    emitted = subprocess.run([sys.executable, str(EMIT)], cwd=CHECK_DIR, capture_output=True, text=True, timeout=60)
    assert emitted.returncode == 0, emitted.stderr
    check_ts = (CHECK_DIR / "check.ts").read_text()
    for name in ("energy.json", "cost.json", "tuning.json"):
        assert f"// {name} $" in check_ts, f"{name} missing from check.ts"

    result = _run_tsc(tsc, CHECK_DIR)
    elapsed = time.perf_counter() - started
    record_property("seconds", round(elapsed, 2))
    print(f"emit + tsc on the committed dashboards: {elapsed:.1f}s")
    report = _load_emit().annotate(result.stdout + result.stderr, CHECK_DIR)
    assert result.returncode == 0, f"dashboards do not match @grafana/schema:\n{report}"


def _first(dashboard: dict[str, Any], panel_type: str) -> tuple[int, dict[str, Any]]:
    return next((i, p) for i, p in enumerate(dashboard["panels"]) if p["type"] == panel_type)


def _broken_copies() -> dict[str, tuple[dict[str, Any], str]]:
    """name -> (dashboard with one invalid field, JSON path tsc must report)."""
    dashboards = {n: json.loads((REPO / "dashboards" / f"{n}.json").read_text()) for n in ("energy", "cost", "tuning")}
    cases: dict[str, tuple[dict[str, Any], str]] = {}

    d = copy.deepcopy(dashboards["energy"])
    d["refresh"] = 5  # Dashboard.refresh: string
    cases["refresh_number"] = (d, "$.refresh")

    d = copy.deepcopy(dashboards["cost"])
    d["panels"][0]["gridPos"]["h"] = "4"  # GridPos.h: number
    cases["gridpos_h_string"] = (d, "$.panels[0].gridPos.h")

    d = copy.deepcopy(dashboards["tuning"])
    i, panel = _first(d, "stat")
    panel["options"]["colorMode"] = "rainbow"  # stat Options.colorMode: BigValueColorMode
    cases["stat_color_mode"] = (d, f"$.panels[{i}].options.colorMode")

    d = copy.deepcopy(dashboards["energy"])
    i, panel = _first(d, "timeseries")
    panel["gridpos"] = panel.pop("gridPos")  # misspelt key: excess property
    cases["misspelt_key"] = (d, f"$.panels[{i}].gridpos")
    return cases


def test_schema_check_rejects_invalid_fields(tsc: list[str], tmp_path: Path, record_property: Any) -> None:
    """Each broken copy fails with exactly one error, at the field that was broken."""
    emit = _load_emit()
    started = time.perf_counter()
    cases = _broken_copies()
    for name, (dashboard, _) in cases.items():
        source = tmp_path / f"{name}.json"
        source.write_text(json.dumps(dashboard, indent=2))
        emit.emit([source], tmp_path / f"{name}.ts")
    # Extends the real tsconfig; @grafana/schema still comes from schema_check/node_modules.
    schema = NODE_MODULES / "@grafana" / "schema"
    (tmp_path / "tsconfig.json").write_text(
        json.dumps(
            {
                "extends": str(CHECK_DIR / "tsconfig.json"),
                "compilerOptions": {"paths": {"@grafana/schema": [str(schema)], "@grafana/schema/*": [f"{schema}/*"]}},
                "files": [f"{name}.ts" for name in cases],
            }
        )
    )

    result = _run_tsc(tsc, tmp_path)
    elapsed = time.perf_counter() - started
    record_property("seconds", round(elapsed, 2))
    print(f"emit + tsc on {len(cases)} broken copies: {elapsed:.1f}s")
    output = result.stdout + result.stderr
    report = emit.annotate(output, tmp_path)
    assert result.returncode != 0, f"tsc accepted every broken copy:\n{report}"

    errors = [line for line in report.splitlines() if ERROR_RE.match(line)]
    for name, (_, path) in cases.items():
        mine = [line for line in errors if Path(ERROR_RE.match(line)["file"]).name == f"{name}.ts"]
        assert len(mine) == 1, f"{name}: expected one error at {path}, got:\n" + "\n".join(mine or [report])
        assert mine[0].endswith(f"[{name}.json {path}]"), f"{name}: error not at {path}:\n{mine[0]}"
    assert len(errors) == len(cases), report
    # tsc names the offending key itself where it can (excess property); the value errors are
    # located by the JSON path emit.py tags each line with.
    assert "'\"gridpos\"' does not exist" in output, report
    assert "'\"rainbow\"' is not assignable" in output, report
