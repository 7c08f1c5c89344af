"""Hardware classes: the built-in ones, overrides from configuration, seeding the database.

A hardware class is a first-class record (ISA Mapper's idea): a TVM target in dict form, the
node-pool label its workers run on, and the power and price figures energy accounting uses.
Power and price defaults are *assumptions* for estimates (documented in docs/configuration.md); set real
figures with the ``hardware`` setting.

``x86`` is this host's CPU (``mcpu`` detected: its schedules are for that CPU, AVX-512 where it
has it); ``x86-avx2`` is a fixed target (``mcpu`` ``haswell``: AVX2 + FMA) whose schedules are
the same on every x86 node with AVX2 and FMA, and it runs in the same node pool.
"""

from __future__ import annotations

import logging
import os
import platform
import re
from typing import TYPE_CHECKING, Any

from tunefleet.errors import ConfigError
from tunefleet.recipes import recipe_for
from tunefleet.vocab import LAYOUTS

if TYPE_CHECKING:
    from tunefleet.config import Settings
    from tunefleet.db import Database
    from tunefleet.db.tables import HardwareClass

log = logging.getLogger(__name__)

# Assumed figures (W per busy core, idle W, W per GPU, price per node-hour in currency units).
BUILTIN_FIGURES: dict[str, dict[str, Any]] = {
    "x86": {"node_pool": "x86", "watts_per_core": 12.0, "idle_watts": 30.0, "watts_per_gpu": 0.0, "price_per_hour": 0.17},
    "x86-avx2": {"node_pool": "x86", "watts_per_core": 12.0, "idle_watts": 30.0, "watts_per_gpu": 0.0,
                 "price_per_hour": 0.17},
    "arm": {"node_pool": "arm", "watts_per_core": 5.0, "idle_watts": 15.0, "watts_per_gpu": 0.0, "price_per_hour": 0.14},
    "gpu": {"node_pool": "gpu", "watts_per_core": 12.0, "idle_watts": 60.0, "watts_per_gpu": 300.0, "price_per_hour": 2.50},
}
#: The ISA ``x86-avx2`` code needs (the features of LLVM's ``haswell`` that matter for its code).
X86_AVX2_ISA = ("avx", "avx2", "fma")
#: x86 vector features whose absence makes a target's code fault (SIGILL): LLVM name -> the
#: ``/proc/cpuinfo`` flag. :func:`check_runs_here` refuses a target needing one the host lacks.
_X86_CHECKED_FEATURES = {"avx": "avx", "avx2": "avx2", "fma": "fma", "avx512f": "avx512f", "avx512bw": "avx512bw",
                         "avx512dq": "avx512dq", "avx512vl": "avx512vl", "avx512cd": "avx512cd",
                         "avx512vnni": "avx512_vnni"}
_FIELDS = {"target", "node_pool", "watts_per_core", "idle_watts", "watts_per_gpu", "price_per_hour", "capabilities",
           "layout", "winograd"}


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of ``/proc/cpuinfo`` (empty where there is none)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                key, sep, value = line.partition(":")
                if not sep:
                    if fields:
                        break  # the first processor's block is enough
                    continue
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def host_cpu_flags() -> set[str]:
    fields = _cpuinfo()
    return set((fields.get("flags") or fields.get("Features") or "").split())


#: The flags a class records as its ISA (and a CPU's identity compares).
_ISA_FLAGS = {"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vnni", "avx512_vnni", "amx_tile", "neon", "asimd",
              "sve", "sve2", "asimddp", "i8mm"}


def host_cpu() -> dict[str, Any]:
    """This machine's CPU as a hardware class records it (``capabilities["cpu"]``): its model name,
    an id that survives a renamed model (x86: vendor, family and model numbers; ARM: implementer
    and part) and its vector ISA. Two machines are one CPU for tuning when all three agree
    (:func:`same_cpu`): a VM may hide AVX-512 on a CPU that has it, and then its code differs."""
    fields = _cpuinfo()
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    if "vendor_id" in fields:
        ident = f"{fields['vendor_id']} family {fields.get('cpu family', '?')} model {fields.get('model', '?')}"
    elif "CPU implementer" in fields:
        ident = f"implementer {fields['CPU implementer']} part {fields.get('CPU part', '?')}"
    else:
        ident = platform.processor() or platform.machine()
    model = fields.get("model name") or fields.get("Model") or fields.get("Hardware") or ident
    return {"model": model, "id": ident, "isa": sorted(flags & _ISA_FLAGS)}


def same_cpu(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two recorded CPUs (:func:`host_cpu`) are one CPU for tuning."""
    return (a.get("model"), a.get("id"), sorted(a.get("isa") or [])) == (b.get("model"), b.get("id"),
                                                                         sorted(b.get("isa") or []))


def cpu_label(cpu: dict[str, Any]) -> str:
    """A recorded CPU's name with its family and model: ``AMD EPYC (family 26 model 2)``. The name
    alone does not tell CPUs apart (a VM's ``AMD EPYC`` is Zen 4 one day and Zen 5 the next)."""
    name = str(cpu.get("model") or "an unrecorded CPU")
    ident = re.sub(r"^(AuthenticAMD|GenuineIntel)\s+", "", str(cpu.get("id") or ""))
    return f"{name} ({ident})" if ident and ident != name else name


def describe_cpu(cpu: dict[str, Any], other: dict[str, Any] | None = None) -> str:
    """A recorded CPU in a few words: its model name; beside ``other``, also what tells the two
    apart (the id when the names agree, the ISA flags this one has and ``other`` lacks)."""
    text = str(cpu.get("model") or "an unnamed CPU")
    if other is not None and other.get("model") == cpu.get("model") and other.get("id") != cpu.get("id"):
        text += f" ({cpu.get('id')})"
    if other is not None:
        extra = sorted(set(cpu.get("isa") or []) - set(other.get("isa") or []))
        if extra:
            text += f" with {', '.join(extra)}"
    return text


def _capabilities(arch: str, cores: int, flags: set[str] | None = None) -> dict[str, Any]:
    return {"arch": arch, "cores": cores, "isa": sorted((flags or set()) & _ISA_FLAGS)}


def builtin_classes(settings: Settings) -> dict[str, dict[str, Any]]:
    """The built-in classes with targets detected on this host (x86) or fixed (x86-avx2, arm, gpu)."""
    from tunefleet.tvm.targets import (
        arm_target,
        cuda_target,
        host_cpu_target,
        x86_avx2_target,
    )

    cores = len(os.sched_getaffinity(0))
    host_is_x86 = platform.machine() in {"x86_64", "AMD64"}
    x86_target = host_cpu_target() if host_is_x86 else {"kind": "llvm", "mtriple": "x86_64-linux-gnu", "num-cores": cores}
    flags = host_cpu_flags()
    classes = {
        # detected: the first CPU that measures it makes it its own (claim_for_this_cpu)
        "x86": {"target": x86_target, "capabilities": {**_capabilities("x86_64", cores, flags if host_is_x86 else set()),
                                                        "detected": True}},
        "x86-avx2": {"target": x86_avx2_target(cores), "capabilities": _capabilities("x86_64", cores, set(X86_AVX2_ISA))},
        "arm": {"target": arm_target(), "capabilities": _capabilities("aarch64", int(arm_target().get("num-cores", cores)),
                                                                       {"neon", "asimd"})},
        "gpu": {"target": cuda_target(settings.gpu_arch), "capabilities": {"arch": "cuda", "sm": settings.gpu_arch}},
    }
    for name, spec in classes.items():
        spec.update(BUILTIN_FIGURES[name])
    # Winograd wins on every x86 (CPU, class) pair measured (docs/performance.md, "Winograd
    # convolutions"); a class whose layout setting is not NHWC turns it off (configured_classes).
    for name in ("x86", "x86-avx2"):
        classes[name]["winograd"] = True
    return classes


def configured_classes(settings: Settings) -> dict[str, dict[str, Any]]:
    """Built-in classes merged with the ``hardware`` setting; targets validated."""
    from tunefleet.tvm.targets import make_target

    classes = builtin_classes(settings)
    for name, override in settings.hardware.items():
        unknown = set(override) - _FIELDS
        if unknown:
            raise ConfigError(f"invalid setting TUNEFLEET_HARDWARE: class {name!r} has unknown field(s) {sorted(unknown)}")
        base = classes.get(name)
        if base is None and "target" not in override:
            raise ConfigError(f"invalid setting TUNEFLEET_HARDWARE: new class {name!r} needs a target")
        merged = {**(base or {"node_pool": name, "capabilities": {}}), **override}
        if override.get("layout") not in (None, "NHWC") and "winograd" not in override:
            merged["winograd"] = False  # Winograd is NHWC only: another layout turns the default off
        classes[name] = merged
    for name, spec in classes.items():
        make_target(spec["target"])  # InvalidTargetError names what is wrong
        if spec.get("layout") is not None and spec["layout"] not in LAYOUTS:
            raise ConfigError(f"invalid setting TUNEFLEET_HARDWARE: class {name!r} has layout {spec['layout']!r}; "
                              f"one of {', '.join(LAYOUTS)}")
        if not isinstance(spec.get("winograd", False), bool):
            raise ConfigError(f"invalid setting TUNEFLEET_HARDWARE: class {name!r} has winograd "
                              f"{spec['winograd']!r}; true or false")
        try:
            recipe_for(spec["target"], spec.get("layout"), spec.get("winograd", False))
        except ConfigError as exc:
            raise ConfigError(f"invalid setting TUNEFLEET_HARDWARE: class {name!r}: {exc}") from None
    return classes


def hardware_names(settings: Settings) -> set[str]:
    """Names of the built-in and configured classes, without detecting their targets (no TVM)."""
    return set(BUILTIN_FIGURES) | set(settings.hardware)


def ensure_hardware_classes(db: Database, settings: Settings) -> None:
    """Seed the classes into a database that has none, or when ``hardware`` overrides are set;
    a built-in class the database lacks (one added to tunefleet since it was seeded) is added
    alone, leaving the stored targets of the others as they are.

    Detecting the built-in targets imports TVM (seconds), so commands that only read the
    database do not pay for it once the classes exist.
    """
    have = {hw.name for hw in db.hardware_classes()}
    if not have:
        seed_hardware_classes(db, settings)
        return
    # A class seeded on another machine keeps its target: re-detecting "x86" here would file this
    # CPU's timings under the other CPU's class (only classes the settings name are updated).
    names = (set(BUILTIN_FIGURES) - have) | set(settings.hardware)
    if names:
        seed_hardware_classes(db, settings, names=names)


def seed_hardware_classes(db: Database, settings: Settings, names: set[str] | None = None) -> list[HardwareClass]:
    """Upsert every configured class (or those of ``names``) into the database (idempotent)."""
    out = []
    stored = {hw.name: hw for hw in db.hardware_classes()}
    for name, spec in configured_classes(settings).items():
        if names is not None and name not in names:
            continue
        old = stored.get(name)
        old_cpu = (old.capabilities or {}).get("cpu") if old is not None else None
        new_cpu = (spec.get("capabilities") or {}).get("cpu")
        if old_cpu is not None and (new_cpu is None or not same_cpu(old_cpu, new_cpu)):
            # Claimed by a CPU (measured there): keep its target and the CPU it records; the
            # settings still update its figures and layout.
            if "target" in settings.hardware.get(name, {}) and settings.hardware[name]["target"] != old.target:
                log.warning("hardware class %r keeps its target %s: it belongs to %s, measured there; define a "
                            "class of another name for the new target", name, old.target, describe_cpu(old_cpu))
            spec = {**spec, "target": dict(old.target), "capabilities": dict(old.capabilities)}
        out.append(
            db.upsert_hardware_class(
                name,
                spec["target"],
                spec["node_pool"],
                watts_per_core=float(spec.get("watts_per_core", 0.0)),
                idle_watts=float(spec.get("idle_watts", 0.0)),
                watts_per_gpu=float(spec.get("watts_per_gpu", 0.0)),
                price_per_hour=float(spec.get("price_per_hour", 0.0)),
                capabilities=spec.get("capabilities") or {},
                layout=spec.get("layout"),
                winograd=bool(spec.get("winograd", False)),
            )
        )
    return out


def claim_for_this_cpu(db: Database, name: str, *, record: bool = True) -> HardwareClass:
    """The hardware class ``name``, checked for measuring on this machine: :func:`check_runs_here`,
    and, for a CPU class, the CPU it belongs to (``capabilities["cpu"]``) must be this one.

    A class is its target *and* its CPU: timings of two CPUs under one class would mix, and a
    schedule's speed is the CPU's. A CPU class records the first CPU that measures it (``record``;
    a compare-and-set in the database, so two workers on two CPUs cannot both claim it). The
    built-in ``x86``, whose target was detected on whichever machine seeded the classes (on a
    cluster, maybe not a worker), takes this CPU's target when it claims it with nothing measured
    yet. Read-only commands do not call this: a home reused on another CPU still answers ``best``,
    ``report`` and ``hub export``.

    Raises
    ------
    tunefleet.errors.NotSupportedError
        One line naming both CPUs and the ways out: a home of its own for this machine (the hub
        carries the other's schedules over) or a class of its own (``TUNEFLEET_HARDWARE``).
    """
    from tunefleet.errors import NotSupportedError

    hw = db.hardware_class(name)
    caps = dict(hw.capabilities or {})
    if caps.get("hub"):
        raise NotSupportedError(f"not supported: measuring hardware class {name!r}: it holds records imported from "
                                "a hub bundle (measured elsewhere); tune a class of this machine, which starts from them")
    if str(hw.target.get("kind")) != "llvm":
        check_runs_here(hw.name, hw.target)
        return hw
    here = host_cpu()
    there = caps.get("cpu")
    if there is None and record:
        adopt = _detected_here(hw) if caps.get("detected") else None
        measured = db.count_measurements(hardware_class_id=hw.id) > 0
        if adopt is not None and measured:
            # measured before CPUs were recorded, under another CPU's target: not this CPU's class
            there = {"model": f"a CPU with target {hw.target}", "id": "", "isa": []}
        else:
            there = db.claim_hardware_cpu(hw.name, here, adopt=adopt)
            hw = db.hardware_class(name)
    check_runs_here(hw.name, hw.target)
    if there is not None and not same_cpu(there, here):
        raise NotSupportedError(
            f"not supported: measuring hardware class {name!r} on this machine: the class belongs to "
            f"{describe_cpu(there, here)}, this machine is {describe_cpu(here, there)}, and their timings would "
            f"mix; give this machine a home of its own (TUNEFLEET_HOME or TUNEFLEET_DATABASE_URL; 'tunefleet hub "
            f"export' and 'hub import' carry the schedules over) or a class of its own (TUNEFLEET_HARDWARE: "
            f"docs/hub.md#a-class-is-its-target-and-its-cpu)")
    return hw


def _detected_here(hw: HardwareClass) -> dict[str, Any] | None:
    """This host's target and capabilities for a class detected elsewhere (None: they agree)."""
    if platform.machine() not in {"x86_64", "AMD64"}:
        return None
    from tunefleet.tvm.targets import host_cpu_target
    from tunefleet.tvm.threads import class_threads

    target = host_cpu_target()
    if target == dict(hw.target):
        return None
    cores = class_threads(target)
    return {"target": target, "capabilities": {**_capabilities("x86_64", cores, host_cpu_flags()), "detected": True}}


def check_runs_here(name: str, target: dict[str, Any]) -> None:
    """Raise :class:`NotSupportedError` if this machine cannot measure candidates for a target.

    Tuning measures every candidate on the node that tunes it, so an ``arm`` shard must run on an
    ARM node and a ``gpu`` shard on a node with a CUDA device: their workers run in their own
    node pools (the ``tune`` deployment of each class). An x86 target's code must also only use
    vector features this CPU has (``x86-avx2``: AVX, AVX2, FMA; an ``x86`` class detected on an
    AVX-512 machine: AVX-512 too), or its candidates would die of illegal instructions.
    """
    from tunefleet.errors import NotSupportedError

    kind = str(target.get("kind", ""))
    host = platform.machine().lower()
    if kind == "llvm":
        triple = str(target.get("mtriple") or "")
        arch = triple.split("-", 1)[0].lower() if triple else host
        same = {arch, host} <= {"x86_64", "amd64"} or {arch, host} <= {"aarch64", "arm64"}
        if not same:
            raise NotSupportedError(f"not supported: tuning hardware class {name!r} ({arch}) on this {host} "
                                    f"machine; run its shards on a {arch} node (its tune deployment's work pool)")
        if arch in {"x86_64", "amd64"}:
            _check_x86_features(name, target)
    elif kind == "cuda":
        import tvm

        if not tvm.cuda(0).exist:
            raise NotSupportedError(f"not supported: tuning hardware class {name!r} (cuda) on a machine without "
                                    f"a CUDA device; run its shards on a GPU node (its tune deployment's work pool)")
    else:
        raise NotSupportedError(f"not supported: tuning targets of kind {kind!r} (hardware class {name!r})")


def _check_x86_features(name: str, target: dict[str, Any]) -> None:
    """Refuse an x86 target whose ``mcpu``/``mattr`` need vector features this CPU lacks."""
    from tunefleet.errors import NotSupportedError

    if not target.get("mcpu") and not target.get("mattr"):
        return  # LLVM's generic x86-64: SSE2 only
    flags = host_cpu_flags()
    if not flags:
        return  # no /proc/cpuinfo to tell (not Linux): measuring will tell
    from tunefleet.tvm.targets import target_cpu_features

    needed = sorted(_X86_CHECKED_FEATURES[f] for f in target_cpu_features(target) if f in _X86_CHECKED_FEATURES)
    missing = [flag for flag in needed if flag not in flags]
    if missing:
        cpu = f"mcpu {target['mcpu']}" if target.get("mcpu") else "its mattr"
        raise NotSupportedError(f"not supported: tuning hardware class {name!r} on this CPU: its target ({cpu}) "
                                f"uses {', '.join(missing)}, which this CPU lacks; run its shards on an x86 node "
                                f"with {', '.join(needed)}")
