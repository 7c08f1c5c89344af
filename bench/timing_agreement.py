"""Does ``tunefleet run``'s table agree with the bench's timing of the same library, and how far
does the bench agree with itself a few minutes later?

Usage::

    python bench/timing_agreement.py mobilenet_v2 --home ~/.tunefleet     # 3 repeats
    python bench/timing_agreement.py resnet18 --home H --repeats 4 --json agree.json

For a zoo model already tuned in ``--home``, each repeat runs, one after the other:

1. ``tunefleet run --model MODEL --hardware HW --trials 1 --json -o DIR/repeat-N`` in a
   subprocess: every workload has its trial already, so the run tunes nothing and goes to its build
   step, whose report gives the tuned, PyTorch eager and onnxruntime figures of ``run``'s table
   (:func:`tunefleet.delivery.build.time_builds`); ``--via build`` runs ``tunefleet build MODEL
   --json -o ...`` instead (the same timing, without the run's flow around it);
2. this script's ``--measure`` mode in a fresh subprocess: that library timed as
   ``bench/versus_alternatives.py`` times it (its ``prepare_alternatives`` and ``measure_phase``: eager,
   ``torch.compile`` and onnxruntime in alternating rounds, on the class's cores).

It prints every figure, the table's over the bench's for each runtime within a repeat (what
issue 31 asks to be within 10 %), and each bench timing over the previous repeat's (the same
measurement of the same libraries minutes apart: how far this machine's speed moves on its own).
Both timings read where the threads' two CPUs sat after each block (:mod:`tunefleet.delivery.placement`):
each repeat says ``near``, ``far`` or ``mixed`` for the table and for the bench, so that two figures
of different placements are not taken for a disagreement of the methods.
Asserts nothing about speed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # versus_alternatives.py, beside this file

from versus_alternatives import (  # noqa: E402 - beside this file; light at import
    measure_phase,
    pin_threads,
    prepare_alternatives,
    tunefleet_command,
)

from tunefleet.delivery.placement import placement_of  # noqa: E402 - light: no TVM, no torch

RUNTIMES = {"tuned": ("tuned_ms", "tunefleet tuned"), "eager": ("torch_ms", "torch eager"),
            "onnxruntime": ("onnxruntime_ms", "onnxruntime")}
"""Our name -> (the build report's JSON key, the bench's runtime name)."""


def measure(library: str, model: str, threads: int, rounds: int) -> dict[str, Any]:
    """The bench's timing of ``library`` (a fresh process: call before numpy/TVM/torch load)."""
    pin_threads(threads)
    from tunefleet.models.zoo import build_zoo_model

    with tempfile.TemporaryDirectory() as tmp:
        inputs_np, calls, skipped, _, reference = prepare_alternatives(build_zoo_model(model), threads,
                                                                       Path(tmp) / f"{model}.onnx")
        measured = measure_phase({"library": library}, inputs_np, calls, reference, rounds, threads=threads)
    return {"latency": measured["latency"], "not_measured": skipped, "placement": measured["placement"]}


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.3f}" if a and b else "-"


def table_rows(repeats: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Per repeat: the table's figure over the bench's (same repeat), and each one over the
    previous repeat's (how far the same measurement moved in a few minutes), per runtime."""
    out = []
    for j, row in enumerate(repeats):
        prev = repeats[j - 1] if j else {"table": {}, "bench": {}}
        cells = {"repeat": str(row["repeat"])}
        for k in RUNTIMES:
            cells[f"table/bench {k}"] = _ratio(row["table"][k], row["bench"][k])
        for side in ("table", "bench"):
            for k in RUNTIMES:
                cells[f"{side}/prev {k}"] = _ratio(row[side][k], prev[side].get(k))
        out.append(cells)
    return out


def print_table(repeats: list[dict[str, Any]], via: str) -> None:
    """The ratios of :func:`table_rows`, one line per repeat ("table" is ``via``'s table)."""
    rows = table_rows(repeats)
    print(f"ratios: {via}'s table / the bench's timing of the same library in the same repeat; each / the previous "
          "repeat's (the same measurement minutes apart)")
    names = [n for n in rows[0] if n != "repeat"]
    print(f"{'repeat':>6} " + " ".join(f"{n.replace('table', via):>22}" for n in names))
    for cells in rows:
        print(f"{cells['repeat']:>6} " + " ".join(f"{cells[n]:>22}" for n in names))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a zoo model tuned in --home (resnet18, mobilenet_v2, bert-base, ...)")
    ap.add_argument("--home", type=Path, help="its TUNEFLEET_HOME (default: the environment's)")
    ap.add_argument("--hardware", default="x86", help="hardware class (default x86)")
    ap.add_argument("--repeats", type=int, default=3, help="run + bench pairs (default 3)")
    ap.add_argument("--via", choices=("run", "build"), default="run",
                    help="the table of `tunefleet run --trials 1` (default) or of `tunefleet build`")
    ap.add_argument("--rounds", type=int, default=None, help="the bench's alternating rounds (default: the build's)")
    ap.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "tunefleet-bench" / "timing_agreement")
    ap.add_argument("--json", type=Path, help="write every figure here")
    ap.add_argument("--measure", metavar="LIBRARY", help=argparse.SUPPRESS)  # the child's mode
    ap.add_argument("--threads", type=int, default=2, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    from tunefleet.delivery.timing import ROUNDS

    rounds = args.rounds or ROUNDS
    if args.measure:
        print(json.dumps(measure(args.measure, args.model, args.threads, rounds)))
        return 0

    env = dict(os.environ)
    if args.home is not None:
        env["TUNEFLEET_HOME"] = str(args.home.expanduser().resolve())
    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    repeats: list[dict[str, Any]] = []
    cli = tunefleet_command()
    for i in range(1, args.repeats + 1):
        out = work / f"repeat-{i}"
        out.mkdir(exist_ok=True)
        if args.via == "run":
            command = [*cli, "run", "--model", args.model, "--hardware", args.hardware, "--trials", "1", "--json",
                       "-o", str(out)]
        else:
            command = [*cli, "build", args.model, "--hardware", args.hardware, "--json",
                       "-o", str(out / f"{args.model}-{args.hardware}.so")]
        built = subprocess.run(command, check=False, env=env, capture_output=True, text=True)
        if built.returncode != 0:
            print(built.stdout[-2000:], built.stderr[-2000:], sep="\n", file=sys.stderr)
            raise SystemExit(f"timing_agreement: tunefleet {args.via} exited {built.returncode}")
        result = json.loads(built.stdout)
        report = result["builds"][0] if args.via == "run" else result
        library = report["output"]
        planned = sum(int(p.get("new_trials") or 0) for p in result.get("planned") or [])
        if planned:  # the table then follows a tuning run in the same process, not a bare build
            print(f"repeat {i}: warning: the run tuned {planned} trial(s) before its table", flush=True)
        threads = int(report.get("threads") or 2)
        timed = subprocess.run([sys.executable, __file__, args.model, "--measure", str(library), "--threads", str(threads),
                                "--rounds", str(rounds)], check=False, env=env, capture_output=True, text=True)
        if timed.returncode != 0:
            print(timed.stderr[-2000:], file=sys.stderr)
            raise SystemExit(f"timing_agreement: the bench's timing exited {timed.returncode}")
        measured = json.loads(timed.stdout.strip().splitlines()[-1])
        bench = measured["latency"]
        row = {"repeat": i, "threads": threads, "library": library, "planned": result.get("planned"),
               "table": {ours: report.get(key) for ours, (key, _) in RUNTIMES.items()},
               "bench": {ours: bench.get(name, {}).get("ms") for ours, (_, name) in RUNTIMES.items()},
               "bench_rounds_ms": {ours: bench.get(name, {}).get("rounds_ms") for ours, (_, name) in RUNTIMES.items()},
               "bench_torch_compile_ms": bench.get("torch.compile", {}).get("ms"),
               "table_placement": report.get("placement") or {}, "bench_placement": measured.get("placement") or {}}
        repeats.append(row)
        print(f"repeat {i}: {args.via} " + ", ".join(f"{k} {v:.4g}" for k, v in row["table"].items() if v) +
              f" ms ({placement_of(row['table_placement'])}) | bench " +
              ", ".join(f"{k} {v:.4g}" for k, v in row["bench"].items() if v) +
              f" ms ({placement_of(row['bench_placement'])})", flush=True)

    if args.json is not None:  # before the table: what was measured outlives a bad print
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"model": args.model, "hardware": args.hardware, "via": args.via, "rounds": rounds,
                                         "repeats": repeats}, indent=2))
        print(f"wrote {args.json}")
    print(f"\n{args.model} on {args.hardware}, {len(repeats)} repeats")
    print_table(repeats, args.via)
    return 0


if __name__ == "__main__":
    sys.exit(main())
