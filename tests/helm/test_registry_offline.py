"""The schedule registry (`tunefleet serve`) in the Helm chart, rendered and checked offline.

Like the rest of tests/helm: Helm v4's engine in-process, ``helm lint --strict``, every object
validated with kubernetes-validate --strict for both KUBE_VERSIONS. The registry's own code is
not run here: these tests check what the chart gives it (command, probes, port, settings,
credentials by reference, hardening, Service, Ingress, NetworkPolicy), not that it serves.
"""

from __future__ import annotations

import functools
import json
import urllib.parse
from typing import Any

import pytest

from tests.helm.offline import (
    CHART,
    KUBE_VERSIONS,
    REQUIRED,
    SENTINELS,
    VALUE_SETS,
    by_kind_name,
    chart_defaults,
    merge,
    objects,
    pools_spec,
    render,
    validate_strict,
)

NAMESPACE = "tuning"
SETS = sorted(VALUE_SETS)
NAME = "tunefleet-registry"
STORE_ENV = ("TUNEFLEET_DATABASE_URL", "TUNEFLEET_S3_ACCESS_KEY", "TUNEFLEET_S3_SECRET_KEY")
INGRESS = {"registry": {"ingress": {
    "enabled": True, "className": "nginx", "host": "registry.tunefleet.example.test",
    "tls": {"secretName": "registry-tls"}, "annotations": {"cert-manager.io/cluster-issuer": "letsencrypt"}}}}


@functools.cache
def rendered_set(set_name: str) -> list[dict[str, Any]]:
    return objects(render(VALUE_SETS[set_name], namespace=NAMESPACE))


def rendered(values: dict[str, Any]) -> list[dict[str, Any]]:
    return objects(render(values, namespace=NAMESPACE))


def values_of(values: dict[str, Any]) -> dict[str, Any]:
    return merge(chart_defaults(), values)


def registry_objects(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objs if o["metadata"]["name"] == NAME
            or o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "registry"]


def container(objs: list[dict[str, Any]]) -> dict[str, Any]:
    pod = by_kind_name(objs)[("Deployment", NAME)]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["registry"] and "initContainers" not in pod
    return dict(pod["containers"][0])


def port_number(ctr: dict[str, Any], port: int | str) -> int:
    """A probe's or a Service's target port, by name or number, as the container's port number."""
    if isinstance(port, int):
        return port
    return int(next(p["containerPort"] for p in ctr["ports"] if p["name"] == port))


def store_refs(env: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {e["name"]: dict(e["valueFrom"]["secretKeyRef"]) for e in env if e["name"] in STORE_ENV}


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# -- the default render ------------------------------------------------------------------------------

@pytest.mark.parametrize("set_name", SETS)
def test_the_registry_is_deployed_by_default_offline_strict(set_name: str) -> None:
    objs = rendered_set(set_name)
    values = values_of(VALUE_SETS[set_name])
    byname = by_kind_name(objs)
    ours = registry_objects(objs)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in ours) == [
        ("Deployment", NAME), ("NetworkPolicy", NAME), ("Service", NAME), ("ServiceAccount", NAME)]
    assert not [o for o in objs if o["kind"] == "Ingress"], "no Ingress unless registry.ingress.enabled"
    assert validate_strict(ours) == len(ours) * len(KUBE_VERSIONS)

    deployment = byname[("Deployment", NAME)]
    assert deployment["spec"]["replicas"] == 1
    pod = deployment["spec"]["template"]
    assert _matches(deployment["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    ctr = container(objs)
    assert ctr["command"] == ["tunefleet", "serve", "--host", "0.0.0.0", "--port", "8080"]
    assert ctr["image"] == f"{values['image']['repository']}:{values['image']['tag']}"
    assert ctr["imagePullPolicy"] == values["image"]["pullPolicy"]
    assert ctr["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    live, ready = ctr["livenessProbe"]["httpGet"], ctr["readinessProbe"]["httpGet"]
    assert (live["path"], port_number(ctr, live["port"])) == ("/healthz", 8080)
    assert (ready["path"], port_number(ctr, ready["port"])) == ("/readyz", 8080)
    if "startupProbe" in ctr:  # a slow start must not count against liveness: same cheap endpoint
        assert ctr["startupProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e for e in ctr["env"]}
    assert env["TUNEFLEET_REGISTRY_MAX_UPLOAD_MB"] == {"name": "TUNEFLEET_REGISTRY_MAX_UPLOAD_MB", "value": "100"}
    assert ctr["resources"] == values["registry"]["resources"]

    service = byname[("Service", NAME)]["spec"]
    assert service["type"] == "ClusterIP"
    assert _matches(service["selector"], pod["metadata"]["labels"])
    assert [(p["port"], port_number(ctr, p["targetPort"]), p["protocol"]) for p in service["ports"]] == [
        (8080, 8080, "TCP")]
    # The Service selects the registry's pods and nothing else of the release.
    for (kind, name), obj in byname.items():
        if kind in {"Deployment", "Job"} and name != NAME:
            assert not _matches(service["selector"], obj["spec"]["template"]["metadata"]["labels"]), name


@pytest.mark.parametrize("set_name", SETS)
def test_the_registry_gets_the_database_and_store_settings_of_the_tunefleet_containers_offline(
        set_name: str) -> None:
    """The same ConfigMap (envFrom) as the workers, and the database URL and S3 keys by
    secretKeyRef to the same Secret and keys as the deploy hook and every flow-run Job; the CA
    bundles of the database and the store mounted like theirs. Not the Prefect API's auth string:
    the registry is no Prefect client."""
    objs = rendered_set(set_name)
    values = values_of(VALUE_SETS[set_name])
    byname = by_kind_name(objs)
    ctr = container(objs)
    worker = byname[("Deployment", "tunefleet-worker-x86")]["spec"]["template"]["spec"]["containers"][0]
    assert ctr["envFrom"] == worker["envFrom"] == [{"configMapRef": {"name": "tunefleet-config"}}]
    refs = store_refs(ctr["env"])
    secret = values["secrets"]["existingSecret"] or "tunefleet"
    keys = values["secrets"]["keys"]
    assert refs == {"TUNEFLEET_DATABASE_URL": {"name": secret, "key": keys["databaseUrl"]},
                    "TUNEFLEET_S3_ACCESS_KEY": {"name": secret, "key": keys["s3AccessKey"]},
                    "TUNEFLEET_S3_SECRET_KEY": {"name": secret, "key": keys["s3SecretKey"]}}
    flow_run = pools_spec(objs)["container"]
    assert store_refs(flow_run["env"]) == refs and flow_run["envFrom"] == ctr["envFrom"]
    deploy = byname[("Job", "tunefleet-deploy")]["spec"]["template"]["spec"]["containers"][0]
    assert store_refs(deploy["env"]) == refs
    assert not [e for e in ctr["env"] if e["name"].startswith("PREFECT_")], "no Prefect credentials"
    assert all("valueFrom" in e for e in ctr["env"] if e["name"] in STORE_ENV)
    if not values["secrets"]["existingSecret"]:
        data = byname[("Secret", "tunefleet")]["data"]
        assert all(r["key"] in data for r in refs.values()), "keys the chart's own Secret holds"
    assert {v["name"] for v in byname[("Deployment", NAME)]["spec"]["template"]["spec"]["volumes"]} == {"tmp", "home"}


def test_the_registry_mounts_the_ca_bundles_of_the_database_and_the_store_offline() -> None:
    with_cas = merge(REQUIRED, {"database": {"caCert": {"configMap": "pg-ca"}},
                                "s3": {"caCert": {"secret": "minio-ca", "key": "bundle.pem"}}})
    objs = rendered(with_cas)
    pod = by_kind_name(objs)[("Deployment", NAME)]["spec"]["template"]["spec"]
    flow_run = pools_spec(objs)
    cas = [v for v in pod["volumes"] if v["name"].endswith("-ca")]
    assert cas == [v for v in flow_run["pod"]["volumes"] if v["name"].endswith("-ca")] and len(cas) == 2
    mounts = [m for m in pod["containers"][0]["volumeMounts"] if m["name"].endswith("-ca")]
    assert mounts == [m for m in flow_run["container"]["volumeMounts"] if m["name"].endswith("-ca")]
    assert {m["mountPath"] for m in mounts} == {"/etc/tunefleet/tls/database", "/etc/tunefleet/tls/s3"}
    assert validate_strict([by_kind_name(objs)[("Deployment", NAME)]]) == len(KUBE_VERSIONS)


def test_the_registry_pod_is_hardened_like_the_others_offline() -> None:
    objs = rendered_set("defaults")
    values = chart_defaults()
    byname = by_kind_name(objs)
    pod = byname[("Deployment", NAME)]["spec"]["template"]["spec"]
    assert pod["securityContext"] == values["podSecurityContext"]
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    ctr = pod["containers"][0]
    sc = ctr["securityContext"]
    assert sc == values["containerSecurityContext"]
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in ctr["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]] and "emptyDir" in volumes[mounts["/home/tunefleet"]]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(ctr["resources"][kind])
    # Its own account: no token, and no Role or RoleBinding names it.
    assert pod["serviceAccountName"] == NAME and pod["automountServiceAccountToken"] is False
    assert byname[("ServiceAccount", NAME)]["automountServiceAccountToken"] is False
    for obj in objs:
        if obj["kind"] in {"RoleBinding", "ClusterRoleBinding"}:
            assert NAME not in json.dumps(obj["subjects"]), obj["metadata"]["name"]
        if obj["kind"] in {"Role", "ClusterRole"}:
            assert obj["metadata"]["name"] != NAME


# -- registry.enabled=false --------------------------------------------------------------------------

@pytest.mark.parametrize("set_name", SETS)
def test_a_disabled_registry_renders_none_of_it_offline(set_name: str) -> None:
    off = rendered(merge(VALUE_SETS[set_name], {"registry": {"enabled": False}}))
    assert registry_objects(off) == []
    assert NAME not in json.dumps(off)
    assert not [o for o in off if o["kind"] == "Ingress"]
    # Everything else is exactly what the release has with the registry (the Prefect API's auth
    # string aside: generated anew on every offline render).
    def rest(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for obj in objs:
            if obj in registry_objects(objs):
                continue
            obj = json.loads(json.dumps(obj))
            if obj["kind"] == "Secret":
                obj["data"].pop("prefect-auth-string", None)
            out.append(obj)
        return out

    assert rest(off) == rest(rendered_set(set_name))
    # Enabling the Ingress on a disabled registry still renders nothing of it.
    off_ingress = rendered(merge(VALUE_SETS[set_name], merge(INGRESS, {"registry": {"enabled": False}})))
    assert registry_objects(off_ingress) == [] and not [o for o in off_ingress if o["kind"] == "Ingress"]
    validate_strict(off, KUBE_VERSIONS[-1:])


# -- the Ingress --------------------------------------------------------------------------------------

def test_an_enabled_ingress_is_valid_and_routes_to_the_service_offline_strict() -> None:
    objs = rendered(merge(REQUIRED, INGRESS))
    assert validate_strict(objs) == len(objs) * len(KUBE_VERSIONS)
    byname = by_kind_name(objs)
    ingress = byname[("Ingress", NAME)]
    assert ingress["apiVersion"] == "networking.k8s.io/v1"
    assert ingress["metadata"]["namespace"] == NAMESPACE
    spec = ingress["spec"]
    assert spec["ingressClassName"] == "nginx"
    assert spec["tls"] == [{"hosts": ["registry.tunefleet.example.test"], "secretName": "registry-tls"}]
    [rule] = spec["rules"]
    assert rule["host"] == "registry.tunefleet.example.test"
    [path] = rule["http"]["paths"]
    assert (path["path"], path["pathType"]) == ("/", "Prefix")
    backend = path["backend"]["service"]
    service = byname[("Service", backend["name"])]
    assert backend["name"] == NAME
    assert [p for p in service["spec"]["ports"] if p["name"] == backend["port"]["name"]], "a port of the Service"
    annotations = ingress["metadata"]["annotations"]
    assert annotations["cert-manager.io/cluster-issuer"] == "letsencrypt"
    assert annotations["nginx.ingress.kubernetes.io/proxy-body-size"] == "101m", "room for maxUploadMB"


def test_an_ingress_without_tls_or_class_and_with_its_own_body_size_offline_strict() -> None:
    values = merge(REQUIRED, {"registry": {"maxUploadMB": 250, "ingress": {
        "enabled": True, "host": "registry.example.test",
        "annotations": {"nginx.ingress.kubernetes.io/proxy-body-size": "0"}}}})
    objs = rendered(values)
    ingress = by_kind_name(objs)[("Ingress", NAME)]
    assert validate_strict([ingress]) == len(KUBE_VERSIONS)
    assert "tls" not in ingress["spec"] and "ingressClassName" not in ingress["spec"]
    assert ingress["metadata"]["annotations"] == {"nginx.ingress.kubernetes.io/proxy-body-size": "0"}, "the user's wins"
    env = {e["name"]: e for e in container(objs)["env"]}
    assert env["TUNEFLEET_REGISTRY_MAX_UPLOAD_MB"]["value"] == "250"
    values["registry"]["ingress"]["annotations"] = {}
    default_size = by_kind_name(rendered(values))
    assert default_size[("Ingress", NAME)]["metadata"]["annotations"] == {
        "nginx.ingress.kubernetes.io/proxy-body-size": "251m"}


@pytest.mark.parametrize("extra", [INGRESS, {"registry": {"service": {"type": "LoadBalancer"}}}],
                         ids=["ingress", "load-balancer"])
def test_helm_lint_with_an_exposed_registry_offline_strict(extra: dict[str, Any]) -> None:
    import helm_python

    for version in KUBE_VERSIONS:
        report = helm_python.lint(CHART, merge(REQUIRED, extra), strict=True, namespace=NAMESPACE,
                                  kube_version=f"v{version}.0")
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert not report["errors"] and not problems, (version, report)


# -- NetworkPolicy -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("extra", "anywhere"), [
    ({}, False),
    (INGRESS, True),
    ({"registry": {"service": {"type": "NodePort"}}}, True),
], ids=["in-namespace", "ingress", "node-port"])
def test_the_registry_port_is_open_to_the_namespace_or_anywhere_when_exposed_offline(
        extra: dict[str, Any], anywhere: bool) -> None:
    objs = rendered(merge(REQUIRED, merge({"registry": {"port": 9090}}, extra)))
    byname = by_kind_name(objs)
    policy = byname[("NetworkPolicy", NAME)]["spec"]
    pod_labels = byname[("Deployment", NAME)]["spec"]["template"]["metadata"]["labels"]
    assert _matches(policy["podSelector"]["matchLabels"], pod_labels)
    assert policy["policyTypes"] == ["Ingress"]
    [rule] = policy["ingress"]
    assert rule["ports"] == [{"port": 9090, "protocol": "TCP"}]
    if anywhere:
        assert "from" not in rule, "every source: the ingress controller's place differs per cluster"
    else:
        assert rule["from"] == [{"podSelector": {}}], "every pod of this namespace, nothing outside it"
    # the policy selects the registry alone
    for (kind, name), obj in byname.items():
        if kind in {"Deployment", "Job"} and name != NAME:
            assert not _matches(policy["podSelector"]["matchLabels"], obj["spec"]["template"]["metadata"]["labels"])
    ctr = container(objs)
    assert ctr["command"][-2:] == ["--port", "9090"]
    assert ctr["ports"][0]["containerPort"] == 9090
    assert byname[("Service", NAME)]["spec"]["ports"][0]["port"] == 9090
    assert port_number(ctr, ctr["readinessProbe"]["httpGet"]["port"]) == 9090
    validate_strict(objs, KUBE_VERSIONS[-1:])


def test_with_restricted_egress_the_registry_reaches_what_the_flow_runs_reach_offline() -> None:
    """The egress policy selects every pod of the release: the registry gets DNS and the rules of
    networkPolicy.egress.extraTo (PostgreSQL, S3) exactly like the flow-run Jobs."""
    extra_to = [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}], "ports": [{"port": 5432, "protocol": "TCP"}]},
                {"to": [{"ipBlock": {"cidr": "10.1.0.0/16"}}], "ports": [{"port": 9000, "protocol": "TCP"}]}]
    objs = rendered(merge(REQUIRED, {"networkPolicy": {"egress": {"restrict": True, "extraTo": extra_to}}}))
    byname = by_kind_name(objs)
    egress = byname[("NetworkPolicy", "tunefleet-egress")]["spec"]
    selector = egress["podSelector"]["matchLabels"]
    assert _matches(selector, byname[("Deployment", NAME)]["spec"]["template"]["metadata"]["labels"])
    assert _matches(selector, pools_spec(objs)["podLabels"])
    assert egress["egress"][-2:] == extra_to
    egress_policies = [o for o in objs if o["kind"] == "NetworkPolicy" and "Egress" in o["spec"]["policyTypes"]]
    assert egress_policies == [byname[("NetworkPolicy", "tunefleet-egress")]], "no registry-only egress rule"


# -- secrets -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("set_name", SETS)
def test_no_secret_value_outside_secrets_with_the_registry_exposed_offline(set_name: str) -> None:
    objs = rendered(merge(VALUE_SETS[set_name], INGRESS))
    forms = {form for value in SENTINELS.values()
             for form in (value, urllib.parse.quote(value, safe=""), urllib.parse.quote_plus(value))}
    assert registry_objects(objs)
    for obj in objs:
        if obj["kind"] != "Secret":
            text = json.dumps(obj)
            assert not [f for f in forms if f in text], f"{obj['kind']}/{obj['metadata']['name']}"
    for entry in container(objs)["env"]:
        if entry["name"] in STORE_ENV:
            assert "value" not in entry, entry["name"]


# -- values schema ------------------------------------------------------------------------------------

INVALID = [
    ("ingress-without-host", {"registry": {"ingress": {"enabled": True}}}, "/registry/ingress/host"),
    ("ingress-host-with-scheme", {"registry": {"ingress": {"enabled": True, "host": "https://r.example"}}},
     "/registry/ingress/host"),
    ("port-zero", {"registry": {"port": 0}}, "/registry/port"),
    ("upload-zero", {"registry": {"maxUploadMB": 0}}, "/registry/maxUploadMB"),
    ("upload-string", {"registry": {"maxUploadMB": "100M"}}, "/registry/maxUploadMB"),
    ("negative-replicas", {"registry": {"replicas": -1}}, "/registry/replicas"),
    ("bad-service-type", {"registry": {"service": {"type": "ExternalName"}}}, "/registry/service/type"),
    ("unknown-key", {"registry": {"authToken": "x"}}, "authToken"),
    ("resources-without-limits", {"registry": {"resources": {"limits": None}}}, "/registry/resources"),
    ("annotation-not-a-string", {"registry": {"ingress": {"annotations": {"a": 1}}}},
     "/registry/ingress/annotations/a"),
]


@pytest.mark.parametrize(("extra", "field"), [(e, f) for _, e, f in INVALID], ids=[i for i, _, _ in INVALID])
def test_invalid_registry_values_fail_naming_the_field_offline(extra: dict[str, Any], field: str) -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError) as info:
        render(merge(REQUIRED, extra))
    assert field in str(info.value), str(info.value)


def test_the_registry_values_are_documented_offline() -> None:
    """Every registry value is in values.yaml, helm/README.md and docs/cluster.md."""
    from tests.helm.offline import ROOT

    defaults = chart_defaults()["registry"]
    assert defaults == {
        "enabled": True, "replicas": 1, "port": 8080, "maxUploadMB": 100,
        "resources": defaults["resources"], "service": {"type": "ClusterIP"},
        "ingress": {"enabled": False, "className": "", "host": "", "tls": {"secretName": ""}, "annotations": {}}}
    assert {"requests", "limits"} == set(defaults["resources"])
    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["registry"]
    assert set(schema["properties"]) == set(defaults)
    assert set(schema["properties"]["ingress"]["properties"]) == set(defaults["ingress"])
    keys = ["registry.enabled", "registry.replicas", "registry.port", "registry.resources", "registry.maxUploadMB",
            "registry.service.type", "registry.ingress.enabled", "registry.ingress.className",
            "registry.ingress.host", "registry.ingress.tls.secretName", "registry.ingress.annotations",
            "TUNEFLEET_REGISTRY_MAX_UPLOAD_MB"]
    for doc in (ROOT / "helm" / "README.md", ROOT / "docs" / "cluster.md"):
        text = doc.read_text()
        assert [k for k in keys if f"`{k}`" not in text] == [], doc.name
