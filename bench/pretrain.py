"""Train the cost model shipped with tunefleet on the campaign's measurements, and say what it scores.

Usage::

    python bench/pretrain.py bench/data/campaign-*.parquet                      # evaluate and write the model
    python bench/pretrain.py bench/data/campaign-*.parquet --output /tmp/m.json --holdout-dims 384,576
    python bench/pretrain.py bench/data/campaign-*.parquet --evaluate-only --diagnose   # where the misses come from
    python bench/pretrain.py bench/data/campaign-*.parquet --evaluate-only --mlp 150    # a small neural model instead
    python bench/pretrain.py NEW.parquet --evaluate-only --score shipped=tunefleet/data/costmodel/avx2.json --by-name winograd

The sources are hub bundles that hold every measurement of a campaign (``tunefleet hub export
--top-k 100000``: bench/data/ holds one per CPU the campaign ran on). Each run:

1. imports them into a fresh tunefleet home (``--work-dir``, default a temporary folder) and
   exports a dataset: MetaSchedule's ``PerStoreFeature`` features of every measurement, labelled
   per workload and class (best time / this time), as ``tunefleet dataset export`` does;
2. holds out whole shape families: every workload with a tensor dimension in ``--holdout-dims``
   (a channel count, a width, a sequence length) is in the test side, so the training side never
   saw that dimension (``tunefleet.learning.costmodel.shape_holdout``);
3. trains each configuration of :data:`CONFIGS` on the rest, prints its held-out pairwise accuracy,
   peak@1 and peak@5 next to a random and an untrained ranking, and picks the best as ``costmodel
   retrain`` promotes (peak@1, then pairwise accuracy); one that does not beat both baselines is
   not written;
4. trains the chosen configuration on every row and writes it (``--output``, default the
   package's shipped model for the sources' vector code: ``tunefleet/data/costmodel/avx2.json``
   when every source class's target is x86 AVX2 code without AVX-512, ``default.json`` otherwise;
   ``tunefleet.learning.pretrained.vector_code``) with what it was trained on and its held-out
   metrics in its metadata (``tunefleet costmodel list`` shows them).

``--score LABEL=FILE`` (repeatable) also scores existing model files (the shipped one before a
retrain, ``git show REV:tunefleet/data/costmodel/avx2.json``) on every row of the sources and on the
held-out side, split by ``--by-name`` (workloads whose name holds it, and the others): how a model
ranks measurements it was not trained on, say a new CPU's or a new recipe's.

Train each shipped model on its own vector code's campaigns: a model trained on one CPU's AVX-512
measurements ranks an AVX2-only CPU's candidates no better than chance (docs/learning.md).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # versus_alternatives.py, beside this file

from versus_alternatives import parse_compare  # noqa: E402 - beside this file; light at import

DEFAULT_HOLDOUT_DIMS = (384, 256)
"""Held-out shape families: sequence length 384 (the corpus's dense, batch_matmul, softmax, layer
norm and GELU variants) and 256 (channels of convolutions and pools, the transformer width 256);
the run prints how many workloads that holds out."""
CONFIGS: tuple[tuple[str, int, dict[str, Any]], ...] = (
    ("reg:squarederror", 60, {}),
    ("reg:squarederror", 300, {"eta": 0.1}),
    ("rank:pairwise", 60, {}),
    ("rank:pairwise", 300, {"eta": 0.1}),
)
"""(objective, boosting rounds, parameters over the defaults) compared on the held-out split."""
METRICS = ("pairwise_accuracy", "pairwise_by_workload", "peak@1", "peak@5")
"""The held-out metrics printed, and kept in the model's metadata (``tunefleet.learning.costmodel``)."""


def load_table(sources: list[Path], work: Path, *, one_code: bool = False) -> tuple[Any, list[dict[str, Any]]]:
    """Import the bundles into a fresh home under ``work``, export a dataset, return (rows, sources).

    ``one_code``: refuse (:class:`MixedSources`, before featurising) sources whose classes' targets
    are of more than one kind of vector code."""
    from tunefleet import api
    from tunefleet.config import Settings
    from tunefleet.hardware import cpu_label
    from tunefleet.learning import dataset
    from tunefleet.learning.pretrained import vector_code

    ctx = api.connect(Settings(home=work, hub="off"))
    info = []
    for src in sources:
        t0 = time.perf_counter()
        res = api.hub_import(ctx, src)
        print(f"imported {src.name}: {res.counts.get('records_new', 0)} records of {res.counts.get('workloads', 0)} "
              f"workloads ({time.perf_counter() - t0:.1f} s)", flush=True)
        info.append({"file": src.name, "sha256": res.sha256, "created_at": str(res.created_at),
                     "records": res.counts.get("records", 0), "classes": res.classes})
    classes = ctx.db.hub_classes()
    cpus = {hw.name: cpu_label(dict(hw.capabilities or {}).get("cpu") or {}) for hw in classes}
    codes = {hw.name: vector_code(hw.target) for hw in classes}
    for item in info:
        item["cpus"] = sorted({cpus[c] for c in item["classes"] if c in cpus})
        item["vector_code"] = sorted({codes[c] for c in item["classes"] if c in codes})
    mixed = sorted({c for item in info for c in item["vector_code"]})
    if one_code and len(mixed) > 1:
        raise MixedSources(f"the sources mix vector codes ({', '.join(mixed)}): train each shipped model on its own "
                           "code's campaigns, or name --output")
    t0 = time.perf_counter()
    dataset.export(ctx.db, ctx.store)
    table = dataset.renormalise(dataset.load(ctx.db, ctx.store))
    print(f"featurised {table.num_rows} measurements ({time.perf_counter() - t0:.0f} s)", flush=True)
    return table, info


def bundles_exist(prog: str, sources: list[Path]) -> bool:
    """Whether every source bundle is a file; if not, says which are missing in one line on stderr."""
    missing = [str(s) for s in sources if not s.is_file()]
    if missing:
        print(f"{prog}: no such bundle: {', '.join(missing)}", file=sys.stderr)
    return not missing


class MixedSources(ValueError):
    """The sources' classes are of more than one kind of vector code, and no --output was named."""


def header(title: str, width: int = 34) -> str:
    """The column heads over :func:`row`'s lines."""
    return f"{title:{width}s} {'pairwise':>8s} {'by workload':>11s} {'peak@1':>7s} {'peak@5':>7s}"


def row(name: str, m: dict[str, Any], width: int = 34) -> str:
    def f(key: str) -> str:
        return "n/a" if m.get(key) is None else f"{m[key]:.3f}"

    return (f"{name:{width}s} {f('pairwise_accuracy'):>8s} {f('pairwise_by_workload'):>11s} {f('peak@1'):>7s} "
            f"{f('peak@5'):>7s}")


GAPS = (0.02, 0.05, 0.1, 0.25)
"""Edges of the run-time gap buckets of :func:`by_gap` (the slower candidate's time / the faster's, minus 1)."""


def by_gap(scores: Any, table: Any) -> list[tuple[str, int, float | None]]:
    """(bucket, pairs, pairwise accuracy) of the held-out pairs by how far apart their run times
    are: where the ranking's misses are (near-ties that the measurements' own noise can reverse,
    or clear differences)."""
    import numpy as np

    from tunefleet.learning import costmodel as cm

    ok = cm._ok_mask(table)
    labels, sc, groups = cm._labels(table)[ok], np.asarray(scores, dtype=np.float64)[ok], cm._group_ids(table)[ok]
    edges = np.array(GAPS)
    pairs = np.zeros(len(GAPS) + 1)
    credit = np.zeros(len(GAPS) + 1)
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        lab, s = labels[idx], sc[idx]
        better = lab[:, None] > lab[None, :]  # each unordered pair once, from its faster row
        gap = np.divide(lab[:, None], lab[None, :])[better] - 1.0
        ds = np.sign(s[:, None] - s[None, :])[better]
        bucket = np.searchsorted(edges, gap, side="right")
        np.add.at(pairs, bucket, 1)
        np.add.at(credit, bucket, (ds > 0) + 0.5 * (ds == 0))
    names = [f"< {GAPS[0]:.0%}", *(f"{a:.0%}-{b:.0%}" for a, b in itertools.pairwise(GAPS)), f">= {GAPS[-1]:.0%}"]
    return [(name, int(n), float(c / n) if n else None) for name, n, c in zip(names, pairs, credit)]


def noise_by_gap(table: Any) -> list[tuple[str, int, float | None]]:
    """:func:`by_gap` of the measurements themselves: each candidate's first repeat ranking the pairs
    labelled by the mean of its other repeats, the ceiling that run-to-run noise leaves a model."""
    import numpy as np
    import pyarrow as pa

    from tunefleet.learning import costmodel as cm

    runs = table["run_secs"].to_pylist()
    ok = cm._ok_mask(table)
    keep = [i for i, r in enumerate(runs) if ok[i] and r and len(r) >= 2]
    sub = table.take(keep)
    labels = pa.array([1.0 / float(np.mean(runs[i][1:])) for i in keep], pa.float64())
    sub = sub.set_column(sub.schema.get_field_index("label"), "label", labels)
    return by_gap(np.array([1.0 / runs[i][0] for i in keep]), sub)


def gap_line(gaps: list[tuple[str, int, float | None]]) -> str:
    total = max(1, sum(n for _, n, _ in gaps))
    return "; ".join(f"{name}: {n} pairs ({n / total:.0%}), {acc:.3f}" if acc is not None else f"{name}: none"
                     for name, n, acc in gaps)


def evaluate(train_t: Any, test_t: Any, dims: set[int]) -> tuple[tuple[str, int, dict[str, Any]], dict[str, Any]]:
    """Train every configuration on the split (``dims`` held out), print the table; (the best
    configuration, its report)."""
    from tunefleet.learning import costmodel as cm

    n_train, n_test = (len(set(t["workload_hash"].to_pylist())) for t in (train_t, test_t))
    print(f"held out: {n_test} workloads ({test_t.num_rows} rows) with a dimension in {sorted(dims)}; "
          f"trained on {n_train} workloads ({train_t.num_rows} rows)")
    base = cm.baselines(test_t)
    print(header("ranking"))
    for name, m in base.items():
        print(row(f"{name} ranking", m))
    results = []
    for objective, rounds, params in CONFIGS:
        t0 = time.perf_counter()
        model = cm.train(train_t, objective=objective, num_boost_round=rounds, params=params)
        metrics = cm.evaluate(model, test_t)
        results.append(((objective, rounds, params), metrics, model))
        label = f"{objective} {rounds} rounds" + "".join(f" {k}={v}" for k, v in params.items())
        print(row(label, metrics) + f"   ({time.perf_counter() - t0:.0f} s)", flush=True)
    best, metrics, chosen = max(results, key=lambda r: cm._rank_key(r[1]))
    gaps, noise = by_gap(chosen.predict(test_t), test_t), noise_by_gap(test_t)
    print(f"held-out pairs by their run-time gap, pairwise accuracy of the best configuration: {gap_line(gaps)}")
    print(f"the same pairs ranked by each candidate's first repeat (the noise ceiling): {gap_line(noise)}")
    floor = cm.baseline_floor(base)
    report = {"dims": sorted(dims), "workloads": n_test, "rows": test_t.num_rows, "train_workloads": n_train,
              "train_rows": train_t.num_rows, "floor": floor,
              "metrics": {k: metrics.get(k) for k in (*METRICS, "n_pairs")},
              "by_gap": [{"gap": name, "pairs": n, "pairwise_accuracy": acc, "first_repeat": ceiling}
                         for (name, n, acc), (_, _, ceiling) in zip(gaps, noise)],
              "baselines": {name: {k: m.get(k) for k in METRICS}
                            for name, m in base.items()}}
    return best, report


def load_models(files: dict[str, str]) -> dict[str, Any]:
    """{label: model file} -> {label: model}; a file that is not a tunefleet cost model raises
    :class:`~tunefleet.learning.costmodel.CostModelError` naming it (before any featurising)."""
    from tunefleet.learning import costmodel as cm

    models = {}
    for label, path in files.items():
        try:
            models[label] = cm.TrainedModel.from_bytes(Path(path).read_bytes())
        except cm.CostModelError as exc:
            raise cm.CostModelError(f"--score {path}: {exc}") from None
    return models


def score_models(models: dict[str, Any], table: Any, test_t: Any, by_name: str | None) -> dict[str, Any]:
    """Each model's metrics on every row of ``table`` and on the held-out side ``test_t``, and on
    each of them split by ``by_name`` (workloads whose name holds it, the others); printed as rows
    of the table and returned as {label: {part: metrics}}."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from tunefleet.learning import costmodel as cm

    def parts(t: Any, side: str) -> list[tuple[str, Any]]:
        out = [(side, t)]
        if by_name:
            has = pa.array([by_name in (n or "") for n in t["workload_name"].to_pylist()], pa.bool_())
            out += [(f"{side}, {by_name}", t.filter(has)), (f"{side}, not {by_name}", t.filter(pc.invert(has)))]
        return out

    report: dict[str, Any] = {}
    pieces = [p for p in parts(table, "every row") + parts(test_t, "held out") if p[1].num_rows]
    for label, model in models.items():
        lines = []
        for part, t in pieces:
            m = cm.evaluate(model, t)
            report.setdefault(label, {})[part] = {k: m.get(k) for k in (*METRICS, "n_rows", "n_workloads")}
            lines.append((f"{label}: {part} ({m['n_workloads']} wl, {m['n_rows']} rows)", m))
        width = max(len(name) for name, _ in lines)
        print(header("scored", width))
        for name, m in lines:
            print(row(name, m, width=width), flush=True)
    return report


def diagnose(table: Any, objective: str, rounds: int, params: dict[str, Any]) -> dict[str, Any]:
    """Where the held-out misses come from, the chosen configuration on other splits of the same rows:
    fitted and scored on every row (what the features and the model's capacity allow at all), the
    same with 400 rounds of depth 10, 30 % of each workload's rows held out (workloads it has seen),
    and 30 % of the workloads held out at random (shapes the training side may share); and how many
    pairs of a workload's candidates have identical features (no model can order those)."""
    import numpy as np
    import pyarrow as pa

    from tunefleet.learning import costmodel as cm

    keys = ("pairwise_accuracy", "pairwise_by_workload", "peak@1")
    out: dict[str, Any] = {}

    def fit(name: str, train_t: Any, test_t: Any, n_rounds: int = rounds, more: dict[str, Any] | None = None) -> None:
        model = cm.train(train_t, objective=objective, num_boost_round=n_rounds, params={**params, **(more or {})})
        m = cm.evaluate(model, test_t)
        out[name] = {k: m.get(k) for k in (*keys, "n_workloads", "n_rows")}
        print(row(name, m), flush=True)

    fit("every row, scored on itself", table, table)
    fit("every row, 400 rounds depth 10", table, table, n_rounds=400, more={"max_depth": 10})
    held = np.random.default_rng(0).random(table.num_rows) < 0.3
    fit("30% of each workload's rows out", table.filter(pa.array(~held)), table.filter(pa.array(held)))
    fit("30% of the workloads out at random", *cm.split_by_workload(table, 0.3, 0))
    x, groups, labels, ok = cm.candidate_features(table), cm._group_ids(table), cm._labels(table), cm._ok_mask(table)
    pairs = same = 0
    for g in np.unique(groups[ok]):
        idx = np.flatnonzero((groups == g) & ok)
        inverse = np.unique(x[idx], axis=0, return_inverse=True)[1].ravel()
        better = labels[idx][:, None] > labels[idx][None, :]
        pairs += int(better.sum())
        same += int((better & (inverse[:, None] == inverse[None, :])).sum())
    out["identical_features"] = {"pairs": pairs, "identical": same}
    print(f"pairs of a workload's candidates with different run times: {pairs}; with identical features: {same} "
          f"({same / max(1, pairs):.1%})")
    return out


def mlp(train_t: Any, test_t: Any, epochs: int, hidden: int = 256, seed: int = 0) -> dict[str, Any]:
    """TenSet's MLP cost model on the split :func:`evaluate` used (needs torch): each store's 164 features through
    three ReLU layers of ``hidden``, summed over the candidate's stores, then one linear score;
    trained with a pairwise logistic loss within each workload (8 workloads of up to 64 candidates
    a step, each pair weighted by its log run-time gap), features standardised on the training
    side. Prints the held-out metrics (and the fit on the training rows) every 10 epochs."""
    import numpy as np
    import torch

    from tunefleet.learning import costmodel as cm
    from tunefleet.learning.dataset import FEATURE_DIMS, feature_matrix

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    (f_tr, off_tr), (f_te, off_te) = feature_matrix(train_t), feature_matrix(test_t)
    mu, sd = f_tr.mean(0), f_tr.std(0) + 1e-6
    x_tr, x_te = torch.from_numpy((f_tr - mu) / sd), torch.from_numpy((f_te - mu) / sd)
    log_y = np.log(np.maximum(cm._labels(train_t), 1e-12))
    groups, ok = cm._group_ids(train_t), cm._ok_mask(train_t)
    members = [r for g in np.unique(groups) if len(r := np.flatnonzero((groups == g) & ok)) >= 2]
    layers: list[torch.nn.Module] = []
    for n_in in (FEATURE_DIMS, hidden, hidden):
        layers += [torch.nn.Linear(n_in, hidden), torch.nn.ReLU()]
    encode, head = torch.nn.Sequential(*layers), torch.nn.Linear(hidden, 1)
    opt = torch.optim.Adam([*encode.parameters(), *head.parameters()], lr=7e-4, weight_decay=1e-6)

    def scores(x: Any, offsets: np.ndarray, rows: np.ndarray) -> Any:
        sizes = offsets[rows + 1] - offsets[rows]
        idx = torch.from_numpy(np.concatenate([np.arange(offsets[r], offsets[r + 1]) for r in rows]))
        seg = torch.from_numpy(np.repeat(np.arange(len(rows)), sizes))
        pooled = torch.zeros(len(rows), hidden).index_add_(0, seg, encode(x[idx]))
        return head(pooled).squeeze(-1)

    def metrics(x: Any, offsets: np.ndarray, t: Any) -> dict[str, Any]:
        with torch.no_grad():
            return cm.evaluate_scores(scores(x, offsets, np.arange(t.num_rows)).numpy(), t)

    out: dict[str, Any] = {"epochs": epochs, "hidden": hidden}
    for epoch in range(1, epochs + 1):
        rng.shuffle(members)
        for i in range(0, len(members), 8):
            picked = [rng.choice(r, size=min(64, len(r)), replace=False) for r in members[i:i + 8]]
            s = scores(x_tr, off_tr, np.concatenate(picked))
            loss, at = torch.zeros(()), 0
            for rows in picked:
                gap = torch.from_numpy(log_y[rows][:, None] - log_y[rows][None, :])
                better = gap > 0
                part = s[at:at + len(rows)]
                at += len(rows)
                if better.any():
                    w = gap[better].float()
                    loss = loss + (w * torch.nn.functional.softplus(part[None, :] - part[:, None])[better]).sum() / w.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
        if epoch % 10 == 0 or epoch == epochs:
            held, fit = metrics(x_te, off_te, test_t), metrics(x_tr, off_tr, train_t)
            print(row(f"MLP {hidden}x3, epoch {epoch}", held) + f"   (training rows: pairwise "
                  f"{fit['pairwise_accuracy']:.3f})", flush=True)
            out[str(epoch)] = {"heldout": {k: held.get(k) for k in METRICS},
                               "train_pairwise": fit["pairwise_accuracy"]}
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sources", nargs="+", type=Path, help="hub bundles holding a campaign's measurements")
    p.add_argument("--output", type=Path, default=None, help="where to write the model (default the package's "
                   "shipped model for the sources' vector code: tunefleet/data/costmodel/avx2.json or default.json)")
    p.add_argument("--holdout-dims", default=",".join(map(str, DEFAULT_HOLDOUT_DIMS)),
                   help="hold out every workload with one of these tensor dimensions (comma-separated)")
    p.add_argument("--work-dir", type=Path, help="the scratch tunefleet home (default a temporary folder)")
    p.add_argument("--evaluate-only", action="store_true", help="print the table, write nothing")
    p.add_argument("--json", type=Path, help="also write the report as JSON here")
    p.add_argument("--diagnose", action="store_true", help="also score the chosen configuration on other splits of "
                   "the same rows (in-sample, rows of seen workloads, random workloads) and count candidates "
                   "with identical features")
    p.add_argument("--mlp", type=int, default=0, metavar="EPOCHS", help="also train a small neural model "
                   "(TenSet's MLP, pairwise loss) for EPOCHS epochs on the same split and print its metrics; "
                   "it is never written (needs torch)")
    p.add_argument("--score", action="append", default=[], metavar="LABEL=FILE", help="also score an existing "
                   "model file on every row of the sources and on the held-out side (repeatable)")
    p.add_argument("--by-name", metavar="TEXT", help="--score's rows also split into the workloads whose name "
                   "holds TEXT and the others (e.g. winograd)")
    args = p.parse_args(argv)
    if args.by_name and not args.score:
        p.error("--by-name splits --score's rows: name a model with --score LABEL=FILE")
    args.score = parse_compare(p, args.score, "--score")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import tvm

    from tunefleet.learning import costmodel as cm
    from tunefleet.learning.pretrained import model_file

    if not bundles_exist("pretrain", args.sources):
        return 2
    try:
        models = load_models(args.score)
    except cm.CostModelError as exc:
        print(f"pretrain: {exc}", file=sys.stderr)
        return 2
    dims = {int(d) for d in args.holdout_dims.split(",") if d.strip()}
    with tempfile.TemporaryDirectory(prefix="tunefleet-pretrain-") as tmp:
        try:
            table, sources = load_table(args.sources, args.work_dir or Path(tmp),
                                        one_code=args.output is None and not args.evaluate_only)
        except MixedSources as exc:
            print(f"pretrain: {exc}", file=sys.stderr)
            return 2
    split = cm.split_by_workload(table, heldout=cm.shape_holdout(table, dims))
    scored = score_models(models, table, split[1], args.by_name)
    (objective, rounds, params), report = evaluate(*split, dims)
    if scored:
        report["scored"] = scored
    if args.diagnose:
        report["diagnose"] = diagnose(table, objective, rounds, params)
    if args.mlp:
        report["mlp"] = mlp(*split, args.mlp)
    label = f"{objective}, {rounds} rounds" + "".join(f", {k}={v}" for k, v in params.items())
    if (report["metrics"]["pairwise_accuracy"] or 0.0) <= report["floor"]:
        print(f"pretrain: the best configuration ({label}) ranks the held-out workloads no better than the "
              f"baselines; nothing written", file=sys.stderr)
        return 1
    print(f"chosen: {label}")
    if args.json:
        args.json.write_text(json.dumps({"chosen": label, "heldout": report, "sources": sources}, indent=1) + "\n")
    if args.evaluate_only:
        return 0
    codes = sorted({c for s in sources for c in s["vector_code"]})
    output = args.output or model_file(codes[0])
    model = cm.train(table, objective=objective, num_boost_round=rounds, params=params)
    newest = max(s["created_at"] for s in sources)
    model.meta.update({
        "created_at": newest,  # the newest source's: the same sources give the same metadata
        "tvm_version": str(tvm.__version__),
        "trained_on": {"rows": table.num_rows, "workloads": len(set(table["workload_hash"].to_pylist())),
                       "cpus": sorted({c for s in sources for c in s["cpus"]}), "vector_code": codes,
                       "sources": sources},
        "heldout": {**report["metrics"], "dims": report["dims"], "workloads": report["workloads"],
                    "rows": report["rows"], "baselines": report["baselines"]},
    })
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_bytes(model.to_bytes())
    print(f"wrote {output}: {objective}, {table.num_rows} rows of {model.meta['trained_on']['workloads']} "
          f"workloads ({output.stat().st_size / 1e6:.2f} MB), written {dt.datetime.now():%Y-%m-%d %H:%M}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
