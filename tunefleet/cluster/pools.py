"""Give tunefleet's Kubernetes work pools the settings of this deployment.

``tunefleet deploy --pool-type kubernetes`` creates the pools ``tunefleet-<class>`` with
``tunefleet.cluster.job_templates``'s defaults: image ``tunefleet:0.1.0``, namespace ``tunefleet``, service account
``tunefleet-run`` (no API token), no credentials. This script runs right after it in the deploy Job (the Helm
chart's post-install/post-upgrade hook, or the Job of ``k8s/base``) and replaces each pool's base
job template with one built by the same ``tunefleet.cluster.job_templates.base_job_template`` from a spec
(``pools.json``, rendered by the chart or kept in the kustomize overlay):

* the release's image, pull policy, namespace (the deploy Job's own) and flow-run service account;
* per class: node pool label, architecture, GPUs, extra tolerations, CPU/memory (CPU limit too);
* the credentials (and the Prefect API's auth string) as ``secretKeyRef`` entries and the
  settings as ``envFrom`` a ConfigMap: the
  manifest's ``{{ env }}`` placeholder is replaced by that list (the worker still prepends the
  ``env`` variable and its own Prefect settings, as prefect-kubernetes documents for secrets);
* the pod and container security contexts and the emptyDirs for ``/tmp`` and the home directory
  (the root filesystem is read-only), the volumes of the database's and the store's CA bundles
  when the spec has them, pod labels for the NetworkPolicies.

Usage (the spec from ``$TUNEFLEET_POOLS_SPEC``, default ``/etc/tunefleet/pools/pools.json``)::

    python -m tunefleet.cluster.pools wait           # until $PREFECT_API_URL/health answers
    python -m tunefleet.cluster.pools hardware-args  # "--hardware x86 --hardware arm" for tunefleet deploy
    python -m tunefleet.cluster.pools apply          # create/update every pool's base job template
    python -m tunefleet.cluster.pools show [CLASS]   # print the templates; needs no Prefect server

``apply`` and ``show`` need ``$TUNEFLEET_POOLS_NAMESPACE`` (the Job sets it from the downward API).
Every template is rendered into a Job with the Prefect Kubernetes worker's own code before any
pool is touched, so a spec the worker would reject changes nothing.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

DEFAULT_SPEC = "/etc/tunefleet/pools/pools.json"


def load_spec(path: str | None = None) -> dict[str, Any]:
    """The spec: ``classes`` by name plus the settings shared by every pool."""
    with open(path or os.environ.get("TUNEFLEET_POOLS_SPEC", DEFAULT_SPEC), encoding="utf-8") as fh:
        spec: dict[str, Any] = json.load(fh)
    if not spec.get("classes"):
        raise SystemExit("error: the pools spec names no hardware class")
    return spec


def build_template(hardware: str, spec: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """The base job template of the pool of ``hardware`` for this deployment.

    Parameters
    ----------
    hardware : str
        Hardware class name (a key of ``spec["classes"]``).
    spec : mapping
        The pools spec (``pools.json``).
    namespace : str
        Namespace the flow-run Jobs are created in (the workers' namespace).

    Returns
    -------
    dict
        ``{"job_configuration": ..., "variables": ...}`` for the pool ``tunefleet-<hardware>``.
    """
    from tunefleet.cluster.job_templates import base_job_template

    cls = spec["classes"][hardware]
    template = base_job_template(
        hardware, arch=cls["arch"], gpus=int(cls["gpus"]), image=cls.get("image") or spec["image"],
        namespace=namespace, node_pool=cls["nodePool"], cpu_request=str(cls["cpu"]),
        memory_request=str(cls["memory"]))
    props = template["variables"]["properties"]
    props["service_account_name"]["default"] = spec["serviceAccountName"]
    if spec.get("imagePullPolicy"):
        props["image_pull_policy"]["default"] = spec["imagePullPolicy"]
    props["cpu_limit"]["default"] = str(cls.get("cpuLimit") or cls["cpu"])
    if spec.get("finishedJobTtl") is not None:
        props["finished_job_ttl"]["default"] = int(spec["finishedJobTtl"])
    if spec.get("podWatchTimeout") is not None:
        props["pod_watch_timeout_seconds"]["default"] = int(spec["podWatchTimeout"])
    if "activeDeadline" in spec:  # the chart's jobs.activeDeadlineSeconds (null: no deadline)
        deadline = spec["activeDeadline"]
        props["active_deadline_seconds"]["default"] = None if deadline is None else int(deadline)
    tolerations = props["tolerations"]["default"]
    for toleration in cls.get("tolerations") or []:
        if toleration not in tolerations:
            tolerations.append(dict(toleration))
    labels = dict(spec.get("podLabels") or {})
    props["labels"]["default"] = {**labels, **props["labels"]["default"]}

    pod = template["job_configuration"]["job_manifest"]["spec"]["template"]
    pod.setdefault("metadata", {}).setdefault("labels", {})
    pod["metadata"]["labels"] = {**labels, **pod["metadata"]["labels"]}
    pod_spec = pod["spec"]
    for key, value in (spec.get("pod") or {}).items():
        pod_spec[key] = copy.deepcopy(value)
    container = pod_spec["containers"][0]
    for key, value in (spec.get("container") or {}).items():
        container[key] = copy.deepcopy(value)
    return template


def build_templates(spec: Mapping[str, Any], namespace: str) -> dict[str, dict[str, Any]]:
    """Every class's template, each rendered once with the worker's own code as a check."""
    from tunefleet.cluster.job_templates import render_job

    templates = {hw: build_template(hw, spec, namespace) for hw in sorted(spec["classes"])}
    for template in templates.values():
        render_job(template)  # raises TunefleetError if the worker would reject it
    return templates


def wait_for_api(timeout_s: float | None = None, interval_s: float = 5.0) -> None:
    """Block until ``$PREFECT_API_URL/health`` answers (the server may still be starting).

    Any answer below 500 counts: an API behind authentication (Prefect Cloud) may refuse the
    unauthenticated probe, and the Prefect client that runs next authenticates properly.
    """
    url = os.environ.get("PREFECT_API_URL", "").rstrip("/")
    if not url:
        raise SystemExit("error: PREFECT_API_URL is not set")
    timeout_s = float(os.environ.get("TUNEFLEET_POOLS_WAIT_S", "600")) if timeout_s is None else timeout_s
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                status = response.status
        except urllib.error.HTTPError as exc:
            status = exc.code
        except (urllib.error.URLError, OSError) as exc:
            status, reason = 0, str(exc)
        if 0 < status < 500:
            print(f"Prefect API {url} answers (HTTP {status})", flush=True)
            return
        if status:
            reason = f"HTTP {status}"
        if time.monotonic() >= deadline:
            raise SystemExit(f"error: Prefect API {url} did not answer within {timeout_s:g} s ({reason})")
        print(f"waiting for the Prefect API at {url} ({reason})", flush=True)
        time.sleep(interval_s)


def apply(spec: Mapping[str, Any], namespace: str) -> list[str]:
    """Create or update the work pool of every class; returns the pool names."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound

    from tunefleet.cluster.job_templates import pool_name

    templates = build_templates(spec, namespace)
    done = []
    with get_client(sync_client=True) as client:
        for hardware, template in templates.items():
            name = pool_name(hardware)
            try:
                existing = client.read_work_pool(name)
            except ObjectNotFound:
                client.create_work_pool(WorkPoolCreate(
                    name=name, type="kubernetes", base_job_template=template,
                    description=f"tunefleet workers for hardware class {hardware}"))
                print(f"created work pool {name}", flush=True)
            else:
                if existing.type != "kubernetes":
                    raise SystemExit(f"error: work pool {name} exists with type {existing.type}")
                client.update_work_pool(name, WorkPoolUpdate(base_job_template=template))
                print(f"updated work pool {name}", flush=True)
            done.append(name)
    return done


def _namespace() -> str:
    namespace = os.environ.get("TUNEFLEET_POOLS_NAMESPACE", "")
    if not namespace:
        raise SystemExit("error: TUNEFLEET_POOLS_NAMESPACE is not set")
    return namespace


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args else ""
    if command == "wait":
        wait_for_api()
    elif command == "hardware-args":
        print(" ".join(f"--hardware {hw}" for hw in sorted(load_spec()["classes"])))
    elif command == "apply":
        apply(load_spec(), _namespace())
    elif command == "show":
        templates = build_templates(load_spec(), _namespace())
        selected = {k: v for k, v in templates.items() if len(args) < 2 or k in args[1:]}
        print(json.dumps(selected, indent=2, sort_keys=True))
    else:
        print("usage: python -m tunefleet.cluster.pools wait | hardware-args | apply | show [CLASS ...]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
