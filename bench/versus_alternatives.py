"""Is the tuned model faster than what its user would run instead, on the same threads?

Usage::

    python bench/versus_alternatives.py resnet18                       # 15 min, then 60 min more
    python bench/versus_alternatives.py bert-base --budget 15m --more 0 --json bert.json
    python bench/versus_alternatives.py mlp --trials 2 --more 0        # a smoke run (a minute or two)
    python bench/versus_alternatives.py resnet18 --trials 1 --more 0   # a smoke run with every alternative

One model per invocation (a zoo name: resnet18, mobilenet_v2, bert-base, ...; mlp and small-cnn
for smoke runs). The bench drives the CLI the way a user does, then measures in its own process:

1. Phase 1: ``tunefleet run --model MODEL --hardware HW --budget 15m --json --output-dir DIR`` (or
   ``--trials N`` instead of ``--budget``) in a subprocess, with the bench's own ``TUNEFLEET_HOME``
   (``--home``; reusing it continues the same database; a second bench run on a home in use
   stops at once, as its timings would skew each other). Phase 2 (``--more``, default ``60m``;
   ``--more 0`` skips it; ``--more-trials N`` passes ``--trials N`` instead) runs the same command
   again on the same database. Each phase's wall time is recorded and its JSON result parsed (the
   build's exported library ``output`` and the CLI's own ``tuned_ms``).
2. After each phase: the exported library (``tvm.runtime.load_module`` -> ``relax.VirtualMachine``)
   is timed alternating with PyTorch eager, ``torch.compile`` (default mode; its compile time,
   from a cold inductor cache, is reported apart) and onnxruntime (the same torch module exported
   with ``torch.onnx.export(..., dynamo=False)``; ORT_ENABLE_ALL, intra-op threads = the thread
   count, inter-op 1): same inputs,
   same thread count (the hardware class's ``num-cores``, else 2; ``--threads``), the median of
   ``--rounds`` alternating rounds (the order rotates each round), each round the median of several
   calls after warm-up. Every call is timed the same way (wall clock around one call from Python),
   by ``tunefleet.delivery.timing.time_alternating``: the function ``tunefleet run``'s build report
   times the tuned build, PyTorch eager and onnxruntime with.
   Each output is compared with PyTorch eager (max abs diff). An alternative that cannot run prints
   ``not measured: <reason>``. ``mlp`` has no PyTorch module in the zoo: the bench rebuilds the same
   three layers in PyTorch with the zoo's weights (the max abs diff shows they agree).
3. Machine peak: fp32 BLAS sgemm (numpy float32 matmul, 2048^3 by default) on the same threads
   (OPENBLAS_NUM_THREADS / OMP_NUM_THREADS / MKL_NUM_THREADS are set before numpy is imported; the
   thread count OpenBLAS reports is printed), in GFLOP/s: the fastest of 10 (the median printed
   beside it), measured after the tuning run and again after each phase's timings, the faster
   kept. Each timed runtime's GFLOP/s on the model's nominal work (PyTorch's FLOP counter on the
   eager module: convolutions and matrix products as direct products) as a share of that peak: a
   runtime near 1.0 has no faster direct kernels left to find, only fewer multiplications
   (Winograd).
4. The ten workloads with the largest latency share (weight x best mean run time on the class),
   read from the database: name, op kind, weight, best latency, share of the model's summed
   latency, GFLOP/s and fraction of the sgemm peak; and the tuning wall time, candidates measured
   and seconds per measured candidate.

``--hub off|default|BUNDLE`` sets the runs' ``TUNEFLEET_HUB`` (a fresh ``--home`` imports that
hub bundle first; ``off``: tuning from scratch) and each phase prints run's ``hub:`` line: how many
workloads started from the hub. ``--compare LABEL=LIBRARY`` (repeatable) times another exported
library in the same rounds, e.g. an earlier run's under another recipe; phase 2 times phase 1's
library in its rounds too (``tuned after phase 1``), so what the more minutes bought is a ratio
from one timing, not a difference between two (this VM's speed moves between timings minutes
apart, and not by the same factor for every runtime). ``--json PATH`` writes everything measured as JSON (docs/performance.md's table is filled from
it). Prints what it measured; asserts nothing about speed. Needs ``pip install -e '.[bench]'``
(PyTorch and transformers; onnx and onnxruntime are tunefleet's own dependencies).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The one timing function, shared with `tunefleet run`'s build report; imports only the standard
# library, so the thread variables are still set before numpy loads (pin_threads).
from tunefleet.delivery import placement
from tunefleet.delivery.timing import ROUNDS, time_alternating

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_WORK_DIR = Path(tempfile.gettempdir()) / "tunefleet-bench" / "versus_alternatives"
DEFAULT_THREADS = 2
ALTERNATIVES = ("torch eager", "torch.compile", "onnxruntime")
TOP_WORKLOADS = 10
INSTALL_HINT = "pip install -e '.[bench]'"


# -- phases: the CLI as a user runs it -------------------------------------------------------------

def tunefleet_command() -> list[str]:
    """The ``tunefleet`` console script of this interpreter's environment, else ``python -m tunefleet.cli.app``."""
    script = Path(sys.executable).parent / "tunefleet"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "tunefleet.cli.app"]


def run_phase(name: str, args: argparse.Namespace, amount: list[str], output_dir: Path,
              env: dict[str, str]) -> dict[str, Any]:
    """One ``tunefleet run --json``: its wall time, exit status and parsed result.

    stderr (the log path and the live progress line) goes to this terminal; stdout is the JSON.
    """
    cmd = [*tunefleet_command(), "run", "--model", args.model, "--hardware", args.hardware, *amount,
           "--json", "--output-dir", str(output_dir)]
    for flag in ("batch_size", "image_size", "seq_len"):
        if getattr(args, flag) is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    print(f"== {name}: {' '.join(cmd[len(tunefleet_command()):])}", flush=True)
    start = time.perf_counter()
    proc = subprocess.run(cmd, check=False, stdout=subprocess.PIPE, text=True, env=env)
    wall = time.perf_counter() - start
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        error = (f"{name} exited {proc.returncode} without a JSON result (stdout: {proc.stdout.strip()[-500:]!r}); "
                 "see its error line above")
        print(f"   {error}", flush=True)
        return {"name": name, "command": cmd, "returncode": proc.returncode, "wall_s": wall, "error": error,
                "library": None}
    if proc.returncode != 0:
        print(f"   {name} exited {proc.returncode} (some shards failed); measuring what it built", flush=True)
    tuned = (result.get("tuned") or {}).get(args.hardware) or {}
    build = (result.get("builds") or [{}])[0]
    phase = {"name": name, "command": cmd, "returncode": proc.returncode, "wall_s": wall,
             "tune_s": tuned.get("seconds"), "measured": tuned.get("measured"), "errors": tuned.get("errors"),
             "shards_done": tuned.get("shards_done"), "shards_failed": tuned.get("shards_failed"),
             "library": build.get("output"), "cli_tuned_ms": build.get("tuned_ms"),
             "cli_untuned_ms": build.get("untuned_ms"), "cli_torch_ms": build.get("torch_ms"),
             "cli_onnxruntime_ms": build.get("onnxruntime_ms"), "cli_placement_line": build.get("placement_line"),
             "tuned_workloads": build.get("tuned_workloads"), "workloads": build.get("workloads"),
             "model_id": (result.get("models") or [{}])[0].get("model_id"), "hub": result.get("hub"),
             "run_result": result}
    print(f"   {name}: {wall:.0f} s wall; tune {_fmt(phase['tune_s'], '.0f')} s, {phase['measured']} candidates "
          f"measured ({phase['errors']} errors); {phase['tuned_workloads']}/{phase['workloads']} workloads tuned; "
          f"library {phase['library']}", flush=True)
    if phase["hub"]:
        print(f"   hub: {phase['hub']}", flush=True)
    return phase


# -- threads ---------------------------------------------------------------------------------------

def pin_threads(threads: int) -> None:
    """Every runtime in this process on ``threads`` threads; before numpy, TVM or torch is imported."""
    if "numpy" in sys.modules:
        print("   warning: numpy was imported before the thread count was set; BLAS may use another count")
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "TVM_NUM_THREADS"):
        os.environ[var] = str(threads)


def _openblas(symbols: tuple[str, ...]) -> Any:
    """The first of ``symbols`` in the OpenBLAS numpy loaded, or None if it is not OpenBLAS."""
    import ctypes

    import numpy  # noqa: F401 - loads the BLAS library into this process

    try:
        with open("/proc/self/maps", encoding="utf-8") as fh:
            libs = {line.split()[-1] for line in fh if "openblas" in line.lower() and line.split()[-1].startswith("/")}
    except OSError:
        return None
    for lib in sorted(libs):
        handle = ctypes.CDLL(lib)
        for symbol in symbols:
            fn = getattr(handle, symbol, None)
            if fn is not None:
                return fn
    return None


def blas_threads() -> int | None:
    """The thread count OpenBLAS (numpy's BLAS) reports, or None if it is not OpenBLAS."""
    fn = _openblas(("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads"))
    return None if fn is None else int(fn())


def blas_core() -> str | None:
    """The CPU core type OpenBLAS runs its kernels for (``OPENBLAS_CORETYPE`` sets it), or None."""
    import ctypes

    fn = _openblas(("scipy_openblas_get_corename64_", "openblas_get_corename64_", "openblas_get_corename"))
    if fn is None:
        return None
    fn.restype = ctypes.c_char_p
    return fn().decode()


def default_coretype(hardware: str) -> str | None:
    """The ``OPENBLAS_CORETYPE`` of a class's sgemm peak: Haswell (AVX2) for ``x86-avx2``;
    SkylakeX (AVX-512) for the native ``x86`` class on a CPU with AVX-512F, since OpenBLAS runs
    its AVX2 kernels on an AVX-512 CPU it does not know (Zen 5: core Haswell), which would halve
    the reference; else None (OpenBLAS picks)."""
    from tunefleet.hardware import host_cpu

    if hardware == "x86-avx2":
        return "Haswell"
    if hardware == "x86" and "avx512f" in (host_cpu().get("isa") or []):
        return "SkylakeX"
    return None


def matmul_times(a: Any, b: Any, repeat: int) -> list[float]:
    """Seconds of each of ``repeat`` calls of numpy's ``a @ b``, after one warm-up call."""
    a @ b
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t)
    return times


def sgemm_peak(n: int, repeat: int = 10) -> dict[str, Any]:
    """fp32 GFLOP/s of numpy's BLAS on an n x n x n matmul: the fastest of ``repeat`` after one
    warm-up. A peak, so the fastest: a busy moment slows some repeats, never speeds one up."""
    import numpy as np

    rng = np.random.default_rng(0)
    times = matmul_times(rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32),
                         repeat)
    seconds = min(times)
    return {"n": n, "seconds": seconds, "median_seconds": statistics.median(times),
            "gflops": 2.0 * n ** 3 / seconds / 1e9, "blas_threads": blas_threads(), "blas_core": blas_core()}


def median_gflops(peak: dict[str, Any]) -> float:
    """The GFLOP/s of the median repeat of a :func:`sgemm_peak`: printed beside the fastest, which
    the shares are read against, so that a lone fast repeat shows."""
    return 2.0 * peak["n"] ** 3 / peak["median_seconds"] / 1e9


# -- the model and its alternatives ----------------------------------------------------------------

def _torch_mlp(zoo: Any) -> Any:
    """The zoo's ``mlp`` in PyTorch with the same weights (zoo.py's ``_build_nn`` drawing rule)."""
    import numpy as np
    import torch

    from tunefleet.models.zoo import _NN_BUILDERS, ZOO_SEED

    module, spec = _NN_BUILDERS["mlp"](zoo.metadata["options"])
    _, params = module.export_tvm(spec={"forward": spec})
    rng = np.random.default_rng(ZOO_SEED)
    state = {}
    for name, param in params:
        shape = tuple(int(s) for s in param.shape)
        std = float(np.sqrt(2.0 / int(np.prod(shape[1:])))) if len(shape) > 1 else 0.01
        state[name] = torch.from_numpy((rng.standard_normal(shape) * std).astype("float32"))

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = torch.nn.Linear(64, 128)
            self.fc2 = torch.nn.Linear(128, 128)
            self.fc3 = torch.nn.Linear(128, 10)

        def forward(self, x: Any) -> Any:
            return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))

    mlp = MLP()
    mlp.load_state_dict(state)
    return mlp.eval()


def torch_module(zoo: Any) -> tuple[Any, str | None]:
    """(the eager module, None) or (None, why there is none)."""
    if zoo.torch_module is not None:
        return zoo.torch_module, None
    if zoo.name == "mlp":
        try:
            import torch  # noqa: F401
        except ImportError:
            return None, f"PyTorch is not installed ({INSTALL_HINT})"
        return _torch_mlp(zoo), None
    return None, f"zoo model {zoo.name} has no PyTorch module"


def nominal_flops(zoo: Any, inputs_np: list[Any]) -> tuple[float | None, str | None]:
    """(the model's floating-point operations per call as PyTorch's FLOP counter sees them, None),
    or (None, why not). The counter counts convolutions and matrix products as direct products
    (2 per multiply-add) and nothing else: the work every runtime has before any algorithm that
    does fewer multiplications (Winograd), so a runtime's GFLOP/s on it against the sgemm peak
    says how close to the machine's limit it runs."""
    module, why_not = torch_module(zoo)
    if module is None:
        return None, why_not
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    try:
        with torch.inference_mode(), counter:
            module(*[torch.from_numpy(x) for x in inputs_np])
    except Exception as exc:  # noqa: BLE001 - reported instead of the line
        return None, _reason(exc)
    return float(counter.get_total_flops()), None


def print_nominal_work(phase: dict[str, Any], flops: float | None, why_not: str | None, peak_gflops: float) -> None:
    """Each timed runtime's GFLOP/s on the model's nominal work (:func:`nominal_flops`) and its
    share of the sgemm peak; kept in ``phase["nominal"]``."""
    if flops is None:
        print(f"\nnominal work: not counted: {why_not}")
        return
    gflops = {name: flops / (r["ms"] * 1e-3) / 1e9 for name, r in phase["measure"]["latency"].items()}
    rows = {name: {"gflops": g, "peak_fraction": g / peak_gflops} for name, g in gflops.items()}
    phase["nominal"] = {"flops": flops, "peak_gflops": peak_gflops, "runtimes": rows}
    print(f"\nnominal work: {flops / 1e9:.3f} GFLOP per call (PyTorch's FLOP counter: convolutions and matrix "
          f"products as direct products); at the sgemm peak of {peak_gflops:.1f} GFLOP/s that is "
          f"{flops / peak_gflops / 1e6:.3f} ms")
    print("  " + "; ".join(f"{name} {r['gflops']:.1f} GFLOP/s ({r['peak_fraction']:.2f} of the peak)"
                           for name, r in rows.items()))


def _outputs(out: Any) -> list[Any]:
    """Any runtime's result as a flat list of numpy arrays."""
    import numpy as np

    if hasattr(out, "detach"):
        return [out.detach().numpy()]
    if hasattr(out, "numpy"):
        return [out.numpy()]
    if isinstance(out, np.ndarray):
        return [out]
    if hasattr(out, "logits"):
        return [out.logits.detach().numpy()]
    flat: list[Any] = []
    for item in out:
        flat += _outputs(item)
    return flat


def _max_abs_diff(a: list[Any], b: list[Any]) -> float:
    import numpy as np

    if len(a) != len(b):
        return float("nan")
    return max((float(np.max(np.abs(x.astype("float64") - y.astype("float64")))) if x.size else 0.0
                for x, y in zip(a, b, strict=True)), default=0.0)


def _reason(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__


def load_vm(library: str) -> Any:
    """The exported tuned library in Relax's virtual machine on the CPU (TVM's native warnings
    while it loads go to ``tvm-native.log`` beside the library)."""
    import tvm
    from tvm import relax

    from tunefleet.tvm.native_log import native_stderr_to

    with native_stderr_to(Path(library).parent / "tvm-native.log"):
        return relax.VirtualMachine(tvm.runtime.load_module(library), tvm.cpu())


def tuned_runner(library: str, inputs_np: list[Any]) -> Any:
    """A zero-argument call of the exported tuned library on the inputs."""
    import tvm

    main = load_vm(library)["main"]
    inputs = [tvm.runtime.tensor(x, tvm.cpu()) for x in inputs_np]
    return lambda: main(*inputs)


def alternatives(module: Any, inputs_np: list[Any], threads: int, onnx_path: Path) -> tuple[dict[str, Any], dict[str, str], dict[str, float]]:
    """(name -> zero-argument call, name -> why not measured, setup seconds) for the alternatives
    (eager and onnxruntime as ``tunefleet build`` times them: :mod:`tunefleet.delivery.alternatives`)."""
    import torch

    from tunefleet.delivery import alternatives as alt

    calls: dict[str, Any] = {"torch eager": alt.torch_eager_call(module, inputs_np, threads)}
    skipped: dict[str, str] = {}
    setup: dict[str, float] = {}
    args = [torch.from_numpy(x) for x in inputs_np]
    try:
        compiled = torch.compile(module)

        def compiled_call() -> Any:
            with torch.inference_mode():
                return compiled(*args)

        t = time.perf_counter()
        compiled_call()  # compiles
        setup["torch.compile"] = time.perf_counter() - t
        compiled_call()
        calls["torch.compile"] = compiled_call
    except Exception as exc:  # noqa: BLE001 - reported as a "not measured" row
        skipped["torch.compile"] = _reason(exc)
    try:
        t = time.perf_counter()
        calls["onnxruntime"] = alt.onnxruntime_call(alt.export_onnx(module, inputs_np, onnx_path), inputs_np, threads)
        setup["onnxruntime"] = time.perf_counter() - t
    except Exception as exc:  # noqa: BLE001 - reported as a "not measured" row
        skipped["onnxruntime"] = _reason(exc)
    return calls, skipped, setup


def prepare_alternatives(zoo: Any, threads: int, onnx_path: Path) -> tuple[list[Any], dict[str, Any], dict[str, str],
                                                                           dict[str, float], list[Any] | None]:
    """For a zoo model: (its inputs, the alternatives' calls, name -> why not measured, setup
    seconds, eager's outputs to check the others against), torch on ``threads`` threads and one
    inter-op thread. ``bench/timing_agreement.py`` prepares its timing the same way."""
    inputs_np = zoo.loaded.random_inputs(seed=0)
    module, why_not = torch_module(zoo)
    if module is None:
        return inputs_np, {}, dict.fromkeys(ALTERNATIVES, why_not or "no PyTorch module"), {}, None
    import torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # building the zoo model already started torch's inter-op pool
        pass
    print(f"preparing the alternatives (torch {torch.__version__}: eager, torch.compile, onnxruntime) ...", flush=True)
    alt_calls, skipped, setup = alternatives(module, inputs_np, threads, onnx_path)
    reference = None
    try:
        reference = _outputs(alt_calls["torch eager"]())
    except Exception as exc:  # noqa: BLE001 - reported as a "not measured" row
        del alt_calls["torch eager"]
        skipped["torch eager"] = _reason(exc)
    return inputs_np, alt_calls, skipped, setup, reference


def measure_phase(phase: dict[str, Any], inputs_np: list[Any], alt_calls: dict[str, Any], reference: list[Any] | None,
                  rounds: int, compare: dict[str, str] | None = None, threads: int = DEFAULT_THREADS) -> dict[str, Any]:
    """Time the phase's tuned library alternating with the ``compare`` libraries (label -> path)
    and the alternatives, reading after each block where the ``threads`` threads' CPUs sat
    (:mod:`tunefleet.delivery.placement`, as ``tunefleet run``'s table does); check outputs
    against eager."""
    calls = {"tunefleet tuned": tuned_runner(phase["library"], inputs_np),
             **{label: tuned_runner(library, inputs_np) for label, library in (compare or {}).items()}, **alt_calls}
    diffs = {}
    if reference is not None:
        for name, fn in calls.items():
            if name != "torch eager":
                diffs[name] = _max_abs_diff(_outputs(fn()), reference)
    probe = placement.probe_for(threads)
    latency = time_alternating(calls, rounds, between=probe)
    sides, line = placement.split_timing(latency, probe, [(name, name) for name in calls])
    return {"latency": latency, "max_abs_diff_vs_eager": diffs, "placement": sides, "placement_line": line}


# -- the database's view: workloads, trials --------------------------------------------------------

def workload_shares(db: Any, model_id: int, hardware: str, peak_gflops: float | None) -> dict[str, Any]:
    """Every workload of the model with its best latency on the class, by latency share; trial counts."""
    hw = db.hardware_class(hardware)
    rows, unmeasured, attempted, successful = [], [], 0, 0
    for wl, weight in db.workloads(model_id, hw.id):
        attempted += db.count_measurements(wl.id, hw.id)
        successful += db.count_measurements(wl.id, hw.id, errors=False)
        best = db.best_measurements(wl.id, hw.id, 1)
        if not best:
            unmeasured.append(wl.name)
            continue
        best_s = float(best[0].mean_run_s)
        gflops = float(wl.flops) / best_s / 1e9 if wl.flops else None
        rows.append({"workload": wl.structural_hash, "name": wl.name, "op_kind": wl.op_kind, "weight": weight,
                     "flops": float(wl.flops), "best_ms": best_s * 1e3, "weighted_ms": weight * best_s * 1e3,
                     "gflops": gflops, "peak_fraction": gflops / peak_gflops if gflops and peak_gflops else None})
    total = sum(r["weighted_ms"] for r in rows)
    for r in rows:
        r["share"] = r["weighted_ms"] / total if total else None
    rows.sort(key=lambda r: -r["weighted_ms"])
    return {"workloads": rows, "summed_ms": total, "unmeasured": unmeasured,
            "measurements": attempted, "successful_measurements": successful}


# -- printing --------------------------------------------------------------------------------------

def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _ms(value: float) -> str:
    """Milliseconds with 4 significant digits (an MLP runs in microseconds, BERT in 100s of ms)."""
    return f"{value:.4g}" if value < 1000 else f"{value:.0f}"


def print_latency(phase: dict[str, Any], skipped: dict[str, str], setup: dict[str, float], threads: int) -> dict[str, Any]:
    """The side-by-side table; returns the ratios tuned / alternative."""
    lat = phase["measure"]["latency"]
    diffs = phase["measure"]["max_abs_diff_vs_eager"]
    tuned = lat["tunefleet tuned"]["ms"]
    ratios = {}
    print(f"\n{phase['name']}: latency on {threads} threads (median of {len(lat['tunefleet tuned']['rounds_ms'])} "
          "alternating rounds; ratio < 1: tuned is faster)")
    print(f"{'runtime':<20} {'ms':>10} {'round min-max ms':>20} {'calls/round':>11} {'tuned / it':>11} "
          f"{'max abs diff vs eager':>22}")
    compared = [name for name in lat if name != "tunefleet tuned" and name not in ALTERNATIVES]
    for name in ("tunefleet tuned", *compared, *ALTERNATIVES):
        if name in lat:
            r = lat[name]
            ratio = tuned / r["ms"] if name != "tunefleet tuned" else None
            if ratio is not None:
                ratios[f"tuned / {name}"] = ratio
            spread = f"{_ms(min(r['rounds_ms']))}-{_ms(max(r['rounds_ms']))}"
            diff = "(reference)" if name == "torch eager" else _fmt(diffs.get(name), ".3g")
            print(f"{name:<20} {_ms(r['ms']):>10} {spread:>20} {r['calls_per_round']:>11} "
                  f"{_fmt(ratio, '.2f') + ('x' if ratio else ''):>11} {diff:>22}")
        elif name in skipped:
            print(f"{name:<20} not measured: {skipped[name]}")
    if "torch.compile" in setup and phase["name"] == "phase 1":  # set up once, before phase 1's timing
        print(f"torch.compile: first call (compiling, cold inductor cache) took {setup['torch.compile']:.1f} s")
    if "onnxruntime" in setup and phase["name"] == "phase 1":
        print(f"onnxruntime: export + session creation took {setup['onnxruntime']:.1f} s")
    if phase["measure"].get("placement_line"):
        print(phase["measure"]["placement_line"])
    if phase.get("cli_tuned_ms") is not None:
        print(f"(tunefleet run's own build report: tuned {_ms(phase['cli_tuned_ms'])} ms, "
              f"untuned {_fmt(phase.get('cli_untuned_ms'), '.3f')} ms, eager {_fmt(phase.get('cli_torch_ms'), '.3f')} ms, "
              f"onnxruntime {_fmt(phase.get('cli_onnxruntime_ms'), '.3f')} ms"
              + (f"; {phase['cli_placement_line']}" if phase.get("cli_placement_line") else "") + ")")
    return ratios


def print_workloads(report: dict[str, Any], peak: float | None, tuned_ms: float) -> None:
    rows = report["workloads"][:TOP_WORKLOADS]
    print(f"\ntop {len(rows)} of {len(report['workloads'])} measured workloads by latency share "
          f"(weight x best mean run time; summed over all: {_ms(report['summed_ms'])} ms, the whole model "
          f"ran in {_ms(tuned_ms)} ms)")
    print(f"{'workload':<44} {'op kind':<14} {'weight':>6} {'best ms':>9} {'share':>6} {'GFLOP/s':>8} {'of peak':>8}")
    for r in rows:
        print(f"{r['name'][:44]:<44} {str(r['op_kind'])[:14]:<14} {r['weight']:>6} {_ms(r['best_ms']):>9} "
              f"{_fmt(r['share'] and r['share'] * 100, '5.1f')}% {_fmt(r['gflops'], '8.2f')} "
              f"{_fmt(r['peak_fraction'], '8.3f')}")
    if report["unmeasured"]:
        print(f"{len(report['unmeasured'])} workload(s) without a successful measurement (default schedule): "
              + ", ".join(report["unmeasured"]))


# -- main ------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="zoo model: resnet18, mobilenet_v2, bert-base, ... (mlp, small-cnn: smoke runs)")
    ap.add_argument("--hardware", default="x86", help="hardware class (default x86)")
    amount = ap.add_mutually_exclusive_group()
    amount.add_argument("--budget", default="15m", help="phase 1's `tunefleet run --budget` (default 15m)")
    amount.add_argument("--trials", type=int, default=None,
                        help="phase 1 with `tunefleet run --trials N` (trials per workload) instead of --budget")
    more = ap.add_mutually_exclusive_group()
    more.add_argument("--more", default="60m",
                      help="phase 2's `--budget`, continuing the same database (default 60m; 0 skips phase 2)")
    more.add_argument("--more-trials", type=int, default=None,
                      help="phase 2 with `--trials N` (target trials per workload) instead of --more")
    ap.add_argument("--home", type=Path, default=None,
                    help="TUNEFLEET_HOME of the runs; reusing it continues the same database "
                    "(default WORK_DIR/home-MODEL-HARDWARE)")
    ap.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR,
                    help=f"libraries, ONNX files and the default home (default {DEFAULT_WORK_DIR})")
    ap.add_argument("--threads", type=int, default=None,
                    help="threads of every runtime (default the hardware class's num-cores, else 2)")
    ap.add_argument("--rounds", type=int, default=ROUNDS,
                    help=f"alternating timing rounds, at least 3 (default {ROUNDS}, as tunefleet run's build report)")
    ap.add_argument("--sgemm-n", type=int, default=2048, help="matrix size of the sgemm peak (default 2048)")
    ap.add_argument("--blas-coretype", default=None,
                    help="OPENBLAS_CORETYPE of the sgemm peak (default Haswell for the x86-avx2 class: AVX2 "
                    "kernels, the class's own peak; SkylakeX for the native x86 class on an AVX-512 CPU; "
                    "else OpenBLAS picks this CPU's)")
    ap.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write everything measured here")
    ap.add_argument("--batch-size", type=int, default=None, help="zoo option passed to `tunefleet run`")
    ap.add_argument("--image-size", type=int, default=None, help="zoo option passed to `tunefleet run`")
    ap.add_argument("--seq-len", type=int, default=None, help="zoo option passed to `tunefleet run`")
    ap.add_argument("--hub", default=None, metavar="BUNDLE",
                    help="the runs' TUNEFLEET_HUB: 'off' (tuning from scratch), 'default', or a hub bundle file "
                    "(default: this environment's, else 'default')")
    ap.add_argument("--compare", action="append", default=[], metavar="LABEL=LIBRARY",
                    help="another exported library (e.g. an earlier run's, under another recipe; give that run its "
                    "own --work-dir so this one does not overwrite it) timed in the same alternating rounds; repeatable")
    args = ap.parse_args(argv)
    if args.rounds < 3:
        ap.error("--rounds must be at least 3")
    args.compare = parse_compare(ap, args.compare)
    return args


def parse_compare(ap: argparse.ArgumentParser, items: list[str], option: str = "--compare",
                  taken: tuple[str, ...] = ()) -> dict[str, str]:
    """``--compare LABEL=LIBRARY`` values (``option``'s) as label -> library path; a malformed one,
    a label given twice or in ``taken``, or a missing file is the parser's one-line error."""
    compare: dict[str, str] = {}
    for item in items:
        label, sep, library = item.partition("=")
        if not sep or not label:
            ap.error(f"{option} takes LABEL=LIBRARY, got {item!r}")
        if label in compare or label in taken:
            ap.error(f"{option} {label}: the label is taken")
        if not Path(library).is_file():
            ap.error(f"{option} {label}: no such library {library}")
        compare[label] = library
    return compare


def claim_home(home: Path) -> Any:
    """The home's bench lock, taken without waiting: a second bench run on one home would tune the
    same database while the first one times its libraries, and skew both (SystemExit if taken)."""
    from filelock import FileLock, Timeout

    lock = FileLock(home / ".bench.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise SystemExit(f"not started: another bench run is using the home {home} (it holds {lock.lock_file}); "
                         "two runs on one home tune one database and skew each other's timings: wait for it, "
                         "or pass another --home") from None
    return lock


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    coretype = args.blas_coretype or default_coretype(args.hardware)
    if coretype:  # OpenBLAS reads it when it loads, with numpy: before anything imports numpy
        os.environ["OPENBLAS_CORETYPE"] = coretype
    work = args.work_dir.resolve()
    home = (args.home or work / f"home-{args.model}-{args.hardware}").resolve()
    home.mkdir(parents=True, exist_ok=True)
    _home_lock = claim_home(home)  # held until this process exits
    child_env = {**os.environ, "TUNEFLEET_HOME": str(home)}  # the runs' environment: not this process's threads
    if args.hub is not None:
        child_env["TUNEFLEET_HUB"] = args.hub  # what a new database imports first (docs/hub.md)
    os.environ["TUNEFLEET_HOME"] = str(home)  # this process reads the same database (and config file)

    phases_wanted = [("phase 1", ["--trials", str(args.trials)] if args.trials is not None else ["--budget", args.budget])]
    if args.more_trials is not None:
        phases_wanted.append(("phase 2", ["--trials", str(args.more_trials)]))
    elif args.more not in ("0", "0m", "0s", "0h", ""):
        phases_wanted.append(("phase 2", ["--budget", args.more]))

    from tunefleet.config import load_settings, mask_url
    from tunefleet.db import Database

    settings = load_settings()
    print(f"TUNEFLEET_HOME {home}; database {mask_url(settings.effective_database_url)}", flush=True)
    out: dict[str, Any] = {"model": args.model, "hardware": args.hardware, "home": str(home),
                           "host": {"machine": platform.machine(), "processor": _cpu_model(),
                                    "usable_cores": len(os.sched_getaffinity(0))},
                           "phases": []}
    first = run_phase(phases_wanted[0][0], args, phases_wanted[0][1], work / f"out-{args.model}-{args.hardware}" / "phase1",
                      child_env)
    if "error" in first:
        out["phases"].append(first)
        return _finish(out, args.json, 1)
    db = Database.from_settings(settings)
    if args.threads is None:
        cores = db.hardware_class(args.hardware).target.get("num-cores")
        threads = int(cores) if cores else DEFAULT_THREADS
    else:
        threads = args.threads
    pin_threads(threads)
    out["threads"] = threads

    peak = sgemm_peak(args.sgemm_n)
    out["sgemm"] = peak
    print(f"\nfp32 peak: sgemm {args.sgemm_n}^3 (numpy) {peak['gflops']:.1f} GFLOP/s on {threads} threads, "
          f"median of the repeats {median_gflops(peak):.1f} "
          f"(OpenBLAS reports {_fmt(peak['blas_threads'], 'd')} threads, core {peak['blas_core'] or '?'})", flush=True)

    # torch.compile's compile time from a cold cache on every invocation (inductor keeps one on disk).
    inductor_cache = work / "inductor-cache"
    shutil.rmtree(inductor_cache, ignore_errors=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_cache)

    from tunefleet.models.zoo import build_zoo_model

    zoo = build_zoo_model(args.model, **{k: getattr(args, k) for k in ("batch_size", "image_size", "seq_len")
                                         if getattr(args, k) is not None})
    inputs_np, alt_calls, skipped, setup, reference = prepare_alternatives(zoo, threads, work / f"{args.model}.onnx")
    flops, flops_why_not = nominal_flops(zoo, inputs_np)
    out["nominal_flops"] = flops
    out["setup_s"] = setup
    out["not_measured"] = skipped
    out["versions"] = _versions()

    status = 0
    earlier: dict[str, str] = {}  # label -> library of the phases timed so far
    for i, (name, amount) in enumerate(phases_wanted):
        phase = first if i == 0 else run_phase(name, args, amount, work / f"out-{args.model}-{args.hardware}" / f"phase{i + 1}",
                                               child_env)
        if not phase["library"]:
            if "error" not in phase:
                print(f"   {phase['name']} wrote no library: nothing to time", flush=True)
            out["phases"].append(phase)
            status = 1
            continue
        phase["measure"] = measure_phase(phase, inputs_np, alt_calls, reference, args.rounds, {**earlier, **args.compare},
                                         threads)
        earlier[f"tuned after {phase['name']}"] = phase["library"]
        phase["ratios"] = print_latency(phase, skipped, setup, threads)
        # The first peak was measured as the tuning run's processes exited, which can halve it
        # (docs/performance.md, mobilenet_v2 +60): measure again after the timings, keep the faster.
        again = sgemm_peak(args.sgemm_n)
        if again["gflops"] > peak["gflops"]:
            print(f"fp32 peak measured again after the timings: {again['gflops']:.1f} GFLOP/s, median "
                  f"{median_gflops(again):.1f} (first {peak['gflops']:.1f})", flush=True)
            peak = out["sgemm"] = again
        print_nominal_work(phase, flops, flops_why_not, peak["gflops"])
        report = workload_shares(db, phase["model_id"], args.hardware, peak["gflops"])
        phase["workload_report"] = report
        print_workloads(report, peak["gflops"], phase["measure"]["latency"]["tunefleet tuned"]["ms"])
        measured = phase["measured"]
        per = f"{phase['wall_s'] / measured:.2f} s wall, {_fmt(phase['tune_s'] and phase['tune_s'] / measured, '.2f')} s tuning" \
            if measured else "-"
        print(f"\ntuning: {phase['name']} {phase['wall_s']:.0f} s wall (tune step {_fmt(phase['tune_s'], '.0f')} s), "
              f"{measured} candidates measured ({phase['errors']} errors): {per} per measured candidate; the database "
              f"holds {report['measurements']} measurements of this model's workloads on {args.hardware} "
              f"({report['successful_measurements']} successful)", flush=True)
        out["phases"].append(phase)

    return _finish(out, args.json, status)


def _finish(out: dict[str, Any], path: Path | None, status: int) -> int:
    """Write what was measured (``--json``), also after a phase failed; the exit status."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(out, indent=2, default=str))
        print(f"\nwrote {path}")
    return status


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for dist in ("apache-tvm", "torch", "onnxruntime", "numpy", "transformers"):
        try:
            found[dist] = version(dist)
        except PackageNotFoundError:
            found[dist] = "not installed"
    return found


if __name__ == "__main__":
    sys.exit(main())
