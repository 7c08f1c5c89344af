"""Kubernetes work pools: the Job every deployment would create, rendered and validated offline.

No API server and no Prefect server run here. Jobs are rendered with prefect-kubernetes' own
worker code (``tunefleet.cluster.job_templates.render_job``) and validated against the Kubernetes 1.30 OpenAPI
schemas with ``kubernetes-validate`` in strict mode (unknown fields are errors).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tunefleet.cluster import job_templates
from tunefleet.errors import ConfigError, NotSupportedError, TunefleetError

ROOT = Path(__file__).resolve().parents[2]
WORK_POOLS = ROOT / "k8s" / "work-pools"
PREFECT_YAML = ROOT / "flows" / "prefect.yaml"
DEPLOYMENTS: list[dict[str, Any]] = yaml.safe_load(PREFECT_YAML.read_text())["deployments"]


@pytest.fixture(scope="module")
def templates() -> dict[str, dict[str, Any]]:
    return job_templates.default_templates()


def pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]


def container(job: dict[str, Any]) -> dict[str, Any]:
    return pod_spec(job)["containers"][0]


def render_deployment(deployment: dict[str, Any], templates: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The Job a flow run of ``deployment`` gets from its work pool, found by the pool's name."""
    by_pool = {job_templates.pool_name(hw): template for hw, template in templates.items()}
    pool = deployment["work_pool"]
    assert pool["name"] in by_pool, f"{deployment['name']}: no template for work pool {pool['name']}"
    return job_templates.render_job(by_pool[pool["name"]], pool.get("job_variables"),
                          flow_run_name=f"{deployment['name']}-run", deployment_name=deployment["name"],
                          flow_name=deployment["entrypoint"].rsplit(".", 1)[-1])


def test_committed_work_pool_templates_match_default_templates(templates) -> None:  # type: ignore[no-untyped-def]
    committed = {path.stem: json.loads(path.read_text()) for path in sorted(WORK_POOLS.glob("*.json"))}
    assert committed == templates, "k8s/work-pools/ is stale: run python -m tunefleet.cluster.job_templates export k8s/work-pools"


def test_export_writes_the_committed_bytes(tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert job_templates.main(["export", str(tmp_path)]) == 0
    for name in ("x86", "arm", "gpu"):
        assert (tmp_path / f"{name}.json").read_bytes() == (WORK_POOLS / f"{name}.json").read_bytes()


def test_templates_pass_prefect_server_validation_offline(templates) -> None:  # type: ignore[no-untyped-def]
    """What the Prefect server checks when tunefleet deploy creates the pools and deployments."""
    from prefect.server.schemas.actions import WorkPoolCreate
    from prefect.utilities.schema_tools import validate

    for hw, template in templates.items():
        pool = WorkPoolCreate(name=job_templates.pool_name(hw), type="kubernetes", base_job_template=template)
        assert pool.base_job_template == template
        variables = template["variables"]
        defaults = {k: v["default"] for k, v in variables["properties"].items()
                    if v.get("default") is not None}
        validate(defaults, variables, raise_on_error=True, preprocess=True, ignore_required=True)


def test_template_variables(templates) -> None:  # type: ignore[no-untyped-def]
    stock = {"image", "namespace", "service_account_name", "env", "labels", "name", "command",
             "annotations", "image_pull_policy", "finished_job_ttl", "job_watch_timeout_seconds",
             "pod_watch_timeout_seconds", "stream_output", "cluster_config", "backoff_limit",
             "cpu_request", "cpu_limit", "memory_request"}
    for hw, template in templates.items():
        props = template["variables"]["properties"]
        assert stock | {"node_selector", "tolerations", "gpu_limit", "active_deadline_seconds"} <= set(props)
        assert props["image"]["default"] == "tunefleet:0.1.0"
        assert props["namespace"]["default"] == "tunefleet"
        assert props["service_account_name"]["default"] == "tunefleet-run"
        assert props["env"]["default"]["PREFECT_LOGGING_EXTRA_LOGGERS"] == "tunefleet"
        assert props["labels"]["default"] == {"tunefleet.io/hardware": hw}
        assert props["gpu_limit"]["default"] == (1 if hw == "gpu" else None)
        assert props["active_deadline_seconds"]["default"] == job_templates.DEFAULT_ACTIVE_DEADLINE_S


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=[d["name"] for d in DEPLOYMENTS])
def test_rendered_job_validates_offline_strict(deployment, templates) -> None:  # type: ignore[no-untyped-def]
    job = render_deployment(deployment, templates)
    hw = deployment["work_pool"]["name"].removeprefix(job_templates.POOL_PREFIX)

    job_templates.validate_manifest(job)

    assert job["metadata"]["generateName"] == f"{deployment['name']}-run-"
    assert job["metadata"]["namespace"] == "tunefleet"
    spec = pod_spec(job)
    assert spec["nodeSelector"] == {"tunefleet.io/hardware": hw,
                                    "kubernetes.io/arch": "arm64" if hw == "arm" else "amd64"}
    assert {"key": "tunefleet.io/hardware", "operator": "Equal", "value": hw,
            "effect": "NoSchedule"} in spec["tolerations"]
    # a flow run parses untrusted model files: the account without permissions, and no API token
    assert spec["serviceAccountName"] == "tunefleet-run"
    assert spec["automountServiceAccountToken"] is False
    assert job["spec"]["template"]["metadata"]["labels"]["tunefleet.io/hardware"] == hw
    assert job["metadata"]["labels"]["prefect.io/deployment-name"] == deployment["name"]
    # no flow run holds its node forever: Kubernetes ends the Job after its deadline
    assert job["spec"]["activeDeadlineSeconds"] == job_templates.DEFAULT_ACTIVE_DEADLINE_S
    ctr = container(job)
    assert ctr["image"] == "tunefleet:0.1.0"
    assert {"name": "PREFECT_LOGGING_EXTRA_LOGGERS", "value": "tunefleet"} in ctr["env"]
    assert ctr["resources"]["requests"] == {"cpu": "2", "memory": "4Gi"}
    assert ctr["resources"]["limits"]["memory"] == "4Gi"
    gpu_tolerated = any(t.get("key") == "nvidia.com/gpu" for t in spec["tolerations"])
    if hw == "gpu":
        assert ctr["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert gpu_tolerated
    else:
        assert "nvidia.com/gpu" not in ctr["resources"]["limits"]
        assert "nvidia.com/gpu" not in ctr["resources"].get("requests", {})
        assert not gpu_tolerated


def test_every_hardware_class_has_a_deployment() -> None:
    pools = {d["work_pool"]["name"] for d in DEPLOYMENTS}
    assert {job_templates.pool_name(hw) for hw in ("x86", "arm", "gpu")} <= pools


def test_stock_template_job_fails_strict_validation_offline() -> None:
    """Why tunefleet moves completions/parallelism: the stock Job has them in the pod spec."""
    from prefect_kubernetes.worker import KubernetesWorker

    job = job_templates.render_job(KubernetesWorker.get_default_base_job_template())
    with pytest.raises(TunefleetError, match=r"spec\.template\.spec: .*'completions', 'parallelism'"):
        job_templates.validate_manifest(job)


def test_job_counts_sit_on_the_job_spec_and_the_worker_accepts_them_offline(templates) -> None:  # type: ignore[no-untyped-def]
    """prefect-kubernetes 0.8 insists on /spec/template/spec/{completions,parallelism}.

    Its check diffs the manifest against its base with jsonpatch and rejects "add" operations;
    completions/parallelism of 1 on the Job spec turn those into "move" operations. Without them
    the worker refuses the template, which this test proves with the worker's own code.
    """
    for template in templates.values():
        manifest = template["job_configuration"]["job_manifest"]
        assert "completions" not in manifest["spec"]["template"]["spec"]
        assert "parallelism" not in manifest["spec"]["template"]["spec"]
        assert manifest["spec"]["completions"] == manifest["spec"]["parallelism"] == 1

    broken = json.loads(json.dumps(templates["x86"]))
    spec = broken["job_configuration"]["job_manifest"]["spec"]
    del spec["completions"], spec["parallelism"]
    with pytest.raises(TunefleetError, match="worker rejects .*missing required attributes"):
        job_templates.render_job(broken)


def test_job_variables_override_changes_rendered_job_offline(templates) -> None:  # type: ignore[no-untyped-def]
    selector = {"tunefleet.io/hardware": "x86", "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "c7i.4xlarge"}
    job = job_templates.render_job(templates["x86"], {"cpu_request": "8", "memory_request": "16Gi",
                                            "node_selector": selector, "env": {"TUNEFLEET_X": "1"},
                                            "image": "registry.example/tunefleet:0.2.0"})
    job_templates.validate_manifest(job)
    ctr = container(job)
    assert ctr["resources"]["requests"] == {"cpu": "8", "memory": "16Gi"}
    assert ctr["resources"]["limits"] == {"memory": "16Gi"}
    assert ctr["image"] == "registry.example/tunefleet:0.2.0"
    assert pod_spec(job)["nodeSelector"] == selector
    env = {e["name"]: e["value"] for e in ctr["env"]}
    assert env["TUNEFLEET_X"] == "1" and env["PREFECT_LOGGING_EXTRA_LOGGERS"] == "tunefleet"

    default = job_templates.render_job(templates["x86"])
    assert container(default)["resources"]["requests"]["cpu"] == "2"
    assert pod_spec(default)["nodeSelector"] != selector


def test_gpu_limit_override_offline(templates) -> None:  # type: ignore[no-untyped-def]
    two = job_templates.render_job(templates["gpu"], {"gpu_limit": 2})
    job_templates.validate_manifest(two)
    assert container(two)["resources"]["limits"]["nvidia.com/gpu"] == 2


def test_job_deadline_is_a_job_variable_offline(templates) -> None:  # type: ignore[no-untyped-def]
    hour = job_templates.render_job(templates["x86"], {"active_deadline_seconds": 3600})
    job_templates.validate_manifest(hour)
    assert hour["spec"]["activeDeadlineSeconds"] == 3600
    lifted = job_templates.render_job(templates["x86"], {"active_deadline_seconds": None})
    job_templates.validate_manifest(lifted)
    assert lifted["spec"].get("activeDeadlineSeconds") is None  # null: no deadline
    for bad in (0, -5, "1h"):
        with pytest.raises(TunefleetError, match="active_deadline_seconds"):
            job_templates.render_job(templates["x86"], {"active_deadline_seconds": bad})
    pool = job_templates.base_job_template("x86", active_deadline_s=900)
    assert job_templates.render_job(pool)["spec"]["activeDeadlineSeconds"] == 900
    assert "activeDeadlineSeconds" not in job_templates.render_job(
        job_templates.base_job_template("x86", active_deadline_s=None))["spec"]
    for bad_arg in (0, 1.5, True):
        with pytest.raises(ConfigError, match="Job deadline"):
            job_templates.base_job_template("x86", active_deadline_s=bad_arg)  # type: ignore[arg-type]


def test_invalid_job_variables_are_rejected_offline(templates) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TunefleetError, match="cpu_request"):
        job_templates.render_job(templates["x86"], {"cpu_request": 8})
    with pytest.raises(TunefleetError, match="tolerations"):
        job_templates.render_job(templates["x86"], {"tolerations": [{"key": "a", "colour": "red"}]})


@pytest.mark.parametrize(("mutate", "expected"), [
    (lambda job: container(job).__setitem__("gpus", 1), r"spec\.template\.spec\.containers\.0: .*'gpus'"),
    (lambda job: job["spec"].__setitem__("backoffLimit", "zero"), r"spec\.backoffLimit: 'zero' is not of type"),
    (lambda job: pod_spec(job).__setitem__("tolerations", {"key": "x"}), r"spec\.template\.spec\.tolerations"),
], ids=["unknown-field", "wrong-type", "wrong-shape"])
def test_invalid_manifest_fails_validation_offline(mutate, expected, templates) -> None:  # type: ignore[no-untyped-def]
    job = job_templates.render_job(templates["x86"])
    mutate(job)
    with pytest.raises(TunefleetError, match=expected) as info:
        job_templates.validate_manifest(job)
    message = str(info.value)
    assert "\n" not in message and message.startswith("Job/tunefleet-run-* is invalid for Kubernetes 1.30")


def test_validate_manifest_needs_kind_and_known_version() -> None:
    with pytest.raises(TunefleetError, match="apiVersion and kind"):
        job_templates.validate_manifest({"metadata": {"name": "x"}})
    with pytest.raises(ConfigError, match="does not support version 9.99"):
        job_templates.validate_manifest({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}},
                              kubernetes_version="9.99")


def test_generate_name_only_object_validates_offline() -> None:
    job_templates.validate_manifest({"apiVersion": "v1", "kind": "Namespace", "metadata": {"generateName": "tf-"}})


@pytest.mark.parametrize("path", ["namespace.yaml", "rbac.yaml"])
def test_cluster_manifests_validate_offline_strict(path) -> None:  # type: ignore[no-untyped-def]
    docs = [doc for doc in yaml.safe_load_all((ROOT / "k8s" / "base" / path).read_text()) if doc]
    assert docs
    for doc in docs:
        job_templates.validate_manifest(doc)


def test_rbac_grants_what_the_worker_uses(templates) -> None:  # type: ignore[no-untyped-def]
    docs = {d["kind"]: d for d in yaml.safe_load_all((ROOT / "k8s" / "base" / "rbac.yaml").read_text()) if d}
    assert set(docs) == {"ServiceAccount", "Role", "RoleBinding"}
    props = templates["x86"]["variables"]["properties"]
    assert {d["metadata"]["namespace"] for d in docs.values()} == {props["namespace"]["default"]}
    namespace = yaml.safe_load((ROOT / "k8s" / "base" / "namespace.yaml").read_text())
    assert namespace["metadata"]["name"] == props["namespace"]["default"]

    granted = {(group, res, verb) for rule in docs["Role"]["rules"] for group in rule["apiGroups"]
               for res in rule["resources"] for verb in rule["verbs"]}
    # exactly what prefect-kubernetes' worker and observer call (tests/helm/test_cluster_security_offline.py)
    assert granted == {("batch", "jobs", v) for v in ("create", "delete", "get", "list", "watch")} | {
        ("", "pods", "list"), ("", "pods", "watch"), ("", "pods/log", "get")}
    binding = docs["RoleBinding"]
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": docs["Role"]["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tunefleet-worker",
                                    "namespace": "tunefleet"}]
    # the flow runs' account is another one, bound to nothing, without a token
    assert props["service_account_name"]["default"] != docs["ServiceAccount"]["metadata"]["name"]
    run = yaml.safe_load((ROOT / "k8s" / "base" / "serviceaccount-run.yaml").read_text())
    assert run["metadata"]["name"] == props["service_account_name"]["default"] == "tunefleet-run"
    assert run["automountServiceAccountToken"] is False


def test_any_hardware_class_gets_a_template() -> None:
    riscv = job_templates.base_job_template("riscv", arch="riscv64")
    props = riscv["variables"]["properties"]
    assert props["node_selector"]["default"] == {"tunefleet.io/hardware": "riscv", "kubernetes.io/arch": "riscv64"}
    assert props["gpu_limit"]["default"] is None
    fpga = job_templates.base_job_template("fpga", node_pool="fpga-f1")
    assert fpga["variables"]["properties"]["node_selector"]["default"]["kubernetes.io/arch"] == "amd64"
    job = job_templates.render_job(fpga)
    assert pod_spec(job)["nodeSelector"]["tunefleet.io/hardware"] == "fpga-f1"
    assert {"key": "tunefleet.io/hardware", "operator": "Equal", "value": "fpga-f1",
            "effect": "NoSchedule"} in pod_spec(job)["tolerations"]
    assert job["metadata"]["labels"]["tunefleet.io/hardware"] == "fpga"
    assert job["spec"]["template"]["metadata"]["labels"]["tunefleet.io/hardware"] == "fpga"
    assert job["metadata"]["labels"]["prefect.io/work-pool-name"] == "tunefleet-fpga"
    job_templates.validate_manifest(job)
    a100 = job_templates.render_job(job_templates.base_job_template("a100", gpus=8))
    assert container(a100)["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert any(t["key"] == "nvidia.com/gpu" for t in pod_spec(a100)["tolerations"])
    no_gpu = job_templates.render_job(job_templates.base_job_template("gpu", gpus=0))
    assert "nvidia.com/gpu" not in container(no_gpu)["resources"]["limits"]


@pytest.mark.parametrize("kwargs", [{"hardware": "X86"}, {"hardware": "x86", "arch": ""},
                                    {"hardware": "gpu", "gpus": -1}, {"hardware": "a_b"}])
def test_bad_template_arguments_raise_config_error(kwargs) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError):
        job_templates.base_job_template(**kwargs)


def test_missing_optional_dependencies_raise_not_supported(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(__import__("sys").modules, "prefect_kubernetes", None)
    with pytest.raises(NotSupportedError, match=r"install tunefleet\[kubernetes\]"):
        job_templates.base_job_template("x86")
    monkeypatch.setitem(__import__("sys").modules, "kubernetes_validate", None)
    with pytest.raises(NotSupportedError, match=r"install tunefleet\[kubernetes\]"):
        job_templates.validate_manifest({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}})


def test_render_job_inside_running_event_loop_offline(templates) -> None:  # type: ignore[no-untyped-def]
    import asyncio

    async def inside() -> dict[str, Any]:
        return job_templates.render_job(templates["arm"])

    job = asyncio.run(inside())
    assert pod_spec(job)["nodeSelector"]["kubernetes.io/arch"] == "arm64"


def test_prefect_variable_references_cannot_render_offline(templates) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(NotSupportedError, match="cannot resolve Prefect blocks or variables"):
        job_templates.render_job(templates["x86"], {"image": "{{ prefect.variables.tunefleet_image }}"})
