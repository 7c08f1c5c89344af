"""Does the best the tuner recorded hold up? Re-time each workload's best schedules, side by side.

A workload's best schedule is the fastest of every candidate measured for it, each measured once
(five repeats of one cold run). On a noisy machine the fastest of many noisy figures is lower
than what that schedule runs at on average, and more so the more candidates were measured: the
tuner can then report a workload faster than any of its schedules is, and a longer search can
"improve" a workload by finding a luckier measurement rather than a faster schedule.

This bench takes a tuned home's database and, for each workload of a model on a class, re-times
in one process, serially, with the tuner's own evaluator (:func:`tunefleet.delivery.confirm.retime`, as a build re-times)
the ``--top`` fastest schedules recorded and, with ``--before``, the fastest recorded before that
time (e.g. the end of a run's first phase), in ``--rounds`` alternating rounds (every schedule
once per round, so drift spreads over all of them). It prints, per workload, the recorded and the
re-timed figures (the median of the rounds' means) and, summed over the model's workloads
(weight x run time), what the recorded bests add up to against what they re-time at::

    TUNEFLEET_HOME=<home> python bench/remeasure_best.py resnet18 --hardware x86-avx2 \\
        --before "2026-11-30 08:30:00" --json remeasure.json

Nothing is written to the database (nor a hub bundle imported on first use). Keep the machine quiet while it runs.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a model of the home (name, id or sha256 prefix)")
    p.add_argument("--hardware", required=True, help="the hardware class")
    p.add_argument("--top", type=int, default=2, help="re-time this many of the fastest recorded schedules (default 2)")
    p.add_argument("--before", help="also re-time the fastest recorded before this UTC time (YYYY-MM-DD HH:MM:SS)")
    p.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    p.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = p.parse_args(argv)
    if args.top < 1 or args.rounds < 1:
        p.error("--top and --rounds must be at least 1")
    if args.before:
        try:
            args.before = dt.datetime.fromisoformat(args.before)
        except ValueError:
            p.error(f"--before: not a time: {args.before!r} (YYYY-MM-DD HH:MM:SS, UTC)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from tunefleet import api
    from tunefleet.delivery.confirm import retime

    os.environ.setdefault("TUNEFLEET_HUB", "off")  # read the home as it is: no bundle imported on first use
    ctx = api.connect()
    try:
        db = ctx.db
        hw = db.hardware_class(args.hardware)
        model = db.model(args.model)
        print(f"{model.name} on {hw.name} ({hw.target.get('mcpu', '?')})", flush=True)
        rows: list[dict[str, Any]] = []
        picks = []
        for wl, weight in db.workloads(model.id, hw.id):
            mine = [("best" if i == 0 else f"#{i + 1}", m) for i, m in enumerate(db.best_measurements(wl.id, hw.id, args.top))]
            if args.before:
                mine += [("before", m) for m in db.best_measurements(wl.id, hw.id, 1, before=args.before)]
            for label, m in mine:
                picks.append((wl, m))
                rows.append({"workload": wl.name, "workload_id": wl.id, "weight": weight, "pick": label,
                             "measurement_id": m.id, "recorded_s": m.mean_run_s, "recorded_secs": m.run_secs,
                             "mode": m.measure_mode})
        if not rows:
            print("nothing measured for this model on this class", file=sys.stderr)
            return 1
        print(f"building {len(rows)} schedules, then timing them in {args.rounds} alternating rounds", flush=True)
        for r, t in zip(rows, retime(hw, picks, rounds=args.rounds)):  # the tuner's thread count and evaluator
            r["runs"], r["error"] = t.runs, t.error
        report = report_rows(rows)
        print_report(report)
        if args.json:
            args.json.write_text(json.dumps(report, indent=1))
            print(f"wrote {args.json}")
    finally:
        ctx.close()
    return 0


def report_rows(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = []
    for r in rows:
        again = statistics.median(r["runs"]) if r["runs"] and not r.get("error") else None
        out.append({k: r[k] for k in ("workload", "workload_id", "weight", "pick", "measurement_id", "recorded_s",
                                      "recorded_secs", "mode")} | {"error": r.get("error")}
                   | {"retimed_s": again, "retimed_rounds": r["runs"], "ratio": again / r["recorded_s"] if again else None})
    sums: dict[str, dict[str, float]] = {}
    for label in sorted({r["pick"] for r in out}):
        picked = [r for r in out if r["pick"] == label and r["retimed_s"] is not None]
        sums[label] = {"workloads": len(picked), "recorded_s": sum(r["weight"] * r["recorded_s"] for r in picked),
                       "retimed_s": sum(r["weight"] * r["retimed_s"] for r in picked)}
    return {"rows": out, "sums": sums}


def print_report(report: dict[str, Any]) -> None:
    print(f"\n{'workload':<40} {'w':>2} {'pick':>6} {'recorded ms':>11} {'re-timed ms':>11} {'ratio':>6}  rounds ms")
    for r in report["rows"]:
        again = "failed" if r["retimed_s"] is None else f"{r['retimed_s'] * 1e3:.3f}"
        if r["error"]:
            again = f"{again} ({r['error']})"
        ratio = "" if r["ratio"] is None else f"{r['ratio']:.2f}"
        rounds = " ".join(f"{x * 1e3:.3f}" for x in r["retimed_rounds"])
        print(f"{r['workload'][:40]:<40} {r['weight']:>2} {r['pick']:>6} {r['recorded_s'] * 1e3:>11.3f} {again:>11} "
              f"{ratio:>6}  {rounds}")
    print("\nsummed over the model's workloads (weight x run time):")
    for label, s in report["sums"].items():
        if not s["workloads"]:
            print(f"  {label:>6}: nothing re-timed (every run failed: the errors are in the table)")
            continue
        print(f"  {label:>6}: recorded {s['recorded_s'] * 1e3:.2f} ms, re-timed {s['retimed_s'] * 1e3:.2f} ms "
              f"({s['retimed_s'] / s['recorded_s']:.2f}x) over {s['workloads']} workloads")


if __name__ == "__main__":
    sys.exit(main())
