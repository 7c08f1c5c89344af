"""One version: ``tunefleet.__version__``. The package metadata reads it (pyproject's dynamic
version), and every image tag the repository names — Kubernetes manifests, work-pool templates,
the Helm chart, the Dockerfile, the docs — must be it, so a release changes one line."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import yaml

import tunefleet

ROOT = Path(__file__).resolve().parents[1]
#: Where image tags are written: everything tracked but the tests' own fixtures of made-up registries.
SCANNED = ("Dockerfile", "README.md", "docs", "helm", "k8s", "tunefleet", "flows", "scripts", "bench")
IMAGE = re.compile(r"\btunefleet:(\d+\.\d+\.\d+)")


def _text_files() -> list[Path]:
    out = []
    for name in SCANNED:
        path = ROOT / name
        for f in [path] if path.is_file() else sorted(path.rglob("*")):
            if f.is_file() and f.suffix in {"", ".md", ".yaml", ".yml", ".json", ".py", ".sh", ".tpl", ".txt"} \
                    and "node_modules" not in f.parts and "__pycache__" not in f.parts:
                out.append(f)
    return out


def test_the_package_metadata_is_the_module_s_version() -> None:
    assert importlib.metadata.version("tunefleet") == tunefleet.__version__


def test_every_image_tag_is_the_package_version() -> None:
    tags = {(str(f.relative_to(ROOT)), m.group(1)) for f in _text_files()
            for m in IMAGE.finditer(f.read_text(errors="replace"))}
    assert len({f for f, _ in tags}) >= 8  # the manifests, pools, templates, chart docs, Dockerfile
    wrong = sorted((f, v) for f, v in tags if v != tunefleet.__version__)
    assert not wrong, f"image tags that are not tunefleet {tunefleet.__version__}: {wrong}"


def test_the_chart_s_app_version_and_image_tag_are_the_package_version() -> None:
    chart = yaml.safe_load((ROOT / "helm" / "tunefleet" / "Chart.yaml").read_text())
    values = yaml.safe_load((ROOT / "helm" / "tunefleet" / "values.yaml").read_text())
    assert chart["appVersion"] == values["image"]["tag"] == tunefleet.__version__
