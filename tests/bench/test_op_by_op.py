"""bench/op_by_op.py: convolutions matched across layouts, onnxruntime's profile read per run."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))  # bench/ is scripts, not a package

import op_by_op


def test_an_activation_reads_the_same_in_every_layout() -> None:
    assert op_by_op.activation([1, 96, 56, 56], "onnxruntime") == (96, 56, 56)  # NCHW
    assert op_by_op.activation([1, 12, 56, 56, 8], "onnxruntime") == (96, 56, 56)  # NCHW8c
    assert op_by_op.activation([1, 56, 56, 96], "tunefleet") == (96, 56, 56)  # NHWC
    assert op_by_op.activation([1, 96, 56, 56], "tunefleet") == (96, 56, 56)  # NCHW: the square pair is last
    assert op_by_op.activation([1, 128, 768], "tunefleet") is None


@pytest.mark.parametrize(("weights", "c_in", "c_out", "kind"), [
    (32 * 16, 32, 16, "1x1"),
    (9 * 64 * 64, 64, 64, "3x3"),
    (9 * 96, 96, 96, "dw3x3"),
    (9 * 8 * 32, 3, 32, "3x3"),  # the stem's 3 input channels packed to a block of 8
    (49 * 3 * 64, 3, 64, "7x7"),
    (1234567, 5, 7, "?"),
])
def test_a_convolution_s_kernel_from_its_weight_count(weights: int, c_in: int, c_out: int, kind: str) -> None:
    assert op_by_op.conv_kind(weights, c_in, c_out) == kind


def test_the_same_convolution_gets_the_same_key_on_both_runtimes() -> None:
    # A depthwise 3x3 of stride 2: NHWC with prepacked weights in tunefleet, NCHW8c in onnxruntime.
    ours = op_by_op.conv_key([[1, 112, 112, 96], [3, 3, 1, 96], [96]], [1, 56, 56, 96], "tunefleet")
    theirs = op_by_op.conv_key([[1, 12, 112, 112, 8], [12, 1, 3, 3, 8], [96]], [1, 12, 56, 56, 8], "onnxruntime")
    assert ours == theirs == "dw3x3 96->96 112x112->56x56"
    assert op_by_op.conv_key([[1, 56, 56, 96]], [1, 56, 56, 96], "tunefleet") is None  # no weight


def test_a_winograd_kernel_is_matched_to_its_3x3_convolution() -> None:
    # tunefleet's Winograd weights, transformed and packed ([6, 6, 64, 64] as the schedule split
    # them), against onnxruntime's direct 3x3 in NCHW8c: one key, so the two are compared.
    ours = op_by_op.conv_key([[1, 56, 56, 64], [3, 3, 2, 2, 32, 2, 2, 32], [64]], [1, 56, 56, 64], "tunefleet",
                             winograd=True)
    theirs = op_by_op.conv_key([[1, 8, 56, 56, 8], [8, 8, 3, 3, 8, 8], [64]], [1, 8, 56, 56, 8], "onnxruntime")
    assert ours == theirs == "3x3 64->64 56x56->56x56"
    # without the flag the transformed weights fit no kernel size
    assert op_by_op.conv_key([[1, 56, 56, 64], [36, 64, 64], [64]], [1, 56, 56, 64], "tunefleet").startswith("?")


def test_a_kernel_s_kind_drops_the_numbers_and_the_fusion_prefix() -> None:
    assert op_by_op.tvm_kind("fused_conv2d3_add2_clip1") == "conv2d_add_clip"
    assert op_by_op.tvm_kind("transpose1") == "transpose"


def _event(cat: str, name: str, ts: int, dur: int, **args: object) -> dict:
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def test_onnxruntime_s_node_events_go_to_the_run_that_holds_them() -> None:
    events = [_event("Session", "model_run", 0, 100), _event("Session", "model_run", 200, 100),
              _event("Node", "conv_kernel_time", 10, 40, op_name="Conv", input_type_shape=[{"float": [1, 8, 4, 4]}],
                     output_type_shape=[{"float": [1, 8, 4, 4]}]),
              _event("Node", "conv_fence_before", 5, 1, op_name="Conv"),  # not a kernel's time
              _event("Node", "conv_kernel_time", 210, 60, op_name="Conv", input_type_shape=[{"float": [1, 8, 4, 4]}],
                     output_type_shape=[{"float": [1, 8, 4, 4]}]),
              _event("Node", "relu_kernel_time", 280, 10, op_name="Relu")]
    runs = op_by_op.ort_kernels(events, skip_runs=0)
    assert [[k["name"] for k in run] for run in runs] == [["conv"], ["conv", "relu"]]
    assert runs[1][0]["ms"] == pytest.approx(0.060)
    assert runs[0][0]["shapes"] == [[1, 8, 4, 4]] and runs[0][0]["out"] == [1, 8, 4, 4]
    assert op_by_op.ort_kernels(events, skip_runs=1) == runs[1:]


def test_each_kernel_keeps_its_median_over_the_runs() -> None:
    def run(*ms: float) -> list[dict]:
        return [{"name": f"k{i}", "kind": "k", "shapes": [], "out": [], "ms": m} for i, m in enumerate(ms)]

    kernels = op_by_op.per_kernel([run(1, 10), run(3, 30), run(2, 20), run(9)])  # the short run is dropped
    assert [k["ms"] for k in kernels] == [2, 20]


def test_convolutions_are_matched_and_the_rest_summed_by_kind() -> None:
    conv = {"kind": "conv2d_add_clip", "shapes": [[1, 56, 56, 96], [9 * 96]], "out": [1, 56, 56, 96]}
    ort_conv = {"kind": "Conv", "shapes": [[1, 12, 56, 56, 8], [9 * 96]], "out": [1, 12, 56, 56, 8]}
    summary = op_by_op.summarise({
        "tunefleet": [{**conv, "name": "a", "ms": 2.0}, {**conv, "name": "b", "ms": 1.0},
                      {"name": "t", "kind": "transpose", "shapes": [], "out": [], "ms": 0.5}],
        "onnxruntime": [{**ort_conv, "name": "c", "ms": 1.5}, {**ort_conv, "name": "d", "ms": 1.5},
                        {"name": "r", "kind": "ReorderOutput", "shapes": [], "out": [], "ms": 0.25}]})
    (row,) = summary["convs"]
    assert row["key"] == "dw3x3 96->96 56x56->56x56"
    assert row["tunefleet"] == {"calls": 2, "ms": 3.0} and row["onnxruntime"] == {"calls": 2, "ms": 3.0}
    assert row["ratio"] == {"tunefleet": pytest.approx(1.0)}
    assert summary["kinds"]["tunefleet"] == {"transpose": {"calls": 1, "ms": 0.5}}
    assert summary["kinds"]["onnxruntime"] == {"ReorderOutput": {"calls": 1, "ms": 0.25}}
    assert summary["total_ms"] == {"tunefleet": 3.5, "onnxruntime": 3.25}


def test_a_real_onnxruntime_profile_gives_every_node_of_every_run(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from tunefleet.delivery.alternatives import onnxruntime_session

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 8, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], name="conv"),
         helper.make_node("Sigmoid", ["y"], ["z"], name="sig")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 16, 16, 16])], [w])
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    sess = onnxruntime_session(path, 1, profile_prefix=str(tmp_path / "prof"))
    for _ in range(4):
        sess.run(None, {"x": np.ones((1, 8, 16, 16), np.float32)})
    runs = op_by_op.ort_kernels(op_by_op.profile_events(sess), skip_runs=1)
    assert len(runs) == 3
    convs = [k for k in runs[0] if op_by_op.is_conv(k["kind"])]
    assert len(convs) == 1  # a Conv, fused with the Sigmoid or not
    assert op_by_op.conv_key(convs[0]["shapes"], convs[0]["out"], "onnxruntime") == "3x3 8->16 16x16->16x16"


def test_a_real_onnxruntime_matrix_product_gets_the_key_tunefleet_s_gets(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from tunefleet.delivery.alternatives import onnxruntime_session

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((64, 96)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"), helper.make_node("Relu", ["y"], ["z"], name="relu")],
        "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 64])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 32, 96])], [w])
    path = tmp_path / "mm.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    sess = onnxruntime_session(path, 1, profile_prefix=str(tmp_path / "prof"))
    for _ in range(3):
        sess.run(None, {"x": np.ones((1, 32, 64), np.float32)})
    (run,) = op_by_op.ort_kernels(op_by_op.profile_events(sess), skip_runs=2)
    (mm,) = [k for k in run if op_by_op.is_matmul(k["kind"])]  # a MatMul, fused with the Relu or not
    assert op_by_op.matmul_key(mm["shapes"], mm["out"]) == "32x64 by 64x96"


def test_several_libraries_are_measured_under_their_labels(capsys: pytest.CaptureFixture[str],
                                                           tmp_path: Path) -> None:
    a, b = tmp_path / "a.so", tmp_path / "b.so"
    a.write_bytes(b"")
    b.write_bytes(b"")
    assert op_by_op.parse_args(["m", "--library", str(a)]).libraries == {"tunefleet": str(a)}
    assert op_by_op.parse_args(["m", "--library", f"scratch={a}", "--library", f"hub={b}"]).libraries == {
        "scratch": str(a), "hub": str(b)}
    for argv, error in ([f"{a}", f"{b}"], "--library takes LABEL=LIBRARY"), \
                       ([f"x={a}", f"x={b}"], "--library x: the label is taken"), \
                       ([f"onnxruntime={a}"], "--library onnxruntime: the label is taken"):
        with pytest.raises(SystemExit):
            op_by_op.parse_args(["m", *[w for item in argv for w in ("--library", item)]])
        assert error in capsys.readouterr().err


def test_convolutions_of_several_libraries_each_get_their_ratio() -> None:
    conv = {"name": "c", "kind": "conv2d", "shapes": [[1, 7, 7, 320], [320 * 1280]], "out": [1, 7, 7, 1280]}
    ort = {"name": "c", "kind": "Conv", "shapes": [[1, 320, 7, 7], [1280, 320, 1, 1]], "out": [1, 1280, 7, 7]}
    summary = op_by_op.summarise({"scratch": [{**conv, "ms": 0.6}], "hub": [{**conv, "ms": 0.5}],
                                  "onnxruntime": [{**ort, "ms": 0.4}]})
    (row,) = summary["convs"]
    assert row["key"] == "1x1 320->1280 7x7->7x7"
    assert row["ratio"] == {"scratch": pytest.approx(1.5), "hub": pytest.approx(1.25)}


def test_calls_below_one_and_a_missing_library_are_the_parser_s_errors(capsys: pytest.CaptureFixture[str],
                                                                        tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        op_by_op.parse_args(["mobilenet_v2", "--library", str(tmp_path / "none.so")])
    assert "no such library" in capsys.readouterr().err
    lib = tmp_path / "lib.so"
    lib.write_bytes(b"")
    with pytest.raises(SystemExit):
        op_by_op.parse_args(["mobilenet_v2", "--library", str(lib), "--calls", "0"])
    assert "--calls must be at least 1" in capsys.readouterr().err


def test_the_same_matrix_product_gets_the_same_key_on_both_runtimes() -> None:
    # bert's dense layer: tunefleet's 2-D product with prepacked weights, onnxruntime's Gemm.
    ours = op_by_op.matmul_key([[128, 768], [48, 768, 16], [768]], [128, 768])
    assert ours == op_by_op.matmul_key([[128, 768], [768, 768], [768]], [128, 768]) == "128x768 by 768x768"
    # the same on onnxruntime's 3-D activation (a MatMul before a separate Add)
    assert op_by_op.matmul_key([[1, 128, 768], [768, 3072]], [1, 128, 3072]) == "128x768 by 768x3072"
    # attention's scores: tunefleet's batch of 12 heads, onnxruntime's FusedMatMul of [1, 12, ...]
    # with the second operand transposed: K comes from what the first operand holds, not its last axis
    ours = op_by_op.matmul_key([[12, 128, 64], [12, 64, 128]], [12, 128, 128])
    theirs = op_by_op.matmul_key([[1, 12, 128, 64], [1, 12, 128, 64]], [1, 12, 128, 128])
    assert ours == theirs == "12 x 128x64 by 64x128"
    assert op_by_op.matmul_flops(ours) == 2 * 12 * 128 * 64 * 128
    assert op_by_op.matmul_flops("128x768 by 768x768") == 2 * 128 * 768 * 768
    assert op_by_op.matmul_key([], [128, 768]) is None
    assert op_by_op.matmul_key([[100, 7]], [128, 768]) is None  # 700 elements are no 128-row operand


def test_a_matrix_product_is_told_from_its_kind() -> None:
    assert all(op_by_op.is_matmul(k) for k in ("matmul_add_prepacked", "dense_add", "Gemm", "FusedMatMul", "MatMul"))
    assert not any(op_by_op.is_matmul(k) for k in ("conv2d_add_relu", "SkipLayerNormalization", "reshape_gelu"))


def test_matrix_products_are_matched_with_their_gflops(capsys: pytest.CaptureFixture[str]) -> None:
    dense = {"name": "m", "kind": "matmul_add_prepacked", "shapes": [[128, 768], [48, 768, 16], [768]],
             "out": [128, 768]}
    gemm = {"name": "g", "kind": "Gemm", "shapes": [[128, 768], [768, 768], [768]], "out": [128, 768]}
    summary = op_by_op.summarise({"tunefleet": [{**dense, "ms": 0.75}, {**dense, "ms": 0.75}],
                                  "onnxruntime": [{**gemm, "ms": 1.0}, {**gemm, "ms": 1.0}]})
    assert summary["convs"] == [] and summary["kinds"] == {"tunefleet": {}, "onnxruntime": {}}
    (row,) = summary["matmuls"]
    assert row["key"] == "128x768 by 768x768" and row["gflop"] == pytest.approx(2 * 128 * 768 * 768 / 1e9)
    assert row["ratio"] == {"tunefleet": pytest.approx(0.75)}
    op_by_op.print_report(summary, {"tunefleet": {"ms": 1.6}, "onnxruntime": {"ms": 2.1}})
    out = capsys.readouterr().out
    assert "convolution" not in out  # a model without convolutions prints no empty table
    line = next(x for x in out.splitlines() if x.startswith("128x768 by 768x768"))
    # 0.151 GFLOP a call, two calls: in 1.5 ms 201.3 GFLOP/s, in 2.0 ms 151.0
    assert line.split()[-2:] == ["201.3", "151.0"] and "0.75" in line
    assert "1 of 1 matrix products found on every side" in out and "BLAS" not in out
    row["blas_gflops"] = 180.0  # numpy's BLAS on the same product: a column of its own, last
    op_by_op.print_report(summary, {"tunefleet": {"ms": 1.6}, "onnxruntime": {"ms": 2.1}})
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("128x768 by 768x768"))
    assert line.split()[-3:] == ["201.3", "151.0", "180.0"]


def test_numpy_s_blas_is_timed_on_the_same_product() -> None:
    assert op_by_op.matmul_dims("2 x 8x16 by 16x4") == (2, 8, 16, 4)
    assert op_by_op.matmul_dims("8x16 by 16x4") == (1, 8, 16, 4)
    assert op_by_op.blas_gflops("2 x 8x16 by 16x4", repeat=3) > 0
