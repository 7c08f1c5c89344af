"""What the shipped cost model buys on a model outside the campaign's corpus, side by side in one run.

Usage::

    python bench/pretrained_bench.py resnet50 --budget 15m               # every arm, 15 minutes of tuning each
    python bench/pretrained_bench.py my-cnn.onnx --budget 5m --arms scratch,pretrained --json out.json
    python bench/pretrained_bench.py my-cnn.onnx --arms scratch,pretrained --work-dir W --report-only

Arms, each in a fresh tunefleet home under ``--work-dir``, the same seed:

* ``scratch``: tune the model for ``--budget`` with no cost model (``pretrained_cost_model`` off,
  the hub off): stock MetaSchedule's start, random first rounds;
* ``pretrained``: the same with the shipped cost model warm-starting every shard (the hub off,
  so the model's effect is alone);
* ``pretrained-nocheck``: the same with the warm start's agreement check off
  (``warm_start_min_agreement`` 0: the model guides every shard whatever it misranks), which says
  what the check costs or saves in trials (not in the default ``--arms``);
* ``zeroshot``: no tuning; a home that holds only the shipped hub bundle, ``build --zero-shot``
  with ``--verify`` (default ``90s``, the proposals' search included): every workload's default
  schedule, the schedules it borrows (the hub's, other shapes') and the shipped model's proposals,
  verified by measurement, then searches refining each workload's best measured with the budget left;
* ``zeroshot-noborrow``: the same without the borrowed schedules (what borrowing adds; not in the
  default ``--arms``).
* ``zeroshot-norefine``: the same without refining (verification ends when the defaults, borrowed
  schedules and proposals are measured, however much budget is left; not in the default ``--arms``).

For the tuning arms it prints, per arm, the candidates measured and the model's estimated latency
(the sum over its workloads of calls x best measured time, what the tuned build's kernels take)
after every round, the trials each arm needed to reach 0.9 of the ``scratch`` arm's final speed,
and then every arm's built model timed as ``tunefleet build`` times it (alternating rounds with
onnxruntime and PyTorch eager, on the same threads; one build after another, in this process),
then, per tuning arm, where its trials went (its estimate after its first round, when every
workload has had the trials each gets before any gets a search batch; and for its heaviest
workloads the best of that first round over their final best and the trials each took to come
within 1.1x of it), and last every arm's library and onnxruntime side by side in the same 7
alternating rounds (the figures to compare arms by: a VM's speed moves between the builds' own
timings), with any ``--compare LABEL=LIBRARY`` (an earlier run's arm, say) in the same rounds.
``--report-only --work-dir DIR`` tunes and times nothing: it prints the trials and where they went
from the tuning arms' homes an earlier run left in ``DIR``.
Name the CPU next to the figures: ``lscpu``. Prints what it measured; asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # versus_alternatives.py, beside this file

from versus_alternatives import parse_compare, tuned_runner  # noqa: E402 - beside this file; light at import

from tunefleet.delivery.zeroshot import DEFAULT_VERIFY  # noqa: E402 - light: nothing heavy at import

HW = "x86"
ARMS = ("scratch", "pretrained", "pretrained-nocheck", "zeroshot", "zeroshot-noborrow", "zeroshot-norefine")
TUNING = ("scratch", "pretrained", "pretrained-nocheck")
REACH = 0.9
"""The speed, as a share of the scratch arm's final one, whose trials the table reports."""
WITHIN = 1.1
"""A workload counts as converged once its best is within this factor of its final one."""


def connect(home: Path, hub: str) -> Any:
    from tunefleet import api
    from tunefleet.config import load_settings

    return api.connect(load_settings(home=home, hub=hub))


def ingest(ctx: Any, source: str) -> Any:
    from tunefleet import api

    model = api.ingest(ctx, source).model
    api.extract(ctx, model, HW)
    return model


def curve(db: Any, model: Any) -> list[tuple[int, float]]:
    """(candidates measured, estimated model latency in ms) after each measurement, from the first
    at which every workload has a successful one: the sum of calls x best time so far."""
    hw = db.hardware_class(HW)
    weights = {wl.id: w for wl, w in db.workloads(model_id=model.id, hardware_class_id=hw.id)}
    best: dict[int, float] = {}
    out = []
    for n, m in enumerate((m for m in db.measurements(hardware_class_id=hw.id) if m.workload_id in weights), 1):
        if m.mean_run_s is not None and m.error_kind is None and m.mean_run_s < best.get(m.workload_id, float("inf")):
            best[m.workload_id] = m.mean_run_s
        if len(best) == len(weights):
            out.append((n, sum(weights[w] * best[w] for w in weights) * 1e3))
    return out


def progress(trials: dict[int, list[float | None]], workloads: dict[int, tuple[str, int]], *, top: int = 6,
             within: float = WITHIN) -> list[dict[str, Any]]:
    """Where an arm's trials went, for the ``top`` workloads holding most of its final estimate
    (calls x best): each one's trials, its best, the best of its first round (the first
    :data:`~tunefleet.planning.allocation.DEFAULT_MIN_TRIALS` trials, which every workload gets
    before any gets a search batch) over that best, and the trials it took to come ``within`` of
    it. ``trials``: each workload's run times in the order measured (None: an error);
    ``workloads``: id -> (name, calls per inference)."""
    from tunefleet.planning.allocation import DEFAULT_MIN_TRIALS

    rows = []
    for wid, times in trials.items():
        measured = [t if t is not None else float("inf") for t in times]
        final = min(measured, default=float("inf"))
        if wid not in workloads or final == float("inf"):
            continue
        name, calls = workloads[wid]
        best, reached = float("inf"), None
        for i, t in enumerate(measured, 1):
            best = min(best, t)
            if reached is None and best <= final * within:
                reached = i
        rows.append({"workload": name, "calls": calls, "trials": len(times), "best_ms": final * 1e3,
                     "first_round_x": min(measured[:DEFAULT_MIN_TRIALS]) / final, "trials_to_within": reached})
    rows.sort(key=lambda r: -r["calls"] * r["best_ms"])
    return rows[:top]


def workload_progress(db: Any, model: Any, top: int = 6) -> list[dict[str, Any]]:
    """:func:`progress` of the model's workloads from the database."""
    hw = db.hardware_class(HW)
    workloads = {wl.id: (wl.name, w) for wl, w in db.workloads(model_id=model.id, hardware_class_id=hw.id)}
    trials: dict[int, list[float | None]] = {}
    for m in db.measurements(hardware_class_id=hw.id):
        if m.workload_id in workloads:
            ok = m.error_kind is None and m.mean_run_s is not None
            trials.setdefault(m.workload_id, []).append(m.mean_run_s if ok else None)
    return progress(trials, workloads, top=top)


def print_progress(arm: str, points: list[tuple[int, float]], rows: list[dict[str, Any]]) -> None:
    """The arm's first point (every workload measured: its first round) against its end, and
    :func:`progress`'s table."""
    if not points:
        return
    (n0, ms0), (n1, ms1) = points[0], points[-1]
    print(f"\n{arm}: after its first round ({n0} candidates) {ms0:.3f} ms, {ms1 / ms0:.2f} of its final speed "
          f"({ms1:.3f} ms at {n1}); its heaviest workloads:")
    print(f"  {'workload':<40}{'calls':>6}{'trials':>8}{'best ms':>10}{'first round / best':>20}"
          f"{f'trials to {WITHIN:.2g}x its best':>26}")
    for r in rows:
        print(f"  {r['workload'][:39]:<40}{r['calls']:>6}{r['trials']:>8}{r['best_ms']:>10.4f}"
              f"{r['first_round_x']:>19.2f}x{f(r['trials_to_within']):>26}")


def print_reach_ratios(reach: dict[str, int | None]) -> None:
    """Each warm-started arm's trials to :data:`REACH` of the scratch arm's final speed over the
    scratch arm's (``reach``: tuning arm -> its trials, None where it never got there)."""
    for arm, n in reach.items():
        if arm != "scratch" and n and reach.get("scratch"):
            print(f"trials to {REACH:.0%} of the scratch arm's final speed, {arm} / scratch: {n / reach['scratch']:.2f}")


def trials_to(points: list[tuple[int, float]], latency_ms: float) -> int | None:
    """Candidates measured when the estimate first reached ``latency_ms`` (None: never)."""
    return next((n for n, ms in points if ms <= latency_ms), None)


def tune_arm(name: str, source: str, work: Path, budget: str, seed: int) -> dict[str, Any]:
    from tunefleet import api

    ctx = connect(work / name, "off")
    model = ingest(ctx, source)
    options = ctx.options().replace(seed=seed, **arm_knobs(name))
    t0 = time.perf_counter()
    summary = api.tune(ctx, HW, options, budget=budget, models=[model])
    wall = time.perf_counter() - t0
    points = curve(ctx.db, model)
    print(f"{name}: {summary.measured} candidates in {wall:.0f} s, {summary.shards_done} shards, the warm start "
          f"dropped in {summary.warm_start_dropped}; estimated latency "
          + ", ".join(f"{ms:.2f} ms at {n}" for n, ms in points[:: max(1, len(points) // 12)]), flush=True)
    return {"arm": name, "ctx": ctx, "model": model, "candidates": summary.measured, "wall_s": wall,
            "points": points, "estimate_ms": points[-1][1] if points else None,
            "shards": summary.shards_done, "warm_start_dropped": summary.warm_start_dropped}


def arm_knobs(name: str) -> dict[str, Any]:
    """The tuning options a tuning arm changes: the shipped cost model, and its agreement check."""
    warm = name.startswith("pretrained")
    return {"pretrained_cost_model": warm, **({"warm_start_min_agreement": 0.0} if name == "pretrained-nocheck" else {})}


def zeroshot_arm(name: str, source: str, work: Path, verify: str) -> dict[str, Any]:
    from tunefleet import api
    from tunefleet.delivery import zeroshot

    ctx = connect(work / name, "default")  # only the shipped bundle in the database
    model = ingest(ctx, source)
    kept = zeroshot.BORROWED, zeroshot.REFINED
    zeroshot.BORROWED = 0 if name == "zeroshot-noborrow" else zeroshot.BORROWED
    zeroshot.REFINED = 0 if name == "zeroshot-norefine" else zeroshot.REFINED
    t0 = time.perf_counter()
    try:
        report = api.build(ctx, model, HW, zero_shot=True, verify=verify, output=work / f"{name}.so")
    finally:
        zeroshot.BORROWED, zeroshot.REFINED = kept
    wall = time.perf_counter() - t0
    print(f"{name}: {report.workloads} workloads, {report.predicted_workloads} predicted, {report.verified} "
          f"candidates verified (default schedules, then {report.verified_borrowed} borrowed from other shapes or "
          f"classes, proposals, and {report.verified_refined} from refining searches) in {report.verify_s:.0f} s "
          f"after {report.propose_s:.0f} s of proposal search (budget {report.verify_budget}); "
          f"search {report.zero_shot_s_per_task or 0:.2f} s per workload; the "
          f"whole build {wall:.0f} s", flush=True)
    return {"arm": name, "report": report, "wall_s": wall, "verify_s": report.verify_s, "propose_s": report.propose_s,
            "ctx": ctx, "model": model,
            "borrowed": report.verified_borrowed, "refined": report.verified_refined,
            "search_s_per_task": report.zero_shot_s_per_task}


def f(v: Any, digits: int = 3) -> str:
    """A table cell: ``-`` for nothing, floats to ``digits`` places."""
    return "-" if v is None else (f"{v:.{digits}f}" if isinstance(v, float) else str(v))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a zoo name outside the campaign's corpus (resnet50, vit-base) or an ONNX file")
    p.add_argument("--budget", default="15m", help="tuning budget of each tuning arm (default 15m)")
    p.add_argument("--arms", default="scratch,pretrained,zeroshot", help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--verify", default=DEFAULT_VERIFY,
                   help=f"the zero-shot arm's budget for proposals and verification (default {DEFAULT_VERIFY})")
    p.add_argument("--compare", action="append", default=[], metavar="LABEL=LIBRARY",
                   help="another exported library of the same model (an earlier run's arm, say) timed in the "
                   "side-by-side rounds; repeatable")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work-dir", type=Path, help="where the arms' homes go (default a temporary folder)")
    p.add_argument("--json", type=Path, help="also write the figures as JSON here")
    p.add_argument("--report-only", action="store_true",
                   help="tune and time nothing: read the tuning arms' homes an earlier run left under --work-dir "
                   "and print their trials to the goal and where their trials went")
    args = p.parse_args(argv)
    if args.report_only and args.work_dir is None:
        p.error("--report-only reads the arms' homes of an earlier run: name its --work-dir")
    args.compare = parse_compare(p, args.compare)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    from tunefleet import api

    args = parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        print(f"pretrained_bench: unknown arm(s) {', '.join(unknown)} (known: {', '.join(ARMS)})", file=sys.stderr)
        return 2
    if args.report_only:
        return report_only(args.model, args.work_dir, [a for a in arms if a in TUNING])
    with tempfile.TemporaryDirectory(prefix="tunefleet-pretrained-") as tmp:
        work = args.work_dir or Path(tmp)
        results = [tune_arm(a, args.model, work, args.budget, args.seed) for a in arms if a in TUNING]
        zero_shot = [zeroshot_arm(a, args.model, work, args.verify) for a in arms if a not in TUNING]
        scratch = next((r for r in results if r["arm"] == "scratch"), None)
        goal = scratch["estimate_ms"] / REACH if scratch and scratch["estimate_ms"] else None
        print(f"\n{'arm':<19}{'candidates':>11}{'wall s':>8}{'estimate ms':>13}"
              f"{f'trials to {REACH:.0%} of scratch':>26}{'tuned ms':>10}{'onnxruntime ms':>16}{'eager ms':>10}"
              f"{'vs onnxruntime':>16}")
        rows = []
        for r in results:
            report = api.build(r["ctx"], r["model"], HW, output=work / f"{r['arm']}.so")
            reach = trials_to(r["points"], goal) if goal else None
            rows.append({"arm": r["arm"], "candidates": r["candidates"], "wall_s": r["wall_s"],
                         "shards": r["shards"], "warm_start_dropped": r["warm_start_dropped"],
                         "estimate_ms": r["estimate_ms"], "trials_to_goal": reach, "tuned_ms": report.tuned_ms,
                         "onnxruntime_ms": report.onnxruntime_ms, "torch_ms": report.torch_ms})
        for zs in zero_shot:
            rep = zs["report"]
            rows.append({"arm": zs["arm"], "candidates": rep.verified, "wall_s": zs["wall_s"], "estimate_ms": None,
                         "trials_to_goal": None, "tuned_ms": rep.tuned_ms, "onnxruntime_ms": rep.onnxruntime_ms,
                         "torch_ms": rep.torch_ms, "verify_s": zs["verify_s"], "propose_s": zs["propose_s"],
                         "borrowed": zs["borrowed"],
                         "refined": zs["refined"], "search_s_per_task": zs["search_s_per_task"]})
        for row in rows:
            ratio = (row["tuned_ms"] / row["onnxruntime_ms"]) if row["tuned_ms"] and row["onnxruntime_ms"] else None
            row["vs_onnxruntime"] = ratio
            print(f"{row['arm']:<19}{f(row['candidates']):>11}{f(row['wall_s'], 0):>8}{f(row['estimate_ms']):>13}"
                  f"{f(row['trials_to_goal']):>26}{f(row['tuned_ms']):>10}{f(row['onnxruntime_ms']):>16}"
                  f"{f(row['torch_ms']):>10}{f(ratio, 2) + 'x' if ratio else '-':>16}")
        print_reach_ratios({r["arm"]: r["trials_to_goal"] for r in rows if r["arm"] in TUNING})
        went = {r["arm"]: workload_progress(r["ctx"].db, r["model"]) for r in results}
        for r in results:
            print_progress(r["arm"], r["points"], went[r["arm"]])
        together = side_by_side(work, [*results, *zero_shot], compare=args.compare)
        if args.json:
            args.json.write_text(json.dumps({"model": args.model, "budget": args.budget, "rows": rows,
                                             "side_by_side_ms": together,
                                             "curves": {r["arm"]: r["points"] for r in results},
                                             "heaviest_workloads": went}, indent=1) + "\n")
    return 0


def report_only(source: str, work: Path, arms: list[str]) -> int:
    """``--report-only``: each tuning arm's curve and :func:`progress` from its home under ``work``."""
    homes = {arm: work / arm for arm in arms}
    missing = [arm for arm, home in homes.items() if not (home / "tunefleet.db").is_file()]
    if not arms or missing:
        print(f"pretrained_bench: no home of the arm(s) {', '.join(missing or ['scratch, pretrained'])} under "
              f"{work} (an earlier run's --work-dir holds one folder per tuning arm)", file=sys.stderr)
        return 2
    from tunefleet.errors import NotFoundError

    name = Path(source).stem if Path(source).suffix in (".onnx", ".pt2") else source  # as ingest names it
    results = []
    for arm, home in homes.items():
        ctx = connect(home, "off")
        try:
            model = ctx.db.model(name)
        except NotFoundError as exc:
            print(f"pretrained_bench: {arm}'s home ({home}): {exc}", file=sys.stderr)
            return 2
        results.append({"arm": arm, "ctx": ctx, "model": model, "points": curve(ctx.db, model)})
    scratch = next((r for r in results if r["arm"] == "scratch" and r["points"]), None)
    goal = scratch["points"][-1][1] / REACH if scratch else None
    reach = {r["arm"]: trials_to(r["points"], goal) if goal else None for r in results}
    for r in results:
        end = r["points"][-1] if r["points"] else (None, None)
        print(f"{r['arm']}: {f(end[0])} candidates, estimate {f(end[1])} ms, "
              f"trials to {REACH:.0%} of the scratch arm's final speed {f(reach[r['arm']])}")
    print_reach_ratios(reach)
    for r in results:
        print_progress(r["arm"], r["points"], workload_progress(r["ctx"].db, r["model"]))
    return 0


def side_by_side(work: Path, arms: list[dict[str, Any]], rounds: int = 7,
                 compare: dict[str, str] | None = None) -> dict[str, float]:
    """Every arm's library, the ``compare`` libraries (label -> path) and onnxruntime timed in the
    same alternating rounds, in this process (each build above timed itself apart, minutes from the
    others: the VM's speed moves between them); prints the table, returns name -> ms."""
    from tunefleet.delivery import alternatives
    from tunefleet.delivery.timing import time_alternating
    from tunefleet.models.ingest import load_model

    if not arms:
        return {}
    first = arms[0]
    db, store, model = first["ctx"].db, first["ctx"].store, first["model"]
    loaded = load_model(db, store, model)
    inputs_np = loaded.random_inputs(seed=0)
    calls: dict[str, Any] = {arm["arm"]: tuned_runner(str(work / f"{arm['arm']}.so"), inputs_np) for arm in arms}
    calls.update({label: tuned_runner(path, inputs_np) for label, path in (compare or {}).items()})
    onnx_bytes = store.get_bytes(store.key_from_uri(model.artifact_uri)) if model.format == "onnx" else None
    from tunefleet.tvm.threads import class_threads
    threads = class_threads(db.hardware_class(HW).target)
    alt, notes = alternatives.calls(inputs_np, threads, torch_module=loaded.torch_module, onnx_bytes=onnx_bytes)
    calls.update({k: v for k, v in alt.items() if k == "onnxruntime"})
    for note in notes if "onnxruntime" not in alt else []:
        print(note)
    timed = time_alternating(calls, rounds)
    ort = timed.get("onnxruntime", {}).get("ms")
    print(f"\nside by side, {rounds} alternating rounds in one process:")
    for name, r in timed.items():
        vs = f"{r['ms'] / ort:.2f}x onnxruntime" if ort else ""
        print(f"{name:<19}{r['ms']:10.3f} ms  rounds {min(r['rounds_ms']):.3f}-{max(r['rounds_ms']):.3f}  {vs}")
    return {name: r["ms"] for name, r in timed.items()}


if __name__ == "__main__":
    sys.exit(main())
