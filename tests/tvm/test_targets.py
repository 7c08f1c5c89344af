"""Target creation: the dict form, its JSON string, and one-line errors for what TVM rejects."""

from __future__ import annotations

import json
import os

import pytest

from tunefleet.errors import TunefleetError
from tunefleet.tvm.targets import (
    InvalidTargetError,
    arm_target,
    cuda_target,
    host_cpu_target,
    make_target,
    target_cpu_features,
    target_fingerprint,
    x86_avx2_target,
)


def test_dict_form_creates_llvm_target_with_num_cores() -> None:
    target = make_target({"kind": "llvm", "num-cores": 2})
    assert target.kind.name == "llvm"
    assert int(target.attrs["num-cores"]) == 2
    assert "cpu" in [str(k) for k in target.keys]


def test_json_string_of_the_dict_form_gives_the_same_target() -> None:
    spec = {"kind": "llvm", "num-cores": 2}
    assert target_fingerprint(make_target(json.dumps(spec))) == target_fingerprint(
        make_target(spec)
    )


def test_bare_kind_name_is_accepted() -> None:
    # TVM 0.27 still takes a bare kind/tag name; it has no num-cores (tuning would fail).
    assert make_target("llvm").kind.name == "llvm"


def test_cli_string_with_options_is_rejected_with_a_hint() -> None:
    # TVM 0.27 rejects "llvm -num-cores 2" ("CLI target string form ... is no longer
    # supported"); we reject it before TVM does, pointing at the dict form.
    with pytest.raises(InvalidTargetError) as info:
        make_target("llvm -num-cores 2")
    message = str(info.value)
    assert "\n" not in message
    assert "dict form" in message
    assert isinstance(info.value, TunefleetError)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"kind": "no-such-kind"}, "not defined"),
        ({"kind": "llvm", "bogus-option": 1}, "bogus-option"),
        ({"kind": "llvm", "num-cores": "two"}, "num-cores"),
        ({"kind": "llvm", "num-cores": 0}, "num-cores must be >= 1"),
        ({"kind": "llvm", "mcpu": "no-such-cpu", "num-cores": 2}, "no-such-cpu"),
        ({"num-cores": 2}, "kind"),
        ('{"kind": "llvm", ', "not valid JSON"),
        ("[1, 2]", "must be an object"),
        ("", "empty"),
    ],
)
def test_invalid_targets_raise_one_line_errors(spec: object, fragment: str) -> None:
    with pytest.raises(InvalidTargetError) as info:
        make_target(spec)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message
    assert fragment in message
    assert len(message) <= 600


def test_non_string_non_dict_is_rejected() -> None:
    with pytest.raises(InvalidTargetError, match="expected a dict"):
        make_target(42)  # type: ignore[arg-type]


def test_host_cpu_target_detects_cores_and_cpu() -> None:
    spec = host_cpu_target()
    assert spec["kind"] == "llvm"
    assert spec["num-cores"] == len(os.sched_getaffinity(0))
    if "mcpu" in spec:
        assert spec["mcpu"] and spec["mcpu"] != "generic"
    target = make_target(spec)
    assert int(target.attrs["num-cores"]) == spec["num-cores"]


def test_host_cpu_target_with_explicit_cores() -> None:
    assert host_cpu_target(num_cores=7)["num-cores"] == 7
    with pytest.raises(InvalidTargetError):
        host_cpu_target(num_cores=0)


def test_arm_target_compiles_to_an_aarch64_target() -> None:
    spec = arm_target(num_cores=4)
    assert spec == {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "num-cores": 4}
    target = make_target(spec)
    assert "arm_cpu" in [str(k) for k in target.keys]
    assert make_target(arm_target(mcpu="cortex-a72")).attrs["mcpu"] == "cortex-a72"


def test_x86_avx2_target_is_haswell_with_a_fixed_triple() -> None:
    spec = x86_avx2_target(num_cores=3)
    assert spec == {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell", "num-cores": 3}
    assert x86_avx2_target()["num-cores"] == len(os.sched_getaffinity(0))
    assert make_target(spec).attrs["mcpu"] == "haswell"
    with pytest.raises(InvalidTargetError):
        x86_avx2_target(num_cores=0)


def test_target_cpu_features_are_llvms_for_the_mcpu_and_mattr() -> None:
    avx2 = target_cpu_features(x86_avx2_target(2))
    assert {"avx", "avx2", "fma"} <= avx2 and not any(f.startswith("avx512") for f in avx2)
    assert "avx512f" in target_cpu_features({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})
    without = target_cpu_features({"kind": "llvm", "mcpu": "skylake-avx512", "mattr": ["-avx512f"], "num-cores": 2})
    assert "avx2" in without and "avx512f" not in without
    assert target_cpu_features({"kind": "llvm", "num-cores": 2}) == set()  # generic: nothing asked for
    assert target_cpu_features(cuda_target("sm_80")) == set()


def test_cuda_target() -> None:
    target = make_target(cuda_target("sm_90"))
    assert target.kind.name == "cuda"
    assert str(target.attrs["arch"]) == "sm_90"
    assert "gpu" in [str(k) for k in target.keys]


def test_fingerprint_is_canonical_and_round_trips() -> None:
    a = target_fingerprint({"kind": "llvm", "num-cores": 2, "mcpu": "znver3"})
    b = target_fingerprint({"mcpu": "znver3", "num-cores": 2, "kind": "llvm"})
    assert a == b
    parsed = json.loads(a)
    assert list(parsed) == sorted(parsed)
    assert target_fingerprint(make_target(parsed)) == a
    assert target_fingerprint(cuda_target()) != target_fingerprint(arm_target())
    # A fingerprint is itself a valid JSON target spec.
    assert target_fingerprint(a) == a
