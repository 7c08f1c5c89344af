"""The Helm chart helm/tunefleet, rendered, linted and validated offline.

helm-python-sdk runs Helm v4's template engine, lint and values-schema validation in-process;
every rendered object is validated with kubernetes-validate --strict for two Kubernetes versions.
The flow-run Jobs the workers will create are rendered with the Prefect Kubernetes worker's own
code from the pool templates the deploy hook applies. No cluster, no Prefect server, no image:
nothing here proves the chart installs or runs on a real cluster.
"""

from __future__ import annotations

import base64
import filecmp
import functools
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest

from tests.helm.offline import (
    CHART,
    DASHBOARDS,
    KUBE_VERSIONS,
    REQUIRED,
    ROOT,
    SENTINELS,
    VALUE_SETS,
    WORKER_GRANTS,
    by_kind_name,
    chart_defaults,
    containers,
    enabled_classes,
    flow_run_jobs,
    grants,
    merge,
    objects,
    pod_specs,
    pools_script,
    pools_spec,
    render,
    validate_strict,
)

NAMESPACE = "tuning"
SETS = sorted(VALUE_SETS)


@functools.cache
def rendered(set_name: str) -> list[dict[str, Any]]:
    return objects(render(VALUE_SETS[set_name], namespace=NAMESPACE))


@functools.cache
def jobs(set_name: str) -> dict[str, dict[str, Any]]:
    return flow_run_jobs(pools_spec(rendered(set_name)), NAMESPACE)


def secret_name(values: dict[str, Any]) -> str:
    return values.get("secrets", {}).get("existingSecret") or "tunefleet"


def env_entries(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(label, e) for label, spec in pod_specs(objs) for c in containers(spec) for e in c.get("env", [])]


def sentinel_forms() -> list[str]:
    return [form for value in SENTINELS.values()
            for form in {value, urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value)}]


# -- rendering and validation --------------------------------------------------------------------

@pytest.mark.parametrize("set_name", SETS)
def test_chart_renders_and_validates_offline_strict(set_name: str) -> None:
    objs = rendered(set_name)
    assert validate_strict(objs) == len(objs) * len(KUBE_VERSIONS)
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objs}
    external = bool(merge(chart_defaults(), VALUE_SETS[set_name])["prefect"]["apiUrl"])
    assert (("Deployment", "tunefleet-prefect-server") in kinds) is not external
    assert (("Service", "tunefleet-prefect-server") in kinds) is not external
    for hw in enabled_classes(VALUE_SETS[set_name]):
        assert ("Deployment", f"tunefleet-worker-{hw}") in kinds
    assert {("Job", "tunefleet-db-upgrade"), ("Job", "tunefleet-deploy"), ("ServiceAccount", "tunefleet-worker"),
            ("Role", "tunefleet-worker"), ("RoleBinding", "tunefleet-worker"), ("ConfigMap", "tunefleet-config"),
            ("ConfigMap", "tunefleet-pools"), ("NetworkPolicy", "tunefleet-default-deny-ingress")} <= kinds
    assert all(o["metadata"].get("namespace") == NAMESPACE for o in objs), "every object in the release namespace"


@pytest.mark.parametrize("set_name", SETS)
def test_helm_lint_offline_strict(set_name: str) -> None:
    import helm_python

    for version in KUBE_VERSIONS:
        report = helm_python.lint(CHART, VALUE_SETS[set_name], strict=True, namespace=NAMESPACE,
                                  kube_version=f"v{version}.0")
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert not report["errors"] and not problems, (version, report)


@pytest.mark.parametrize("set_name", SETS)
def test_flow_run_jobs_of_every_pool_validate_offline_strict(set_name: str) -> None:
    """The Job a flow run of each class gets, rendered by the worker's own code, is valid."""
    from prefect.server.schemas.actions import WorkPoolCreate

    values = merge(chart_defaults(), VALUE_SETS[set_name])
    spec = pools_spec(rendered(set_name))
    assert set(spec["classes"]) == set(enabled_classes(VALUE_SETS[set_name]))
    templates = pools_script().build_templates(spec, NAMESPACE)
    for hw, template in templates.items():  # what the Prefect server checks on create/update
        WorkPoolCreate(name=f"tunefleet-{hw}", type="kubernetes", base_job_template=template)
    for hw, job in jobs(set_name).items():
        cls = values["hardware"][hw]
        validate_strict([job])
        assert job["metadata"]["namespace"] == NAMESPACE
        pod = job["spec"]["template"]
        spec_ = pod["spec"]
        assert spec_["nodeSelector"] == {"tunefleet.io/hardware": cls["nodePool"], "kubernetes.io/arch": cls["arch"]}
        assert {"key": "tunefleet.io/hardware", "operator": "Equal", "value": cls["nodePool"],
                "effect": "NoSchedule"} in spec_["tolerations"]
        for extra in cls.get("tolerations") or []:
            assert extra in spec_["tolerations"]
        assert any(t["key"] == "nvidia.com/gpu" for t in spec_["tolerations"]) is (cls["gpus"] > 0)
        assert spec_["serviceAccountName"] == "tunefleet-run"
        assert spec_["automountServiceAccountToken"] is False
        ctr = spec_["containers"][0]
        assert ctr["image"] == (cls.get("image") or f"{values['image']['repository']}:{values['image']['tag']}")
        res = ctr["resources"]
        cpu = cls["job"]["cpu"]
        assert res["requests"] == {"cpu": cpu, "memory": cls["job"]["memory"]}
        assert res["limits"]["cpu"] == (cls["job"].get("cpuLimit") or cpu)
        assert res["limits"]["memory"] == cls["job"]["memory"]
        if cls["gpus"] > 0:
            assert res["limits"]["nvidia.com/gpu"] == cls["gpus"]
        else:
            assert "nvidia.com/gpu" not in res["limits"]
        assert ctr["envFrom"] == [{"configMapRef": {"name": "tunefleet-config"}}]
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in ctr["env"] if "valueFrom" in e}
        assert {"TUNEFLEET_DATABASE_URL", "TUNEFLEET_S3_ACCESS_KEY", "TUNEFLEET_S3_SECRET_KEY"} <= set(refs)
        assert {r["name"] for r in refs.values()} == {secret_name(values)}
        assert pod["metadata"]["labels"]["app.kubernetes.io/instance"] == "tunefleet"
        assert pod["metadata"]["labels"]["tunefleet.io/hardware"] == hw
        assert job["metadata"]["labels"]["prefect.io/work-pool-name"] == f"tunefleet-{hw}"
    if set_name == "gpu-2":
        assert jobs(set_name)["gpu"]["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2


# -- workers -------------------------------------------------------------------------------------

@pytest.mark.parametrize("set_name", SETS)
def test_worker_deployment_per_hardware_class_offline(set_name: str) -> None:
    objs = by_kind_name(rendered(set_name))
    values = merge(chart_defaults(), VALUE_SETS[set_name])
    workers = {name for kind, name in objs if kind == "Deployment" and "-worker-" in name}
    assert workers == {f"tunefleet-worker-{hw}" for hw in enabled_classes(VALUE_SETS[set_name])}
    for hw, cls in enabled_classes(VALUE_SETS[set_name]).items():
        deployment = objs[("Deployment", f"tunefleet-worker-{hw}")]
        spec = deployment["spec"]["template"]["spec"]
        assert deployment["metadata"]["annotations"]["tunefleet.io/job-gpus"] == str(cls["gpus"])
        if cls["worker"]["onNodePool"]:
            assert spec["nodeSelector"] == {"tunefleet.io/hardware": cls["nodePool"], "kubernetes.io/arch": cls["arch"]}
            assert {"key": "tunefleet.io/hardware", "operator": "Equal", "value": cls["nodePool"],
                    "effect": "NoSchedule"} in spec["tolerations"]
            assert any(t["key"] == "nvidia.com/gpu" for t in spec["tolerations"]) is (cls["gpus"] > 0)
            for extra in cls.get("tolerations") or []:
                assert extra in spec["tolerations"]
        else:
            assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
            assert "tolerations" not in spec
        ctr = spec["containers"][0]
        # The worker polls and creates Jobs; the GPUs go to its Jobs (test above), never to it.
        assert "nvidia.com/gpu" not in json.dumps(ctr["resources"])
        assert ctr["command"] == ["prefect", "worker", "start", "--pool", f"tunefleet-{hw}", "--type",
                                  "kubernetes", "--with-healthcheck"]
        env = {e["name"]: e for e in ctr["env"]}
        assert env["PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES"]["value"] == NAMESPACE
        assert spec["serviceAccountName"] == "tunefleet-worker"
        assert ctr["envFrom"] == [{"configMapRef": {"name": "tunefleet-config"}}]
        assert ctr["image"] == f"{values['image']['repository']}:{values['image']['tag']}"
        # Workers hold no tunefleet credentials: they only talk to Prefect and the Kubernetes API.
        assert "TUNEFLEET_DATABASE_URL" not in env


def test_gpu_class_with_two_gpus_offline() -> None:
    objs = by_kind_name(rendered("gpu-2"))
    worker = objs[("Deployment", "tunefleet-worker-gpu")]["spec"]["template"]["spec"]
    assert worker["nodeSelector"] == {"tunefleet.io/hardware": "gpu", "kubernetes.io/arch": "amd64"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in worker["tolerations"]
    job = jobs("gpu-2")["gpu"]["spec"]["template"]["spec"]
    assert job["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert job["nodeSelector"] == worker["nodeSelector"]
    assert ("Deployment", "tunefleet-worker-gpu") not in by_kind_name(rendered("defaults"))


def test_external_prefect_runs_no_server_offline() -> None:
    objs = by_kind_name(rendered("external-prefect"))
    assert not [k for k in objs if "prefect-server" in k[1]]
    config = objs[("ConfigMap", "tunefleet-config")]["data"]
    assert config["PREFECT_API_URL"] == "https://prefect.example.test/api"
    env = {e["name"]: e for e in objs[("Deployment", "tunefleet-worker-x86")]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["PREFECT_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "tunefleet", "key": "prefect-api-key", "optional": True}
    # The worker hands flow-run Jobs a secretKeyRef to the key, not the key itself.
    assert env["PREFECT_INTEGRATIONS_KUBERNETES_WORKER_API_KEY_SECRET_NAME"]["value"] == "tunefleet"
    assert env["PREFECT_INTEGRATIONS_KUBERNETES_WORKER_API_KEY_SECRET_KEY"]["value"] == "prefect-api-key"
    own = by_kind_name(rendered("defaults"))
    assert own[("ConfigMap", "tunefleet-config")]["data"]["PREFECT_API_URL"] == f"http://tunefleet-prefect-server.{NAMESPACE}.svc:4200/api"


# -- secrets -------------------------------------------------------------------------------------

def find_leaks(objs: list[dict[str, Any]], flow_jobs: dict[str, dict[str, Any]]) -> list[str]:
    """Where a sentinel secret value shows up outside a Secret (raw or URL-encoded)."""
    forms = sentinel_forms()
    found = []
    for obj in objs:
        if obj["kind"] != "Secret" and any(f in json.dumps(obj) for f in forms):
            found.append(f"{obj['kind']}/{obj['metadata']['name']}")
    for label, entry in env_entries(objs):
        if any(f in str(entry.get("value", "")) for f in forms):
            found.append(f"{label}: env {entry['name']} literal")
    for hw, job in flow_jobs.items():
        if any(f in json.dumps(job) for f in forms):
            found.append(f"flow-run Job of {hw}")
    return found


@pytest.mark.parametrize("set_name", SETS)
def test_no_secret_value_outside_secrets_offline(set_name: str) -> None:
    assert find_leaks(rendered(set_name), jobs(set_name)) == []


def test_leak_check_catches_a_secret_in_a_configmap_offline() -> None:
    """The check above is not vacuous: a secret put where it does not belong is found."""
    leaky = merge(REQUIRED, {"extraEnv": {"MY_TOKEN": SENTINELS["s3SecretKey"]}})
    objs = objects(render(leaky, namespace=NAMESPACE))
    leaks = find_leaks(objs, flow_run_jobs(pools_spec(objs), NAMESPACE))
    assert "ConfigMap/tunefleet-config" in leaks
    assert any("env MY_TOKEN literal" in leak for leak in leaks)  # the migration hook's inline env


@pytest.mark.parametrize("set_name", SETS)
def test_secrets_reach_pods_only_through_secret_key_refs_offline(set_name: str) -> None:
    values = merge(chart_defaults(), VALUE_SETS[set_name])
    objs = rendered(set_name)
    secrets = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Secret"}
    allowed = {secret_name(values)} | ({"tunefleet-migrate"} if not values["secrets"]["existingSecret"] else set())
    for label, entry in env_entries(objs):
        if entry["name"] in {"TUNEFLEET_DATABASE_URL", "TUNEFLEET_S3_ACCESS_KEY", "TUNEFLEET_S3_SECRET_KEY",
                             "PREFECT_API_KEY", "PREFECT_API_DATABASE_CONNECTION_URL", "PREFECT_API_AUTH_STRING",
                             "PREFECT_SERVER_API_AUTH_STRING"}:
            if str(entry.get("value", "")).startswith("sqlite+aiosqlite:///"):
                continue  # the server's SQLite file: a path, no credential
            assert "value" not in entry, (label, entry["name"])
            ref = entry["valueFrom"]["secretKeyRef"]
            assert ref["name"] in allowed, (label, ref)
            assert ref["key"] in set(values["secrets"]["keys"].values())
    if values["secrets"]["existingSecret"]:
        assert not secrets, "with existingSecret the chart creates no Secret"
        migrate = by_kind_name(objs)[("Job", "tunefleet-db-upgrade")]
        env = {e["name"]: e for e in migrate["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["TUNEFLEET_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "tunefleet-credentials"
        if not values["prefect"]["apiUrl"]:
            server = by_kind_name(objs)[("Deployment", "tunefleet-prefect-server")]
            env = {e["name"]: e for e in server["spec"]["template"]["spec"]["containers"][0]["env"]}
            assert env["PREFECT_API_DATABASE_CONNECTION_URL"]["valueFrom"]["secretKeyRef"] == {
                "name": "tunefleet-credentials", "key": "prefect-database-url"}
        return
    data = {k: base64.b64decode(v).decode() for k, v in secrets["tunefleet"]["data"].items()}
    from sqlalchemy.engine import make_url

    url = make_url(data["database-url"])
    assert (url.drivername, url.username, url.host, url.port, url.database) == (
        "postgresql+psycopg2", "tunefleet", values["database"]["host"], 5432, "tunefleet")
    assert url.password == SENTINELS["databasePassword"], "the password survives URL encoding"
    assert data["s3-access-key"] == SENTINELS["s3AccessKey"] and data["s3-secret-key"] == SENTINELS["s3SecretKey"]
    external = bool(values["prefect"]["apiUrl"])
    if not external and values["prefect"]["server"]["database"]["type"] == "postgresql":
        prefect_url = make_url(data["prefect-database-url"])
        assert prefect_url.drivername == "postgresql+asyncpg" and prefect_url.database == "prefect"
        assert prefect_url.password == SENTINELS["databasePassword"]
    else:
        assert "prefect-database-url" not in data
    hook = secrets["tunefleet-migrate"]
    assert hook["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert "hook-succeeded" in hook["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    assert set(hook["data"]) == {"database-url"}


def test_settings_in_configmap_are_real_tunefleet_settings_offline(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Every TUNEFLEET_* key the chart sets is a known setting, and tunefleet accepts the values."""
    from tunefleet.config import ENV_PREFIX, Settings, load_settings

    known = {ENV_PREFIX + name.upper() for name in Settings.model_fields}
    for set_name in SETS:
        objs = by_kind_name(rendered(set_name))
        data = objs[("ConfigMap", "tunefleet-config")]["data"]
        assert {k for k in data if k.startswith(ENV_PREFIX)} <= known, set_name
        for key, value in data.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("TUNEFLEET_DATABASE_URL", "postgresql+psycopg2://u:p@db:5432/tunefleet")
        settings = load_settings()
        assert settings.store == "s3" and settings.s3_endpoint == "minio.minio.svc:9000"
        for key in data:
            monkeypatch.delenv(key)
    custom = by_kind_name(rendered("custom"))[("ConfigMap", "tunefleet-config")]["data"]
    assert json.loads(custom["TUNEFLEET_HARDWARE"]) == {
        "x86": {"node_pool": "c7i-4xl"}, "a100": {"target": {"kind": "cuda", "arch": "sm_80"}}}
    assert "TUNEFLEET_HARDWARE" not in by_kind_name(rendered("defaults"))[("ConfigMap", "tunefleet-config")]["data"]


# -- pod hardening -------------------------------------------------------------------------------

@pytest.mark.parametrize("set_name", SETS)
def test_every_pod_is_hardened_and_bounded_offline(set_name: str) -> None:
    objs = rendered(set_name)
    pods = list(pod_specs(objs)) + [(f"flow-run/{hw}", j["spec"]["template"]["spec"]) for hw, j in jobs(set_name).items()]
    assert len(pods) >= 4
    for label, spec in pods:
        psc = spec["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 10001, label
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, label
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in containers(spec):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, label
            assert sc["allowPrivilegeEscalation"] is False, label
            assert sc["capabilities"]["drop"] == ["ALL"], label
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            for path in ("/tmp", "/home/tunefleet"):
                assert "emptyDir" in volumes[mounts[path]], (label, path)
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(c["resources"][kind]), (label, kind)
        automount = spec.get("automountServiceAccountToken")
        is_worker = spec.get("serviceAccountName") == "tunefleet-worker"
        assert automount is is_worker, f"{label}: only workers mount an API token"


# -- hooks, RBAC, network policies ---------------------------------------------------------------

def test_hooks_migrate_before_and_deploy_after_offline() -> None:
    objs = by_kind_name(rendered("defaults"))
    migrate = objs[("Job", "tunefleet-db-upgrade")]
    notes = migrate["metadata"]["annotations"]
    assert notes["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert int(objs[("Secret", "tunefleet-migrate")]["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(notes["helm.sh/hook-weight"])
    assert migrate["spec"]["template"]["spec"]["containers"][0]["command"] == ["tunefleet", "db", "upgrade"]
    assert "serviceAccountName" not in migrate["spec"]["template"]["spec"], "the chart's accounts do not exist pre-install"
    deploy = objs[("Job", "tunefleet-deploy")]
    assert deploy["metadata"]["annotations"]["helm.sh/hook"] == "post-install,post-upgrade"
    script = deploy["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    assert "tunefleet deploy --pool-type kubernetes $(python -m tunefleet.cluster.pools hardware-args)" in script
    assert script.index("cluster.pools wait") < script.index("tunefleet deploy") < script.index("cluster.pools apply")
    mounts = deploy["spec"]["template"]["spec"]["volumes"]
    assert {"name": "pools", "configMap": {"name": "tunefleet-pools"}} in mounts
    pools = objs[("ConfigMap", "tunefleet-pools")]["data"]
    assert set(pools) == {"pools.json"}  # the code comes from the image (tunefleet.cluster.pools), not a ConfigMap
    off = by_kind_name(objects(render(merge(REQUIRED, {"hooks": {"migrate": {"enabled": False}, "deploy": {"enabled": False}}}))))
    assert not [k for k in off if k[0] == "Job" or k[1] == "tunefleet-migrate"]


def test_rbac_lets_workers_create_and_watch_jobs_offline() -> None:
    objs = by_kind_name(rendered("defaults"))
    granted = grants(objs[("Role", "tunefleet-worker")])
    assert granted == WORKER_GRANTS, "exactly what the worker calls (test_cluster_security_offline.py)"
    assert not any(r in {"secrets", "*"} for _, r, _ in granted), "workers read no Secrets"
    binding = objs[("RoleBinding", "tunefleet-worker")]
    assert binding["roleRef"]["name"] == "tunefleet-worker"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tunefleet-worker", "namespace": NAMESPACE}]
    assert objs[("ServiceAccount", "tunefleet-run")]["automountServiceAccountToken"] is False
    assert not [k for k in objs if k[0] in {"ClusterRole", "ClusterRoleBinding"}]


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("set_name", SETS)
def test_network_policies_offline(set_name: str) -> None:
    values = merge(chart_defaults(), VALUE_SETS[set_name])
    objs = by_kind_name(rendered(set_name))
    deny = objs[("NetworkPolicy", "tunefleet-default-deny-ingress")]["spec"]
    assert deny == {"podSelector": {}, "policyTypes": ["Ingress"]}
    server = objs.get(("NetworkPolicy", "tunefleet-prefect-server"))
    if values["prefect"]["apiUrl"]:
        assert server is None
    else:
        rule = server["spec"]["ingress"][0]
        assert rule["ports"] == [{"port": 4200, "protocol": "TCP"}]
        allowed = rule["from"][0]["podSelector"]["matchLabels"]
        server_pod = objs[("Deployment", "tunefleet-prefect-server")]["spec"]["template"]["metadata"]["labels"]
        assert _matches(server["spec"]["podSelector"]["matchLabels"], server_pod)
        clients = [o["spec"]["template"]["metadata"]["labels"] for (k, n), o in objs.items()
                   if k in {"Deployment", "Job"} and n != "tunefleet-prefect-server"]
        clients += [j["spec"]["template"]["metadata"]["labels"] for j in jobs(set_name).values()]
        assert clients and all(_matches(allowed, labels) for labels in clients), "workers, hooks and flow runs reach the API"
    egress = objs.get(("NetworkPolicy", "tunefleet-egress"))
    if values["networkPolicy"]["egress"]["restrict"]:
        rules = egress["spec"]["egress"]
        assert {"port": 53, "protocol": "UDP"} in rules[0]["ports"]
        assert rules[-1] == values["networkPolicy"]["egress"]["extraTo"][-1]
    else:
        assert egress is None


# -- dashboards ----------------------------------------------------------------------------------

def test_chart_dashboards_copy_equals_dashboards_byte_for_byte() -> None:
    source = sorted(p.name for p in DASHBOARDS.glob("*.json"))
    copy = sorted(p.name for p in (CHART / "files" / "dashboards").glob("*.json"))
    assert source and copy == source, "helm/tunefleet/files/dashboards/ must hold exactly dashboards/*.json"
    _, mismatch, errors = filecmp.cmpfiles(DASHBOARDS, CHART / "files" / "dashboards", source, shallow=False)
    assert not mismatch and not errors, f"stale chart copies: {mismatch + errors}; cp dashboards/*.json helm/tunefleet/files/dashboards/"


@pytest.mark.parametrize("set_name", ["defaults", "custom"])
def test_dashboards_configmap_carries_every_dashboard_offline(set_name: str) -> None:
    values = merge(chart_defaults(), VALUE_SETS[set_name])
    cm = by_kind_name(rendered(set_name))[("ConfigMap", "tunefleet-dashboards")]
    label, value = values["dashboards"]["label"], values["dashboards"]["labelValue"]
    assert cm["metadata"]["labels"][label] == value
    if set_name == "defaults":
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert set(cm["data"]) == {p.name for p in DASHBOARDS.glob("*.json")}
    for path in DASHBOARDS.glob("*.json"):
        assert cm["data"][path.name] == path.read_text().rstrip("\n")
        assert json.loads(cm["data"][path.name])["uid"] == f"tunefleet-{path.stem}"
    assert len(json.dumps(cm)) < 900_000, "a ConfigMap holds at most 1 MiB"


# -- values schema -------------------------------------------------------------------------------

INVALID = [
    ("unknown-arch", {"hardware": {"arm": {"arch": "riscv64"}}}, "/hardware/arm/arch"),
    ("negative-gpus", {"hardware": {"gpu": {"enabled": True, "gpus": -1}}}, "/hardware/gpu/gpus"),
    ("missing-s3-endpoint", {"s3": {"endpoint": ""}}, "/s3/endpoint"),
    ("s3-endpoint-with-scheme", {"s3": {"endpoint": "http://minio:9000"}}, "/s3/endpoint"),
    ("missing-pushgateway", {"metrics": {"pushgateway": ""}}, "/metrics/pushgateway"),
    ("missing-database-host", {"database": {"host": ""}}, "/database/host"),
    ("missing-password", {"secrets": {"databasePassword": ""}}, "/secrets/databasePassword"),
    ("cpu-not-a-string", {"hardware": {"x86": {"job": {"cpu": 2}}}}, "/hardware/x86/job/cpu"),
    ("bad-node-pool", {"hardware": {"x86": {"nodePool": "Big Nodes"}}}, "/hardware/x86/nodePool"),
    ("bad-class-name", {"hardware": {"GPU_A100": {"enabled": True}}}, "/hardware"),
    ("unknown-key", {"replicaCount": 3}, "replicaCount"),
    ("bad-toleration", {"hardware": {"x86": {"tolerations": [{"key": "a", "colour": "red"}]}}}, "/hardware/x86/tolerations/0"),
    ("root-allowed", {"podSecurityContext": {"runAsNonRoot": False}}, "/podSecurityContext/runAsNonRoot"),
    ("bad-prefect-url", {"prefect": {"apiUrl": "prefect:4200"}}, "/prefect/apiUrl"),
    ("x86-disabled", {"hardware": {"x86": {"enabled": False}}}, "hardware.x86.enabled"),
    ("custom-class-without-target", {"hardware": {"fpga": {
        "enabled": True, "nodePool": "fpga", "arch": "amd64", "gpus": 0, "job": {"cpu": "2", "memory": "4Gi"},
        "worker": {"onNodePool": True, "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                                     "limits": {"cpu": "1", "memory": "1Gi"}}}}}},
     "hardware.fpga.settings.target"),
]


@pytest.mark.parametrize(("extra", "field"), [(e, f) for _, e, f in INVALID], ids=[i for i, _, _ in INVALID])
def test_invalid_values_fail_at_install_naming_the_field_offline(extra: dict[str, Any], field: str) -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError) as info:
        render(merge(REQUIRED, extra))
    assert field in str(info.value), str(info.value)


def test_chart_defaults_alone_fail_naming_required_endpoints_offline() -> None:
    import helm_python

    with pytest.raises(helm_python.HelmValuesError) as info:
        render(None)
    message = str(info.value)
    for field in ("/s3/endpoint", "/metrics/pushgateway", "/database/host", "/secrets/databasePassword"):
        assert field in message, message


def test_lint_reports_invalid_values_offline() -> None:
    import helm_python

    report = helm_python.lint(CHART, merge(REQUIRED, {"hardware": {"arm": {"arch": "s390"}}}))
    text = json.dumps(report)
    assert report["errors"] or any(m["severity"] == 3 for m in report["messages"])
    assert "/hardware/arm/arch" in text


# -- image and the pool script -------------------------------------------------------------------

def test_default_image_matches_tunefleet_k8s_and_dockerfile_offline() -> None:
    from tunefleet.cluster import job_templates

    image = chart_defaults()["image"]
    assert f"{image['repository']}:{image['tag']}" == job_templates.DEFAULT_IMAGE
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "python:3.11-slim" in dockerfile and "USER 10001" in dockerfile
    assert "NOT BUILT IN CI" in dockerfile
    # The worker sets only a flow run's args; an ENTRYPOINT would swallow them.
    assert not [line for line in dockerfile.splitlines() if line.startswith("ENTRYPOINT")]


def test_pool_script_commands_offline(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    script = pools_script()
    spec_path = tmp_path / "pools.json"
    spec_path.write_text(json.dumps(pools_spec(rendered("gpu-2"))))
    monkeypatch.setenv("TUNEFLEET_POOLS_SPEC", str(spec_path))
    assert script.main(["hardware-args"]) == 0
    assert capsys.readouterr().out.split() == ["--hardware", "arm", "--hardware", "gpu", "--hardware", "x86"]
    monkeypatch.setenv("TUNEFLEET_POOLS_NAMESPACE", "elsewhere")
    assert script.main(["show", "gpu"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert list(shown) == ["gpu"]
    assert shown["gpu"]["variables"]["properties"]["namespace"]["default"] == "elsewhere"
    assert shown["gpu"]["variables"]["properties"]["gpu_limit"]["default"] == 2
    assert script.main(["bogus"]) == 2


def test_pool_script_waits_for_the_prefect_api_offline(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``wait`` against a stand-in /api/health on the loopback interface (not a Prefect server)."""
    script = pools_script()
    hits: list[str] = []

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(401 if len(hits) >= 2 else 503)  # starting, then up behind auth
            self.end_headers()
            self.wfile.write(b"true")

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{server.server_port}/api")
        script.wait_for_api(timeout_s=10, interval_s=0.05)
        assert hits[-1] == "/api/health" and len(hits) == 2
    finally:
        server.shutdown()
        server.server_close()
    monkeypatch.setenv("PREFECT_API_URL", f"http://127.0.0.1:{server.server_port}/api")
    with pytest.raises(SystemExit, match="did not answer within 0 s"):
        script.wait_for_api(timeout_s=0, interval_s=0.01)


def test_builtin_x86_avx2_class_runs_in_the_x86_pool_offline() -> None:
    """Enabled, the fixed AVX2 class needs no target, runs on the x86 nodes and sets no TUNEFLEET_HARDWARE."""
    values = merge(REQUIRED, {"hardware": {"x86-avx2": {"enabled": True}}})
    listed = objects(render(values, namespace=NAMESPACE))
    assert validate_strict(listed, KUBE_VERSIONS[-1:]) == len(listed)
    objs = by_kind_name(listed)
    worker = objs[("Deployment", "tunefleet-worker-x86-avx2")]["spec"]["template"]["spec"]
    assert worker["nodeSelector"] == {"tunefleet.io/hardware": "x86", "kubernetes.io/arch": "amd64"}
    job = flow_run_jobs(pools_spec(listed), NAMESPACE)["x86-avx2"]["spec"]["template"]["spec"]
    assert job["nodeSelector"] == {"tunefleet.io/hardware": "x86", "kubernetes.io/arch": "amd64"}
    assert "TUNEFLEET_HARDWARE" not in objs[("ConfigMap", "tunefleet-config")]["data"]
    moved = merge(values, {"hardware": {"x86-avx2": {"nodePool": "c7i"}}})
    data = by_kind_name(objects(render(moved)))[("ConfigMap", "tunefleet-config")]["data"]
    assert json.loads(data["TUNEFLEET_HARDWARE"]) == {"x86-avx2": {"node_pool": "c7i"}}
