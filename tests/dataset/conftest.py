"""Fixtures for the dataset export tests: real TIR from the ``mlp`` zoo model, a real S3 server."""

from __future__ import annotations

from dataclasses import dataclass

import pytest



@dataclass
class MlpWorkload:
    """One workload of the mlp model with real candidate traces (its design spaces)."""

    structural_hash: str
    name: str
    op_kind: str
    flops: float
    tir_json: str
    args_info: list
    traces: list[str]  # the empty trace (default schedule) first, then the design spaces


@pytest.fixture(scope="session")
def mlp_workloads() -> list[MlpWorkload]:
    """The mlp model's three workloads and 4-6 real traces each, from TVM (no tuning, ~5 s)."""
    from tvm.s_tir import meta_schedule as ms

    from tunefleet.models.zoo import build_zoo_model
    from tunefleet.tvm.builder import import_tensor_intrinsics
    from tunefleet.tvm.extract import extract_workloads
    from tunefleet.tvm.targets import host_cpu_target, make_target
    from tunefleet.tvm.traces import to_python, trace_json_of

    import_tensor_intrinsics()
    target = make_target(host_cpu_target(2))
    out = []
    for w in extract_workloads(build_zoo_model("mlp").mod, target):
        ctx = ms.TuneContext(w.mod, target=target, space_generator="post-order-apply", task_name=w.name)
        spaces = [trace_json_of(sch) for sch in ctx.generate_design_space()]
        args = to_python([a.as_json() for a in ms.arg_info.ArgInfo.from_prim_func(w.mod["main"])])
        out.append(MlpWorkload(w.structural_hash, w.name, w.op_kind, float(w.flops), w.tir_json, args,
                               ["[[],[]]", *dict.fromkeys(spaces)]))
    return out

