"""The cluster is closed to strangers (issue 34, round two, item 7), rendered and checked offline.

* The Prefect API the chart runs asks for HTTP basic authentication: the auth string is generated
  into the chart's Secret (kept across upgrades) or read from ``secrets.existingSecret``, and the
  server, the workers, the deploy hook and every flow-run Job get it by ``secretKeyRef`` only.
* RBAC: the workers' Role grants exactly what prefect-kubernetes' worker and observer call (read
  from the installed package); nothing else in the release may use the Kubernetes API.

Like the rest of tests/helm: Helm's engine in-process, kubernetes-validate --strict, the flow-run
Jobs rendered with the Prefect worker's own code. The one test with a live Prefect server is
marked slow.
"""

from __future__ import annotations

import base64
import functools
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.helm.offline import (
    CHART,
    KUBE_VERSIONS,
    KUSTOMIZE,
    REQUIRED,
    VALUE_SETS,
    WORKER_GRANTS,
    by_kind_name,
    chart_defaults,
    containers,
    grants,
    kustomize,
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
AUTH_KEY = "prefect-auth-string"
GENERATED = re.compile(r"^tunefleet:[A-Za-z0-9]{32}$")


@functools.cache
def rendered(set_name: str) -> list[dict[str, Any]]:
    return objects(render(VALUE_SETS[set_name], namespace=NAMESPACE))


def values_of(set_name: str) -> dict[str, Any]:
    return merge(chart_defaults(), VALUE_SETS[set_name])


def secret_data(objs: list[dict[str, Any]], name: str = "tunefleet") -> dict[str, str]:
    secret = by_kind_name(objs)[("Secret", name)]
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def env_of(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in obj["spec"]["template"]["spec"]["containers"][0].get("env", [])}


def ref(entry: dict[str, Any]) -> dict[str, Any]:
    assert "value" not in entry, f"{entry['name']} is a literal"
    return dict(entry["valueFrom"]["secretKeyRef"])


# -- the Prefect API asks for authentication ---------------------------------------------------------

def test_the_env_names_are_prefects_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    """The names the chart sets are what Prefect 3 (server, client) and prefect-kubernetes read."""
    from prefect.settings import Settings
    from prefect_kubernetes.settings import KubernetesSettings

    monkeypatch.setenv("PREFECT_SERVER_API_AUTH_STRING", "a:server")
    monkeypatch.setenv("PREFECT_API_AUTH_STRING", "a:client")
    monkeypatch.setenv("PREFECT_INTEGRATIONS_KUBERNETES_WORKER_API_AUTH_STRING_SECRET_NAME", "s")
    monkeypatch.setenv("PREFECT_INTEGRATIONS_KUBERNETES_WORKER_API_AUTH_STRING_SECRET_KEY", "k")
    settings = Settings()
    assert settings.server.api.auth_string.get_secret_value() == "a:server"
    assert settings.api.auth_string.get_secret_value() == "a:client"
    worker = KubernetesSettings().worker
    assert (worker.api_auth_string_secret_name, worker.api_auth_string_secret_key) == ("s", "k")


@pytest.mark.parametrize("set_name", SETS)
def test_every_prefect_client_and_the_server_get_the_auth_string_from_the_secret_offline(set_name: str) -> None:
    values = values_of(set_name)
    objs = rendered(set_name)
    byname = by_kind_name(objs)
    secret = values["secrets"]["existingSecret"] or "tunefleet"
    external = bool(values["prefect"]["apiUrl"])
    expected = {"name": secret, "key": AUTH_KEY}
    if external and not values["secrets"]["existingSecret"]:
        # an external API without an auth string given (Prefect Cloud: an API key): none is sent
        for label, spec in pod_specs(objs):
            assert not [e for c in containers(spec) for e in c.get("env", []) if "AUTH_STRING" in e["name"]], label
        assert AUTH_KEY not in secret_data(objs)
        return
    if external:
        expected["optional"] = True  # an external API may have none: pods start without it
    else:
        server = env_of(byname[("Deployment", "tunefleet-prefect-server")])
        assert ref(server["PREFECT_SERVER_API_AUTH_STRING"]) == {"name": secret, "key": AUTH_KEY}
        if not values["secrets"]["existingSecret"]:
            assert GENERATED.match(secret_data(objs)[AUTH_KEY])
    for hw in (name for name, hw in values["hardware"].items() if hw["enabled"]):
        worker = env_of(byname[("Deployment", f"tunefleet-worker-{hw}")])
        assert ref(worker["PREFECT_API_AUTH_STRING"]) == expected
        # what makes the worker hand its Jobs a secretKeyRef instead of its own literal value
        assert worker["PREFECT_INTEGRATIONS_KUBERNETES_WORKER_API_AUTH_STRING_SECRET_NAME"]["value"] == secret
        assert worker["PREFECT_INTEGRATIONS_KUBERNETES_WORKER_API_AUTH_STRING_SECRET_KEY"]["value"] == AUTH_KEY
    deploy = env_of(byname[("Job", "tunefleet-deploy")])
    assert ref(deploy["PREFECT_API_AUTH_STRING"]) == expected
    pool_env = {e["name"]: e for e in pools_spec(objs)["container"]["env"]}
    assert ref(pool_env["PREFECT_API_AUTH_STRING"]) == expected
    config = byname[("ConfigMap", "tunefleet-config")]["data"]
    assert not [k for k in config if "AUTH" in k], "never in a ConfigMap"


def test_the_auth_string_is_generated_once_and_kept_across_upgrades_offline(tmp_path: Path) -> None:
    """On install a new one; on upgrade the one in the release's Secret (Helm ``lookup``, which
    returns nothing offline: a copy of the chart stands an existing Secret in for it)."""
    first, second = (secret_data(objects(render(REQUIRED)))[AUTH_KEY] for _ in range(2))
    assert GENERATED.match(first) and GENERATED.match(second) and first != second, "generated: random"

    chart = tmp_path / "tunefleet"
    shutil.copytree(CHART, chart)
    helpers = chart / "templates" / "_helpers.tpl"
    text = helpers.read_text()
    lookup = '{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "tunefleet.secretName" .) }}'
    assert text.count(lookup) == 1, "the lookup the upgrade path depends on"
    kept = "tunefleet:" + "K" * 32
    found = f'{{{{- $existing := dict "data" (dict "{AUTH_KEY}" "{base64.b64encode(kept.encode()).decode()}") }}}}'
    helpers.write_text(text.replace(lookup, found))
    import helm_python

    with helm_python.Chart.load(chart) as loaded:
        upgraded = objects(loaded.render(REQUIRED, name="tunefleet", namespace=NAMESPACE, is_upgrade=True))
    assert secret_data(upgraded)[AUTH_KEY] == kept
    given = merge(REQUIRED, {"secrets": {"prefectAuthString": "ops:given-password"}})
    assert secret_data(objects(render(given)))[AUTH_KEY] == "ops:given-password"


def test_an_invalid_auth_string_fails_naming_the_field_offline() -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError, match="/secrets/prefectAuthString"):
        render(merge(REQUIRED, {"secrets": {"prefectAuthString": "no-colon"}}))


def test_the_generated_auth_string_is_nowhere_but_in_the_secret_offline(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    """Not in a ConfigMap, not in an env literal, not in the Job a worker submits for a flow run."""
    objs = rendered("defaults")
    auth = secret_data(objs)[AUTH_KEY]
    for obj in objs:
        if obj["kind"] != "Secret":
            assert auth not in json.dumps(obj), f"{obj['kind']}/{obj['metadata']['name']}"
    for hw, job in submitted_jobs(objs, auth, monkeypatch, tmp_path).items():
        assert auth not in json.dumps(job), hw
        env = {e["name"]: e for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert ref(env["PREFECT_API_AUTH_STRING"]) == {"name": "tunefleet", "key": AUTH_KEY}
        validate_strict([job], KUBE_VERSIONS[-1:])


def test_a_worker_without_the_secret_settings_would_put_the_auth_string_in_its_jobs_offline(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The check above is not vacuous: the worker copies its own auth string into every Job it
    creates, as a literal, unless its settings name the Secret to reference instead."""
    objs = rendered("defaults")
    auth = secret_data(objs)[AUTH_KEY]
    jobs = submitted_jobs(objs, auth, monkeypatch, tmp_path, drop=(
        "PREFECT_INTEGRATIONS_KUBERNETES_WORKER_API_AUTH_STRING_SECRET_NAME",
        "PREFECT_INTEGRATIONS_KUBERNETES_WORKER_API_AUTH_STRING_SECRET_KEY"))
    assert jobs and all(auth in json.dumps(job) for job in jobs.values())


def submitted_jobs(objs: list[dict[str, Any]], auth: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                   drop: tuple[str, ...] = ()) -> dict[str, dict[str, Any]]:
    """The Job of each pool as its worker submits it, in the worker's environment: the ConfigMap,
    the worker container's literal env, and the auth string its secretKeyRef resolves to."""
    from prefect.context import SettingsContext
    from prefect.settings import Settings
    from prefect.settings.profiles import Profile

    from tunefleet.cluster import job_templates

    byname = by_kind_name(objs)
    templates = pools_script().build_templates(pools_spec(objs), NAMESPACE)
    out = {}
    for hw, template in templates.items():
        env = dict(byname[("ConfigMap", "tunefleet-config")]["data"])
        worker = env_of(byname[("Deployment", f"tunefleet-worker-{hw}")])
        env.update({name: e["value"] for name, e in worker.items() if "value" in e and name not in drop})
        env.update({"PREFECT_API_AUTH_STRING": auth, "PREFECT_HOME": str(tmp_path / "prefect"),
                    "HOME": str(tmp_path)})
        with monkeypatch.context() as patch:
            for key in [k for k in __import__("os").environ if k.startswith("PREFECT_")]:
                patch.delenv(key)
            for key, value in env.items():
                patch.setenv(key, value)
            with SettingsContext(profile=Profile(name="worker"), settings=Settings()):
                out[hw] = job_templates.render_job(template, flow_run_name=f"tune-{hw}-run", as_submitted=True)
    return out


@pytest.mark.slow
def test_the_prefect_server_refuses_strangers_and_admits_the_chart_clients(tmp_path: Path) -> None:
    """A real Prefect server with the environment the chart gives its container: an API call
    without the Secret's auth string is refused (401); the deploy hook's pool script, with the
    environment the chart gives it, authenticates and creates the pools."""
    import urllib.error
    import urllib.request

    from tunefleet.testing.prefect_server import PrefectServer

    objs = rendered("defaults")
    byname = by_kind_name(objs)
    auth = secret_data(objs)[AUTH_KEY]
    server_env = {name: auth for name, e in env_of(byname[("Deployment", "tunefleet-prefect-server")]).items()
                  if "valueFrom" in e and e["valueFrom"]["secretKeyRef"]["key"] == AUTH_KEY}
    assert list(server_env) == ["PREFECT_SERVER_API_AUTH_STRING"]
    with PrefectServer(None, extra_env=server_env) as server:
        def status(path: str, credentials: str | None) -> int:
            request = urllib.request.Request(f"{server.api_url}{path}")
            if credentials:
                request.add_header("Authorization", "Basic " + base64.b64encode(credentials.encode()).decode())
            try:
                with urllib.request.urlopen(request, timeout=10) as resp:
                    return int(resp.status)
            except urllib.error.HTTPError as exc:
                return int(exc.code)

        assert status("/health", None) == 200, "the probes need no credentials"
        assert status("/work_pools/tunefleet-x86", None) == 401
        assert status("/work_pools/tunefleet-x86", "tunefleet:wrong-password") == 401
        assert status("/work_pools/tunefleet-x86", auth) == 404  # in, and there is no such pool yet

        spec = tmp_path / "pools.json"
        spec.write_text(json.dumps(pools_spec(objs)))
        import subprocess
        import sys

        deploy = env_of(byname[("Job", "tunefleet-deploy")])
        hook_env = server.env(TUNEFLEET_POOLS_SPEC=str(spec), TUNEFLEET_POOLS_NAMESPACE=NAMESPACE)
        command = [sys.executable, "-m", "tunefleet.cluster.pools", "apply"]
        refused = subprocess.run(command, env=hook_env, capture_output=True, text=True, timeout=300, check=False)
        assert refused.returncode != 0 and "401" in refused.stderr, refused.stderr[-2000:]
        assert "PREFECT_API_AUTH_STRING" in deploy
        hook_env["PREFECT_API_AUTH_STRING"] = auth  # what the hook's secretKeyRef resolves to
        applied = subprocess.run(command, env=hook_env, capture_output=True, text=True, timeout=300, check=False)
        assert applied.returncode == 0, applied.stderr[-2000:]
        assert "created work pool tunefleet-x86" in applied.stdout
        assert status("/work_pools/tunefleet-x86", auth) == 200


# -- RBAC: exactly what each component calls ---------------------------------------------------------

_CALL = re.compile(r"\.(create|read|list|delete|patch|replace)_namespaced_([a-z_]+?)\(")
_VERB = {"create": "create", "read": "get", "list": "list", "delete": "delete", "patch": "patch", "replace": "update"}
_RESOURCE = {"job": ("batch", "jobs"), "pod": ("", "pods"), "pod_log": ("", "pods/log"), "secret": ("", "secrets"),
             "event": ("", "events")}
# The worker's Secret calls run only under settings the chart does not set (checked below).
_SECRET_SETTINGS = ("PREFECT_INTEGRATIONS_KUBERNETES_WORKER_CREATE_SECRET_FOR_API_KEY",
                    "PREFECT_INTEGRATIONS_KUBERNETES_WORKER_STORE_ENV_AS_SECRET")


def worker_calls() -> set[tuple[str, str, str]]:
    """The Kubernetes API calls of the installed prefect-kubernetes worker and observer, as
    (apiGroup, resource, verb): its client calls, and what its kopf handlers watch."""
    import prefect_kubernetes

    package = Path(prefect_kubernetes.__file__).parent
    source = "\n".join((package / name).read_text() for name in ("worker.py", "observer.py"))
    calls = set()
    for method, resource in _CALL.findall(source):
        assert resource in _RESOURCE, f"prefect-kubernetes calls {method}_namespaced_{resource}: new, review the Role"
        calls.add((*_RESOURCE[resource], _VERB[method]))
    # kopf.on.event("pods", ...) and kopf.on.event("batch", "v1", "jobs", ...): list + watch
    assert re.search(r'kopf\.on\.event\(\s*"pods"', source) and re.search(r'kopf\.on\.event\(\s*"batch",\s*"v1",\s*"jobs"', source)
    calls |= {("", "pods", "list"), ("", "pods", "watch"), ("batch", "jobs", "list"), ("batch", "jobs", "watch")}
    assert "list_pod_for_all_namespaces" in source  # only without namespaces to observe (the chart sets them)
    assert not re.search(r"kopf\.(event|info|warn|exception)\(", source), "the observer posts no Kubernetes events"
    return calls


def test_the_workers_role_grants_exactly_what_prefect_kubernetes_calls_offline() -> None:
    calls = worker_calls()
    secret_calls = {c for c in calls if c[1] == "secrets"}
    assert secret_calls, "the worker's Secret calls are still there: they must stay off"
    assert calls - secret_calls == WORKER_GRANTS
    byname = by_kind_name(rendered("defaults"))
    assert grants(byname[("Role", "tunefleet-worker")]) == WORKER_GRANTS
    for hw in ("x86", "arm"):
        env = env_of(byname[("Deployment", f"tunefleet-worker-{hw}")])
        assert not set(_SECRET_SETTINGS) & set(env)
        assert env["PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES"]["value"] == NAMESPACE
    base = by_kind_name(kustomize(KUSTOMIZE / "base"))
    assert grants(base[("Role", "tunefleet-worker")]) == WORKER_GRANTS


@pytest.mark.parametrize("set_name", SETS)
def test_only_the_workers_may_use_the_kubernetes_api_offline(set_name: str) -> None:
    """One Role, bound to the workers' account alone; every other pod (server, hooks, flow runs,
    the schedule registry) runs as an account bound to nothing and mounts no token."""
    objs = rendered(set_name)
    byname = by_kind_name(objs)
    assert [k for k in byname if k[0] in {"Role", "ClusterRole"}] == [("Role", "tunefleet-worker")]
    bindings = [o for o in objs if o["kind"] in {"RoleBinding", "ClusterRoleBinding"}]
    assert [b["subjects"] for b in bindings] == [[{"kind": "ServiceAccount", "name": "tunefleet-worker",
                                                   "namespace": NAMESPACE}]]
    assert byname[("ServiceAccount", "tunefleet-run")]["automountServiceAccountToken"] is False
    assert byname[("ServiceAccount", "tunefleet-registry")]["automountServiceAccountToken"] is False
    for label, spec in pod_specs(objs):
        if "-worker-" in label:
            assert spec["serviceAccountName"] == "tunefleet-worker"
            continue
        allowed = {"tunefleet-registry"} if label == "Deployment/tunefleet-registry" else {"tunefleet-run", "default"}
        assert spec.get("serviceAccountName", "default") in allowed, label
        assert spec["automountServiceAccountToken"] is False, label
    for template in pools_script().build_templates(pools_spec(objs), NAMESPACE).values():
        pod = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
    deploy = byname[("Job", "tunefleet-deploy")]["spec"]["template"]["spec"]
    assert deploy["serviceAccountName"] == "tunefleet-run", "the deploy hook talks to Prefect, not Kubernetes"
