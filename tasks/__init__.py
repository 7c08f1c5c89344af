"""Prefect tasks: one per pipeline step, thin wrappers over the ``tunefleet`` core."""

from tunefleet.tasks.steps import (
    account,
    build,
    export,
    extract,
    end_rounds,
    ingest,
    plan,
    plan_round,
    retrain,
    retry_if_transient,
    tune_shard,
)
from tunefleet.vocab import hardware_tag

__all__ = ["account", "build", "end_rounds", "export", "retrain", "extract", "hardware_tag", "ingest", "plan", "plan_round",
           "retry_if_transient", "tune_shard"]
