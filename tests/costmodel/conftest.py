"""Reuse the dataset tests' real ``mlp`` workloads (real TIR and traces, no tuning) and the engine fixtures."""

from tests.dataset.conftest import mlp_workloads  # noqa: F401
from tests.engine.conftest import engine, engine_settings  # noqa: F401
