"""Built-in hardware classes: the fixed ``x86-avx2`` class, where a class may be tuned, seeding."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tunefleet import hardware
from tunefleet.config import load_settings
from tunefleet.errors import NotSupportedError
from tunefleet.hardware import (
    check_runs_here,
    configured_classes,
    ensure_hardware_classes,
    hardware_names,
)

AVX2_HOST = {"sse2", "sse4_2", "avx", "avx2", "fma"}
AVX512_HOST = AVX2_HOST | {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd", "avx512_vnni"}


@pytest.fixture
def settings(tunefleet_home: Path) -> Any:
    return load_settings()


@pytest.fixture
def classes(settings: Any) -> dict[str, dict[str, Any]]:
    return configured_classes(settings)


def _on(monkeypatch: pytest.MonkeyPatch, machine: str, flags: set[str]) -> None:
    monkeypatch.setattr(hardware.platform, "machine", lambda: machine)
    monkeypatch.setattr(hardware, "host_cpu_flags", lambda: set(flags))


def test_x86_avx2_is_a_fixed_haswell_class_in_the_x86_pool(settings: Any, classes: dict[str, dict[str, Any]]) -> None:
    from tunefleet.recipes import recipe_for
    from tunefleet.tvm.targets import make_target

    avx2, x86 = classes["x86-avx2"], classes["x86"]
    assert avx2["target"] == {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell",
                              "num-cores": len(os.sched_getaffinity(0))}
    assert make_target(avx2["target"]).attrs["mcpu"] == "haswell"
    # the ISA its code needs, not this host's flags
    assert avx2["capabilities"] == {"arch": "x86_64", "cores": len(os.sched_getaffinity(0)), "isa": ["avx", "avx2", "fma"]}
    figures = ("node_pool", "watts_per_core", "idle_watts", "watts_per_gpu", "price_per_hour")
    assert {k: avx2[k] for k in figures} == {k: x86[k] for k in figures} and avx2["node_pool"] == "x86"
    assert recipe_for(avx2["target"]) == recipe_for(x86["target"]) == recipe_for("llvm")  # the CPU recipe
    assert recipe_for(avx2["target"]).prepack and recipe_for(avx2["target"]).layout == "NHWC"
    assert "x86-avx2" in hardware_names(settings)


def test_x86_avx2_target_is_the_same_whatever_the_host(monkeypatch: pytest.MonkeyPatch, settings: Any) -> None:
    here = configured_classes(settings)["x86-avx2"]["target"]
    _on(monkeypatch, "aarch64", {"neon", "asimd"})
    assert configured_classes(settings)["x86-avx2"]["target"] == here  # valid on an ARM host too (fixed mtriple)


def test_x86_avx2_runs_on_any_x86_host_with_avx2_and_fma(monkeypatch: pytest.MonkeyPatch,
                                                        classes: dict[str, dict[str, Any]]) -> None:
    target = classes["x86-avx2"]["target"]
    for flags in (AVX2_HOST, AVX512_HOST):
        _on(monkeypatch, "x86_64", flags)
        check_runs_here("x86-avx2", target)


@pytest.mark.parametrize(("machine", "flags", "says"), [
    ("x86_64", {"sse2", "sse4_2", "avx"}, "this CPU lacks"),  # Sandy Bridge: AVX, no AVX2/FMA
    ("x86_64", AVX2_HOST - {"fma"}, "uses fma, which this CPU lacks"),
    ("aarch64", {"neon", "asimd"}, "(x86_64) on this aarch64 machine"),
])
def test_x86_avx2_is_refused_in_one_line_where_its_code_cannot_run(
        monkeypatch: pytest.MonkeyPatch, classes: dict[str, dict[str, Any]], machine: str, flags: set[str],
        says: str) -> None:
    _on(monkeypatch, machine, flags)
    with pytest.raises(NotSupportedError) as exc:
        check_runs_here("x86-avx2", classes["x86-avx2"]["target"])
    message = str(exc.value)
    assert message.startswith("not supported: tuning hardware class 'x86-avx2'") and says in message
    assert "\n" not in message


def test_an_avx512_target_is_refused_on_an_avx2_only_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``x86`` class detected on an AVX-512 machine (its target in a shared database) on a Zen 3 node."""
    _on(monkeypatch, "x86_64", AVX2_HOST)
    with pytest.raises(NotSupportedError, match=r"'x86' .*mcpu skylake-avx512\) uses .*avx512f.*which this CPU lacks"):
        check_runs_here("x86", {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    check_runs_here("x86", {"kind": "llvm", "mcpu": "skylake-avx512", "mattr": ["-avx512f"], "num-cores": 2})
    check_runs_here("x86", {"kind": "llvm", "num-cores": 2})  # generic x86-64 runs anywhere
    _on(monkeypatch, "x86_64", set())  # no /proc/cpuinfo to tell: not refused
    check_runs_here("x86", {"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})


def test_a_database_seeded_before_x86_avx2_gets_it_alone(settings: Any) -> None:
    from tunefleet.db import Database

    db = Database.from_settings(settings)
    try:
        for name in ("x86", "arm", "gpu"):  # a database seeded by an earlier tunefleet, on another machine
            db.upsert_hardware_class(name, {"kind": "llvm", "mcpu": "znver3", "num-cores": 64}, name)
        ensure_hardware_classes(db, settings)
        assert db.hardware_class("x86-avx2").target["mcpu"] == "haswell"
        assert db.hardware_class("x86").target == {"kind": "llvm", "mcpu": "znver3", "num-cores": 64}  # left alone
    finally:
        db.close()


def test_x86_and_x86_avx2_share_workloads() -> None:
    """The workload hash is the TIR's structural hash: the extracted TIR does not carry the target, and
    both classes use the CPU recipe, so a model's workloads are the same rows on both classes (the
    class is a separate key of every measurement)."""
    from tests.tvm.conftest import build_mlp
    from tunefleet.tvm.extract import extract_workloads, random_params
    from tunefleet.tvm.targets import host_cpu_target, x86_avx2_target

    mod, _ = build_mlp()
    params = random_params(mod, seed=0)

    def hashes(target: dict[str, Any]) -> list[tuple[str, str]]:
        return sorted((w.name, w.structural_hash) for w in extract_workloads(mod, target, params))

    assert hashes(x86_avx2_target()) == hashes(host_cpu_target())


# -- a class is its target and its CPU -------------------------------------------------------------

OTHER_CPU = {"model": "AMD Ryzen 9 5950X 16-Core Processor", "id": "AuthenticAMD family 25 model 33",
             "isa": ["avx", "avx2", "fma"]}


@pytest.fixture
def home_db(tunefleet_home: Path, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A home whose database (SQLite, PostgreSQL) was set up on this machine."""
    from tunefleet.db import Database

    monkeypatch.setenv("TUNEFLEET_DATABASE_URL", db_url)
    settings = load_settings()
    db = Database.from_settings(settings)
    ensure_hardware_classes(db, settings)
    yield settings, db
    db.close()


def test_the_x86_class_belongs_to_the_first_cpu_that_measures_it(home_db: Any) -> None:
    _, db = home_db
    here = hardware.host_cpu()
    assert here["model"] and here["id"] and set(here["isa"]) <= set(hardware.host_cpu_flags())
    x86 = db.hardware_class("x86")
    assert x86.capabilities["detected"] and "cpu" not in x86.capabilities  # seeding does not claim it
    assert hardware.claim_for_this_cpu(db, "x86", record=False).capabilities.get("cpu") is None
    assert hardware.claim_for_this_cpu(db, "x86").capabilities["cpu"] == here
    assert db.hardware_class("x86").target == x86.target


def test_an_x86_class_seeded_on_another_node_is_adopted_by_the_first_worker(home_db: Any) -> None:
    """On a cluster the classes may be seeded by a pod on another CPU than the x86 pool's: nothing
    was measured under that target, so the first worker makes the class its own CPU's."""
    from tunefleet.tvm.targets import host_cpu_target

    _, db = home_db
    elsewhere = {"kind": "llvm", "mcpu": "znver3", "num-cores": 64}
    db.upsert_hardware_class("x86", elsewhere, "x86", capabilities={"arch": "x86_64", "cores": 64,
                                                                    "isa": ["avx", "avx2", "fma"], "detected": True})
    x86 = hardware.claim_for_this_cpu(db, "x86")
    assert x86.target == host_cpu_target() and x86.capabilities["cpu"] == hardware.host_cpu()
    assert x86.capabilities["isa"] == hardware.host_cpu()["isa"]


def test_a_class_measured_under_another_cpus_target_before_cpus_were_recorded_is_refused(home_db: Any) -> None:
    from tunefleet.db import NewMeasurement

    _, db = home_db
    elsewhere = {"kind": "llvm", "mcpu": "znver3", "num-cores": 64}
    x86 = db.upsert_hardware_class("x86", elsewhere, "x86", capabilities={"arch": "x86_64", "detected": True})
    wl, _ = db.add_workload(structural_hash="ab" * 8, name="w", op_kind="dense/matmul", flops=1.0, tir_json="{}")
    db.commit_measurements([NewMeasurement(wl.id, x86.id, "[[],[]]", run_secs=[1e-3])])
    with pytest.raises(NotSupportedError, match="belongs to a CPU with target .*znver3"):
        hardware.claim_for_this_cpu(db, "x86")
    assert "cpu" not in db.hardware_class("x86").capabilities and db.hardware_class("x86").target == elsewhere


def test_a_home_reopened_on_another_cpu_refuses_to_measure_in_one_line(home_db: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    settings, db = home_db
    here = hardware.claim_for_this_cpu(db, "x86").capabilities["cpu"]  # tuned here once
    target = db.hardware_class("x86").target
    monkeypatch.setattr(hardware, "host_cpu", lambda: dict(OTHER_CPU))
    # opening it again (with a hardware override, which re-seeds) leaves the class as it was
    monkeypatch.setenv("TUNEFLEET_HARDWARE", '{"x86": {"price_per_hour": 0.5}}')
    ensure_hardware_classes(db, load_settings())
    x86 = db.hardware_class("x86")
    assert x86.capabilities["cpu"] == here and x86.target == target and x86.price_per_hour == 0.5
    with pytest.raises(NotSupportedError) as exc:
        hardware.claim_for_this_cpu(db, "x86")
    message = str(exc.value)
    assert message.startswith("not supported: measuring hardware class 'x86' on this machine")
    assert here["model"] in message and OTHER_CPU["model"] in message and "TUNEFLEET_HOME" in message
    assert "\n" not in message
    # the tuner refuses the same way: nothing is measured under a class of another CPU
    from tunefleet.engine.worker import Tuner

    with pytest.raises(NotSupportedError, match="their timings would mix"):
        Tuner(db, "x86")
    assert db.hardware_class("x86").capabilities["cpu"] == here  # and nothing was recorded


def test_a_class_records_the_first_cpu_that_measures_it_once(home_db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    _, db = home_db
    assert "cpu" not in db.hardware_class("x86-avx2").capabilities  # a fixed target: no CPU until measured
    assert hardware.claim_for_this_cpu(db, "x86-avx2", record=False).capabilities.get("cpu") is None
    claimed = hardware.claim_for_this_cpu(db, "x86-avx2").capabilities["cpu"]
    assert claimed == hardware.host_cpu()
    # a second CPU loses the compare-and-set and is refused
    assert db.claim_hardware_cpu("x86-avx2", OTHER_CPU) == claimed
    monkeypatch.setattr(hardware, "host_cpu", lambda: dict(OTHER_CPU))
    with pytest.raises(NotSupportedError, match="'x86-avx2'.*AMD Ryzen 9 5950X"):
        hardware.claim_for_this_cpu(db, "x86-avx2")


def test_one_cpu_is_model_id_and_isa() -> None:
    same = dict(OTHER_CPU)
    assert hardware.same_cpu(OTHER_CPU, same)
    assert not hardware.same_cpu(OTHER_CPU, {**same, "isa": ["avx", "avx2", "avx512f", "fma"]})  # a VM hid AVX-512
    assert not hardware.same_cpu(OTHER_CPU, {**same, "id": "AuthenticAMD family 25 model 17"})
    wider = {**same, "isa": ["avx", "avx2", "avx512f", "fma"]}
    assert hardware.describe_cpu(wider, OTHER_CPU) == f"{OTHER_CPU['model']} with avx512f"
    assert hardware.describe_cpu({**same, "id": "x"}, OTHER_CPU) == f"{OTHER_CPU['model']} (x)"
