"""Workload extraction on the test MLP: keys, weights, FLOPs, JSON, cross-process stability."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax
from tvm.s_tir import meta_schedule as ms

from tunefleet.errors import ConfigError, TunefleetError
from tunefleet.tvm.extract import (
    ExtractedWorkload,
    ExtractionError,
    Recipe,
    classify_op_kind,
    extract_workloads,
    has_winograd_convolution,
    prepare_for_build,
    prepare_for_tuning,
    random_params,
    recipe_for,
    workload_hash,
)

REPO_ROOT = Path(__file__).resolve().parents[2]

_HASH_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from tests.tvm.conftest import build_mlp
    from tunefleet.tvm.extract import extract_workloads, random_params
    from tunefleet.tvm.targets import host_cpu_target
    mod, _ = build_mlp()
    workloads = extract_workloads(mod, host_cpu_target(), random_params(mod, seed=int(sys.argv[1])))
    print(json.dumps(sorted([w.name, w.structural_hash] for w in workloads)))
    """
)


def test_mlp_extracts_two_fused_dense_workloads(mlp_workloads: list[ExtractedWorkload]) -> None:
    assert len(mlp_workloads) == 2
    by_name = {w.name: w for w in mlp_workloads}
    # AttachAttrLayoutFreeBuffers (the CPU recipe's prepacking) re-adds the functions: a suffix "1".
    assert set(by_name) == {"fused_matmul_add_relu1", "fused_matmul1_add11"}
    for workload in mlp_workloads:
        assert workload.op_kind == "dense/matmul"
        assert workload.weight == 1
        assert len(workload.structural_hash) == 16
        int(workload.structural_hash, 16)
    # 1x64 @ 64x128: 2*64*128 multiply-adds, +128 bias adds, +128 relu max.
    assert by_name["fused_matmul_add_relu1"].flops == 2 * 64 * 128 + 128 + 128
    assert by_name["fused_matmul1_add11"].flops == 2 * 128 * 32 + 32


def test_hash_is_metaschedules_workload_key(mlp_workloads: list[ExtractedWorkload]) -> None:
    for workload in mlp_workloads:
        # Workload(mod) in C++ stores ModuleEquality("structural").Hash(mod); as_json()[0]
        # prints it in decimal.
        ms_key = int(ms.database.Workload(workload.mod).as_json()[0])
        assert workload.structural_hash == format(ms_key, "016x")
        assert workload.structural_hash == workload_hash(workload.task.dispatched[0])
        # TuneContext normalises the module; normalisation must not change the key.
        ctx_mod = ms.tune_context._normalize_mod(workload.mod)
        assert workload_hash(ctx_mod) == workload.structural_hash


def test_tir_json_round_trips(mlp_workloads: list[ExtractedWorkload]) -> None:
    for workload in mlp_workloads:
        restored = tvm.ir.load_json(workload.tir_json)
        assert tvm_ffi.structural_equal(restored, workload.mod)
        assert workload_hash(restored) == workload.structural_hash


def test_weight_values_do_not_change_hashes(
    mlp_mod: Any, mlp_workloads: list[ExtractedWorkload], cpu_target: Any
) -> None:
    other = extract_workloads(mlp_mod, cpu_target, random_params(mlp_mod, seed=123))
    assert sorted(w.structural_hash for w in other) == sorted(
        w.structural_hash for w in mlp_workloads
    )


def test_unbound_weights_add_transpose_tasks(mlp_mod: Any, cpu_target: Any) -> None:
    # Without constants, FoldConstant cannot fold the weights' transposes: they become tasks.
    workloads = extract_workloads(mlp_mod, cpu_target)
    kinds = sorted(w.op_kind for w in workloads)
    assert kinds == ["dense/matmul", "dense/matmul", "injective", "injective"]


def test_raw_graph_yields_no_tasks_without_preparation(mlp_mod: Any, cpu_target: Any) -> None:
    # The documented trap: extract_tasks silently returns [] on an unlowered graph.
    assert list(ms.relax_integration.extract_tasks(mlp_mod, cpu_target)) == []
    with pytest.raises(ExtractionError, match="No tuning tasks"):
        extract_workloads(mlp_mod, cpu_target, prepared=True)


def test_empty_module_raises_clear_error(cpu_target: Any) -> None:
    with pytest.raises(ExtractionError) as info:
        extract_workloads(tvm.IRModule({}), cpu_target)
    assert isinstance(info.value, TunefleetError)


def test_unknown_weight_names_are_rejected(mlp_mod: Any, cpu_target: Any) -> None:
    with pytest.raises(ExtractionError, match="not parameters"):
        prepare_for_tuning(mlp_mod, cpu_target, {"fc9.weight": [[1.0]]})


def test_random_params_skip_inputs(mlp_mod: Any) -> None:
    params = random_params(mlp_mod)
    assert sorted(params) == ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]
    assert params["fc1.weight"].shape == (128, 64)
    assert str(params["fc2.bias"].dtype) == "float32"


def test_build_pipeline_sees_the_same_workloads(
    mlp_mod: Any,
    mlp_params: dict[str, Any],
    mlp_workloads: list[ExtractedWorkload],
    cpu_target: Any,
) -> None:
    # compile_relax runs dispatch + LegalizeOps..FuseTIR itself on what it is given; fed
    # prepare_for_build's output it must produce the PrimFuncs we extracted under the recipe
    # stock TVM builds (no prepacking: the CPU default's prepacking needs build_with_database).
    mlp_workloads = extract_workloads(mlp_mod, cpu_target, mlp_params, recipe=Recipe())
    built = prepare_for_build(mlp_mod, cpu_target, mlp_params)
    seq = tvm.transform.Sequential(
        [
            *relax.pipeline.library_dispatch_passes(cpu_target),
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
        ]
    )
    with cpu_target, tvm.transform.PassContext(opt_level=3):
        fused = seq(built)
    hashes = {
        workload_hash(ms.tune_context._normalize_mod(func))
        for _, func in fused.functions.items()
        if isinstance(func, tvm.tirx.PrimFunc)
    }
    assert hashes == {w.structural_hash for w in mlp_workloads}


def test_prepare_for_tuning_is_not_idempotent(
    mlp_mod: Any,
    mlp_params: dict[str, Any],
    mlp_workloads: list[ExtractedWorkload],
    cpu_target: Any,
) -> None:
    # Why compile_relax must get prepare_for_build's output, not prepare_for_tuning's: a
    # second AnnotateTIROpPattern stamps op_pattern on the fused functions and the hash moves.
    prepared = prepare_for_tuning(mlp_mod, cpu_target, mlp_params)
    again = extract_workloads(prepare_for_tuning(prepared, cpu_target), cpu_target, prepared=True)
    assert {w.structural_hash for w in again}.isdisjoint(
        {w.structural_hash for w in mlp_workloads}
    )
    same = extract_workloads(prepared, cpu_target, prepared=True)
    assert [w.structural_hash for w in same] == [w.structural_hash for w in mlp_workloads]


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("fused_conv2d_add_relu", "conv2d"),
        ("fused_conv2d3_add7_relu2", "conv2d"),
        ("conv2d_transpose", "conv_transpose"),
        ("fused_matmul1_add1", "dense/matmul"),
        ("batch_matmul", "dense/matmul"),
        ("max_pool2d", "pool"),
        ("adaptive_avg_pool2d", "pool"),
        ("softmax", "softmax"),
        ("fused_layer_norm", "norm"),
        ("mean", "reduce"),
        ("fused_max", "reduce"),
        ("transpose1", "injective"),
        ("fused_reshape_transpose", "injective"),
    ],
)
def test_classify_op_kind_by_name(name: str, kind: str) -> None:
    assert classify_op_kind(name) == kind


def test_classify_op_kind_falls_back_to_op_pattern(
    mlp_workloads: list[ExtractedWorkload],
) -> None:
    assert classify_op_kind("fused_add_multiply") == "unknown"
    # A nameless matmul+bias (OutEWiseFusable) is "complex" by its TIR pattern.
    assert classify_op_kind("mystery", mlp_workloads[0].mod) == "complex"


def test_hashes_are_stable_across_processes(mlp_workloads: list[ExtractedWorkload]) -> None:
    expected = sorted([w.name, w.structural_hash] for w in mlp_workloads)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _HASH_SCRIPT, str(seed)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for seed in (1, 2)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        assert json.loads(out.strip().splitlines()[-1]) == expected


def test_recipes(cpu_target: Any, mlp_mod: Any, mlp_params: dict[str, Any]) -> None:
    assert recipe_for(cpu_target) == Recipe("NHWC", prepack=True, fast_math=True, fold=True)
    assert recipe_for(cpu_target).name == "nhwc+prepack+fastmath+fold"
    assert recipe_for(cpu_target, "native") == Recipe(None, prepack=True, fast_math=True, fold=True)
    assert recipe_for(cpu_target, "NCHWc").name == "nchwc+prepack+fastmath+fold"
    assert recipe_for({"kind": "cuda", "arch": "sm_80"}) == Recipe(None, prepack=False, fold=True)
    for recipe in (Recipe("NHWC", True, True), Recipe("NHWC", True), Recipe(None, False, True), Recipe(),
                   Recipe("NCHWc", True, True, True), Recipe(None, fold=True)):
        assert Recipe.from_name(recipe.name) == recipe
    with pytest.raises(ConfigError, match="unknown layout"):
        recipe_for(cpu_target, "NCHW4c")
    with pytest.raises(ConfigError, match="not supported: the blocked NCHWc layout on a GPU"):
        recipe_for({"kind": "cuda", "arch": "sm_80"}, "NCHWc")
    for bad in ("nchw", "nhwc+fastmath+prepack", "nhwc+prepack+prepack", "nhwc+fast", "nhwc+fold+prepack"):
        with pytest.raises(ConfigError, match="unknown extraction recipe"):
            Recipe.from_name(bad)
    # Prepacking is part of a workload's identity: the same MLP hashes differently without it.
    packed = {w.structural_hash for w in extract_workloads(mlp_mod, cpu_target, mlp_params)}
    plain = {w.structural_hash for w in extract_workloads(mlp_mod, cpu_target, mlp_params, recipe=Recipe())}
    assert packed.isdisjoint(plain)
    # Fast math changes only workloads with erf/exp/tanh/softmax: the MLP's stay the same.
    exact = {w.structural_hash for w in extract_workloads(mlp_mod, cpu_target, mlp_params, recipe=Recipe("NHWC", True))}
    assert exact == packed


def test_nhwc_leaves_layout_transforms_only_at_the_boundary(cpu_target: Any) -> None:
    from tunefleet.models.zoo import build_zoo_model

    zm = build_zoo_model("small-cnn", image_size=16)
    fused = prepare_for_tuning(zm.mod, cpu_target, recipe=Recipe("NHWC", prepack=False))
    convs = [gv.name_hint for gv, f in fused.functions.items()
             if isinstance(f, tvm.tirx.PrimFunc) and "conv2d" in gv.name_hint]
    assert len(convs) == 2
    for name in convs:  # NHWC data: the channel axis (16 or 32) is last in the output
        out = ms.arg_info.ArgInfo.from_prim_func(fused[name])[-1]
        assert [int(d) for d in out.shape][-1] in (16, 32)
    # One transpose in (NCHW input -> NHWC) and none between the convolutions: weights folded.
    transposes = [gv.name_hint for gv in fused.get_global_vars() if "transpose" in gv.name_hint]
    assert len(transposes) <= 2, transposes
    assert "layout_transform" not in fused["main"].script()


def test_fast_math_replaces_libm_calls_and_keeps_the_outputs(cpu_target: Any) -> None:
    """GELU, its tanh form and softmax: with ``fast_math`` no ``erf``/``exp``/``tanh`` call is
    left in the TIR (LLVM would call libm per element), and the build agrees with the exact,
    unconverted model."""
    from tvm.script import relax as R

    from tunefleet.tvm.compile import build_with_database

    @tvm.script.ir_module
    class Gelus:
        @R.function
        def main(x: R.Tensor((4, 64), "float32"), w: R.Tensor((64, 64), "float32")) -> R.Tensor((4, 64), "float32"):
            with R.dataflow():
                y = R.matmul(x, w)
                g = R.nn.gelu(y)
                t = R.nn.gelu_tanh(g)
                s = R.nn.softmax(t, axis=-1)
                R.output(s)
            return s

    params = {"w": np.random.default_rng(0).standard_normal((64, 64)).astype("float32") * 0.1}
    exact_recipe, fast_recipe = Recipe("NHWC", True), Recipe("NHWC", True, fast_math=True)
    for recipe, calls_left in ((exact_recipe, True), (fast_recipe, False)):
        tir = prepare_for_tuning(Gelus, cpu_target, params, recipe=recipe).script()
        assert any(f"T.{fn}(" in tir for fn in ("erf", "exp", "tanh")) is calls_left, recipe.name
    assert {w.op_kind for w in extract_workloads(Gelus, cpu_target, params, recipe=fast_recipe)} == {"softmax", "dense/matmul"}

    dev = tvm.cpu()
    x = tvm.runtime.tensor(np.random.default_rng(1).standard_normal((4, 64)).astype("float32") * 3, dev)
    exact = relax.VirtualMachine(tvm.compile(prepare_for_build(Gelus, cpu_target, params), target=cpu_target), dev)
    fast = relax.VirtualMachine(build_with_database(Gelus, cpu_target, ms.database.MemoryDatabase(), params=params,
                                                    recipe=fast_recipe).executable, dev)
    np.testing.assert_allclose(fast["main"](x).numpy(), exact["main"](x).numpy(), rtol=1e-5, atol=1e-6)


def test_nhwc_converts_relu6_and_tf_padding_without_transposes(cpu_target: Any) -> None:
    """ReLU6 (``clip``) and a zero ``pad`` before a convolution (TF-style padding, as in
    transformers' MobileNetV2): ``ConvertLayout`` alone sends each through NCHW and back, a
    transpose pair per block. After the rewrite only the model's own input and output are
    transposed, the pad is in the depthwise convolution's padding, and the outputs equal the
    unconverted model's."""
    from tvm.script import relax as R

    from tunefleet.tvm.compile import build_with_database

    @tvm.script.ir_module
    class Block:
        @R.function
        def main(x: R.Tensor((1, 8, 16, 16), "float32"), w: R.Tensor((8, 8, 3, 3), "float32"),
                 dw: R.Tensor((8, 1, 3, 3), "float32")) -> R.Tensor((1, 8, 8, 8), "float32"):
            with R.dataflow():
                a = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
                b = R.clip(a, R.prim_value(0.0), R.prim_value(6.0))
                c = R.nn.pad(b, [0, 0, 0, 0, 0, 1, 0, 1], "constant", 0.0)
                d = R.nn.conv2d(c, dw, strides=[2, 2], groups=8)
                R.output(d)
            return d

    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((8, 8, 3, 3)).astype("float32"),
              "dw": rng.standard_normal((8, 1, 3, 3)).astype("float32")}
    recipe = Recipe("NHWC", prepack=True)
    prepared = prepare_for_build(Block, cpu_target, params, recipe=recipe).script()
    assert "R.clip" not in prepared and "R.nn.pad" not in prepared
    assert "padding=[0, 0, 1, 1]" in prepared
    fused = prepare_for_tuning(Block, cpu_target, params, recipe=recipe)
    transposes = [gv.name_hint for gv in fused.get_global_vars() if "transpose" in gv.name_hint]
    assert len(transposes) == 2, transposes  # NCHW input -> NHWC, NHWC output -> NCHW

    dev = tvm.cpu()
    x = tvm.runtime.tensor(rng.standard_normal((1, 8, 16, 16)).astype("float32"), dev)
    native = relax.VirtualMachine(tvm.compile(prepare_for_build(Block, cpu_target, params), target=cpu_target), dev)
    nhwc = relax.VirtualMachine(build_with_database(Block, cpu_target, ms.database.MemoryDatabase(), params=params,
                                                    recipe=recipe).executable, dev)
    expected = native["main"](x).numpy()
    assert np.abs(expected).max() > 1
    np.testing.assert_allclose(nhwc["main"](x).numpy(), expected, rtol=1e-5, atol=1e-4)


def _conv_bn_relu_residual(channels: int = 16, size: int = 8) -> Any:
    from tvm.script import relax as R

    c, s = channels, size

    @tvm.script.ir_module
    class Block:
        @R.function
        def main(x: R.Tensor((1, c, s, s), "float32"), w: R.Tensor((c, c, 3, 3), "float32"),
                 gamma: R.Tensor((c,), "float32"), beta: R.Tensor((c,), "float32"),
                 mean: R.Tensor((c,), "float32"), var: R.Tensor((c,), "float32")) -> R.Tensor((1, c, s, s), "float32"):
            R.func_attr({"num_input": 1})
            with R.dataflow():
                a = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
                bn = R.nn.batch_norm(a, gamma, beta, mean, var, axis=1)
                b = R.nn.relu(bn[0])
                c = R.nn.conv2d(b, w, padding=[1, 1, 1, 1])
                d = R.add(c, x)
                e = R.nn.relu(d)
                R.output(e)
            return e

    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((c, c, 3, 3)).astype("float32") * 0.1,
              "gamma": rng.uniform(0.5, 1.5, c).astype("float32"), "beta": rng.standard_normal(c).astype("float32"),
              "mean": rng.standard_normal(c).astype("float32"), "var": rng.uniform(0.5, 1.5, c).astype("float32")}
    return Block, params


def _build_and_compare(mod: Any, target: Any, params: dict[str, Any], recipe: Recipe, shape: tuple[int, ...]) -> None:
    from tunefleet.tvm.compile import build_with_database

    dev = tvm.cpu()
    x = tvm.runtime.tensor(np.random.default_rng(1).standard_normal(shape).astype("float32"), dev)
    reference = relax.VirtualMachine(tvm.compile(prepare_for_build(mod, target, params), target=target), dev)
    built = relax.VirtualMachine(build_with_database(mod, target, ms.database.MemoryDatabase(), params=params,
                                                     recipe=recipe).executable, dev)
    np.testing.assert_allclose(built["main"](x).numpy(), reference["main"](x).numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["NHWC", "NCHWc", None])
def test_fold_puts_batchnorm_relu_and_the_residual_add_in_the_convolutions(cpu_target: Any, layout: str | None) -> None:
    """Without ``fold``, BatchNorm becomes four elementwise ops after its convolution and a
    tuple get-item stops FuseOps before the ReLU: the ReLU and the residual add + ReLU are
    workloads of their own. With it, each convolution is one workload, epilogue included, and
    the outputs equal the model's."""
    block, params = _conv_bn_relu_residual()
    names = {w.name for w in extract_workloads(block, cpu_target, params, recipe=Recipe(layout, prepack=True))}
    assert any("relu" in n and "conv2d" not in n for n in names), names
    folded = Recipe(layout, prepack=True, fold=True)
    names = {w.name for w in extract_workloads(block, cpu_target, params, recipe=folded)}
    assert all("conv2d" in n or "transpose" in n or "layout_transform" in n for n in names), names
    assert not any("subtract" in n or "divide" in n for n in names), names
    assert any("add" in n and "relu" in n and "conv2d" in n for n in names), names
    _build_and_compare(block, cpu_target, params, folded, (1, 16, 8, 8))


def test_a_build_folds_the_weights_once_for_every_recipe(cpu_target: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Within ``reusing_folded_weights`` (a build: its extraction and every recipe's compile),
    BatchNorm is folded once per module and weights, and every recipe's workloads are the ones
    it has alone — also after a layout conversion, whose rewrites must not touch the module they
    were given. Outside the block nothing is kept."""
    from tvm.script import relax as R

    from tunefleet.tvm.extract import reusing_folded_weights

    @tvm.script.ir_module
    class Block:  # conv, BatchNorm, ReLU6 and a zero pad: what the NHWC conversion rewrites first
        @R.function
        def main(x: R.Tensor((1, 8, 8, 8), "float32"), w: R.Tensor((8, 8, 3, 3), "float32"),
                 gamma: R.Tensor((8,), "float32"), beta: R.Tensor((8,), "float32"),
                 mean: R.Tensor((8,), "float32"), var: R.Tensor((8,), "float32")) -> R.Tensor((1, 8, 7, 7), "float32"):
            R.func_attr({"num_input": 1})
            with R.dataflow():
                a = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
                bn = R.nn.batch_norm(a, gamma, beta, mean, var, axis=1)
                b = R.clip(bn[0], R.prim_value(0.0), R.prim_value(6.0))
                c = R.nn.pad(b, [0, 0, 0, 0, 0, 1, 0, 1], "constant", 0.0)
                d = R.nn.conv2d(c, w, strides=[2, 2])
                R.output(d)
            return d

    rng = np.random.default_rng(0)
    block = Block
    params = {"w": rng.standard_normal((8, 8, 3, 3)).astype("float32"), "gamma": np.ones(8, "float32"),
              "beta": np.zeros(8, "float32"), "mean": np.zeros(8, "float32"), "var": np.ones(8, "float32")}
    recipes = [Recipe("NHWC", prepack=True, fold=True), Recipe(None, prepack=True, fold=True),
               Recipe(None, fold=True), Recipe("NCHWc", fold=True)]
    folds = []
    real = relax.transform.FoldBatchnormToConv2D
    monkeypatch.setattr(relax.transform, "FoldBatchnormToConv2D", lambda: (folds.append(1), real())[1])

    def keys() -> list[list[str]]:
        return [sorted(w.structural_hash for w in extract_workloads(block, cpu_target, params, recipe=r))
                for r in recipes]

    alone = keys()
    assert len(folds) == len(recipes) and len({tuple(k) for k in alone}) == len(recipes)
    folds.clear()
    with reusing_folded_weights():
        assert keys() == alone and keys() == alone
        assert len(folds) == 1
        with reusing_folded_weights():  # a build inside a pipeline run's block: the pipeline's folds
            assert keys() == alone
        assert len(folds) == 1
        other = {k: v.copy() for k, v in params.items()}  # other weights: folded again
        extract_workloads(block, cpu_target, other, recipe=recipes[0])
        assert len(folds) == 2
    folds.clear()
    keys()
    assert len(folds) == len(recipes)


def test_nchwc_keeps_activations_blocked_between_convolutions(cpu_target: Any) -> None:
    """Blocked NCHW[x]c: the convolutions become ``conv2d_NCHWc`` (TVM's own legalisation refuses
    blocked layouts), their outputs stay blocked (one layout transform into the chain, one out)
    and the build computes what the model does."""
    from tunefleet.tvm.extract import channel_block

    block, params = _conv_bn_relu_residual()
    recipe = Recipe("NCHWc", prepack=True, fold=True)
    fused = prepare_for_tuning(block, cpu_target, params, recipe=recipe)
    names = [gv.name_hint for gv, f in fused.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
    convs = [n for n in names if "conv2d" in n]
    assert len(convs) == 2 and all("NCHWc" in n for n in convs), names
    assert len([n for n in names if "layout_transform" in n]) == 2, names
    b = channel_block(cpu_target)
    for name in convs:  # (N, C // b, H, W, b)
        out = ms.arg_info.ArgInfo.from_prim_func(fused[name])[-1]
        assert [int(d) for d in out.shape] == [1, 16 // b, 8, 8, b]
    _build_and_compare(block, cpu_target, params, recipe, (1, 16, 8, 8))


def test_channel_block_follows_the_vector_width() -> None:
    from tunefleet.tvm.extract import channel_block
    from tunefleet.tvm.targets import make_target

    assert channel_block(make_target({"kind": "llvm", "mcpu": "haswell", "num-cores": 2})) == 8
    assert channel_block(make_target({"kind": "llvm", "mcpu": "skylake-avx512", "num-cores": 2})) == 16
    assert channel_block(make_target({"kind": "llvm", "mtriple": "aarch64-linux-gnu", "num-cores": 2})) == 4


def _single_conv(shape: tuple[Any, ...], weight: tuple[int, ...], strides: int = 1) -> Any:
    """A module of one convolution (NCHW, OIHW) followed by a ReLU."""
    from tvm.script import relax as R

    bb = relax.BlockBuilder()
    dims = [tvm.tirx.Var(d, "int64") if isinstance(d, str) else d for d in shape]
    x = relax.Var("x", R.Tensor(dims, "float32"))
    w = relax.Var("w", R.Tensor(weight, "float32"))
    with bb.function("main", [x, w], attrs={"num_input": 1}):
        with bb.dataflow():
            conv = bb.emit(relax.op.nn.conv2d(x, w, strides=strides, padding=[weight[2] // 2] * 4))
            out = bb.emit_output(relax.op.nn.relu(conv))
        bb.emit_func_output(out)
    return bb.get()


def test_winograd_computes_the_qualifying_convolutions(cpu_target: Any) -> None:
    """Under ``winograd``, a 3x3 stride-1 NHWC convolution with 32 channels or more becomes one
    Winograd workload, its epilogue fused and its weight transform folded away; the outputs equal
    the model's (14x14: the last tiles are partial)."""
    from dataclasses import replace

    block, params = _conv_bn_relu_residual(channels=32, size=14)
    assert has_winograd_convolution(block)  # in the frontend's NCHW: the build's check before conversion
    recipe = Recipe("NHWC", prepack=True, fast_math=True, fold=True, winograd=True)
    assert recipe.name == "nhwc+prepack+fastmath+fold+winograd" and Recipe.from_name(recipe.name) == recipe
    workloads = extract_workloads(block, cpu_target, params, recipe=recipe)
    convs = [w.name for w in workloads if "conv2d" in w.name]
    assert len(convs) == 2 and all("winograd" in n for n in convs), convs
    assert any("add" in n and "relu" in n for n in convs), convs
    assert not any("weight_transform" in w.name for w in workloads)  # folded into a constant
    direct = extract_workloads(block, cpu_target, params, recipe=replace(recipe, winograd=False))
    assert {w.structural_hash for w in workloads}.isdisjoint(w.structural_hash for w in direct if "conv2d" in w.name)
    _build_and_compare(block, cpu_target, params, recipe, (1, 32, 14, 14))


@pytest.mark.parametrize(("shape", "weight", "strides"), [
    ((1, 16, 8, 8), (16, 16, 3, 3), 1),  # too few channels: the transforms would cost more
    ((1, 32, 8, 8), (32, 32, 1, 1), 1),  # 1x1
    ((1, 32, 8, 8), (32, 32, 3, 3), 2),  # strided
    ((1, 32, 12, 12), (32, 32, 3, 3), 1),  # 9 output tiles: each transformed weight used 9 times a call
    (("n", 32, 8, 8), (32, 32, 3, 3), 1),  # a symbolic batch
])
def test_winograd_leaves_other_convolutions_direct(cpu_target: Any, shape: tuple[Any, ...],
                                                   weight: tuple[int, ...], strides: int) -> None:
    from dataclasses import replace

    mod = _single_conv(shape, weight, strides)
    params = {"w": np.random.default_rng(0).standard_normal(weight).astype("float32")}
    recipe = Recipe("NHWC", prepack=True, fold=True, winograd=True)
    hashes = {w.structural_hash for w in extract_workloads(mod, cpu_target, params, recipe=recipe)}
    direct = {w.structural_hash for w in extract_workloads(mod, cpu_target, params, recipe=replace(recipe, winograd=False))}
    assert hashes == direct
    assert not has_winograd_convolution(mod)  # the build does not compile the direct twin again


def test_winograd_transform_matrices_hold_tvms_values_nested_by_row() -> None:
    """The data and inverse transforms are TVM's matrices, written as ``Select``s nested by row with
    no zero entries: one comparison per condition, where TVM's chain tests row and column in each
    of its entries (what the simplifier folds again in every candidate's build)."""
    from tvm import te
    from tvm.topi.nn.winograd_util import winograd_transform_matrices

    from tunefleet.tvm.extract import _winograd_transforms

    def values(tensor: Any) -> np.ndarray:
        f = tvm.compile(te.create_prim_func([tensor]), target="llvm")
        out = tvm.runtime.tensor(np.zeros([int(d) for d in tensor.shape], "float32"))
        f(out)
        return out.numpy()

    ours = _winograd_transforms(4, 3, "float32")
    theirs = winograd_transform_matrices(4, 3, "float32")[:2]
    for mine, tvms in zip(ours, theirs, strict=True):
        np.testing.assert_array_equal(values(mine), values(tvms))
        rows, cols = (int(d) for d in tvms.shape)
        text, tvm_text = str(mine.op.body[0]), str(tvms.op.body[0])
        assert text.count("Select") == np.count_nonzero(values(tvms)) + rows and " and " not in text
        assert tvm_text.count("Select") == rows * cols and tvm_text.count(" and ") == rows * cols


def test_winograd_is_refused_where_it_does_not_apply(cpu_target: Any) -> None:
    assert recipe_for(cpu_target, winograd=True).name == "nhwc+prepack+fastmath+fold+winograd"
    with pytest.raises(ConfigError, match="not supported: Winograd convolutions on a GPU"):
        recipe_for({"kind": "cuda", "arch": "sm_80"}, winograd=True)
    for layout in ("native", "NCHWc"):
        with pytest.raises(ConfigError, match="not supported: Winograd convolutions in the .* layout"):
            recipe_for(cpu_target, layout, winograd=True)
