"""Models the zoo and the campaign's corpus do not have, built from transformers' configs and
exported to ONNX: the test models of what the shipped cost model buys on an architecture it never saw.

Usage::

    python bench/outside_models.py DIR                           # write every model, print what was written
    python bench/outside_models.py DIR --models convnext-tiny
    python bench/outside_models.py --list
    python bench/pretrained_bench.py DIR/convnext-tiny.onnx --budget 3m   # then measure one

Models (float32 activations, batch 1, random weights drawn from ``torch.manual_seed(SEED)``):

* ``convnext-tiny``: ConvNeXt-T image classifier (``ConvNextConfig()``: depths 3-3-9-3, widths
  96-768, 224x224): 7x7 depthwise convolutions, channels-last LayerNorm and 4x linear expansions
  over every pixel, GELU: no family of the corpus has a 7x7 depthwise convolution or a dense over
  3,136 rows;
* ``electra-small``: the ELECTRA-small encoder (``ElectraConfig()``: 12 layers, hidden 256, 4 heads,
  FFN 1,024, embeddings 128 projected to 256) on 128 int64 token ids, returning the last hidden
  state: the corpus's attention has 8, 12 or 16 heads, and no projection from 128.

(MobileBERT, the first transformer tried, does not import: its trigram embedding's padding is
exported as a computed ``Pad``, which TVM's ONNX frontend refuses: "Dynamic pads are not supported yet".)

``--small`` writes the same architectures at a fraction of the depth and width (the tests' models).
The export is the one ``tunefleet build`` uses to time onnxruntime (torch's TorchScript exporter);
a file already holding the same bytes is not rewritten.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunefleet.models.zoo import torch_wrappers

SEED = 0


@dataclass(frozen=True)
class OutsideModel:
    name: str
    description: str
    build: Callable[[Any, Any, bool], tuple[Any, Any]]
    """(torch, transformers, small) -> (module in eval mode, example input as a numpy array)."""


def _convnext(torch: Any, transformers: Any, small: bool) -> tuple[Any, Any]:
    import numpy as np

    if small:
        cfg = transformers.ConvNextConfig(depths=[1, 1, 1, 1], hidden_sizes=[8, 16, 32, 64], num_labels=10)
        size = 32
    else:
        cfg = transformers.ConvNextConfig(num_labels=1000)
        size = 224
    image_cls, _ = torch_wrappers(torch)
    return image_cls(transformers.ConvNextForImageClassification(cfg)).eval(), np.zeros((1, 3, size, size), np.float32)


def _electra(torch: Any, transformers: Any, small: bool) -> tuple[Any, Any]:
    import numpy as np

    if small:
        cfg = transformers.ElectraConfig(vocab_size=100, embedding_size=16, hidden_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, intermediate_size=64, max_position_embeddings=32)
        seq = 16
    else:
        cfg = transformers.ElectraConfig()
        seq = 128
    _, text_cls = torch_wrappers(torch)
    return text_cls(transformers.ElectraModel(cfg)).eval(), np.zeros((1, seq), np.int64)


MODELS = (
    OutsideModel("convnext-tiny", "ConvNeXt-T image classifier, 224x224 (transformers ConvNextConfig)", _convnext),
    OutsideModel("electra-small", "ELECTRA-small encoder, 128 tokens (transformers ElectraConfig)", _electra),
)
_BY_NAME = {m.name: m for m in MODELS}


def select(names: str | None) -> list[OutsideModel]:
    """The models named (comma-separated; None: all), in catalogue order."""
    if names is None:
        return list(MODELS)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in _BY_NAME]
    if unknown:
        raise ValueError(f"unknown model(s) {', '.join(unknown)} (known: {', '.join(_BY_NAME)})")
    return [m for m in MODELS if m.name in wanted]


def write_models(directory: str | Path, names: str | None = None, *, small: bool = False) -> list[Path]:
    """Export the selected models to ``directory/<name>.onnx``; returns the paths in catalogue order."""
    import torch
    import transformers

    from tunefleet.delivery.alternatives import export_onnx

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for spec in select(names):
        path = directory / f"{spec.name}.onnx"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            module, example = spec.build(torch, transformers, small)
        with tempfile.TemporaryDirectory(dir=directory) as tmp:
            fresh = export_onnx(module, [example], Path(tmp) / path.name)
            if not (path.is_file() and path.read_bytes() == fresh.read_bytes()):
                fresh.replace(path)  # a reader never sees half a file
        paths.append(path)
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", nargs="?", type=Path, help="where to write the .onnx files")
    parser.add_argument("--models", help=f"comma-separated subset of: {', '.join(_BY_NAME)} (default all)")
    parser.add_argument("--small", action="store_true", help="the same architectures, tiny (for tests)")
    parser.add_argument("--list", action="store_true", help="print the models, write nothing")
    args = parser.parse_args(argv)
    try:
        chosen = select(args.models)
    except ValueError as exc:
        parser.error(str(exc))
    if args.list:
        for spec in chosen:
            print(f"{spec.name:<16}{spec.description}")
        return 0
    if args.directory is None:
        parser.error("give a directory to write the models into (or --list)")
    for path in write_models(args.directory, args.models, small=args.small):
        print(f"{path}  ({path.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
