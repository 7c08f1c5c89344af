"""Reuse the dataset tests' real ``mlp`` workloads (real TIR and traces, no tuning)."""

from tests.dataset.conftest import mlp_workloads  # noqa: F401
