"""Prefect tasks: one per pipeline step, thin wrappers over the ``tunefleet`` core."""

from tunefleet.tasks.steps import (
    account,
    build,
    export,
    extract,
    ingest,
    plan,
    retrain,
    retry_if_transient,
    tune_shard,
)
from tunefleet.vocab import hardware_tag

__all__ = ["account", "build", "export", "retrain", "extract", "hardware_tag", "ingest", "plan", "retry_if_transient", "tune_shard"]
