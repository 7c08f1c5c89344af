"""Fixtures for the TVM adapter tests: a tiny MLP (built without downloads) and a CPU target.

Weights: ``export_tvm`` returns parameter specs and makes the weights extra function inputs;
the fixtures bind random weights (``random_params``, seed 0) as constants, as a deployed model
has them. Workload hashes do not depend on the weight values (see test_extract.py).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

logger = logging.getLogger(__name__)

MLP_INPUT_SHAPE = (1, 64)


def build_mlp() -> tuple[Any, Any]:
    """The test MLP (64 -> 128 -> relu -> 32) as a Relax module and its parameter specs."""
    from tvm.relax.frontend import nn

    class MLP(nn.Module):
        def __init__(self) -> None:
            self.fc1 = nn.Linear(64, 128)
            self.fc2 = nn.Linear(128, 32)

        def forward(self, x: nn.Tensor) -> nn.Tensor:
            return self.fc2(nn.relu(self.fc1(x)))

    mod, specs = MLP().export_tvm({"forward": {"x": nn.spec.Tensor(MLP_INPUT_SHAPE, "float32")}})
    return mod, specs


def matmul_mod(n: int = 16) -> Any:
    """An n x n matmul as a TIR IRModule (entry ``main``): a workload small enough to schedule by hand."""
    from tvm import te
    from tvm.ir import IRModule

    a = te.placeholder((n, n), name="A")
    b = te.placeholder((n, n), name="B")
    k = te.reduce_axis((0, n), name="k")
    c = te.compute((n, n), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="C")
    return IRModule({"main": te.create_prim_func([a, b, c])})


@pytest.fixture(scope="session")
def mlp_mod() -> Any:
    """The MLP's Relax IRModule (function ``forward``; weights are inputs 2..5)."""
    mod, _ = build_mlp()
    return mod


@pytest.fixture(scope="session")
def mlp_params(mlp_mod: Any) -> dict[str, Any]:
    """Random weights for the MLP, keyed by parameter name (``fc1.weight``, ...)."""
    from tunefleet.tvm.extract import random_params

    return random_params(mlp_mod, seed=0)


@pytest.fixture(scope="session")
def cpu_target_spec() -> dict[str, Any]:
    """The host CPU target in dict form (with num-cores)."""
    from tunefleet.tvm.targets import host_cpu_target

    return host_cpu_target()


@pytest.fixture(scope="session")
def cpu_target(cpu_target_spec: dict[str, Any]) -> Any:
    """The host CPU target as a ``tvm.target.Target``."""
    from tunefleet.tvm.targets import make_target

    return make_target(cpu_target_spec)


@pytest.fixture(scope="session")
def mlp_workloads(mlp_mod: Any, mlp_params: dict[str, Any], cpu_target: Any) -> list[Any]:
    """The MLP's extracted workloads for the host CPU."""
    from tunefleet.tvm.extract import extract_workloads

    return extract_workloads(mlp_mod, cpu_target, mlp_params)
