"""Register tunefleet with a Prefect server: a work pool per hardware class, then the deployments.

``deploy`` creates (or updates) the work pool ``tunefleet-<class>`` of every hardware class in the
database — a ``process`` pool, or a ``kubernetes`` pool whose base job template pins the Jobs to
that class's node pool (:mod:`tunefleet.cluster.job_templates`) — optionally caps parallel tuning per class with a
Prefect tag concurrency limit, and registers the deployments of ``flows/prefect.yaml`` with
Prefect's own ``prefect deploy``. Re-running it is safe: pools are updated in place, deployments
are upserted by name.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from tunefleet.cluster.job_templates import POOL_PREFIX, pool_name
from tunefleet.errors import ConfigError, TunefleetError

log = logging.getLogger(__name__)

PoolType = Literal["process", "kubernetes"]
DEPLOY_TIMEOUT_S = 300


def prefect_yaml() -> Path:
    """The packaged ``prefect.yaml`` (``flows/prefect.yaml`` in the source tree)."""
    return Path(str(resources.files("tunefleet.flows").joinpath("prefect.yaml")))


def api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        raise ConfigError("tunefleet deploy needs a Prefect server: set PREFECT_API_URL "
                          "(e.g. http://127.0.0.1:4200/api)")
    return str(url)


def process_job_template() -> dict[str, Any]:
    """Prefect's process template, with tunefleet's logs forwarded to the flow-run logs."""
    from prefect.workers.process import ProcessWorker

    template = ProcessWorker.get_default_base_job_template()
    env = template["variables"]["properties"]["env"]
    env["default"] = {"PREFECT_LOGGING_EXTRA_LOGGERS": "tunefleet"}
    return template


def job_template(hardware: str, pool_type: PoolType, *, node_pool: str | None = None) -> dict[str, Any]:
    if pool_type == "process":
        return process_job_template()
    if pool_type == "kubernetes":
        from tunefleet.cluster.job_templates import base_job_template

        return base_job_template(hardware, node_pool=node_pool)
    raise ConfigError(f"invalid pool type {pool_type!r}: use process or kubernetes")


@dataclass
class DeployResult:
    api_url: str
    pools_created: list[str] = field(default_factory=list)
    pools_updated: list[str] = field(default_factory=list)
    concurrency_limits: dict[str, int] = field(default_factory=dict)
    deployments: list[str] = field(default_factory=list)


def ensure_pool(client: Any, name: str, pool_type: PoolType, template: dict[str, Any]) -> bool:
    """Create the pool, or update its template if it exists with the same type; True if created."""
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound

    try:
        existing = client.read_work_pool(name)
    except ObjectNotFound:
        client.create_work_pool(WorkPoolCreate(name=name, type=pool_type, base_job_template=template,
                                               description=f"tunefleet workers for hardware class {name[len(POOL_PREFIX):]}"))
        return True
    if existing.type != pool_type:
        raise TunefleetError(f"work pool {name} exists with type {existing.type}; delete it "
                             f"(prefect work-pool delete {name}) or deploy with --pool-type {existing.type}")
    client.update_work_pool(name, WorkPoolUpdate(base_job_template=template))
    return False


def ensure_concurrency_limit(client: Any, tag: str, limit: int) -> None:
    from prefect.exceptions import ObjectNotFound

    try:
        current = client.read_concurrency_limit_by_tag(tag)
        if current.concurrency_limit == limit:
            return
        client.delete_concurrency_limit_by_tag(tag)
    except ObjectNotFound:
        pass
    client.create_concurrency_limit(tag=tag, concurrency_limit=limit)


def deployments_for_pools(pools: set[str], path: Path | None = None) -> list[dict[str, Any]]:
    """The deployments of ``prefect.yaml`` bound to one of ``pools`` (others would have no worker)."""
    import yaml

    spec = yaml.safe_load((path or prefect_yaml()).read_text())
    return [d for d in spec["deployments"] if d.get("work_pool", {}).get("name") in pools]


def register_deployments(names: list[str], path: Path | None = None, *, timeout_s: float = DEPLOY_TIMEOUT_S) -> None:
    """``prefect --no-prompt deploy --name ...`` on the packaged prefect.yaml, from a scratch directory."""
    path = path or prefect_yaml()
    args = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--prefect-file", str(path)]
    for name in names:
        args += ["--name", name]
    with tempfile.TemporaryDirectory(prefix="tunefleet-deploy-") as scratch:
        proc = subprocess.run(args, cwd=scratch, capture_output=True, text=True, timeout=timeout_s,
                              env=os.environ.copy())
    if proc.returncode != 0:
        tail = [line for line in (proc.stdout + proc.stderr).strip().splitlines() if line.strip()][-5:]
        raise TunefleetError(f"prefect deploy failed (exit {proc.returncode}): {' | '.join(tail)}")


def deploy(hardware: Mapping[str, str], *, pool_type: PoolType = "process", concurrency: int | None = None) -> DeployResult:
    """Create the work pools of hardware classes (name -> node-pool label) and register every deployment."""
    from prefect.client.orchestration import get_client

    result = DeployResult(api_url=api_url())
    if concurrency is not None and concurrency < 1:
        raise ConfigError(f"invalid concurrency {concurrency}: must be >= 1")
    from tunefleet.vocab import EXPORT_TAG, hardware_tag

    with get_client(sync_client=True) as client:
        try:
            client.hello()
        except Exception as exc:  # httpx errors: one line, not a traceback
            raise TunefleetError(f"cannot reach the Prefect server at {result.api_url}: {exc}") from None
        for hw, node_pool in hardware.items():
            name = pool_name(hw)
            created = ensure_pool(client, name, pool_type, job_template(hw, pool_type, node_pool=node_pool))
            (result.pools_created if created else result.pools_updated).append(name)
            log.info("work pool %s (%s) %s", name, pool_type, "created" if created else "updated")
            if concurrency is not None:
                ensure_concurrency_limit(client, hardware_tag(hw), concurrency)
                result.concurrency_limits[hardware_tag(hw)] = concurrency
        ensure_concurrency_limit(client, EXPORT_TAG, 1)  # dataset exports one at a time
        result.concurrency_limits[EXPORT_TAG] = 1
    from prefect.flows import load_flow_from_entrypoint

    selected = deployments_for_pools({pool_name(hw) for hw in hardware})
    if not selected:
        raise TunefleetError("no deployment in prefect.yaml runs on the pools of "
                             f"{', '.join(hardware)}; deploy at least the x86 class (it runs pipeline and steps)")
    register_deployments([d["name"] for d in selected])
    result.deployments = [f"{load_flow_from_entrypoint(d['entrypoint']).name}/{d['name']}" for d in selected]
    return result
