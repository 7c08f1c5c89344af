"""A generated corpus of operator shape variants, as small ONNX models, in the spirit of TenSet.

Usage::

    python bench/corpus.py DIR                                  # write every file, print what was written
    python bench/corpus.py DIR --families conv3x3,softmax --limit 2
    python bench/corpus.py --list                               # the families and their counts, no files

Families (float32, batch 1, NCHW as ONNX gives it, opset 17):

* ``conv1x1``, ``conv3x3``, ``depthwise`` (3x3, one group per channel), ``strided`` (3x3 stride 2,
  regular and depthwise, and 3-channel stems) over channel counts 16-1024 and feature maps 7-224,
  at the (size, channels) points of CNN stages; some with bias + ReLU, which CNNs fuse into the
  convolution, some without (a projection before a residual add);
* ``dense``: MatMul over transformer widths 256, 512, 768 and 1024 (attention projections d->d,
  FFN d->4d with bias and an Erf GELU, FFN 4d->d) at sequence lengths 1, 32, 128 and 384;
* ``batch_matmul``: attention's Q.K^T and P.V, 8/12/16 heads of 64 at sequence lengths 32, 128
  and 384;
* ``softmax``, ``layernorm`` (LayerNormalization), ``pooling`` (MaxPool, AveragePool,
  GlobalAveragePool) and ``elementwise`` chains (add + ReLU, mul + add, an Erf GELU).

One file holds one variant, except ``dense``: the four sequence lengths of one weight shape share
the weight in one file (four inputs, four outputs). The weights are most of the corpus's bytes (a
1024x4096 weight is 16 MiB, and the tunefleet home stores a copy of every file), and each file
costs a sandboxed parse at ingest and again at extraction; independent branches of one graph never
fuse, so a shared file gives the same workloads as four files would.

resnet50 and vit-base are the zero-shot test models of another issue: no convolution here has a
shape of a resnet50 convolution (:data:`RESNET50_CONVS`, skipped wherever the grid would hit one),
and no transformer shape uses vit-base's sequence length 197 or its 16x16 patch convolution.
(resnet18, a zoo model the campaign tunes, shares its stem and four 3x3 convolutions with
resnet50 all the same.)

The bytes depend only on this file and the ``onnx`` package's serialisation: the weights of each
file are drawn from ``numpy.random.default_rng([CORPUS_SEED, crc32(file name)])``, so a file's
bytes do not change when a selection leaves others out.
"""

from __future__ import annotations

import argparse
import math
import sys
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

CORPUS_SEED = 0
OPSET = 17  # LayerNormalization is in the default domain from opset 17
IR_VERSION = 8  # the IR version of opset 17: what onnxruntime and TVM's importer expect of it
PRODUCER = "tunefleet-corpus"

FAMILIES = ("conv1x1", "conv3x3", "depthwise", "strided", "dense", "batch_matmul", "softmax", "layernorm",
            "pooling", "elementwise")

# (feature-map size, channel counts) of CNN stages: wide maps have few channels, narrow maps many.
STAGES: tuple[tuple[int, tuple[int, ...]], ...] = (
    (112, (16, 32)),
    (56, (32, 64, 128)),
    (28, (64, 128, 256)),
    (14, (128, 256, 512)),
    (7, (256, 512)),
)
# mobilenet-like depthwise points: the expanded channel counts of inverted residual blocks.
DEPTHWISE_WIDE = ((56, 144), (28, 192), (14, 384), (14, 576), (7, 960))
WIDTHS = (256, 512, 768, 1024)  # transformer hidden sizes; their FFN is 4x (1024 ... 4096)
SEQ_LENS = (1, 32, 128, 384)  # never 197, vit-base's (196 patches + CLS)
HEADS = (8, 12, 16)
HEAD_DIM = 64
ATTENTION_SEQ = (32, 128, 384)

RESNET50_CONVS = frozenset({
    # (kernel, in channels, out channels, input size, stride) of every convolution of resnet50
    # (transformers' ResNet, bottleneck blocks with the stride in the 3x3 convolution)
    (7, 3, 64, 224, 2),
    (1, 64, 64, 56, 1), (3, 64, 64, 56, 1), (1, 64, 256, 56, 1), (1, 256, 64, 56, 1),
    (1, 256, 128, 56, 1), (3, 128, 128, 56, 2), (1, 128, 512, 28, 1), (1, 256, 512, 56, 2),
    (1, 512, 128, 28, 1), (3, 128, 128, 28, 1),
    (1, 512, 256, 28, 1), (3, 256, 256, 28, 2), (1, 256, 1024, 14, 1), (1, 512, 1024, 28, 2),
    (1, 1024, 256, 14, 1), (3, 256, 256, 14, 1),
    (1, 1024, 512, 14, 1), (3, 512, 512, 14, 2), (1, 512, 2048, 7, 1), (1, 1024, 2048, 14, 2),
    (1, 2048, 512, 7, 1), (3, 512, 512, 7, 1),
})
"""resnet50's convolution shapes: the generator skips a regular convolution of one of these shapes."""


@dataclass(frozen=True)
class CorpusFile:
    """One ONNX file of the corpus: its family, its name (the file's stem, unique) and the variants
    (operator instances) it holds, each named; ``build`` adds them to a graph."""

    family: str
    name: str
    variants: tuple[str, ...]
    build: Callable[[_Graph], None]

    @property
    def filename(self) -> str:
        return f"{self.name}.onnx"


# -- the graph builder -------------------------------------------------------------------------------
class _Graph:
    """Nodes, inputs, outputs and initializers of one file, with the file's own random stream."""

    def __init__(self, name: str) -> None:
        import numpy as np

        self.name = name
        self.rng = np.random.default_rng([CORPUS_SEED, zlib.crc32(name.encode())])
        self.nodes: list[Any] = []
        self.inputs: list[Any] = []
        self.outputs: list[Any] = []
        self.initializers: list[Any] = []

    def input(self, name: str, shape: Sequence[int]) -> str:
        from onnx import TensorProto, helper

        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def output(self, name: str, shape: Sequence[int]) -> str:
        from onnx import TensorProto, helper

        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape)))
        return name

    def weight(self, name: str, shape: Sequence[int], fan_in: int) -> str:
        """Random normal weights at He scale: the values never matter to a schedule, but a build of
        the model should compute finite, ReLU-friendly numbers."""
        import numpy as np

        values = self.rng.standard_normal(tuple(shape), dtype=np.float32) * np.float32(math.sqrt(2.0 / fan_in))
        return self._init(name, values)

    def const(self, name: str, values: Any) -> str:
        import numpy as np

        return self._init(name, np.asarray(values, dtype=np.float32))

    def _init(self, name: str, values: Any) -> str:
        from onnx import numpy_helper

        self.initializers.append(numpy_helper.from_array(values, name))
        return name

    def node(self, op: str, inputs: Sequence[str], output: str, **attrs: Any) -> str:
        from onnx import helper

        self.nodes.append(helper.make_node(op, list(inputs), [output], name=f"{output}_{op.lower()}", **attrs))
        return output

    def model_bytes(self) -> bytes:
        from onnx import helper

        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name=PRODUCER,
                                  ir_version=IR_VERSION)
        return model.SerializeToString()


# -- the families --------------------------------------------------------------------------------------
def _conv_out(size: int, kernel: int, stride: int) -> int:
    return (size + 2 * (kernel // 2) - kernel) // stride + 1


def _conv(g: _Graph, *, cin: int, cout: int, size: int, kernel: int, stride: int, groups: int, relu: bool) -> None:
    """x -> Conv (with its bias input when ``relu``) -> ReLU: what a CNN layer with a folded
    BatchNorm is; without ``relu``, the bare convolution of a linear projection."""
    out = _conv_out(size, kernel, stride)
    x = g.input("x", (1, cin, size, size))
    w = g.weight("w", (cout, cin // groups, kernel, kernel), fan_in=cin // groups * kernel * kernel)
    attrs = {"kernel_shape": [kernel, kernel], "pads": [kernel // 2] * 4, "strides": [stride, stride],
             "group": groups}
    if relu:
        y = g.node("Conv", [x, w, g.const("b", g.rng.standard_normal(cout) * 0.1)], "conv", **attrs)
        g.node("Relu", [y], g.output("y", (1, cout, out, out)))
    else:
        g.node("Conv", [x, w], g.output("y", (1, cout, out, out)), **attrs)


def _conv_file(family: str, *, cin: int, cout: int, size: int, kernel: int, stride: int, depthwise: bool,
               relu: bool) -> CorpusFile | None:
    groups = cin if depthwise else 1
    if not depthwise and (kernel, cin, cout, size, stride) in RESNET50_CONVS:
        return None  # a held-out model's shape
    tag = f"c{cin}" if depthwise or cin == cout else f"c{cin}-{cout}"
    name = f"{family}-{tag}-h{size}" + ("-s2" if stride == 2 and family != "strided" else "") + \
        ("-dw" if depthwise and family == "strided" else "") + ("-bias-relu" if relu else "")
    build = partial(_conv, cin=cin, cout=cout, size=size, kernel=kernel, stride=stride, groups=groups, relu=relu)
    return CorpusFile(family, name, (name,), build)


def _conv1x1() -> Iterable[CorpusFile | None]:
    for size, channels in STAGES:
        for c in channels:
            # an expansion with its activation, and the linear projection back (as ResNet and
            # MobileNet blocks have them)
            yield _conv_file("conv1x1", cin=c, cout=2 * c, size=size, kernel=1, stride=1, depthwise=False, relu=True)
            yield _conv_file("conv1x1", cin=2 * c, cout=c, size=size, kernel=1, stride=1, depthwise=False, relu=False)


def _conv3x3() -> Iterable[CorpusFile | None]:
    for size, channels in STAGES:
        for c in channels:
            for relu in (True, False):
                yield _conv_file("conv3x3", cin=c, cout=c, size=size, kernel=3, stride=1, depthwise=False, relu=relu)


def _depthwise() -> Iterable[CorpusFile | None]:
    for size, channels in STAGES:
        for c in channels:
            yield _conv_file("depthwise", cin=c, cout=c, size=size, kernel=3, stride=1, depthwise=True, relu=True)
    for size, c in DEPTHWISE_WIDE:
        yield _conv_file("depthwise", cin=c, cout=c, size=size, kernel=3, stride=1, depthwise=True, relu=True)


def _strided() -> Iterable[CorpusFile | None]:
    for size, c in ((112, 16), (112, 32), (56, 32), (56, 64), (28, 64), (28, 128), (14, 128), (14, 256)):
        yield _conv_file("strided", cin=c, cout=2 * c, size=size, kernel=3, stride=2, depthwise=False, relu=True)
    for size, c in ((112, 32), (56, 64), (28, 128), (14, 256)):
        yield _conv_file("strided", cin=c, cout=c, size=size, kernel=3, stride=2, depthwise=True, relu=True)
    for c in (16, 32):  # stems on 224x224 RGB (resnet's is 7x7, held out with resnet50)
        yield _conv_file("strided", cin=3, cout=c, size=224, kernel=3, stride=2, depthwise=False, relu=True)


def _gelu(g: _Graph, x: str, out: str) -> str:
    """0.5 * x * (1 + erf(x / sqrt(2))): the exact GELU as ONNX exporters write it before opset 20."""
    t = g.node("Div", [x, g.const(f"{out}_sqrt2", math.sqrt(2.0))], f"{out}_div")
    t = g.node("Erf", [t], f"{out}_erf")
    t = g.node("Add", [t, g.const(f"{out}_one", 1.0)], f"{out}_add")
    t = g.node("Mul", [x, t], f"{out}_mul")
    return g.node("Mul", [t, g.const(f"{out}_half", 0.5)], out)


def _dense(g: _Graph, *, k: int, n: int, act: str) -> None:
    """One weight [k, n] and its bias shared by a MatMul + Add (+ GELU) at every sequence length."""
    w = g.weight("w", (k, n), fan_in=k)
    b = g.const("b", g.rng.standard_normal(n) * 0.1)
    for s in SEQ_LENS:
        x, out = g.input(f"x_s{s}", (1, s, k)), f"y_s{s}"
        y = g.node("Add", [g.node("MatMul", [x, w], f"mm_s{s}"), b], f"bias_s{s}" if act == "gelu" else out)
        if act == "gelu":
            _gelu(g, y, out)
        g.output(out, (1, s, n))


def _dense_files() -> Iterable[CorpusFile]:
    for d in WIDTHS:
        kinds = ((d, d, "none", "proj"), (d, 4 * d, "gelu", "ffn-up-gelu"), (4 * d, d, "none", "ffn-down"))
        for k, n, act, role in kinds:
            name = f"dense-{role}-{k}x{n}"
            yield CorpusFile("dense", name, tuple(f"{name}-s{s}" for s in SEQ_LENS), partial(_dense, k=k, n=n, act=act))


def _batch_matmul(g: _Graph, *, heads: int, seq: int, scores: bool) -> None:
    if scores:  # Q . K^T: [1, h, s, 64] x [1, h, 64, s]
        a, b, out = (1, heads, seq, HEAD_DIM), (1, heads, HEAD_DIM, seq), (1, heads, seq, seq)
    else:  # P . V: [1, h, s, s] x [1, h, s, 64]
        a, b, out = (1, heads, seq, seq), (1, heads, seq, HEAD_DIM), (1, heads, seq, HEAD_DIM)
    g.node("MatMul", [g.input("a", a), g.input("b", b)], g.output("y", out))


def _batch_matmul_files() -> Iterable[CorpusFile]:
    for heads in HEADS:
        for seq in ATTENTION_SEQ:
            for scores, what in ((True, "qk"), (False, "pv")):
                name = f"batch_matmul-{what}-h{heads}-s{seq}"
                yield CorpusFile("batch_matmul", name, (name,), partial(_batch_matmul, heads=heads, seq=seq,
                                                                        scores=scores))


def _unary(g: _Graph, *, op: str, shape: tuple[int, ...], out_shape: tuple[int, ...] | None = None,
           **attrs: Any) -> None:
    g.node(op, [g.input("x", shape)], g.output("y", out_shape or shape), **attrs)


def _softmax_files() -> Iterable[CorpusFile]:
    shapes = [(1, h, s, s) for h, s in ((8, 32), (12, 32), (8, 128), (12, 128), (16, 128), (12, 384), (16, 384))]
    shapes.append((1, 1000))  # a classifier's
    for shape in shapes:
        name = "softmax-" + "x".join(str(d) for d in shape[1:])
        yield CorpusFile("softmax", name, (name,), partial(_unary, op="Softmax", shape=shape, axis=-1))


def _layernorm(g: _Graph, *, seq: int, width: int) -> None:
    x = g.input("x", (1, seq, width))
    scale = g.const("scale", 1.0 + 0.1 * g.rng.standard_normal(width))
    bias = g.const("bias", 0.1 * g.rng.standard_normal(width))
    g.node("LayerNormalization", [x, scale, bias], g.output("y", (1, seq, width)), axis=-1, epsilon=1e-5)


def _layernorm_files() -> Iterable[CorpusFile]:
    for width in WIDTHS:
        for seq in SEQ_LENS:
            name = f"layernorm-s{seq}-d{width}"
            yield CorpusFile("layernorm", name, (name,), partial(_layernorm, seq=seq, width=width))


def _pooling_files() -> Iterable[CorpusFile]:
    # (op, kernel, stride, pad, feature-map size, channels); resnet's 3x3/2 max pool of 64 channels
    # at 112 is left out (resnet50 has it), and so is its global pool of 2048 channels at 7
    pools = [("MaxPool", 3, 2, 1, s, c) for s, c in ((112, 32), (56, 64), (56, 128), (28, 256))]
    pools += [("MaxPool", 2, 2, 0, s, c) for s, c in ((112, 16), (56, 64), (28, 128), (14, 256))]
    pools += [("AveragePool", 3, 1, 1, s, c) for s, c in ((28, 128), (14, 256), (7, 512))]
    pools += [("AveragePool", 2, 2, 0, s, c) for s, c in ((56, 64), (28, 128))]
    for op, k, stride, pad, size, c in pools:
        out = (size + 2 * pad - k) // stride + 1
        name = f"pooling-{op.lower()}{k}x{k}s{stride}-c{c}-h{size}"
        yield CorpusFile("pooling", name, (name,), partial(
            _unary, op=op, shape=(1, c, size, size), out_shape=(1, c, out, out), kernel_shape=[k, k],
            strides=[stride, stride], pads=[pad] * 4))
    for size, c in ((7, 512), (7, 1024), (7, 1280), (14, 256), (28, 128)):
        name = f"pooling-globalavg-c{c}-h{size}"
        yield CorpusFile("pooling", name, (name,), partial(_unary, op="GlobalAveragePool", shape=(1, c, size, size),
                                                           out_shape=(1, c, 1, 1)))


def _add_relu(g: _Graph, *, shape: tuple[int, ...]) -> None:
    """A residual add and its ReLU."""
    y = g.node("Add", [g.input("x", shape), g.input("r", shape)], "sum")
    g.node("Relu", [y], g.output("y", shape))


def _mul_add(g: _Graph, *, shape: tuple[int, ...]) -> None:
    """A per-channel scale and shift (an unfolded BatchNorm)."""
    c = shape[1]
    y = g.node("Mul", [g.input("x", shape), g.const("scale", 1.0 + 0.1 * g.rng.standard_normal((c, 1, 1)))], "scaled")
    g.node("Add", [y, g.const("shift", 0.1 * g.rng.standard_normal((c, 1, 1)))], g.output("y", shape))


def _gelu_chain(g: _Graph, *, shape: tuple[int, ...]) -> None:
    _gelu(g, g.input("x", shape), g.output("y", shape))


def _elementwise_files() -> Iterable[CorpusFile]:
    maps = [(1, c, s, s) for s, c in ((112, 32), (56, 64), (28, 128), (28, 256), (14, 512), (7, 1024))]
    for shape in maps:
        tag = f"c{shape[1]}-h{shape[2]}"
        yield CorpusFile("elementwise", f"elementwise-add-relu-{tag}", (f"elementwise-add-relu-{tag}",),
                         partial(_add_relu, shape=shape))
        yield CorpusFile("elementwise", f"elementwise-mul-add-{tag}", (f"elementwise-mul-add-{tag}",),
                         partial(_mul_add, shape=shape))
    for s, n in ((1, 3072), (32, 2048), (128, 1024), (128, 3072), (384, 3072), (128, 4096)):
        name = f"elementwise-gelu-s{s}-n{n}"
        yield CorpusFile("elementwise", name, (name,), partial(_gelu_chain, shape=(1, s, n)))


_GENERATORS: dict[str, Callable[[], Iterable[CorpusFile | None]]] = {
    "conv1x1": _conv1x1, "conv3x3": _conv3x3, "depthwise": _depthwise, "strided": _strided, "dense": _dense_files,
    "batch_matmul": _batch_matmul_files, "softmax": _softmax_files, "layernorm": _layernorm_files,
    "pooling": _pooling_files, "elementwise": _elementwise_files,
}


# -- selection and writing -----------------------------------------------------------------------------
def parse_families(text: str | Sequence[str] | None) -> tuple[str, ...]:
    """Family names from ``"conv3x3,softmax"`` (or a sequence); None or empty: every family.

    Raises
    ------
    ValueError
        An unknown family, naming the valid ones.
    """
    if text is None:
        return FAMILIES
    names = [n.strip() for n in (text.split(",") if isinstance(text, str) else text) if n.strip()]
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown corpus famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}; "
                         f"valid: {', '.join(FAMILIES)}")
    return tuple(n for n in FAMILIES if n in names) or FAMILIES


def corpus_files(families: str | Sequence[str] | None = None, limit: int | None = None) -> list[CorpusFile]:
    """The corpus's files, family by family in :data:`FAMILIES` order.

    Parameters
    ----------
    families : str or sequence of str, optional
        Only these families (``"conv3x3,softmax"``); default all.
    limit : int, optional
        At most this many files of each family (the first ones, which span its smallest shapes
        first for the convolutions); a short run's subset.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    out: list[CorpusFile] = []
    for family in parse_families(families):
        files = [f for f in _GENERATORS[family]() if f is not None]
        out.extend(files[:limit] if limit is not None else files)
    names = [f.name for f in out]
    assert len(names) == len(set(names)), "corpus file names must be unique"
    return out


def corpus_counts(files: Sequence[CorpusFile] | None = None) -> dict[str, tuple[int, int]]:
    """``{family: (files, variants)}`` of ``files`` (default the whole corpus)."""
    counts: dict[str, tuple[int, int]] = {}
    for f in corpus_files() if files is None else files:
        n_files, n_variants = counts.get(f.family, (0, 0))
        counts[f.family] = (n_files + 1, n_variants + len(f.variants))
    return counts


def file_bytes(spec: CorpusFile) -> bytes:
    """The serialised ONNX model of one corpus file (the same bytes on every call)."""
    g = _Graph(spec.name)
    spec.build(g)
    return g.model_bytes()


def write_corpus(directory: str | Path, families: str | Sequence[str] | None = None,
                 limit: int | None = None) -> list[Path]:
    """Write the corpus (or a selection, see :func:`corpus_files`) as ONNX files into ``directory``.

    Idempotent: the same bytes every time, and a file already holding them is not rewritten (its
    modification time stays). Returns the paths, in corpus order.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for spec in corpus_files(families, limit):
        path = directory / spec.filename
        data = file_bytes(spec)
        if not (path.is_file() and path.read_bytes() == data):
            tmp = path.with_suffix(".onnx.tmp")
            tmp.write_bytes(data)
            tmp.replace(path)  # a reader never sees half a file
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", nargs="?", type=Path, help="where to write the .onnx files")
    parser.add_argument("--families", help=f"comma-separated subset of: {', '.join(FAMILIES)} (default all)")
    parser.add_argument("--limit", type=int, help="at most this many files per family")
    parser.add_argument("--list", action="store_true", help="print the families and their counts, write nothing")
    args = parser.parse_args(argv)
    try:
        files = corpus_files(args.families, args.limit)
    except ValueError as exc:
        parser.error(str(exc))
    if not args.list:
        if args.directory is None:
            parser.error("give a directory to write the corpus into (or --list)")
        paths = write_corpus(args.directory, args.families, args.limit)
        for spec, path in zip(files, paths, strict=True):
            print(f"{path}  ({path.stat().st_size / 2**20:.2f} MiB, {len(spec.variants)} variant(s))")
    counts = corpus_counts(files)
    print(f"{'family':<14}{'files':>7}{'variants':>10}")
    for family, (n_files, n_variants) in counts.items():
        print(f"{family:<14}{n_files:>7}{n_variants:>10}")
    print(f"{'total':<14}{sum(c[0] for c in counts.values()):>7}{sum(c[1] for c in counts.values()):>10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
