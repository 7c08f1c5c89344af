"""Prefect Kubernetes work pools, one per hardware class, and offline checks of their Jobs.

Every hardware class gets a work pool ``tunefleet-<class>`` of type ``kubernetes``. Its base job
template (what a Prefect work pool stores: ``{"job_configuration": ..., "variables": ...}``) is
prefect-kubernetes' stock template with tunefleet's changes:

* variables ``node_selector``, ``tolerations`` and ``gpu_limit`` pin each Job to its class's node
  pool (label ``tunefleet.io/hardware=<class>`` plus ``kubernetes.io/arch``, taint
  ``tunefleet.io/hardware=<class>:NoSchedule``) and give GPU Jobs ``nvidia.com/gpu``;
* tunefleet defaults: image ``tunefleet:0.1.0``, namespace ``tunefleet``, service account
  ``tunefleet-run`` without an API token (a flow run parses untrusted model files: it gets no
  Kubernetes permission, unlike the worker's ``tunefleet-worker``), CPU/memory requests (memory
  is also the limit), tunefleet's logs forwarded to the flow-run logs, a TTL for finished Jobs, a
  longer pod-start timeout (the image is large);
* a deadline (``activeDeadlineSeconds``, variable ``active_deadline_seconds``, default
  :data:`DEFAULT_ACTIVE_DEADLINE_S`): Kubernetes ends a flow-run Job still running after it, so a
  flow run that hangs (a stuck tuning process, a wait that never ends) gives its node back
  instead of holding it forever; its shards' leases lapse and other workers take them over;
* ``completions``/``parallelism`` moved from the pod spec (where the stock template puts them,
  and where Kubernetes does not know them: ``kubernetes-validate --strict`` rejects the Job) to the
  Job spec. prefect-kubernetes 0.8 checks that a job manifest still "has" them under
  ``/spec/template/spec`` by diffing it against its base manifest with ``jsonpatch`` and
  rejecting ``add`` operations; with both at 1 on the Job spec the diff yields ``move``
  operations, so the worker accepts the template. :func:`render_job` runs that check, so a
  prefect-kubernetes release that changes it fails tunefleet's tests, not a flow run.

:func:`render_job` renders the Job a deployment's flow run would create with the worker's own
code (no API server, no Prefect server), and :func:`validate_manifest` checks a manifest against
the Kubernetes OpenAPI schemas with ``kubernetes-validate --strict`` semantics.

``python -m tunefleet.cluster.job_templates export k8s/work-pools`` regenerates the committed templates.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import copy
import inspect
import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tunefleet.version import __version__
from tunefleet.errors import ConfigError, NotSupportedError, TunefleetError

POOL_PREFIX = "tunefleet-"
HARDWARE_LABEL = "tunefleet.io/hardware"
ARCH_LABEL = "kubernetes.io/arch"
GPU_RESOURCE = "nvidia.com/gpu"
HARDWARE_ARCH: dict[str, str] = {"x86": "amd64", "arm": "arm64", "gpu": "amd64"}
DEFAULT_CLASSES: tuple[str, ...] = ("x86", "arm", "gpu")
DEFAULT_IMAGE = f"tunefleet:{__version__}"  # the image of this version's Dockerfile
DEFAULT_NAMESPACE = "tunefleet"
DEFAULT_SERVICE_ACCOUNT = "tunefleet-run"
"""The flow-run Jobs' service account: no RoleBinding names it (``k8s/base/serviceaccount-run.yaml``)."""
DEFAULT_CPU_REQUEST = "2"
DEFAULT_MEMORY_REQUEST = "4Gi"
DEFAULT_FINISHED_JOB_TTL = 86400
DEFAULT_POD_WATCH_TIMEOUT = 300
DEFAULT_ACTIVE_DEADLINE_S = 6 * 3600
"""Seconds a flow-run Job may run before Kubernetes ends it: six hours, 24 times the default
budget (``TUNEFLEET_BUDGET``, 15 minutes of wall time for a whole pipeline run) and room for a
long trial budget; a deployment whose runs take longer raises ``active_deadline_seconds`` in its
job variables (the Helm chart: ``jobs.activeDeadlineSeconds``), and ``None`` there lifts it."""
DEFAULT_KUBERNETES_VERSION = "1.30"
_JOB_COUNTS = ("completions", "parallelism")

_LABEL_VALUE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_INSTALL_HINT = "install tunefleet[kubernetes]"


def pool_name(hardware: str) -> str:
    """Name of the Prefect work pool of a hardware class.

    Parameters
    ----------
    hardware : str
        Hardware class name, e.g. ``"x86"``.

    Returns
    -------
    str
        ``"tunefleet-<hardware>"``.
    """
    return f"{POOL_PREFIX}{hardware}"


def _check_label_value(what: str, value: str) -> None:
    if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
        raise ConfigError(f"invalid {what} {value!r}: use lowercase letters, digits and '-' "
                          "(at most 63 characters, starting and ending with a letter or digit)")


def _worker_module() -> Any:
    try:
        from prefect_kubernetes import worker
    except ImportError as exc:
        raise NotSupportedError(f"not supported: Kubernetes work pools need prefect-kubernetes "
                                f"({exc}); {_INSTALL_HINT}") from exc
    return worker


def base_job_template(
    hardware: str,
    *,
    arch: str | None = None,
    gpus: int | None = None,
    image: str = DEFAULT_IMAGE,
    namespace: str = DEFAULT_NAMESPACE,
    node_pool: str | None = None,
    cpu_request: str = DEFAULT_CPU_REQUEST,
    memory_request: str = DEFAULT_MEMORY_REQUEST,
    active_deadline_s: int | None = DEFAULT_ACTIVE_DEADLINE_S,
) -> dict[str, Any]:
    """The base job template of the Kubernetes work pool of one hardware class.

    Parameters
    ----------
    hardware : str
        Hardware class name (any valid label value; ``x86``, ``arm`` and ``gpu`` are built in).
    arch : str, optional
        Node architecture (``kubernetes.io/arch``). Defaults to :data:`HARDWARE_ARCH` for the
        class, else ``"amd64"``.
    gpus : int, optional
        GPUs per Job (``nvidia.com/gpu``). Defaults to 1 for ``gpu``, 0 otherwise; with 0 the Job
        requests no GPU and does not tolerate the GPU taint.
    image : str
        Default container image.
    namespace : str
        Default namespace the Jobs are created in.
    node_pool : str, optional
        Value of the ``tunefleet.io/hardware`` node label and taint the Jobs select and
        tolerate; defaults to ``hardware``. Job and pod labels always carry ``hardware``.
    cpu_request, memory_request : str
        Default resource requests (Kubernetes quantities); the memory request is also the limit.
    active_deadline_s : int or None
        Default seconds a flow-run Job may run before Kubernetes ends it (``activeDeadlineSeconds``);
        None: no deadline.

    Returns
    -------
    dict
        ``{"job_configuration": {...}, "variables": {json schema}}``, ready for
        ``WorkPoolCreate(type="kubernetes", base_job_template=...)``.

    Raises
    ------
    ConfigError
        If a name is not a valid Kubernetes label value, ``gpus`` is negative or
        ``active_deadline_s`` is not a positive integer.
    NotSupportedError
        If prefect-kubernetes is not installed.
    """
    _check_label_value("hardware class", hardware)
    node_pool = hardware if node_pool is None else node_pool
    _check_label_value("node pool", node_pool)
    arch = arch if arch is not None else HARDWARE_ARCH.get(hardware, "amd64")
    _check_label_value("architecture", arch)
    gpus = (1 if hardware == "gpu" else 0) if gpus is None else gpus
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0:
        raise ConfigError(f"invalid GPU count {gpus!r}: use an integer >= 0")
    if active_deadline_s is not None and (isinstance(active_deadline_s, bool)
                                          or not isinstance(active_deadline_s, int) or active_deadline_s < 1):
        raise ConfigError(f"invalid Job deadline {active_deadline_s!r}: use a whole number of seconds >= 1, "
                          "or None for no deadline")

    template = copy.deepcopy(_worker_module().KubernetesWorker.get_default_base_job_template())
    config: dict[str, Any] = template["job_configuration"]
    props: dict[str, Any] = template["variables"]["properties"]

    manifest = config["job_manifest"]
    job_spec = manifest["spec"]
    # Where Kubernetes reads them; unknown fields in the pod spec. Both must stay 1: the worker's
    # manifest check accepts their absence from the pod spec only as a jsonpatch "move" of
    # equal values (see the module docstring).
    for field in _JOB_COUNTS:
        job_spec["template"]["spec"].pop(field, None)
        job_spec[field] = 1
    # null: the placeholder stays unresolved and the worker drops the key (no deadline).
    job_spec["activeDeadlineSeconds"] = "{{ active_deadline_seconds }}"
    pod = job_spec["template"]
    pod.setdefault("metadata", {}).setdefault("labels", {})[HARDWARE_LABEL] = hardware
    pod_spec = pod["spec"]
    pod_spec["automountServiceAccountToken"] = False  # a flow run needs no Kubernetes API
    pod_spec["nodeSelector"] = "{{ node_selector }}"
    pod_spec["tolerations"] = "{{ tolerations }}"
    resources = pod_spec["containers"][0]["resources"]
    resources["limits"] = {"cpu": "{{ cpu_limit }}", "memory": "{{ memory_request }}",
                           GPU_RESOURCE: "{{ gpu_limit }}"}
    resources["requests"] = {"cpu": "{{ cpu_request }}", "memory": "{{ memory_request }}"}
    # The memory limit is the request: no separate variable that could fall below it.
    props.pop("memory_limit", None)

    tolerations: list[dict[str, Any]] = [
        {"key": HARDWARE_LABEL, "operator": "Equal", "value": node_pool, "effect": "NoSchedule"}]
    if gpus > 0:
        tolerations.append({"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"})

    props["image"]["default"] = image
    props["namespace"]["default"] = namespace
    props["service_account_name"]["default"] = DEFAULT_SERVICE_ACCOUNT
    props["env"]["default"] = {"PREFECT_LOGGING_EXTRA_LOGGERS": "tunefleet"}
    props["labels"]["default"] = {HARDWARE_LABEL: hardware}
    props["finished_job_ttl"]["default"] = DEFAULT_FINISHED_JOB_TTL
    props["pod_watch_timeout_seconds"]["default"] = DEFAULT_POD_WATCH_TIMEOUT
    props["cpu_request"]["default"] = cpu_request
    props["memory_request"]["default"] = memory_request
    props["memory_request"]["description"] = (
        "The memory request of the Job's container, also its memory limit. Kubernetes quantity "
        "format (e.g. '4Gi').")
    props["node_selector"] = {
        "title": "Node Selector",
        "description": ("Node labels a Job's pod must match. Replaces the pool's default as a whole: "
                        f"keep {HARDWARE_LABEL!r} and {ARCH_LABEL!r} when overriding."),
        "type": "object",
        "additionalProperties": {"type": "string"},
        "default": {HARDWARE_LABEL: node_pool, ARCH_LABEL: arch},
    }
    props["tolerations"] = {
        "title": "Tolerations",
        "description": ("Taints a Job's pod tolerates (Kubernetes toleration objects). Replaces "
                        "the pool's default as a whole."),
        "type": "array",
        "items": {
            "type": "object",
            "properties": {
                "key": {"type": "string"},
                "operator": {"type": "string", "enum": ["Equal", "Exists"]},
                "value": {"type": "string"},
                "effect": {"type": "string", "enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]},
                "tolerationSeconds": {"type": "integer"},
            },
            "additionalProperties": False,
        },
        "default": tolerations,
    }
    props["active_deadline_seconds"] = {
        "title": "Active Deadline Seconds",
        "description": ("Seconds a flow-run Job may run before Kubernetes ends it (activeDeadlineSeconds), so "
                        "that a hung flow run gives its node back; its shards' leases lapse and other workers "
                        "take them over. Raise it for runs that take longer; null: no deadline."),
        "anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
        "default": active_deadline_s,
    }
    props["gpu_limit"] = {
        "title": "GPU Limit",
        "description": (f"GPUs ({GPU_RESOURCE}) per Job. Leave unset for no GPU request at all; "
                        "GPU nodes need the NVIDIA device plugin."),
        "anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}],
        # null: the placeholder stays unresolved and the worker drops the key.
        "default": gpus if gpus > 0 else None,
    }
    return template


def default_templates() -> dict[str, dict[str, Any]]:
    """Base job templates of the built-in hardware classes.

    Returns
    -------
    dict
        ``{"x86": template, "arm": template, "gpu": template}``.
    """
    return {hardware: base_job_template(hardware) for hardware in DEFAULT_CLASSES}


class _OfflineClient:
    """Stands in for the Prefect client: templates that need the API cannot render offline."""

    def __getattr__(self, name: str) -> Any:
        async def unavailable(*args: Any, **kwargs: Any) -> Any:
            raise NotSupportedError(
                f"not supported: rendering offline cannot resolve Prefect blocks or variables "
                f"referenced by the template (client.{name})")

        return unavailable


def _run(awaitable: Any) -> Any:
    if not inspect.isawaitable(awaitable):
        return awaitable

    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, wait()).result()


def render_job(
    base_job_template: Mapping[str, Any],
    job_variables: Mapping[str, Any] | None = None,
    *,
    flow_run_name: str = "tunefleet-run",
    deployment_name: str = "tunefleet",
    flow_name: str = "tunefleet",
    work_pool_name: str | None = None,
    as_submitted: bool = False,
) -> dict[str, Any]:
    """The Job manifest the Prefect Kubernetes worker would submit for a flow run.

    Uses the worker's own code: the job variables are checked against the template's variables
    schema (as the Prefect server does when a deployment is created), then
    ``KubernetesWorkerJobConfiguration.from_template_and_values`` fills the template (defaults
    overlaid with ``job_variables``, ``env`` merged) and ``prepare_for_flow_run`` adds the
    labels, environment, command and ``generateName`` of a flow run. Nothing is contacted.

    Parameters
    ----------
    base_job_template : mapping
        A work pool's base job template.
    job_variables : mapping, optional
        The deployment's ``work_pool.job_variables``.
    flow_run_name, deployment_name, flow_name : str
        Names used for the flow run's labels and environment.
    work_pool_name : str, optional
        Work pool name for the labels; defaults to ``"tunefleet-<hardware>"`` from the template's
        ``labels`` default when present.
    as_submitted : bool
        Also do what the worker does to the manifest right before it creates the Job: with the
        worker settings ``PREFECT_INTEGRATIONS_KUBERNETES_WORKER_API_KEY_SECRET_NAME``/``_KEY`` and
        ``..._API_AUTH_STRING_SECRET_NAME``/``_KEY`` (read from this process's environment, as the
        worker reads its own), the ``PREFECT_API_KEY`` and ``PREFECT_API_AUTH_STRING`` entries the
        worker copied from its own settings become ``secretKeyRef`` entries. The flow run's
        environment comes from this process's Prefect settings, as it comes from the worker's.

    Returns
    -------
    dict
        The Job manifest exactly as the worker sends it (``metadata.generateName``, no
        ``metadata.name``: the API server generates the name).

    Raises
    ------
    TunefleetError
        If the job variables do not fit the schema or the worker rejects the configuration.
    NotSupportedError
        If prefect-kubernetes is not installed, or the template references Prefect blocks or
        variables (they need a Prefect server), or ``as_submitted`` and the worker settings
        create Secrets (that needs an API server).
    """
    worker = _worker_module()
    from prefect.client.schemas.objects import Flow, FlowRun, WorkPool
    from prefect.client.schemas.responses import DeploymentResponse
    from prefect.utilities.schema_tools import ValidationError as SchemaValidationError
    from prefect.utilities.schema_tools import validate as validate_schema
    from pydantic import ValidationError as PydanticValidationError

    template = copy.deepcopy(dict(base_job_template))
    values = copy.deepcopy(dict(job_variables or {}))
    try:
        validate_schema(values, template.get("variables") or {}, raise_on_error=True,
                        preprocess=True, ignore_required=True)
    except SchemaValidationError as exc:
        raise TunefleetError(f"invalid job variables {sorted(values)}: {exc}") from exc

    configuration_cls = worker.KubernetesWorkerJobConfiguration
    try:
        configuration = _run(configuration_cls.from_template_and_values(
            base_job_template=template, values=values, client=_OfflineClient()))
    except PydanticValidationError as exc:
        problems = "; ".join(str(err.get("msg", err)) for err in exc.errors())
        raise TunefleetError(f"the Prefect Kubernetes worker rejects this job configuration: "
                             f"{problems}") from exc

    if work_pool_name is None:
        labels_default = template["variables"]["properties"].get("labels", {}).get("default") or {}
        hardware = labels_default.get(HARDWARE_LABEL)
        work_pool_name = pool_name(hardware) if hardware else "tunefleet"
    flow = Flow(name=flow_name)
    deployment = DeploymentResponse(name=deployment_name, flow_id=flow.id,
                                    work_pool_name=work_pool_name, job_variables=values)
    flow_run = FlowRun(name=flow_run_name, flow_id=flow.id, deployment_id=deployment.id,
                       work_pool_name=work_pool_name)
    work_pool = WorkPool(name=work_pool_name, type="kubernetes", base_job_template=template)
    configuration.prepare_for_flow_run(flow_run=flow_run, deployment=deployment, flow=flow,
                                       work_pool=work_pool)
    if as_submitted:
        _replace_credentials_as_the_worker_does(worker, configuration)
    return configuration.job_manifest


def _replace_credentials_as_the_worker_does(worker: Any, configuration: Any) -> None:
    """The worker's own steps of ``KubernetesWorker._create_job`` that turn credentials into
    ``secretKeyRef`` entries, without the steps that talk to the API server."""
    from prefect_kubernetes.settings import KubernetesSettings

    settings = KubernetesSettings().worker
    if settings.create_secret_for_api_key or settings.store_env_as_secret:
        raise NotSupportedError("not supported: rendering offline cannot create the Secrets the worker settings "
                                "..._CREATE_SECRET_FOR_API_KEY and ..._STORE_ENV_AS_SECRET ask for")
    submitter = object.__new__(worker.KubernetesWorker)  # the methods used read no worker state
    if settings.api_key_secret_name:
        _run(submitter._replace_api_key_with_secret(configuration=configuration, client=None,
                                                    secret_name=settings.api_key_secret_name,
                                                    secret_key=settings.api_key_secret_key))
    if settings.api_auth_string_secret_name and settings.api_auth_string_secret_key:
        _run(submitter._replace_env_variable_with_secret(
            env_variable_name="PREFECT_API_AUTH_STRING", configuration=configuration,
            secret_name=settings.api_auth_string_secret_name, secret_key=settings.api_auth_string_secret_key))


def validate_manifest(manifest: Mapping[str, Any], *,
                      kubernetes_version: str = DEFAULT_KUBERNETES_VERSION) -> None:
    """Validate a Kubernetes object offline against the OpenAPI schemas, strictly.

    Same check as ``kubernetes-validate --strict``: unknown fields are errors.

    Parameters
    ----------
    manifest : mapping
        One Kubernetes object (``apiVersion``, ``kind``, ...).
    kubernetes_version : str
        Kubernetes version whose schemas to use (``"1.30"``).

    Raises
    ------
    TunefleetError
        With one line naming the object, the field path and the problem.
    ConfigError
        If kubernetes-validate has no schemas for ``kubernetes_version``.
    NotSupportedError
        If kubernetes-validate is not installed.
    """
    try:
        import kubernetes_validate
        from kubernetes_validate.utils import VersionNotSupportedError
    except ImportError as exc:
        raise NotSupportedError(f"not supported: validating manifests needs kubernetes-validate "
                                f"({exc}); {_INSTALL_HINT}") from exc

    if not isinstance(manifest, Mapping):
        raise TunefleetError(f"not a Kubernetes object: {type(manifest).__name__}")
    obj = copy.deepcopy(dict(manifest))
    kind, api_version = obj.get("kind"), obj.get("apiVersion")
    if not kind or not api_version:
        raise TunefleetError("not a Kubernetes object: apiVersion and kind are required")
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    label = f"{kind}/{metadata.get('name') or '?'}"
    # kubernetes-validate crashes on objects with only generateName: give them the kind of name
    # the API server would generate.
    if metadata and not metadata.get("name") and metadata.get("generateName"):
        label = f"{kind}/{metadata['generateName']}*"
        metadata["name"] = f"{metadata['generateName']}00000"
    try:
        kubernetes_validate.validate(obj, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        path = ".".join(str(part) for part in exc.path) or "(root)"
        message = " ".join(str(exc.message).split())
        raise TunefleetError(f"{label} is invalid for Kubernetes {exc.version} (strict): "
                             f"{path}: {message}") from None
    except kubernetes_validate.SchemaNotFoundError as exc:
        raise TunefleetError(f"{label}: {exc.message}") from None
    except VersionNotSupportedError as exc:
        raise ConfigError(f"{exc.message}; use one of 1.25 to "
                          f"{kubernetes_validate.latest_version()}") from None


def export(directory: str | Path) -> list[Path]:
    """Write the built-in templates as ``<class>.json`` files.

    Parameters
    ----------
    directory : str or Path
        Target folder (created if missing), e.g. ``k8s/work-pools``.

    Returns
    -------
    list of Path
        The files written, in class order.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for hardware, template in default_templates().items():
        path = out / f"{hardware}.json"
        path.write_text(json.dumps(template, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m tunefleet.cluster.job_templates export DIRECTORY``.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        Exit status.
    """
    parser = argparse.ArgumentParser(prog="python -m tunefleet.cluster.job_templates",
                                     description="Kubernetes work-pool templates of tunefleet.")
    sub = parser.add_subparsers(dest="command", required=True)
    exp = sub.add_parser("export", help="write <class>.json base job templates")
    exp.add_argument("directory", nargs="?", default="k8s/work-pools")
    args = parser.parse_args(argv)
    try:
        for path in export(args.directory):
            print(path)
    except TunefleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
