"""Energy meter for tuning jobs: every figure is labelled with the source it came from.

Three sources, small implementations of one :class:`EnergyMeter` interface (in the spirit of
TVM MetaSchedule's extension points):

``rapl`` -- :class:`RaplMeter`
    Intel/AMD RAPL package counters under ``/sys/class/powercap/intel-rapl:N/energy_uj``
    (top-level package domains only; sub-zones ``intel-rapl:N:M`` and ``psys`` are not summed).
    Counter wrap-around is handled with ``max_energy_range_uj``. The package energy of each
    interval between two reads is split by the job's CPU-time share: CPU seconds of the job's
    process tree / busy CPU seconds of the whole machine over the same interval.
``nvml`` -- :class:`NvmlMeter`
    Total GPU energy (``nvmlDeviceGetTotalEnergyConsumption``, millijoules) through the
    ``pynvml`` module of the ``nvidia-ml-py`` distribution, imported lazily. The whole device's
    energy is charged to the job (the GPU node is held for it).
``estimate`` -- :class:`EstimateMeter`
    CPU seconds of the job's process tree (builder/runner children included, also those that
    already exited) x the hardware class's watts per busy core, plus its idle watts (and, for a
    GPU class without NVML, its watts per GPU) x wall time.

A GPU class combines NVML with a CPU meter in a :class:`CompositeMeter` (source ``nvml+rapl``
or ``nvml+estimate``). :func:`probe` picks the sources once per process and logs the choice
once at INFO. Meters are cumulative: :meth:`EnergyMeter.read` returns the energy since
:meth:`EnergyMeter.start` and may be called any number of times; call it at least at the end
of every measured batch (see :class:`ProcessTreeCpu` and :class:`RaplMeter` for why).

Nothing happens at import time: no file is read, no library is loaded, nothing is logged.
"""

from __future__ import annotations

import abc
import functools
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from tunefleet.errors import TunefleetError

__all__ = [
    "DEFAULT_POWERCAP_ROOT",
    "GPU_TARGET_KINDS",
    "Availability",
    "CompositeMeter",
    "EnergyMeter",
    "EnergyReading",
    "EnergySourceUnavailable",
    "EstimateMeter",
    "NvmlMeter",
    "ProcessTreeCpu",
    "RaplDomain",
    "RaplMeter",
    "Sources",
    "apportion",
    "clear_probe_cache",
    "detect_sources",
    "machine_busy_cpu_seconds",
    "money",
    "nvml_device_count",
    "nvml_total_energy_mj",
    "probe",
    "rapl_domains",
]

logger = logging.getLogger(__name__)

#: Where Linux exposes power-capping (RAPL) zones.
DEFAULT_POWERCAP_ROOT = "/sys/class/powercap"
#: TVM target kinds that run on an NVIDIA GPU (NVML applies).
GPU_TARGET_KINDS = frozenset({"cuda", "nvptx"})

_PACKAGE_DIR = re.compile(r"^intel-rapl:(\d+)$")
_Clock = Callable[[], float]


class EnergySourceUnavailable(TunefleetError):
    """An energy source was asked for where it cannot be read (no counters, no permission)."""


# --------------------------------------------------------------------------------------------
# Readings and the meter interface
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnergyReading:
    """Energy spent by a job since its meter was started.

    Attributes
    ----------
    joules : float
        Energy attributed to the job, in joules.
    source : str
        Where the figure comes from: ``"rapl"``, ``"nvml"``, ``"estimate"``, or several of
        these joined by ``+`` for a composite meter. Never drop it when storing the figure.
    wall_s : float
        Wall-clock seconds since the meter was started.
    cpu_s : float
        CPU seconds (user + system) of the job's process tree since the meter was started;
        0.0 for a meter that does not track CPU (NVML alone).
    detail : dict
        Source-specific figures, e.g. per-domain joules and the CPU share (RAPL), per-device
        joules (NVML), the CPU/idle/GPU parts of an estimate.
    """

    joules: float
    source: str
    wall_s: float
    cpu_s: float
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def watts(self) -> float:
        """Mean power over the interval (0.0 for an empty interval)."""
        return self.joules / self.wall_s if self.wall_s > 0 else 0.0

    def since(self, earlier: EnergyReading) -> EnergyReading:
        """The interval between an earlier reading of the same meter and this one.

        Use it for per-batch figures: ``batch = meter.read().since(previous)``. ``detail`` of
        the result is empty (the details of readings are cumulative).

        Parameters
        ----------
        earlier : EnergyReading
            A reading taken before this one from the same meter.

        Returns
        -------
        EnergyReading
            Joules, wall seconds and CPU seconds of the interval, with this reading's source.
        """
        if earlier.source != self.source:
            raise ValueError(f"readings of different sources: {earlier.source!r} and {self.source!r}")
        return EnergyReading(
            joules=self.joules - earlier.joules,
            source=self.source,
            wall_s=self.wall_s - earlier.wall_s,
            cpu_s=self.cpu_s - earlier.cpu_s,
        )


@dataclass(frozen=True)
class Availability:
    """Whether an energy source can be used here, and why (or why not).

    Truthy when the source is usable, so ``if RaplMeter.available(): ...`` reads naturally.
    """

    ok: bool
    reason: str

    def __bool__(self) -> bool:
        return self.ok


class EnergyMeter(abc.ABC):
    """Measures (or estimates) the energy a tuning job spends.

    Subclasses implement :meth:`start` and :meth:`read`. A meter is cumulative: :meth:`read`
    returns the energy since :meth:`start` and may be called repeatedly. It is also a context
    manager that starts on entry. Meters are thread-safe.
    """

    #: The label of every figure this meter produces.
    source: str = ""

    @classmethod
    def available(cls) -> Availability:
        """Whether this kind of meter can run here (the default: always)."""
        return Availability(True, f"{cls.__name__}: always available")

    @abc.abstractmethod
    def start(self) -> None:
        """Take the baseline; later readings count from here. Calling it again restarts."""

    @abc.abstractmethod
    def read(self) -> EnergyReading:
        """Energy since :meth:`start` (cumulative).

        Raises
        ------
        RuntimeError
            If the meter was not started.
        """

    def __enter__(self) -> EnergyMeter:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


def _require(started: bool, meter: EnergyMeter) -> None:
    if not started:
        raise RuntimeError(f"{type(meter).__name__}.read() called before start()")


def _check_watts(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


# --------------------------------------------------------------------------------------------
# CPU time of a process tree
# --------------------------------------------------------------------------------------------


@dataclass
class _Seen:
    own: float  # user + system of the process itself, when last read
    reaped: float  # children_user + children_system: children it has waited for, when last read
    parent: psutil.Process | None  # its parent when last read, if that parent is tracked


def _as_roots(processes: Callable[[], Sequence[psutil.Process]] | psutil.Process | None
              ) -> Callable[[], Sequence[psutil.Process]]:
    if processes is None:
        me = psutil.Process()
        return lambda: [me]
    if isinstance(processes, psutil.Process):
        proc = processes
        return lambda: [proc]
    return processes


class ProcessTreeCpu:
    """CPU seconds (user + system) of root processes and all their descendants, ever.

    Two kernel facts make the count survive children that exit:

    * a process's ``children_user``/``children_system`` hold the CPU time of every child it
      has waited for (``wait``), including what those children had collected from theirs; so a
      builder or runner worker that lived and died between two samples is still counted, in its
      parent's figure;
    * every process seen is remembered (keyed by pid *and* creation time, so a reused pid is a
      different process) with its last-seen figures, so a descendant that is re-parented to init
      (its parent died first) is still followed, and when it exits without being waited for by
      a tracked process its last-seen CPU time is kept.

    A process that vanishes while its tracked parent is alive was waited for by that parent
    (its time moved into the parent's ``children_*`` figures) and is not counted twice.

    The result is a lower bound: CPU time of an orphaned descendant after its last sample is
    lost, and so is that of children of a parent that ignores ``SIGCHLD`` (auto-reaped). Call
    :meth:`sample` periodically -- at least at the end of every measured batch -- to keep what
    is lost small; :meth:`total` never decreases.

    Parameters
    ----------
    processes : callable returning processes, or psutil.Process, or None
        The roots of the job: a process, or a function returning the current roots (called at
        every sample). ``None``: this process. Roots should not be descendants of each other.
    """

    def __init__(self, processes: Callable[[], Sequence[psutil.Process]] | psutil.Process | None = None
                 ) -> None:
        self._roots = _as_roots(processes)
        self._live: dict[psutil.Process, _Seen] = {}
        self._absorbed: dict[psutil.Process, bool] = {}  # vanished process -> absorbed by a parent
        self._gone_s = 0.0  # last-seen CPU of vanished processes nobody tracked waited for
        self._total = 0.0
        self._lock = threading.Lock()

    def total(self) -> float:
        """CPU seconds as of the last :meth:`sample` (monotonic non-decreasing)."""
        return self._total

    @property
    def tracked(self) -> int:
        """How many processes of the tree are alive as of the last sample."""
        return len(self._live)

    def sample(self) -> float:
        """Read the tree now and return the updated :meth:`total`."""
        with self._lock:
            order = self._collect()
            now: dict[psutil.Process, _Seen] = {}
            by_pid = {p.pid: p for p in order}
            for proc in order:  # ancestors before descendants: see _collect
                try:
                    with proc.oneshot():
                        times = proc.cpu_times()
                        ppid = proc.ppid()
                except psutil.NoSuchProcess:
                    continue
                except psutil.AccessDenied:  # keep what was last seen of it
                    if proc in self._live:
                        now[proc] = self._live[proc]
                    continue
                parent = by_pid.get(ppid)
                now[proc] = _Seen(
                    own=times.user + times.system,
                    reaped=getattr(times, "children_user", 0.0) + getattr(times, "children_system", 0.0),
                    parent=parent if parent is not None and parent != proc else None,
                )
            vanished = [p for p in self._live if p not in now]
            for proc in vanished:
                self._settle(proc, now)
            for proc in vanished:
                del self._live[proc]
            self._live.update(now)
            parents = {s.parent for s in self._live.values() if s.parent is not None}
            self._absorbed = {p: fate for p, fate in self._absorbed.items() if p in parents}
            current = self._gone_s + sum(s.own + s.reaped for s in self._live.values())
            self._total = max(self._total, current)
            return self._total

    def _collect(self) -> list[psutil.Process]:
        """Roots, their descendants, and remembered descendants that left the tree (orphans).

        ``children(recursive=True)`` lists a parent before its children, so reading in this
        order reads a parent before its children: a child reaped in between is missed for one
        sample (a transient undercount), never counted twice.
        """
        order: list[psutil.Process] = []
        seen: set[psutil.Process] = set()

        def add_tree(root: psutil.Process) -> None:
            try:
                members = [root, *root.children(recursive=True)]
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                members = [root]
            for proc in members:
                if proc not in seen:
                    seen.add(proc)
                    order.append(proc)

        for root in self._roots():
            add_tree(root)
        for proc in list(self._live):
            if proc not in seen and proc.is_running():
                add_tree(proc)
        return order

    def _settle(self, proc: psutil.Process, now: Mapping[psutil.Process, _Seen]) -> bool:
        """Decide whether a vanished process was absorbed into a tracked parent's figures."""
        if proc in self._absorbed:
            return self._absorbed[proc]
        seen = self._live[proc]
        parent = seen.parent
        if parent is None:
            absorbed = False
        elif parent in now:
            absorbed = True  # a live parent reaped it: its time is in the parent's children_*
        elif parent in self._absorbed:
            absorbed = self._absorbed[parent]
        elif parent in self._live:  # vanished in the same interval: follow the parent's fate
            absorbed = self._settle(parent, now)
        else:
            absorbed = False
        self._absorbed[proc] = absorbed
        if not absorbed:
            self._gone_s += seen.own + seen.reaped
        return absorbed


def machine_busy_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot, all CPUs together.

    The sum of ``user``, ``nice``, ``system``, ``irq`` and ``softirq`` of
    :func:`psutil.cpu_times` -- total minus ``idle`` and ``iowait``, leaving out ``steal``
    (time a hypervisor ran someone else) and ``guest``/``guest_nice`` (already inside
    ``user``/``nice`` on Linux).
    """
    times = psutil.cpu_times()
    return float(sum(getattr(times, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq")))


def _cpu_source(processes: Callable[[], Sequence[psutil.Process]] | psutil.Process | None,
                cpu_seconds: Callable[[], float] | None) -> Callable[[], float]:
    if cpu_seconds is not None:
        if processes is not None:
            raise ValueError("give processes or cpu_seconds, not both")
        return cpu_seconds
    return ProcessTreeCpu(processes).sample


# --------------------------------------------------------------------------------------------
# RAPL
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RaplDomain:
    """A RAPL package domain: ``<powercap_root>/intel-rapl:N``.

    Attributes
    ----------
    name : str
        Its ``name`` file (``package-0``), or the directory name if that is missing.
    path : Path
        The domain's directory.
    max_range_uj : int or None
        ``max_energy_range_uj``: the counter wraps to 0 after this value; None if unreadable.
    """

    name: str
    path: Path
    max_range_uj: int | None

    def energy_uj(self) -> int:
        """The counter now, in microjoules (raises ``OSError`` if unreadable)."""
        return _read_int(self.path / "energy_uj")


def _read_int(path: Path) -> int:
    with open(path, encoding="ascii") as fh:
        return int(fh.read().strip())


def rapl_domains(powercap_root: str | Path = DEFAULT_POWERCAP_ROOT) -> list[RaplDomain]:
    """The package domains under a powercap root, in index order.

    Only top-level ``intel-rapl:N`` zones are packages; their sub-zones (``intel-rapl:N:M``:
    core, uncore, dram) and ``intel-rapl-mmio`` duplicates are skipped, and so is a ``psys``
    zone (the whole platform, which already contains the packages).

    Parameters
    ----------
    powercap_root : str or Path
        Usually ``/sys/class/powercap``.

    Returns
    -------
    list of RaplDomain
        Empty if the root does not exist or holds no package zone.
    """
    root = Path(powercap_root)
    if not root.is_dir():
        return []
    found: list[tuple[int, RaplDomain]] = []
    for entry in root.iterdir():
        match = _PACKAGE_DIR.match(entry.name)
        if not match or not entry.is_dir():
            continue
        try:
            name = (entry / "name").read_text(encoding="ascii").strip() or entry.name
        except (OSError, UnicodeDecodeError):
            name = entry.name
        if name == "psys":
            continue
        try:
            max_range: int | None = _read_int(entry / "max_energy_range_uj")
        except (OSError, ValueError):
            max_range = None
        found.append((int(match.group(1)), RaplDomain(name, entry, max_range)))
    return [domain for _, domain in sorted(found, key=lambda item: item[0])]


def _rapl_availability(powercap_root: str | Path) -> Availability:
    root = Path(powercap_root)
    if not root.exists():
        return Availability(False, f"no RAPL: {root} absent")
    domains = rapl_domains(root)
    if not domains:
        return Availability(False, f"no RAPL: no intel-rapl:N package zone under {root}")
    for domain in domains:
        path = domain.path / "energy_uj"
        try:
            domain.energy_uj()
        except PermissionError:
            return Availability(False, f"no RAPL: {path} not readable (permission denied; "
                                       "kernels since 5.10 make energy_uj readable by root only)")
        except (OSError, ValueError) as exc:
            return Availability(False, f"no RAPL: {path} unreadable ({exc})")
    return Availability(True, f"RAPL: {len(domains)} package domain(s) under {root}")


class RaplMeter(EnergyMeter):
    """Package energy from RAPL counters, split by the job's share of the machine's CPU time.

    For every interval between two reads: the package energy (all packages, wrap-around
    handled) x share, where share = job CPU seconds / machine busy CPU seconds in the interval,
    clipped to [0, 1]. The split is per interval, so a share that changes over the job is
    followed as closely as the job reads.

    Read often enough: a counter that wraps more than once between two reads cannot be told
    from one that wrapped once. ``max_energy_range_uj`` is typically 2^32 to 2^38 uJ, which a
    busy package wraps in minutes to hours; reading at every batch end is plenty.

    Only the packages are measured (no DRAM sub-zone, no rest of the node), and idle watts are
    not added: RAPL figures are lower than estimates of the same work.

    Parameters
    ----------
    powercap_root : str or Path
        Usually ``/sys/class/powercap``.
    processes : callable or psutil.Process, optional
        Roots of the job's process tree (see :class:`ProcessTreeCpu`); default this process.
    cpu_seconds : callable, optional
        Instead of ``processes``: a function returning the job's cumulative CPU seconds.
    machine_cpu_seconds : callable, optional
        A function returning the machine's cumulative busy CPU seconds; default
        :func:`machine_busy_cpu_seconds`.
    clock : callable, optional
        Monotonic seconds for wall time; default :func:`time.monotonic`.
    """

    source = "rapl"

    def __init__(self, powercap_root: str | Path = DEFAULT_POWERCAP_ROOT,
                 processes: Callable[[], Sequence[psutil.Process]] | psutil.Process | None = None, *,
                 cpu_seconds: Callable[[], float] | None = None,
                 machine_cpu_seconds: Callable[[], float] | None = None,
                 clock: _Clock = time.monotonic) -> None:
        self.powercap_root = Path(powercap_root)
        self._cpu = _cpu_source(processes, cpu_seconds)
        self._machine = machine_cpu_seconds or machine_busy_cpu_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._domains: list[RaplDomain] = []
        self._started = False

    @classmethod
    def available(cls, powercap_root: str | Path = DEFAULT_POWERCAP_ROOT) -> Availability:
        """Whether package counters exist under ``powercap_root`` and can be read."""
        return _rapl_availability(powercap_root)

    @property
    def domains(self) -> list[RaplDomain]:
        """The package domains in use (after :meth:`start`)."""
        return list(self._domains)

    def start(self) -> None:
        with self._lock:
            status = _rapl_availability(self.powercap_root)
            if not status:
                raise EnergySourceUnavailable(f"cannot measure energy with RAPL: {status.reason}")
            self._domains = rapl_domains(self.powercap_root)
            self._last_uj = {d.name: d.energy_uj() for d in self._domains}
            self._package_j = {d.name: 0.0 for d in self._domains}
            self._wraps = 0
            self._job_j = 0.0
            self._cpu0 = self._last_cpu = self._cpu()
            self._machine0 = self._last_machine = self._machine()
            self._t0 = self._clock()
            self._started = True

    def read(self) -> EnergyReading:
        with self._lock:
            _require(self._started, self)
            interval_j = 0.0
            for domain in self._domains:
                new = domain.energy_uj()
                old = self._last_uj[domain.name]
                if new >= old:
                    delta = new - old
                else:
                    self._wraps += 1
                    if domain.max_range_uj is not None:
                        delta = domain.max_range_uj - old + new
                    else:  # cannot know the range: count from 0 (a lower bound)
                        logger.warning("RAPL counter %s went backwards without max_energy_range_uj; "
                                       "counting from 0", domain.path)
                        delta = new
                self._last_uj[domain.name] = new
                self._package_j[domain.name] += delta / 1e6
                interval_j += delta / 1e6
            cpu, machine = self._cpu(), self._machine()
            d_cpu, d_machine = cpu - self._last_cpu, machine - self._last_machine
            share = min(1.0, max(0.0, d_cpu / d_machine)) if d_machine > 0 else 0.0
            self._job_j += share * interval_j
            self._last_cpu, self._last_machine = cpu, machine
            package_total = sum(self._package_j.values())
            return EnergyReading(
                joules=self._job_j,
                source=self.source,
                wall_s=self._clock() - self._t0,
                cpu_s=cpu - self._cpu0,
                detail={
                    "package_joules": dict(self._package_j),
                    "cpu_share": self._job_j / package_total if package_total > 0 else 0.0,
                    "machine_cpu_s": machine - self._machine0,
                    "wraps": self._wraps,
                },
            )


# --------------------------------------------------------------------------------------------
# NVML
# --------------------------------------------------------------------------------------------

_nvml_lock = threading.Lock()
_nvml_module: Any = None
_nvml_handles: dict[int, Any] = {}


def _nvml() -> Any:
    """The ``pynvml`` module (from ``nvidia-ml-py``), initialised once per process."""
    global _nvml_module
    with _nvml_lock:
        if _nvml_module is None:
            import pynvml  # the nvidia-ml-py distribution; imported only when NVML is wanted

            pynvml.nvmlInit()
            _nvml_module = pynvml
        return _nvml_module


def nvml_device_count() -> int:
    """Number of GPUs NVML sees (all of the node's or container's, ignoring CUDA_VISIBLE_DEVICES)."""
    return int(_nvml().nvmlDeviceGetCount())


def nvml_total_energy_mj(index: int) -> float:
    """Energy a GPU has consumed since the driver was loaded, in millijoules (Volta and newer)."""
    nvml = _nvml()
    handle = _nvml_handles.get(index)
    if handle is None:
        handle = _nvml_handles[index] = nvml.nvmlDeviceGetHandleByIndex(index)
    return float(nvml.nvmlDeviceGetTotalEnergyConsumption(handle))


@functools.lru_cache(maxsize=1)
def _nvml_availability() -> Availability:
    try:
        import pynvml  # noqa: F401
    except ImportError:
        return Availability(False, "no NVML: nvidia-ml-py not installed")
    try:
        count = nvml_device_count()
    except Exception as exc:  # pynvml.NVMLError and friends: no driver, no library
        return Availability(False, f"no NVML: {type(exc).__name__}: {exc}")
    if count == 0:
        return Availability(False, "no NVML: no GPU")
    for index in range(count):
        try:
            nvml_total_energy_mj(index)
        except Exception as exc:
            return Availability(False, f"no NVML: GPU {index} has no total energy counter "
                                       f"({type(exc).__name__}: {exc})")
    return Availability(True, f"NVML: {count} GPU(s)")


class NvmlMeter(EnergyMeter):
    """Total energy of NVIDIA GPUs from NVML, in joules (the counter is in millijoules).

    The whole devices' energy is charged to the job: a GPU node is held for it.

    Parameters
    ----------
    device_indices : sequence of int, optional
        The GPUs to sum; default all GPUs NVML sees. Required with ``reader``.
    reader : callable, optional
        ``reader(index) -> millijoules`` (cumulative). Default :func:`nvml_total_energy_mj`;
        inject one in tests.
    clock : callable, optional
        Monotonic seconds for wall time; default :func:`time.monotonic`.
    """

    source = "nvml"

    def __init__(self, device_indices: Sequence[int] | None = None,
                 reader: Callable[[int], float] | None = None, *, clock: _Clock = time.monotonic) -> None:
        if reader is not None and device_indices is None:
            raise ValueError("an injected NVML reader needs device_indices")
        self._indices = list(device_indices) if device_indices is not None else None
        self._reader = reader or nvml_total_energy_mj
        self._clock = clock
        self._lock = threading.Lock()
        self._started = False

    @classmethod
    def available(cls) -> Availability:
        """Whether NVML loads and every GPU reports total energy (probed once per process)."""
        return _nvml_availability()

    def start(self) -> None:
        with self._lock:
            if self._indices is None:
                self._indices = list(range(nvml_device_count()))
            self._last_mj = {i: float(self._reader(i)) for i in self._indices}
            self._device_j = {i: 0.0 for i in self._indices}
            self._t0 = self._clock()
            self._started = True

    def read(self) -> EnergyReading:
        with self._lock:
            _require(self._started, self)
            for index in self._device_j:
                new = float(self._reader(index))
                old = self._last_mj[index]
                if new < old:  # the driver was reloaded: the counter restarted from 0
                    logger.warning("NVML energy counter of GPU %d went backwards; counting from 0", index)
                    delta = new
                else:
                    delta = new - old
                self._last_mj[index] = new
                self._device_j[index] += delta / 1000.0
            return EnergyReading(
                joules=sum(self._device_j.values()),
                source=self.source,
                wall_s=self._clock() - self._t0,
                cpu_s=0.0,
                detail={"device_joules": dict(self._device_j)},
            )


# --------------------------------------------------------------------------------------------
# Estimate and composite
# --------------------------------------------------------------------------------------------


class EstimateMeter(EnergyMeter):
    """Energy estimated from CPU time and the hardware class's power figures.

    ``joules = cpu_s x watts_per_core + (idle_watts + gpu_watts) x wall_s``

    ``cpu_s`` counts the job's whole process tree, builder/runner workers included (also those
    that exited; see :class:`ProcessTreeCpu`). The idle watts are charged to the job for its
    whole wall time because the node is held for it (two jobs sharing a node are each charged).
    ``gpu_watts`` (watts per GPU x GPUs) is for a GPU class whose GPUs cannot be read.

    Parameters
    ----------
    watts_per_core : float
        Watts one busy core adds.
    idle_watts : float
        Watts the node draws doing nothing.
    processes : callable or psutil.Process, optional
        Roots of the job's process tree; default this process.
    gpu_watts : float, optional
        Watts charged per wall second for GPUs.
    cpu_seconds : callable, optional
        Instead of ``processes``: a function returning the job's cumulative CPU seconds.
    clock : callable, optional
        Monotonic seconds for wall time; default :func:`time.monotonic`.
    """

    source = "estimate"

    def __init__(self, watts_per_core: float, idle_watts: float,
                 processes: Callable[[], Sequence[psutil.Process]] | psutil.Process | None = None, *,
                 gpu_watts: float = 0.0, cpu_seconds: Callable[[], float] | None = None,
                 clock: _Clock = time.monotonic) -> None:
        self.watts_per_core = _check_watts("watts_per_core", watts_per_core)
        self.idle_watts = _check_watts("idle_watts", idle_watts)
        self.gpu_watts = _check_watts("gpu_watts", gpu_watts)
        self._cpu = _cpu_source(processes, cpu_seconds)
        self._clock = clock
        self._lock = threading.Lock()
        self._started = False

    def start(self) -> None:
        with self._lock:
            self._cpu0 = self._cpu()
            self._t0 = self._clock()
            self._started = True

    def read(self) -> EnergyReading:
        with self._lock:
            _require(self._started, self)
            cpu_s = max(0.0, self._cpu() - self._cpu0)
            wall_s = self._clock() - self._t0
            cpu_j = cpu_s * self.watts_per_core
            idle_j = self.idle_watts * wall_s
            gpu_j = self.gpu_watts * wall_s
            return EnergyReading(
                joules=cpu_j + idle_j + gpu_j,
                source=self.source,
                wall_s=wall_s,
                cpu_s=cpu_s,
                detail={"cpu_joules": cpu_j, "idle_joules": idle_j, "gpu_joules": gpu_j,
                        "watts_per_core": self.watts_per_core, "idle_watts": self.idle_watts,
                        "gpu_watts": self.gpu_watts},
            )


class CompositeMeter(EnergyMeter):
    """The sum of several meters (e.g. NVML for the GPUs, RAPL or an estimate for the host).

    The source is the parts' sources joined by ``+`` (``"nvml+estimate"``); ``cpu_s`` and
    ``wall_s`` are the largest of the parts' (they watch the same job).
    """

    def __init__(self, meters: Sequence[EnergyMeter]) -> None:
        if not meters:
            raise ValueError("a composite meter needs at least one meter")
        self.meters = list(meters)
        self.source = "+".join(m.source for m in self.meters)

    def start(self) -> None:
        for meter in self.meters:
            meter.start()

    def read(self) -> EnergyReading:
        parts = [meter.read() for meter in self.meters]
        return EnergyReading(
            joules=sum(p.joules for p in parts),
            source=self.source,
            wall_s=max(p.wall_s for p in parts),
            cpu_s=max(p.cpu_s for p in parts),
            detail={"parts": [{"source": p.source, "joules": p.joules, "detail": p.detail} for p in parts]},
        )


# --------------------------------------------------------------------------------------------
# Choosing the source
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sources:
    """What :func:`detect_sources` found: RAPL's and (for GPU targets) NVML's availability."""

    rapl: Availability
    nvml: Availability | None

    @property
    def source(self) -> str:
        """The label the chosen meter's figures will carry."""
        cpu = "rapl" if self.rapl else "estimate"
        if self.nvml is None:
            return cpu
        if self.nvml:
            return f"nvml+{cpu}"
        return "rapl+estimate" if self.rapl else "estimate"

    @property
    def reason(self) -> str:
        """Why: RAPL's (and NVML's) availability reasons."""
        reasons = [self.rapl.reason] + ([self.nvml.reason] if self.nvml is not None else [])
        return "; ".join(reasons)


def _target_kind(target: str | Mapping[str, Any]) -> str:
    if isinstance(target, Mapping):
        return str(target.get("kind", "llvm")).lower()
    return target.split()[0].lower() if target.strip() else "llvm"


@functools.lru_cache(maxsize=None)
def detect_sources(powercap_root: str = DEFAULT_POWERCAP_ROOT, gpu: bool = False) -> Sources:
    """Probe the energy sources once per process (per arguments) and log the choice at INFO.

    Parameters
    ----------
    powercap_root : str
        Where to look for RAPL zones.
    gpu : bool
        Whether to probe NVML too (GPU targets only; CPU targets never load NVML).

    Returns
    -------
    Sources
        Cached: later calls with the same arguments return the same object without probing
        or logging again (see :func:`clear_probe_cache`).
    """
    found = Sources(rapl=RaplMeter.available(powercap_root),
                    nvml=NvmlMeter.available() if gpu else None)
    logger.info("energy source: %s (%s)", found.source, found.reason)
    return found


def clear_probe_cache() -> None:
    """Forget probed sources (for tests, or after installing drivers): the next probe re-probes."""
    detect_sources.cache_clear()
    _nvml_availability.cache_clear()


def probe(hardware_target_kind: str | Mapping[str, Any] = "llvm", *, watts_per_core: float,
          idle_watts: float, watts_per_gpu: float = 0.0, gpu_count: int = 1,
          powercap_root: str | Path = DEFAULT_POWERCAP_ROOT,
          processes: Callable[[], Sequence[psutil.Process]] | psutil.Process | None = None) -> EnergyMeter:
    """A fresh, unstarted meter for a job on this node, using the best source available.

    CPU targets: RAPL if its counters can be read, else an estimate. GPU targets (``cuda``,
    ``nvptx``): NVML plus the CPU meter (``nvml+rapl`` or ``nvml+estimate``) if NVML works;
    else the GPUs are estimated as ``watts_per_gpu x gpu_count x wall`` -- source
    ``estimate``, or ``rapl+estimate`` when RAPL measures the host. Sources are probed and the
    choice logged once per process (:func:`detect_sources`); each call returns a new meter.

    Parameters
    ----------
    hardware_target_kind : str or mapping
        The TVM target kind (``"llvm"``, ``"cuda"``), a target string, or a target dict.
    watts_per_core, idle_watts, watts_per_gpu : float
        The hardware class's power figures (used by estimates).
    gpu_count : int
        GPUs on the node, for a GPU estimate.
    powercap_root : str or Path
        Where to look for RAPL zones.
    processes : callable or psutil.Process, optional
        Roots of the job's process tree; default this process.

    Returns
    -------
    EnergyMeter
        Call :meth:`~EnergyMeter.start` before the job and :meth:`~EnergyMeter.read` at every
        batch end.
    """
    gpu = _target_kind(hardware_target_kind) in GPU_TARGET_KINDS
    found = detect_sources(str(powercap_root), gpu)
    gpu_watts = _check_watts("watts_per_gpu", watts_per_gpu) * max(0, int(gpu_count)) if gpu else 0.0
    if found.rapl:
        host: EnergyMeter = RaplMeter(powercap_root, processes)
    else:
        host = EstimateMeter(watts_per_core, idle_watts, processes,
                             gpu_watts=0.0 if (found.nvml or not gpu) else gpu_watts)
    if not gpu:
        return host
    if found.nvml:
        return CompositeMeter([NvmlMeter(), host])
    if found.rapl:  # GPUs unreadable, host measured: estimate the GPUs alone
        return CompositeMeter([host, EstimateMeter(0.0, 0.0, cpu_seconds=lambda: 0.0, gpu_watts=gpu_watts)])
    return host


# --------------------------------------------------------------------------------------------
# Money and apportioning
# --------------------------------------------------------------------------------------------


def money(price_per_hour: float, wall_s: float) -> float:
    """Cost of holding a node: ``price_per_hour x wall_s / 3600``.

    Parameters
    ----------
    price_per_hour : float
        The hardware class's price per node-hour.
    wall_s : float
        Seconds the node was held.
    """
    price_per_hour, wall_s = float(price_per_hour), float(wall_s)
    if not (math.isfinite(price_per_hour) and math.isfinite(wall_s)) or price_per_hour < 0 or wall_s < 0:
        raise ValueError(f"price_per_hour and wall_s must be finite and >= 0, got {price_per_hour!r}, {wall_s!r}")
    return price_per_hour * wall_s / 3600.0


def apportion(total: float, weights: Sequence[float] | int) -> list[float]:
    """Split ``total`` in proportion to ``weights``; the parts sum exactly to ``total``.

    Typical use: a batch's energy split over its candidates by their build + run seconds.

    Parameters
    ----------
    total : float
        What to split (joules, money).
    weights : sequence of float, or int
        Non-negative weights, one per part; all zero means equal parts. An int ``n`` means
        ``n`` equal parts.

    Returns
    -------
    list of float
        One part per weight, with the sign of ``total``. ``sum(parts) == total`` holds exactly
        in floating point (in the rare case where no one-part nudge achieves it -- about one in
        100,000 random inputs -- ``math.fsum(parts) == total`` holds instead).

    Raises
    ------
    ValueError
        For a negative or non-finite weight, or no parts for a non-zero total.
    """
    if isinstance(weights, int):
        if weights < 0:
            raise ValueError(f"the number of parts must be >= 0, got {weights}")
        weights = [1.0] * weights
    w = [float(x) for x in weights]
    if any(not math.isfinite(x) or x < 0 for x in w):
        raise ValueError(f"weights must be finite and >= 0, got {w}")
    if not w:
        if total != 0:
            raise ValueError(f"cannot apportion {total!r} over no parts")
        return []
    weight_sum = math.fsum(w)
    if weight_sum == 0:
        w, weight_sum = [1.0] * len(w), float(len(w))
    parts = [total * x / weight_sum for x in w]
    return _exact_sum(parts, total)


def _exact_sum(parts: list[float], total: float) -> list[float]:
    """Nudge one part by a few ulps so that the parts add up to ``total`` exactly.

    Aim: ``sum(parts) == total`` with Python's own ``sum``. The last non-zero part controls
    the final rounding of a left-to-right sum, so it is solved for first; then the larger parts
    below half the total. If none lands exactly (round-half-even can skip every other value; a
    few in 100,000 random cases), ``math.fsum(parts) == total`` is made to hold instead, which
    moving a part below half the total always achieves.
    """
    nonzero = [i for i, x in enumerate(parts) if x != 0]
    if len(nonzero) <= 1:
        if nonzero:
            parts[nonzero[0]] = total
        return parts
    if sum(parts) == total:
        return parts
    by_size = sorted(nonzero, key=lambda i: abs(parts[i]))
    small = [i for i in by_size if abs(parts[i]) <= abs(total) / 2] or by_size
    last = nonzero[-1]
    for index in dict.fromkeys([last, *reversed(small[-4:])]):
        others = sum(parts[:index]) + sum(parts[index + 1:]) if index != last else sum(parts[:index])
        solved = _step_until(parts, index, total - others, total, sum)
        if solved is not None:
            return solved
    index = small[-1]
    others = math.fsum(parts[:index] + parts[index + 1:])
    return _step_until(parts, index, total - others, total, math.fsum) or parts


def _step_until(parts: list[float], index: int, start: float, total: float,
                adder: Callable[[list[float]], float], limit: int = 64) -> list[float] | None:
    """Set ``parts[index]`` to ``start``, then move it ulp by ulp until ``adder(parts) == total``."""
    if start != 0 and (start < 0) != (parts[index] < 0):
        return None  # would flip the part's sign
    trial = list(parts)
    trial[index] = start
    for _ in range(limit):
        current = adder(trial)
        if current == total:
            return trial
        trial[index] = math.nextafter(trial[index], math.inf if current < total else -math.inf)
    return None
