"""Extraction recipes: how a hardware class turns a model into tuning workloads (no TVM here).

The passes themselves run in :mod:`tunefleet.tvm.extract`; this leaf names the choice, so the
database, the planner and the CLI can tell which recipe a model's workloads came from without
importing TVM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tunefleet.errors import ConfigError
from tunefleet.vocab import LAYOUTS


@dataclass(frozen=True)
class Recipe:
    """How a model becomes fused TIR: the conv2d layout, whether weights may be prepacked, whether
    transcendental functions use TVM's fast approximations and whether BatchNorm is folded away.

    ``name`` is what the database keeps with each model-workload link, so a model extracted under
    another recipe is known to need re-extracting (its workloads hash differently).
    """

    layout: str | None = None
    """``"NHWC"``: conv2d (and the ops that follow it) converted to NHWC; ``"NCHWc"``: to the
    blocked NCHW[x]c layout, x the target's float32 vector width (16 with AVX-512, else 8), the
    activations kept blocked between convolutions; None: as given."""
    prepack: bool = False
    """Weights marked layout-free, so tuned schedules may read them in a packed layout."""
    fast_math: bool = False
    """float32 ``erf`` (GELU), ``exp`` (softmax), ``tanh`` as TVM's vectorisable polynomial
    approximations (``topi.fast_erf`` / ``fast_exp`` / ``fast_tanh``) instead of a libm call per
    element, which no schedule can vectorise."""
    fold: bool = False
    """BatchNorm folded into the preceding convolution's weights and bias, and the bindings it
    leaves canonicalised, so a convolution's ReLU and residual add fuse into its epilogue instead
    of running as workloads of their own."""
    winograd: bool = False
    """3x3 stride-1 float32 convolutions with at least ``WINOGRAD_MIN_CHANNELS`` input and output
    channels and ``WINOGRAD_MIN_TILES`` output tiles computed as Winograd F(4x4, 3x3): fewer
    multiplications, their weights transformed once at build time. NHWC only."""

    def __post_init__(self) -> None:
        if self.winograd and self.layout != "NHWC":
            raise ConfigError(f"not supported: Winograd convolutions in the {self.layout or 'native'} layout "
                              "(NHWC only)")

    @property
    def name(self) -> str:
        return (f"{(self.layout or 'native').lower()}{'+prepack' if self.prepack else ''}"
                f"{'+fastmath' if self.fast_math else ''}{'+fold' if self.fold else ''}"
                f"{'+winograd' if self.winograd else ''}")

    @classmethod
    def from_name(cls, name: str) -> Recipe:
        layout, *extras = name.split("+")
        known = [e for e in ("prepack", "fastmath", "fold", "winograd") if e in extras]
        if layout not in _LAYOUT_NAMES or extras != known:
            raise ConfigError(f"unknown extraction recipe {name!r} (e.g. 'nhwc+prepack+fastmath+fold', 'native')")
        return cls(_LAYOUT_NAMES[layout], "prepack" in extras, "fastmath" in extras, "fold" in extras,
                   "winograd" in extras)


#: Output tile of the Winograd convolutions: F(4x4, 3x3), 6x6 input tiles (TVM's CPU choice); their
#: transformed weights are ``[tile + 2, tile + 2, CI, CO]``.
WINOGRAD_TILE = 4
#: The fewest input and output channels for which a convolution is computed as Winograd: below,
#: the transforms cost more than the multiplications they save.
WINOGRAD_MIN_CHANNELS = 32
#: The fewest 4x4 output tiles (over the batch) for which a convolution is computed as Winograd:
#: each transformed weight, 4x the direct weights' bytes, is used once per tile, so with fewer
#: tiles (resnet18's 7x7 maps: 4) the kernel streams its weights from memory in every call.
WINOGRAD_MIN_TILES = 16


_LAYOUT_NAMES = {"native": None, **{layout.lower(): layout for layout in LAYOUTS if layout != "native"}}


def _kind(target: Any) -> str:
    if isinstance(target, Mapping):
        return str(target.get("kind", ""))
    if isinstance(target, str):
        return target.split()[0] if target.strip() else ""
    return str(target.kind.name)  # a tvm.target.Target


def recipe_for(target: Any, layout: str | None = None, winograd: bool = False) -> Recipe:
    """The recipe for a target (dict form, kind name or ``tvm.target.Target``): CPU (llvm) targets
    convert conv2d to NHWC (unless ``layout`` says otherwise), prepack weights (TVM's own CPU
    recipe) and use fast math; GPU targets keep the frontend's layout, unpacked weights (their
    schedules stage weights through shared memory instead) and their own math intrinsics. Every
    target folds BatchNorm into the convolutions. ``winograd`` (CPU, NHWC) computes the 3x3
    convolutions that qualify as Winograd F(4x4, 3x3)."""
    if layout is not None and layout not in LAYOUTS:
        raise ConfigError(f"unknown layout {layout!r}; one of {', '.join(LAYOUTS)}")
    cpu = _kind(target) == "llvm"
    if layout is None:
        layout = "NHWC" if cpu else "native"
    if layout == "NCHWc" and not cpu:
        raise ConfigError("not supported: the blocked NCHWc layout on a GPU target (CPU classes only)")
    if winograd and not cpu:
        raise ConfigError("not supported: Winograd convolutions on a GPU target (CPU classes only)")
    return Recipe(None if layout == "native" else layout, prepack=cpu, fast_math=cpu, fold=True, winograd=winograd)
