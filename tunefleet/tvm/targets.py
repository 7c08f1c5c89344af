"""TVM targets in the one form Apache TVM 0.27 accepts: the JSON dict.

TVM 0.27 rejects the old CLI target strings (``"llvm -mcpu=znver3 -num-cores 2"`` raises
``ValueError: Cannot parse target string ...``); only a bare kind or tag name (``"llvm"``,
``"cuda"``) or the dict form (``{"kind": "llvm", "mcpu": "znver3", "num-cores": 2}``) work.
MetaSchedule also needs ``num-cores`` on CPU targets or tuning fails, so every CPU target built
here carries it.

:func:`make_target` is the only place tunefleet turns a user-supplied spec into a
:class:`tvm.target.Target`; anything TVM rejects becomes an :class:`InvalidTargetError` with a
one-line message. :func:`target_fingerprint` gives the canonical JSON string stored with every
measurement as provenance.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

from tvm.target import Target

from tunefleet.errors import TunefleetError, one_line

logger = logging.getLogger(__name__)

__all__ = [
    "InvalidTargetError",
    "arm_target",
    "cuda_target",
    "host_cpu_target",
    "make_target",
    "target_cpu_features",
    "target_fingerprint",
    "x86_avx2_target",
]


class InvalidTargetError(TunefleetError):
    """A target specification that TVM (or tunefleet's own checks) rejects."""


def _parse_spec(spec: Mapping[str, Any] | str | Target) -> dict[str, Any] | str | Target:
    """Turn ``spec`` into what :class:`tvm.target.Target` accepts, or raise.

    A string starting with ``{`` or ``[`` is parsed as JSON; any other string is passed as a
    kind or tag name (``"llvm"``, ``"cuda"``), which TVM may still reject.
    """
    if isinstance(spec, Target):
        return spec
    if isinstance(spec, Mapping):
        return dict(spec)
    if isinstance(spec, str):
        text = spec.strip()
        if not text:
            raise InvalidTargetError("Invalid target: the target specification is empty.")
        if text.startswith(("{", "[")):
            try:
                parsed = json.loads(text)
            except json.JSONDecodeError as exc:
                raise InvalidTargetError(
                    f"Invalid target {one_line(text, 120)!r}: not valid JSON ({exc.msg} at "
                    f"column {exc.colno})."
                ) from None
            if not isinstance(parsed, dict):
                raise InvalidTargetError(
                    f"Invalid target {one_line(text, 120)!r}: the JSON must be an object."
                )
            return parsed
        if any(ch.isspace() for ch in text) or text.startswith("-"):
            raise InvalidTargetError(
                f"Invalid target {text!r}: TVM 0.27 no longer accepts CLI target strings; use "
                'the dict form, e.g. {"kind": "llvm", "mcpu": "znver3", "num-cores": 2}.'
            )
        return text
    raise InvalidTargetError(
        f"Invalid target: expected a dict or a JSON string, got {type(spec).__name__}."
    )


def _check_llvm(target: Target) -> None:
    """Checks TVM itself does not make on an ``llvm`` target (it accepts both silently)."""
    attrs = dict(target.attrs)
    num_cores = attrs.get("num-cores")
    if num_cores is not None and int(num_cores) < 1:
        raise InvalidTargetError(
            f"Invalid target {target_fingerprint(target)}: num-cores must be >= 1, "
            f"got {int(num_cores)}."
        )
    mcpu = attrs.get("mcpu")
    if mcpu:
        from tvm.target import codegen

        triple = str(attrs.get("mtriple") or codegen.llvm_get_system_triple())
        if not codegen.llvm_is_valid_cpu(str(mcpu), triple):
            raise InvalidTargetError(
                f"Invalid target {target_fingerprint(target)}: LLVM does not know mcpu "
                f"{str(mcpu)!r} for triple {triple!r}."
            )
    if num_cores is None:
        logger.warning(
            "target %s has no num-cores: MetaSchedule tuning fails without it",
            target_fingerprint(target),
        )


def make_target(spec: Mapping[str, Any] | str | Target) -> Target:
    """Create a :class:`tvm.target.Target` from a dict, a JSON string of one, or a kind name.

    Parameters
    ----------
    spec : Mapping or str or tvm.target.Target
        The dict form (``{"kind": "llvm", "mcpu": "znver3", "num-cores": 2}``), the same as a
        JSON string, a bare kind or tag name (``"llvm"``, ``"cuda"``), or a ready Target
        (returned after the same checks). Old CLI strings such as ``"llvm -num-cores 2"`` are
        rejected, as TVM 0.27 rejects them.

    Returns
    -------
    tvm.target.Target
        The target.

    Raises
    ------
    InvalidTargetError
        With a one-line message when TVM rejects the spec, when an ``llvm`` target names an
        ``mcpu`` LLVM does not know for its triple (TVM accepts that silently), or when
        ``num-cores`` is below 1.
    """
    parsed = _parse_spec(spec)
    if isinstance(parsed, Target):
        target = parsed
    else:
        try:
            target = Target(parsed)
        except Exception as exc:  # TVM raises ValueError / TypeError / tvm.error.*
            shown = json.dumps(parsed, sort_keys=True) if isinstance(parsed, dict) else parsed
            message = str(exc).split(". Target creation from", 1)[0]
            raise InvalidTargetError(
                f"Invalid target {one_line(str(shown), 160)}: {one_line(message)}"
            ) from None
    if target.kind.name == "llvm":
        _check_llvm(target)
    return target


def _host_core_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def host_cpu_target(num_cores: int | None = None) -> dict[str, Any]:
    """The dict form of an ``llvm`` target for this host.

    Parameters
    ----------
    num_cores : int, optional
        Cores to tune for; defaults to the cores this process may run on
        (``os.sched_getaffinity``), which respects cgroup/taskset limits unlike
        ``os.cpu_count``.

    Returns
    -------
    dict
        ``{"kind": "llvm", "mcpu": <LLVM host CPU name>, "num-cores": N}``; ``mcpu`` is
        omitted when LLVM cannot name the host CPU (``"generic"`` or unavailable).
    """
    if num_cores is None:
        num_cores = _host_core_count()
    if num_cores < 1:
        raise InvalidTargetError(f"Invalid target: num-cores must be >= 1, got {num_cores}.")
    spec: dict[str, Any] = {"kind": "llvm"}
    try:
        from tvm.target import codegen

        mcpu = str(codegen.llvm_get_system_cpu())
    except Exception:  # LLVM not compiled in, or the query failed
        logger.debug("LLVM host CPU name unavailable", exc_info=True)
        mcpu = ""
    if mcpu and mcpu != "generic":
        spec["mcpu"] = mcpu
    spec["num-cores"] = int(num_cores)
    return spec


#: LLVM's CPU for portable AVX2 code: AVX, AVX2, FMA (and F16C, BMI2), no AVX-512.
X86_AVX2_MCPU = "haswell"


def x86_avx2_target(num_cores: int | None = None) -> dict[str, Any]:
    """The dict form of an ``llvm`` target for any x86-64 CPU with AVX2 and FMA.

    The same on every host except ``num-cores``: ``mcpu`` is LLVM's ``haswell`` (256-bit AVX2 and
    FMA, no AVX-512), so its code runs on Intel Haswell and later and AMD Zen and later, and
    ``mtriple`` is fixed rather than the host's (on a non-x86 host the default triple would
    make ``haswell`` an unknown CPU).

    Parameters
    ----------
    num_cores : int, optional
        Cores to tune for; defaults to the cores this process may run on.

    Returns
    -------
    dict
        ``{"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": "haswell", "num-cores": N}``.
    """
    if num_cores is None:
        num_cores = _host_core_count()
    if num_cores < 1:
        raise InvalidTargetError(f"Invalid target: num-cores must be >= 1, got {num_cores}.")
    return {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "mcpu": X86_AVX2_MCPU, "num-cores": int(num_cores)}


def target_cpu_features(spec: Mapping[str, Any] | str | Target) -> set[str]:
    """The CPU features (LLVM names: ``avx2``, ``fma``, ``avx512f`` ...) an ``llvm`` target's code
    may use: those of its ``mcpu`` with its ``mattr`` applied, for its ``mtriple``.

    Parameters
    ----------
    spec : Mapping or str or tvm.target.Target
        Anything :func:`make_target` accepts.

    Returns
    -------
    set of str
        Empty for a target of another kind, or one without ``mcpu`` and ``mattr`` (LLVM's
        generic CPU of the triple).
    """
    target = make_target(spec)
    if target.kind.name != "llvm":
        return set()
    attrs = dict(target.attrs)
    if not attrs.get("mcpu") and not attrs.get("mattr"):
        return set()
    from tvm.target import codegen

    return {str(feature) for feature in codegen.llvm_get_cpu_features(target)}


def arm_target(num_cores: int = 4, mcpu: str | None = None) -> dict[str, Any]:
    """The dict form of a 64-bit ARM Linux ``llvm`` target.

    Compiling for it works anywhere; linking a shared library (what the MetaSchedule runner
    loads) needs a cross gcc (Debian ``gcc-aarch64-linux-gnu``) or an ARM node.

    Parameters
    ----------
    num_cores : int
        Cores of the ARM node class.
    mcpu : str, optional
        An LLVM CPU name such as ``"cortex-a72"`` or ``"neoverse-n1"``.

    Returns
    -------
    dict
        ``{"kind": "llvm", "mtriple": "aarch64-linux-gnu", "num-cores": N}`` (+ ``mcpu``).
    """
    spec: dict[str, Any] = {"kind": "llvm", "mtriple": "aarch64-linux-gnu"}
    if mcpu:
        spec["mcpu"] = mcpu
    spec["num-cores"] = int(num_cores)
    return spec


def cuda_target(arch: str = "sm_80") -> dict[str, Any]:
    """The dict form of a CUDA target.

    CUDA codegen is compiled into the apache-tvm wheel, so this builds CUDA source on any
    machine; running candidates needs a GPU node.

    Parameters
    ----------
    arch : str
        The compute capability, e.g. ``"sm_80"`` (A100), ``"sm_90"`` (H100).

    Returns
    -------
    dict
        ``{"kind": "cuda", "arch": arch}``; TVM fills ``max_num_threads`` and
        ``thread_warp_size``.
    """
    return {"kind": "cuda", "arch": arch}


def _jsonable(value: Any) -> Any:
    """Convert a ``Target.export()`` value (TVM containers, nested targets) to plain JSON."""
    if isinstance(value, Target):
        return _jsonable(value.export())
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    if isinstance(value, Mapping) or hasattr(value, "items"):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or hasattr(value, "__iter__"):
        return [_jsonable(v) for v in value]
    return str(value)


def target_fingerprint(target: Target | Mapping[str, Any] | str) -> str:
    """A canonical JSON string of ``target.export()`` for provenance.

    Keys are sorted and separators fixed, so two equal targets give the same string, and
    ``make_target(json.loads(fp))`` rebuilds the target.

    Parameters
    ----------
    target : tvm.target.Target or dict or str
        A target, or anything :func:`make_target` accepts.

    Returns
    -------
    str
        For example ``{"keys":["cpu"],"kind":"llvm","mcpu":"znver3","num-cores":2,"tag":""}``.
    """
    if not isinstance(target, Target):
        target = make_target(target)
    return json.dumps(_jsonable(target.export()), sort_keys=True, separators=(",", ":"))

