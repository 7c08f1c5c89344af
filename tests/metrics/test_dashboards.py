"""The committed dashboards: generated from code, stable panel ids, Prometheus datasource variable,
and every query names metrics (and labels) that FleetMetrics really exports."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from types import ModuleType
from typing import Any

import pytest

from tunefleet.energy.metrics import FleetMetrics

from .conftest import GENERATOR, REPO
from .test_metrics import observe_everything

FILES = ("energy.json", "cost.json", "tuning.json")
METRIC_RE = re.compile(r"\b(tunefleet_[a-z0-9_]+)")
SELECTOR_RE = re.compile(r"\b(tunefleet_[a-z0-9_]+)\{([^}]*)\}")
MATCHER_RE = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
BY_RE = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
#: Labels the Pushgateway path adds to every series (grouping key, job, instance).
PUSH_LABELS = {"job", "instance", "shard"}
#: Panels that cannot honour $hardware: the push timestamp has no hardware label of its own.
IGNORES_HARDWARE = {305}


def exported() -> dict[str, set[str]]:
    """Sample name -> label names, from a FleetMetrics that observed everything."""
    m = FleetMetrics()
    observe_everything(m)
    m.last_push.set(1.0)
    names: dict[str, set[str]] = {}
    for family in m.registry.collect():
        for s in family.samples:
            names.setdefault(s.name, set()).update(s.labels)
    return names


@pytest.fixture(scope="module")
def boards() -> dict[str, dict[str, Any]]:
    return {name: json.loads((REPO / "dashboards" / name).read_text(encoding="utf-8")) for name in FILES}


def all_panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in board["panels"]:
        out.append(p)
        out.extend(p.get("panels") or [])
    return out


def test_regenerating_is_byte_identical(generator: ModuleType) -> None:
    generated = generator.generate()
    assert sorted(generated) == sorted(FILES)
    for name, text in generated.items():
        committed = (REPO / "dashboards" / name).read_text(encoding="utf-8")
        assert committed == text, f"dashboards/{name} is stale: run python dashboards/generate.py"
        assert text.endswith("}\n") and json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n" == text
    # and twice in a row gives the same bytes
    assert generator.generate() == generated


def test_check_mode_exit_codes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ok = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    # a changed copy is detected (run the generator from a copy of the directory)
    copy = tmp_path / "dashboards"
    copy.mkdir()
    (copy / "generate.py").write_text(GENERATOR.read_text())
    for name in FILES:
        (copy / name).write_text((REPO / "dashboards" / name).read_text())
    (copy / "cost.json").write_text((copy / "cost.json").read_text().replace("Total cost", "Total c0st"))
    bad = subprocess.run([sys.executable, str(copy / "generate.py"), "--check"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode == 1 and "cost.json" in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr


def test_dashboard_metadata_and_variables(boards: dict[str, dict[str, Any]]) -> None:
    titles = {name: b["title"] for name, b in boards.items()}
    assert titles == {"energy.json": "tunefleet — energy", "cost.json": "tunefleet — cost",
                      "tuning.json": "tunefleet — tuning"}
    assert len({b["uid"] for b in boards.values()}) == 3
    for name, board in boards.items():
        assert "id" not in board or board["id"] is None, name  # importable anywhere
        variables = {v["name"]: v for v in board["templating"]["list"]}
        ds = variables["datasource"]
        assert (ds["type"], ds["query"]) == ("datasource", "prometheus"), name
        hw = variables["hardware"]
        assert hw["type"] == "query" and hw["multi"] and hw["includeAll"], name
        assert hw["query"] == "label_values(tunefleet_trials_total, hardware)"
        assert hw["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_panel_ids_unique_stable_and_datasource_variable(boards: dict[str, dict[str, Any]],
                                                         generator: ModuleType) -> None:
    seen: dict[int, str] = {}
    prefix = {"energy.json": 1, "cost.json": 2, "tuning.json": 3}
    for name, board in boards.items():
        for panel in all_panels(board):
            pid = panel.get("id")
            assert isinstance(pid, int) and pid > 0, (name, panel.get("title"))
            assert pid not in seen, f"panel id {pid} in {name} also in {seen.get(pid)}"
            seen[pid] = name
            assert pid // 100 == prefix[name], (name, pid)
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (name, pid)
            assert panel.get("targets"), (name, pid)
            for t in panel["targets"]:
                assert t["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, (name, pid)
                assert t["refId"], (name, pid)
            if pid not in IGNORES_HARDWARE:
                assert "$hardware" in "".join(t["expr"] for t in panel["targets"]), f"{name} #{pid} ignores $hardware"
    # panel_queries sees every target
    total_targets = sum(len(p["targets"]) for b in boards.values() for p in all_panels(b))
    assert sum(len(generator.panel_queries(b)) for b in boards.values()) == total_targets


def test_every_query_names_exported_metrics_and_labels(boards: dict[str, dict[str, Any]],
                                                       generator: ModuleType) -> None:
    names = exported()
    for board in boards.values():
        for q in generator.panel_queries(board):
            metrics = METRIC_RE.findall(q.expr)
            assert metrics, q
            for metric in metrics:
                assert metric in names, f"{q.dashboard} #{q.panel_id} {q.title}: unknown metric {metric}"
            for metric, matchers in SELECTOR_RE.findall(q.expr):
                for label in MATCHER_RE.findall(matchers):
                    assert label in names[metric] | PUSH_LABELS, f"#{q.panel_id}: {metric} has no label {label}"
            usable = set().union(*(names[m] for m in metrics)) | PUSH_LABELS
            for group in BY_RE.findall(q.expr):
                for label in filter(None, (x.strip() for x in group.split(","))):
                    assert label in usable, f"#{q.panel_id} {q.title}: aggregates by unknown label {label}"


def test_substitute(generator: ModuleType) -> None:
    expr = 'sum(increase(x{hardware=~"$hardware"}[$__rate_interval])) / sum(increase(x{hardware=~"${hardware}"}[$__range]))'
    assert generator.substitute(expr, hardware="x86|arm", rate_interval="30s", range="5m") == (
        'sum(increase(x{hardware=~"x86|arm"}[30s])) / sum(increase(x{hardware=~"x86|arm"}[5m]))')
    assert generator.substitute("rate(x[$__interval])", rate_interval="2m") == "rate(x[2m])"
    with pytest.raises(KeyError):
        generator.substitute("x{model=~\"$model\"}")
    for board in generator.load_committed().values():
        for q in generator.panel_queries(board):
            assert "$" not in generator.substitute(q.expr), q
