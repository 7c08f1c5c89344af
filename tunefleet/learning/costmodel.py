"""Retrain an XGBoost cost model on a dataset version and promote it only when it is better.

Pipeline step 7. :func:`retrain` loads the dataset rows of one hardware class (relabelled with
:func:`tunefleet.learning.dataset.renormalise`), splits them by workload, trains, evaluates the new model
*and* the current promoted one on the same held-out workloads, stores the model and registers it
in ``cost_models`` with its metrics; it is promoted only when it beats the current one.

Decisions
---------
- **Per-candidate features.** A candidate has one 164-float ``PerStoreFeature`` vector per
  buffer store. MetaSchedule's ``XGBModel`` scores each store and sums the scores; here, more
  simply, each row's stores are aggregated into one fixed-length vector: the **sum**, the
  **mean** and the **max** over stores, concatenated (3 x 164 = 492 floats), see
  :func:`candidate_features`. A row without stores gets zeros.
- **Split.** :func:`split_by_workload` holds out whole workloads (by ``workload_hash``), chosen by
  hashing ``"{seed}:{workload_hash}"``, so no held-out workload is ever seen in training and the
  split is deterministic and stable as workloads are added.
- **Objectives.** ``"reg:squarederror"`` regresses the normalised throughput ``label``;
  ``"rank:pairwise"`` learns the order within each group (one query group per (workload,
  hardware class)). :func:`compare_objectives` measures both on the same split.
- **Rows.** Error rows (label 0) are kept for training (the model learns to avoid failures);
  every metric uses successful rows only (``error_kind`` NULL and ``label > 0``).

Metrics (:func:`evaluate`, :func:`evaluate_scores`)
--------------------------------------------------
Groups are (``workload_hash``, ``hardware``); within a group labels are proportional to
throughput (one normaliser per group), so ratios of labels are ratios of throughput.

- ``pairwise_accuracy``: over all pairs of rows of the same group with *different* labels
  (pooled over groups), the fraction the scores order like the labels; a tie in the scores
  counts 0.5. None when there is no such pair. A workload with n candidates weighs about n^2.
- ``pairwise_by_workload``: each group's own pairwise accuracy (the same pairs), averaged with
  the group's successful rows as weights: how TenSet's ``evaluate_model`` averages the figure the
  literature quotes, where a workload with n candidates weighs n. None when no group has a pair.
- ``peak@k`` (k = 1, 5): per group, the best label among the k rows with the highest scores
  divided by the best label of the group, averaged over groups (each group weighs the same; TenSet
  weighs them by their rows, and its peak@5 averages the best-so-far over the 5 picks). Ties in the
  scores are broken randomly but seeded (``seed``), so constant scores give the expected value
  of a random pick, reproducibly.
- ``r2``: coefficient of determination of scores vs labels over the successful rows. Only
  meaningful for the regression objective (a ranking model's scores are on no particular scale).
- ``n_workloads`` (groups with at least one successful row) and ``n_rows`` (successful rows).

Baselines on the same rows: ``random`` (seeded uniform scores) and ``untrained`` (all scores 0,
so every pair is a tie: pairwise accuracy exactly 0.5, peak@k that of a random pick).

Promotion: the new model is promoted when there is no current model (or the current model is
unusable: its file is gone or is not a tunefleet cost model), or its held-out ``peak@1`` is
strictly higher than the current model's on the same held-out set, or equal with strictly higher
``pairwise_accuracy``. Otherwise it is registered but not promoted, and the result says why.
A blip is not a verdict: when the current model cannot be *read* because of a transient error
(the store unreachable — after the store's own retries), nothing is decided: the retrain fails
with one line, a :class:`~tunefleet.errors.TransientError` (the Prefect ``retrain`` task retries
it with its backoff; on the command line, run it again), registering nothing.

The artifact is XGBoost's own JSON model (``costmodels/<hardware>/v<N>-<token>.json``, a key no
other retrain writes), loadable with plain ``xgboost.Booster``; tunefleet's metadata (objective,
feature layout) is kept in the booster's attribute ``tunefleet``.

The database says which models exist. Concurrent retrains of a class are serialised in the
database, not only by the flow: the version is reserved (a row without an artifact) before the
file is written; the file, the metrics and the promotion are then registered in one transaction
under the class's lock (the file in table ``artifacts``), and only if the current model is still
the one the new model was compared with; otherwise it is compared again with the model that
became current meanwhile. A failed retrain deletes its file only when the database says it
registered nothing: when the commit went through and only its acknowledgement was lost, the
registered (maybe promoted) model is returned and its file stays; when the database cannot say,
the file stays and ``tunefleet gc`` deletes it if it was not registered
(:mod:`tunefleet.learning.artifacts`).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from tunefleet.errors import ArtifactNotFoundError, TransientError, TunefleetError
from tunefleet.learning.artifacts import COST_MODEL, unique_name
from tunefleet.learning.ranking import group_credits, total_credit

if TYPE_CHECKING:
    import pyarrow as pa
    import xgboost as xgb

    from tunefleet.db import Database
    from tunefleet.store import ArtifactStore

log = logging.getLogger(__name__)

OBJECTIVES = ("reg:squarederror", "rank:pairwise")
#: Aggregations over stores, concatenated in this order (see :func:`candidate_features`).
AGGREGATIONS = ("sum", "mean", "max")
PREFIX = COST_MODEL.root.rstrip("/")
DEFAULT_PARAMS: dict[str, Any] = {
    "max_depth": 6,
    "eta": 0.2,
    "min_child_weight": 1,
    "subsample": 1.0,
    "tree_method": "hist",
    "max_bin": 64,  # PerStoreFeature values are mostly log-scaled counts: few distinct values
    # One thread: on a shared, loaded machine OpenMP threads contend badly (docs/performance.md);
    # pass params={"nthread": n} on a dedicated node.
    "nthread": 1,
    "verbosity": 0,
}
DEFAULT_ROUNDS = 60
_META_ATTR = "tunefleet"


class CostModelError(TunefleetError):
    """A cost model cannot be trained, evaluated, stored or loaded."""


class CurrentModelUnavailableError(CostModelError, TransientError):
    """The current cost model could not be read for a transient reason (the store unreachable):
    nothing was decided about it; running the retrain again may work."""


# -- features and rows ----------------------------------------------------------------------------
def candidate_features(table: pa.Table) -> np.ndarray:
    """One fixed-length vector per row: sum, mean and max over its stores (float32, n x 492)."""
    from tunefleet.learning.dataset import feature_matrix

    if table.num_rows == 0:
        return aggregate_stores(np.zeros((0, _dims()), dtype=np.float32), np.zeros(1, dtype=np.int64))
    return aggregate_stores(*feature_matrix(table))


def store_features(matrices: list[np.ndarray]) -> np.ndarray:
    """:func:`candidate_features` for per-candidate ``PerStoreFeature`` matrices (as MetaSchedule gives them)."""
    dims = _dims()
    offsets = np.zeros(len(matrices) + 1, dtype=np.int64)
    np.cumsum([m.shape[0] for m in matrices], out=offsets[1:])
    flat = np.concatenate([np.asarray(m, dtype=np.float32).reshape(-1, dims) for m in matrices]) if matrices else (
        np.zeros((0, dims), dtype=np.float32))
    return aggregate_stores(flat, offsets)


def aggregate_stores(feats: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Rows ``i`` = sum, mean and max of ``feats[offsets[i]:offsets[i + 1]]``; zeros for a row without stores."""
    dims = _dims()
    n = len(offsets) - 1
    out = np.zeros((n, len(AGGREGATIONS) * dims), dtype=np.float32)
    counts = np.diff(offsets)
    has = counts > 0
    if n == 0 or feats.shape[0] == 0 or not has.any():
        return out
    starts = offsets[:-1][has]
    sums = np.add.reduceat(feats, starts, axis=0)
    maxs = np.maximum.reduceat(feats, starts, axis=0)
    out[has, :dims] = sums
    out[has, dims:2 * dims] = sums / counts[has, None]
    out[has, 2 * dims:] = maxs
    return out


def _dims() -> int:
    from tunefleet.learning.dataset import FEATURE_DIMS

    return FEATURE_DIMS


def _labels(table: pa.Table) -> np.ndarray:
    return np.nan_to_num(np.asarray(table["label"].to_numpy(zero_copy_only=False), dtype=np.float64))


def _ok_mask(table: pa.Table) -> np.ndarray:
    errors = table["error_kind"].is_null().to_numpy(zero_copy_only=False)
    return np.asarray(errors, dtype=bool) & (_labels(table) > 0)


def _group_ids(table: pa.Table) -> np.ndarray:
    """Integer group per row: one per (workload_hash, hardware)."""
    wl = table["workload_hash"].to_pylist()
    hw = table["hardware"].to_pylist() if "hardware" in table.column_names else [None] * len(wl)
    index: dict[tuple[Any, Any], int] = {}
    return np.array([index.setdefault(k, len(index)) for k in zip(wl, hw)], dtype=np.int64)


# -- split ----------------------------------------------------------------------------------------
def _unit(workload_hash: str, seed: int) -> float:
    digest = hashlib.sha256(f"{seed}:{workload_hash}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def split_by_workload(table: pa.Table, holdout_fraction: float = 0.2, seed: int = 0, *,
                      heldout: set[str] | None = None) -> tuple[pa.Table, pa.Table]:
    """(train, test) with disjoint ``workload_hash`` sets, chosen by hashing each hash with ``seed``.

    A workload is held out when its hash maps below ``holdout_fraction``; with at least two
    workloads both sides are made non-empty (the lowest-hashing workload is held out, the
    highest kept for training, when the threshold alone would leave a side empty). With
    ``heldout`` (e.g. :func:`model_holdout`), exactly those workload hashes are held out.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    if heldout is not None:
        present = set(table["workload_hash"].to_pylist())
        test = present & heldout
        if not test or test == present:
            raise CostModelError(
                f"cannot hold out {len(test)} of the dataset's {len(present)} workloads: both sides need rows")
        mask = pc.is_in(table["workload_hash"], value_set=pa.array(sorted(test), pa.string()))
        return table.filter(pc.invert(mask)), table.filter(mask)

    if not 0.0 < holdout_fraction < 1.0:
        raise CostModelError(f"holdout_fraction must be between 0 and 1 (exclusive), got {holdout_fraction}")
    hashes = sorted(set(table["workload_hash"].to_pylist()))
    if len(hashes) < 2:
        raise CostModelError(
            f"cannot split by workload: the dataset has {len(hashes)} workload(s), at least 2 are needed"
        )
    ranked = sorted(hashes, key=lambda h: (_unit(h, seed), h))
    test = {h for h in ranked if _unit(h, seed) < holdout_fraction}
    if not test:
        test = {ranked[0]}
    if len(test) == len(ranked):
        test.discard(ranked[-1])
    mask = pc.is_in(table["workload_hash"], value_set=pa.array(sorted(test), pa.string()))
    return table.filter(pc.invert(mask)), table.filter(mask)


def tensor_dims(args_info: str | None) -> set[int]:
    """Every dimension of a workload's tensors, from a row's ``args_info`` (MetaSchedule's JSON:
    ``[["TENSOR", dtype, shape], ...]``); empty when there is none."""
    dims: set[int] = set()
    for arg in json.loads(args_info or "[]"):
        if isinstance(arg, list) and len(arg) == 3 and arg[0] == "TENSOR":
            dims.update(int(d) for d in arg[2])
    return dims


def shape_holdout(table: pa.Table, dims: set[int]) -> set[str]:
    """Hashes of the workloads with a tensor dimension in ``dims``: whole shape families (a channel
    count, a width, a sequence length) that the training side of the split never sees.

    A workload's rows can name different shapes (a schedule that rewrites a weight's layout packs
    it: ``[256, 64]`` becomes ``[8, 64, 32]``), so a workload is held out when any of its rows has
    such a dimension: the split does not depend on the rows' order, and no training row has one."""
    pairs = set(zip(table["workload_hash"].to_pylist(), table["args_info"].to_pylist()))  # each shape read once
    return {wl for wl, info in pairs if tensor_dims(info) & dims}


def model_holdout(db: Database, models: list[str]) -> set[str]:
    """Hashes of the workloads only these models have (a workload shared with another model stays in training)."""
    held: set[str] = set()
    for ref in models:
        held |= {wl.structural_hash for wl, _ in db.workloads(model_id=db.model(ref).id)}
    others = {m.id for m in db.models()} - {db.model(ref).id for ref in models}
    for model_id in others:
        held -= {wl.structural_hash for wl, _ in db.workloads(model_id=model_id)}
    return held


# -- metrics --------------------------------------------------------------------------------------
def _peak(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray, k: int, seed: int) -> float | None:
    rng = np.random.default_rng(seed)
    values = []
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        lab, sc = labels[idx], scores[idx]
        best = lab.max()
        if best <= 0:
            continue
        perm = rng.permutation(len(idx))  # random tie-break, then a stable sort by score
        order = perm[np.argsort(-sc[perm], kind="stable")]
        values.append(float(lab[order[:k]].max() / best))
    return float(np.mean(values)) if values else None


def _by_workload(per_group: list[tuple[float, int, int]]) -> float | None:
    """Each group's pairwise accuracy averaged with its rows as weights (groups without a pair left out)."""
    scored = [(credit / pairs, rows) for credit, pairs, rows in per_group if pairs]
    return float(np.average([a for a, _ in scored], weights=[r for _, r in scored])) if scored else None


def _r2(labels: np.ndarray, scores: np.ndarray) -> float | None:
    if len(labels) < 2:
        return None
    ss_tot = float(((labels - labels.mean()) ** 2).sum())
    if ss_tot == 0.0:
        return None
    return 1.0 - float(((labels - scores) ** 2).sum()) / ss_tot


def evaluate_scores(scores: np.ndarray, table: pa.Table, *, seed: int = 0) -> dict[str, Any]:
    """The metrics of the module docstring for given scores (one per row of ``table``)."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.shape != (table.num_rows,):
        raise CostModelError(f"{scores.shape[0] if scores.ndim else 0} scores for {table.num_rows} rows")
    ok = _ok_mask(table)
    labels, sc, groups = _labels(table)[ok], scores[ok], _group_ids(table)[ok]
    per_group = group_credits(labels, sc, groups)
    credit, pairs = total_credit(per_group)
    return {
        "pairwise_accuracy": credit / pairs if pairs else None,
        "pairwise_by_workload": _by_workload(per_group),
        "n_pairs": pairs,
        "peak@1": _peak(labels, sc, groups, 1, seed),
        "peak@5": _peak(labels, sc, groups, 5, seed),
        "r2": _r2(labels, sc),
        "n_workloads": len(np.unique(groups)),
        "n_rows": int(ok.sum()),
    }


def baseline_floor(base: dict[str, dict[str, Any]]) -> float:
    """The pairwise accuracy a model must beat to be promoted: the best of the baselines'
    (:func:`baselines`), the guard against transfer that makes things worse."""
    return max((b.get("pairwise_accuracy") or 0.0) for b in base.values())


def random_scores(table: pa.Table, seed: int = 0) -> np.ndarray:
    """The ``random`` baseline: seeded uniform scores."""
    return np.random.default_rng(seed).random(table.num_rows)


def untrained_scores(table: pa.Table) -> np.ndarray:
    """The ``untrained`` baseline: constant scores (every comparison a tie)."""
    return np.zeros(table.num_rows)


def baselines(table: pa.Table, seed: int = 0) -> dict[str, dict[str, Any]]:
    """Metrics of the random and untrained baselines on ``table``."""
    return {
        "random": evaluate_scores(random_scores(table, seed), table, seed=seed),
        "untrained": evaluate_scores(untrained_scores(table), table, seed=seed),
    }


# -- model ----------------------------------------------------------------------------------------
@dataclass
class TrainedModel:
    """An XGBoost booster with the feature layout and objective it was trained with."""

    booster: xgb.Booster
    objective: str
    meta: dict[str, Any] = field(default_factory=dict)
    cost_model_id: int | None = None
    """Its row in ``cost_models`` when loaded from the registry (:func:`load_cost_model`)."""
    version: int | None = None

    def predict(self, table: pa.Table) -> np.ndarray:
        """One score per row of ``table`` (higher = faster)."""
        if table.num_rows == 0:
            return np.zeros(0)
        return self.predict_features(candidate_features(table))

    def predict_features(self, x: np.ndarray) -> np.ndarray:
        """One score per row of aggregated features (see :func:`store_features`)."""
        import xgboost as xgb

        if x.shape[0] == 0:
            return np.zeros(0)
        return np.asarray(self.booster.predict(xgb.DMatrix(x)), dtype=np.float64)

    def to_bytes(self) -> bytes:
        """XGBoost's JSON model, with tunefleet's metadata in the ``tunefleet`` attribute."""
        self.booster.set_attr(**{_META_ATTR: json.dumps({"objective": self.objective, **self.meta})})
        return bytes(self.booster.save_raw("json"))

    @classmethod
    def from_bytes(cls, data: bytes) -> TrainedModel:
        import xgboost as xgb

        booster = xgb.Booster()
        try:
            booster.load_model(bytearray(data))
            meta = json.loads(booster.attr(_META_ATTR) or "{}")
        except (xgb.core.XGBoostError, ValueError) as exc:
            raise CostModelError(f"not a tunefleet cost model: {str(exc).splitlines()[0][:200]}") from None
        objective = meta.pop("objective", None)
        if objective not in OBJECTIVES or meta.get("aggregations") != list(AGGREGATIONS):
            raise CostModelError("not a tunefleet cost model: its metadata names no known objective/feature layout")
        return cls(booster, objective, meta)


def train(
    table: pa.Table,
    *,
    objective: str = "reg:squarederror",
    params: dict[str, Any] | None = None,
    num_boost_round: int = DEFAULT_ROUNDS,
    include_errors: bool = True,
    seed: int = 0,
) -> TrainedModel:
    """Train on every row of ``table`` (error rows with label 0 unless ``include_errors=False``).

    ``rank:pairwise`` uses one query group per (workload, hardware class).
    """
    import xgboost as xgb

    if objective not in OBJECTIVES:
        raise CostModelError(f"unknown objective {objective!r} (known: {', '.join(OBJECTIVES)})")
    if not include_errors:
        import pyarrow as pa

        table = table.filter(pa.array(_ok_mask(table)))
    if not _ok_mask(table).any():
        raise CostModelError("no successful measurements to train on (every row is an error)")
    x, y, groups = candidate_features(table), _labels(table), _group_ids(table)
    order = np.argsort(groups, kind="stable")
    if objective == "rank:pairwise":
        dm = xgb.DMatrix(x[order], label=y[order], qid=groups[order])
    else:
        dm = xgb.DMatrix(x, label=y)
    full = {**DEFAULT_PARAMS, **(params or {}), "objective": objective, "seed": seed}
    booster = xgb.train(full, dm, num_boost_round=num_boost_round)
    meta = {
        "aggregations": list(AGGREGATIONS),
        "feature_dims": int(x.shape[1]),
        "num_boost_round": num_boost_round,
        "params": {k: v for k, v in full.items() if isinstance(v, (int, float, str, bool))},
        "n_train_rows": int(table.num_rows),
        "n_train_workloads": len(set(table["workload_hash"].to_pylist())),
    }
    return TrainedModel(booster, objective, meta)


def evaluate(model: TrainedModel, table: pa.Table, *, seed: int = 0) -> dict[str, Any]:
    """Metrics of ``model`` on ``table`` (see the module docstring); ``r2`` notes the objective."""
    metrics = evaluate_scores(model.predict(table), table, seed=seed)
    metrics["objective"] = model.objective
    if model.objective != "reg:squarederror":
        metrics["r2_note"] = "not meaningful for a ranking objective (scores are not on the label scale)"
    return metrics


def compare_objectives(
    table: pa.Table, seed: int = 0, *, holdout_fraction: float = 0.2, params: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Train both objectives on the same split; their held-out metrics, the baselines and the better one."""
    train_t, test_t = split_by_workload(table, holdout_fraction, seed)
    out: dict[str, Any] = {obj: evaluate(train(train_t, objective=obj, params=params, seed=seed), test_t, seed=seed)
                           for obj in OBJECTIVES}
    out["baselines"] = baselines(test_t, seed)
    out["better"] = max(OBJECTIVES, key=lambda o: _rank_key(out[o]))
    out["split"] = {"seed": seed, "train_workloads": len(set(train_t["workload_hash"].to_pylist())),
                    "test_workloads": len(set(test_t["workload_hash"].to_pylist()))}
    return out


def _rank_key(metrics: dict[str, Any]) -> tuple[float, float]:
    return (metrics.get("peak@1") or 0.0, metrics.get("pairwise_accuracy") or 0.0)


def beats(new: dict[str, Any], current: dict[str, Any]) -> bool:
    """Promotion rule: strictly higher peak@1, or equal peak@1 and strictly higher pairwise accuracy.

    :func:`retrain` also requires a pairwise accuracy above both baselines' (random, untrained) on the same set.
    """
    (p_new, a_new), (p_cur, a_cur) = _rank_key(new), _rank_key(current)
    return p_new > p_cur or (p_new == p_cur and a_new > a_cur)


# -- retrain, registry ----------------------------------------------------------------------------
@dataclass
class RetrainResult:
    """What :func:`retrain` registered and whether it became current."""

    cost_model_id: int
    version: int
    hardware: str
    artifact_uri: str
    promoted: bool
    reason: str
    metrics: dict[str, Any]
    model: TrainedModel


def model_key(hardware: str, version: int) -> str:
    """A new key for the file of version ``version`` (``costmodels/<class>/v<N>-<token>.json``), unused so far."""
    return f"{PREFIX}/{hardware}/{unique_name(version)}.json"


def _load_artifact(store: ArtifactStore, uri: str) -> TrainedModel:
    return TrainedModel.from_bytes(store.get_bytes(store.key_from_uri(uri)))


def retrain(
    db: Database,
    store: ArtifactStore,
    hardware: str,
    *,
    dataset_versions: list[int] | None = None,
    objective: str = "reg:squarederror",
    holdout_fraction: float = 0.2,
    seed: int = 0,
    params: dict[str, Any] | None = None,
    num_boost_round: int = DEFAULT_ROUNDS,
    table: pa.Table | None = None,
    holdout_models: list[str] | None = None,
) -> RetrainResult:
    """Train, evaluate against the current model on the same held-out workloads, register, maybe promote.

    ``table`` replaces loading the dataset from ``store`` (rows already loaded, e.g. by a flow
    that read them once); ``dataset_versions`` then only labels the metrics. With
    ``holdout_models`` the held-out workloads are those only these models have
    (:func:`model_holdout`) instead of a ``holdout_fraction`` of all.
    """
    from tunefleet.learning import dataset

    hw = db.hardware_class(hardware)
    if table is None:
        versions = sorted(set(dataset_versions)) if dataset_versions else [
            v.version for v in dataset.list_versions(db, include_incomplete=False)]
        if not versions:
            raise CostModelError("no dataset in the database yet; run `tunefleet dataset export` first")
        table = dataset.load(db, store, versions, hardware=hardware)
    else:
        versions = sorted(set(dataset_versions or set(table["dataset_version"].to_pylist())))
        if "hardware" in table.column_names:
            import pyarrow.compute as pc

            table = table.filter(pc.equal(table["hardware"], hardware))
    if table.num_rows == 0:
        raise CostModelError(
            f"no dataset rows for hardware class {hardware!r} in dataset versions {versions}; tune and export first"
        )
    table = dataset.renormalise(table)
    if not _ok_mask(table).any():
        raise CostModelError(f"no successful measurements for hardware class {hardware!r}: every row is an error")
    heldout = model_holdout(db, holdout_models) if holdout_models else None
    train_t, test_t = split_by_workload(table, holdout_fraction, seed, heldout=heldout)
    model = train(train_t, objective=objective, params=params, num_boost_round=num_boost_round, seed=seed)
    new = evaluate(model, test_t, seed=seed)

    # Guard against transfer that makes things worse (tenset#23): a model that does not rank the
    # held-out workloads better than a random ranking is never made current, even as the first one.
    base = baselines(test_t, seed)
    floor = baseline_floor(base)
    test_hashes = sorted(set(test_t["workload_hash"].to_pylist()))
    split = {"seed": seed, "holdout_fraction": None if heldout else holdout_fraction,
             "holdout_models": holdout_models or None,
             "train_workloads": len(set(train_t["workload_hash"].to_pylist())),
             "test_workloads": len(test_hashes), "test_workload_hashes": test_hashes,
             "train_rows": train_t.num_rows, "test_rows": test_t.num_rows}
    data = model.to_bytes()
    dataset_id = next((d.id for d in db.datasets() if versions and d.version == versions[-1]), None)

    # Reserve the version before writing the artifact, so its file name belongs to this retrain
    # alone; registration and promotion then happen in one transaction under the class's lock.
    row = db.add_cost_model(hardware_class_id=hw.id, artifact_uri="", metrics={"state": "training"},
                            dataset_id=dataset_id)
    key = model_key(hardware, row.version)
    try:
        uri = store.put_bytes(key, data, "application/json")
        while True:
            current_row = db.current_cost_model(hw.id)
            current = _evaluate_current(store, current_row, test_t, seed, hardware)
            promote, reason = _decide(new, current, floor)
            metrics: dict[str, Any] = json.loads(json.dumps({
                "objective": objective,
                "heldout": new,
                "current_on_heldout": current,
                "baselines": base,
                "split": split,
                "dataset_versions": versions,
                "num_boost_round": num_boost_round,
                "promoted": promote,
                "reason": reason,
            }))
            if db.finish_cost_model(row.id, artifact_uri=uri, metrics=metrics, promote=promote,
                                    expected_current=current_row.id if current_row is not None else None,
                                    artifact_key=key):
                break
            log.info("cost model v%s of %s: another model became current meanwhile; comparing with it",
                     row.version, hardware)
    except BaseException as exc:
        registered = _abandon(db, store, row.id, row.version, hardware, key)
        if registered is None or not isinstance(exc, Exception):
            raise
        # The commit went through, only its acknowledgement was lost: the database's word stands.
        metrics = dict(registered.metrics or {})
        return RetrainResult(registered.id, registered.version, hardware, registered.artifact_uri,
                             bool(registered.promoted), str(metrics.get("reason", "")), metrics, model)
    log.info("cost model v%s of %s: %s (%s)", row.version, hardware, "promoted" if promote else "not promoted", reason)
    return RetrainResult(row.id, row.version, hardware, uri, promote, reason, metrics, model)


def _evaluate_current(store: ArtifactStore, row: Any, test_t: pa.Table, seed: int,
                      hardware: str) -> dict[str, Any] | None:
    """The current model's metrics on the held-out rows, or its error when it is unusable.

    Unusable is a verdict on the model: its file is gone, or is not a tunefleet cost model. A
    transient failure to read it says nothing about the model: it raises
    :class:`CurrentModelUnavailableError` and nothing is decided.
    """
    if row is None:
        return None
    current: dict[str, Any] = {"cost_model_id": row.id, "version": row.version}
    try:
        model = _load_artifact(store, row.artifact_uri)
    except (CostModelError, ArtifactNotFoundError) as exc:
        current["error"] = str(exc).splitlines()[0][:300]
        log.warning("current cost model v%s of %s cannot be evaluated: %s", row.version, hardware, current["error"])
        return current
    except TransientError as exc:
        raise CurrentModelUnavailableError(
            f"cannot read the current cost model v{row.version} of {hardware} to compare the new model with it: "
            f"{str(exc).splitlines()[0][:300]}; nothing was promoted or registered: run the retrain again"
        ) from None
    current.update(evaluate(model, test_t, seed=seed))
    return current


def _decide(new: dict[str, Any], current: dict[str, Any] | None, floor: float) -> tuple[bool, str]:
    """Whether the new model becomes current, and why (the promotion rule in one place)."""
    if current is None:
        promote, reason = True, "no current model"
    elif "error" in current:
        promote, reason = True, f"current model v{current['version']} is unusable: {current['error']}"
    elif beats(new, current):
        promote, reason = True, (f"beats current v{current['version']} on the same held-out set "
                                 f"(peak@1 {_fmt(new['peak@1'])} vs {_fmt(current['peak@1'])}, pairwise accuracy "
                                 f"{_fmt(new['pairwise_accuracy'])} vs {_fmt(current['pairwise_accuracy'])})")
    else:
        promote, reason = False, (f"does not beat current v{current['version']} on the same held-out set "
                                  f"(peak@1 {_fmt(new['peak@1'])} vs {_fmt(current['peak@1'])}, pairwise accuracy "
                                  f"{_fmt(new['pairwise_accuracy'])} vs {_fmt(current['pairwise_accuracy'])})")
    if promote and not (new.get("pairwise_accuracy") or 0.0) > floor:
        promote, reason = False, (f"does not beat a random or untrained ranking of the held-out workloads "
                                  f"(pairwise accuracy {_fmt(new.get('pairwise_accuracy'))} vs {_fmt(floor)})")
    return promote, reason


def _abandon(db: Database, store: ArtifactStore, cost_model_id: int, version: int, hardware: str, key: str) -> Any:
    """Undo a failed retrain as far as the database says it failed (best effort, never masking).

    The reserved version is given back only while it is a reservation; then nothing points to
    the file and it is removed. When the registering commit went through (only the
    acknowledgement was lost), the registered model row is returned and its file stays. When the
    database cannot say, the file stays too: unregistered, ``tunefleet gc`` deletes it later.
    """
    try:
        registered = db.abandon_cost_model(cost_model_id)
    except Exception as exc:  # noqa: BLE001 - cleanup must not hide the retrain's own error
        log.warning("retrain of %s v%d failed, and the database cannot say whether it registered it (%s); its file "
                    "stays: `tunefleet gc` deletes it if it did not", hardware, version, str(exc).splitlines()[0][:300])
        return None
    if registered is not None:
        log.warning("retrain of %s v%d: the database registered it (its commit went through, the acknowledgement "
                    "was lost); its file stays", hardware, version)
        return registered
    try:
        store.delete(key)  # a file never written is no error
    except Exception as exc:  # noqa: BLE001 - same: the original error is re-raised by the caller
        log.warning("retrain of %s v%d failed; could not remove %s (`tunefleet gc` will): %s", hardware, version,
                    key, str(exc).splitlines()[0][:300])
    return None


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def promote_version(db: Database, hardware: str, version: int) -> Any:
    """Make a registered version current regardless of its metrics (an operator's override)."""
    from tunefleet.errors import NotFoundError

    hw = db.hardware_class(hardware)
    row = db.cost_model_version(hw.id, version)
    if row is None:
        raise NotFoundError(f"no cost model v{version} for {hardware}; see `tunefleet costmodel list`")
    db.promote_cost_model(row.id)
    log.info("cost model v%d of %s promoted by hand", version, hardware)
    return row


def load_cost_model(db: Database, store: ArtifactStore, hardware: str) -> TrainedModel | None:
    """The current promoted cost model of a hardware class, or None when there is none (the
    shipped one stands in: :func:`tunefleet.learning.pretrained.current_or_shipped`).

    Raises
    ------
    CostModelError, ArtifactNotFoundError
        When the model is unusable: its file is not a tunefleet cost model, or is gone.
    TransientError
        When its file cannot be read now (the store unreachable): try again later.
    """
    hw = db.hardware_class(hardware)
    row = db.current_cost_model(hw.id)
    if row is None:
        return None
    model = _load_artifact(store, row.artifact_uri)
    model.cost_model_id, model.version = row.id, row.version
    return model


__all__ = [
    "AGGREGATIONS",
    "aggregate_stores",
    "OBJECTIVES",
    "CostModelError",
    "CurrentModelUnavailableError",
    "RetrainResult",
    "TrainedModel",
    "baseline_floor",
    "baselines",
    "beats",
    "candidate_features",
    "compare_objectives",
    "evaluate",
    "evaluate_scores",
    "load_cost_model",
    "model_holdout",
    "shape_holdout",
    "tensor_dims",
    "model_key",
    "promote_version",
    "random_scores",
    "retrain",
    "split_by_workload",
    "store_features",
    "train",
    "untrained_scores",
]
