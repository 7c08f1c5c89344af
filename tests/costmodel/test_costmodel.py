"""Cost model retraining (pipeline step 7): metric arithmetic on hand-computed cases, the
workload split, training beats the baselines on a learnable synthetic set, promotion logic on
SQLite and PostgreSQL, store round-trip, error one-liners."""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tunefleet.db import Database
from tunefleet.errors import TunefleetError
from tunefleet.learning import costmodel, dataset
from tunefleet.learning.costmodel import CostModelError
from tunefleet.store import LocalStore
from tunefleet.tvm.targets import host_cpu_target


def synthetic(n_workloads: int = 10, per: int = 30, seed: int = 0, hardware: str = "x86",
              errors: int = 2) -> pa.Table:
    """Rows with the dataset schema whose run time depends on features 0, 1 and 2 of the stores."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, Any]] = []
    mid = 0
    for w in range(n_workloads):
        wh = hashlib.sha256(f"w{seed}-{w}".encode()).hexdigest()
        base = 1e-3 * (w + 1)
        cands = []
        for _ in range(per):
            k = int(rng.integers(1, 4))
            feats = rng.random((k, dataset.FEATURE_DIMS), dtype=np.float32)
            speed = feats[:, 0].sum() - feats[:, 1].sum() + 2.0 * feats[:, 2].max()
            cands.append((feats, base * math.exp(-speed)))
        best = min(t for _, t in cands)
        for j, (feats, t) in enumerate(cands):
            err = j < errors
            mid += 1
            rows.append({
                "measurement_id": mid, "workload_hash": wh, "workload_name": f"w{w}", "op_kind": "matmul",
                "flops": 1e6, "target": "llvm", "trace_sha256": None, "trace_json": "[[],[]]", "args_info": "[]",
                "run_secs": None if err else [t], "mean_run_s": None if err else t, "build_s": 0.1,
                "error_kind": "run" if err else None, "best_mean_run_s": best,
                "label": 0.0 if err else best / t, "n_stores": len(feats), "features": feats.tolist(),
                "tvm_version": "0.27.0", "created_at": None, "dataset_version": 1, "hardware": hardware,
            })
    return pa.Table.from_pylist(rows, schema=dataset.schema())


def tiny(labels: list[float], groups: list[str]) -> pa.Table:
    n = len(labels)
    return pa.table({
        "workload_hash": pa.array(groups, pa.string()),
        "hardware": pa.array(["x86"] * n, pa.string()),
        "label": pa.array(labels, pa.float64()),
        "error_kind": pa.array([None if lab > 0 else "run" for lab in labels], pa.string()),
    })


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return synthetic()


# -- metric arithmetic ---------------------------------------------------------------------------------
def test_pairwise_accuracy_hand_computed() -> None:
    t = tiny([1.0, 0.5, 0.25, 1.0, 0.5], ["a", "a", "a", "b", "b"])
    # group a: pairs (1,.5) (1,.25) (.5,.25); group b: (1,.5). Scores: a ordered right except (.5,.25) reversed.
    m = costmodel.evaluate_scores(np.array([3.0, 1.0, 2.0, 0.0, 0.0]), t)
    assert m["n_pairs"] == 4
    assert m["pairwise_accuracy"] == pytest.approx((1 + 1 + 0 + 0.5) / 4)  # tie in b counts 0.5
    assert m["n_workloads"] == 2 and m["n_rows"] == 5
    assert costmodel.evaluate_scores(np.zeros(5), t)["pairwise_accuracy"] == 0.5


def test_pairwise_by_workload_weighs_each_workload_by_its_rows() -> None:
    # a: 4 rows, 6 pairs, all ordered right (1.0); b: 2 rows, 1 pair, reversed (0.0).
    t = tiny([1.0, 0.5, 0.25, 0.125, 1.0, 0.5], ["a"] * 4 + ["b"] * 2)
    m = costmodel.evaluate_scores(np.array([4.0, 3.0, 2.0, 1.0, 0.0, 1.0]), t)
    assert m["pairwise_accuracy"] == pytest.approx(6 / 7)  # pooled: a's pairs outnumber b's 6 to 1
    assert m["pairwise_by_workload"] == pytest.approx((4 * 1.0 + 2 * 0.0) / 6)  # a weighs 4 rows, b 2
    single = tiny([1.0, 1.0], ["a", "a"])  # no pair with different labels anywhere
    assert costmodel.evaluate_scores(np.zeros(2), single)["pairwise_by_workload"] is None


def test_equal_labels_and_errors_are_not_pairs() -> None:
    t = tiny([1.0, 1.0, 0.0, 0.5], ["a", "a", "a", "a"])  # the error row (label 0) is ignored
    m = costmodel.evaluate_scores(np.array([0.0, 1.0, 9.0, 0.5]), t)
    assert m["n_pairs"] == 2 and m["n_rows"] == 3
    assert m["pairwise_accuracy"] == pytest.approx(0.5)  # (1 vs .5): row0 0.0<0.5 wrong; row1 1.0>0.5 right


def test_peak_at_k_hand_computed() -> None:
    t = tiny([1.0, 0.5, 0.25, 0.1, 0.8, 0.4], ["a"] * 4 + ["b"] * 2)
    m = costmodel.evaluate_scores(np.array([0.0, 3.0, 2.0, 1.0, 1.0, 2.0]), t)
    # a: top-1 picks 0.5 (best 1.0) -> 0.5; b: top-1 picks 0.4 (best 0.8) -> 0.5
    assert m["peak@1"] == pytest.approx(0.5)
    assert m["peak@5"] == pytest.approx(1.0)  # top-5 covers every row of both groups
    perfect = costmodel.evaluate_scores(np.array([4.0, 3.0, 2.0, 1.0, 2.0, 1.0]), t)
    assert perfect["peak@1"] == 1.0 and perfect["pairwise_accuracy"] == 1.0


def test_ties_break_randomly_but_seeded() -> None:
    t = tiny([1.0, 0.5, 0.25, 0.125], ["a"] * 4)
    picks = {costmodel.evaluate_scores(np.zeros(4), t, seed=s)["peak@1"] for s in range(40)}
    assert picks == {1.0, 0.5, 0.25, 0.125}  # every row can win a tie
    a = costmodel.evaluate_scores(np.zeros(4), t, seed=3)
    assert a == costmodel.evaluate_scores(np.zeros(4), t, seed=3)


def test_r2() -> None:
    t = tiny([1.0, 0.5, 0.25], ["a"] * 3)
    assert costmodel.evaluate_scores(np.array([1.0, 0.5, 0.25]), t)["r2"] == pytest.approx(1.0)
    mean = np.full(3, np.mean([1.0, 0.5, 0.25]))
    assert costmodel.evaluate_scores(mean, t)["r2"] == pytest.approx(0.0)


def test_features_aggregate_stores(table: pa.Table) -> None:
    x = costmodel.candidate_features(table.slice(0, 3))
    feats, offsets = dataset.feature_matrix(table.slice(0, 3))
    d = dataset.FEATURE_DIMS
    assert x.shape == (3, 3 * d)
    for i in range(3):
        s = feats[offsets[i]:offsets[i + 1]]
        np.testing.assert_allclose(x[i, :d], s.sum(0), rtol=1e-6)
        np.testing.assert_allclose(x[i, d:2 * d], s.mean(0), rtol=1e-6)
        np.testing.assert_allclose(x[i, 2 * d:], s.max(0), rtol=1e-6)


# -- split ----------------------------------------------------------------------------------------------
def test_split_is_disjoint_and_deterministic(table: pa.Table) -> None:
    tr, te = costmodel.split_by_workload(table, 0.3, seed=1)
    a, b = set(tr["workload_hash"].to_pylist()), set(te["workload_hash"].to_pylist())
    assert a and b and not a & b and tr.num_rows + te.num_rows == table.num_rows
    tr2, te2 = costmodel.split_by_workload(table, 0.3, seed=1)
    assert tr2.equals(tr) and te2.equals(te)
    other = {frozenset(costmodel.split_by_workload(table, 0.3, seed=s)[1]["workload_hash"].to_pylist())
             for s in range(5)}
    assert len(other) > 1, "the seed changes the split"
    two = table.filter(pa.compute.is_in(table["workload_hash"],
                                        value_set=pa.array(sorted(a | b)[:2])))
    tr3, te3 = costmodel.split_by_workload(two, 0.01)
    assert tr3.num_rows and te3.num_rows, "both sides non-empty with two workloads"
    one = table.filter(pa.compute.equal(table["workload_hash"], sorted(a)[0]))
    with pytest.raises(CostModelError, match="at least 2 are needed"):
        costmodel.split_by_workload(one)


# -- training -------------------------------------------------------------------------------------------
def test_trained_beats_random_and_untrained(table: pa.Table) -> None:
    result = costmodel.compare_objectives(table, seed=0, holdout_fraction=0.3)
    base = result["baselines"]
    for obj in costmodel.OBJECTIVES:
        m = result[obj]
        assert m["pairwise_accuracy"] > base["random"]["pairwise_accuracy"] + 0.1, (obj, m, base)
        assert m["pairwise_accuracy"] > base["untrained"]["pairwise_accuracy"] + 0.1
        assert m["peak@5"] >= max(base["random"]["peak@5"], base["untrained"]["peak@5"])
    assert base["untrained"]["pairwise_accuracy"] == 0.5
    assert result["reg:squarederror"]["r2"] > 0.3
    assert "r2_note" in result["rank:pairwise"]
    assert result["better"] in costmodel.OBJECTIVES


def test_unknown_objective_and_all_errors(table: pa.Table) -> None:
    with pytest.raises(CostModelError, match="unknown objective"):
        costmodel.train(table, objective="binary:logistic")
    errs = synthetic(2, 3, errors=3)
    with pytest.raises(CostModelError, match="no successful measurements"):
        costmodel.train(errs)


# -- retrain, promotion, store -----------------------------------------------------------------------------
def _db(db_url: str) -> Database:
    db = Database(db_url)
    db.upsert_hardware_class("x86", host_cpu_target(2), "x86")
    return db


def test_retrain_promotion(db_url: str, tmp_path, table: pa.Table) -> None:  # type: ignore[no-untyped-def]
    db = _db(db_url)
    store = LocalStore(tmp_path / "artifacts")
    hw_id = db.hardware_class("x86").id
    assert costmodel.load_cost_model(db, store, "x86") is None

    # Even with no current model, one that ranks no better than chance is not made current.
    useless = costmodel.retrain(db, store, "x86", table=table, holdout_fraction=0.3, num_boost_round=1,
                                params={"max_depth": 1, "eta": 0.0})
    assert not useless.promoted and "random or untrained ranking" in useless.reason
    assert db.current_cost_model(hw_id) is None and useless.version == 1

    first = costmodel.retrain(db, store, "x86", table=table, holdout_fraction=0.3)
    assert first.promoted and first.version == 2 and first.reason == "no current model"
    first_key = store.key_from_uri(first.artifact_uri)
    assert re.fullmatch(r"costmodels/x86/v2-[0-9a-f]{8}\.json", first_key), "a key of its own"
    assert [(a.kind, a.key) for a in db.artifacts("cost_model")][-1:] == [("cost_model", first_key)]
    row = db.current_cost_model(hw_id)
    assert row is not None and row.id == first.cost_model_id and row.metrics["heldout"] == first.metrics["heldout"]
    m = row.metrics
    assert m["objective"] == "reg:squarederror" and m["dataset_versions"] == [1]
    assert m["split"]["test_workloads"] >= 1 and m["split"]["train_workloads"] >= 1
    assert set(m["baselines"]) == {"random", "untrained"} and m["current_on_heldout"] is None

    # Round trip through the store: identical predictions.
    loaded = costmodel.load_cost_model(db, store, "x86")
    assert loaded is not None and loaded.objective == "reg:squarederror"
    np.testing.assert_array_equal(loaded.predict(table), first.model.predict(table))

    # A useless model (no boosting rounds: constant predictions) is registered, not promoted.
    worse = costmodel.retrain(db, store, "x86", table=table, holdout_fraction=0.3, num_boost_round=1,
                              params={"max_depth": 1, "eta": 0.0})
    assert not worse.promoted and worse.version == 3 and "does not beat current v2" in worse.reason
    assert db.current_cost_model(hw_id).id == first.cost_model_id  # type: ignore[union-attr]
    cur = worse.metrics["current_on_heldout"]
    assert cur["version"] == 2 and cur["peak@1"] == first.metrics["heldout"]["peak@1"]
    assert store.exists(store.key_from_uri(worse.artifact_uri))

    # The same training again does not strictly beat itself: kept, not promoted.
    same = costmodel.retrain(db, store, "x86", table=table, holdout_fraction=0.3)
    assert not same.promoted and db.current_cost_model(hw_id).id == first.cost_model_id  # type: ignore[union-attr]

    # A broken current artifact: the new model is promoted and the reason says why.
    store.put_bytes(first_key, b"not a model")
    fresh = costmodel.retrain(db, store, "x86", table=table, holdout_fraction=0.3)
    assert fresh.promoted and "unusable" in fresh.reason
    assert db.current_cost_model(hw_id).id == fresh.cost_model_id  # type: ignore[union-attr]


class _StoreWithHook(LocalStore):
    """A local store that runs ``before_put`` once, just before its first write (the interleaving point)."""

    def __init__(self, root: Any, before_put: Any) -> None:
        super().__init__(root)
        self.before_put = before_put

    def put_bytes(self, key: str, data: bytes, content_type: str | None = None) -> str:
        hook, self.before_put = self.before_put, None
        if hook is not None:
            hook()
        return super().put_bytes(key, data, content_type)


def test_concurrent_retrains_write_distinct_versions(db_url: str, tmp_path, table: pa.Table) -> None:  # type: ignore[no-untyped-def]
    """A second retrain that runs entirely while the first is about to write its artifact gets
    its own version number and file; neither overwrites the other's model."""
    db = _db(db_url)
    inner: list[costmodel.RetrainResult] = []
    store = _StoreWithHook(tmp_path / "artifacts", lambda: inner.append(
        costmodel.retrain(db, LocalStore(tmp_path / "artifacts"), "x86", table=table, holdout_fraction=0.3,
                          num_boost_round=5)))
    outer = costmodel.retrain(db, store, "x86", table=table, holdout_fraction=0.3, num_boost_round=20)
    (other,) = inner
    assert {outer.version, other.version} == {1, 2} and outer.artifact_uri != other.artifact_uri
    for res in (outer, other):
        row = db.cost_model_version(db.hardware_class("x86").id, res.version)
        assert row is not None and row.id == res.cost_model_id and row.artifact_uri == res.artifact_uri
        assert row.metrics["num_boost_round"] == res.metrics["num_boost_round"]
        assert store.get_bytes(store.key_from_uri(res.artifact_uri)) == res.model.to_bytes(), \
            f"v{res.version}'s file holds another retrain's model"
    db.close()


def test_promotion_compares_with_a_model_made_current_meanwhile(db_url: str, tmp_path, table: pa.Table) -> None:  # type: ignore[no-untyped-def]
    """A retrain that found no current model, while another retrain promoted one before it
    finished, compares with that one instead of replacing it blindly."""
    db = _db(db_url)
    store = LocalStore(tmp_path / "artifacts")
    looked = db.current_cost_model
    inner: list[costmodel.RetrainResult] = []
    fired: list[bool] = []

    def current_then_race(hardware_class_id: int) -> Any:
        found = looked(hardware_class_id)
        if not fired:  # the other retrain runs (and promotes) right after this one looked
            fired.append(True)
            inner.append(costmodel.retrain(db, store, "x86", table=table, holdout_fraction=0.3))
        return found

    db.current_cost_model = current_then_race  # type: ignore[method-assign]
    same = costmodel.retrain(db, store, "x86", table=table, holdout_fraction=0.3)
    (first,) = inner
    assert first.promoted and first.reason == "no current model"
    assert (same.metrics["current_on_heldout"] or {}).get("version") == first.version
    assert not same.promoted and f"does not beat current v{first.version}" in same.reason
    assert looked(db.hardware_class("x86").id).id == first.cost_model_id  # type: ignore[union-attr]
    db.close()


def test_retrain_errors(db_url: str, tmp_path, table: pa.Table) -> None:  # type: ignore[no-untyped-def]
    db = _db(db_url)
    store = LocalStore(tmp_path / "artifacts")
    with pytest.raises(TunefleetError, match="no dataset in"):
        costmodel.retrain(db, store, "x86")
    with pytest.raises(CostModelError, match="no dataset rows for hardware class 'x86'") as info:
        costmodel.retrain(db, store, "x86", table=synthetic(3, 3, hardware="arm"))
    assert "\n" not in str(info.value)
    with pytest.raises(CostModelError, match="at least 2 are needed"):
        costmodel.retrain(db, store, "x86", table=synthetic(1, 5))
    with pytest.raises(CostModelError, match="every row is an error"):
        costmodel.retrain(db, store, "x86", table=synthetic(3, 2, errors=2))
    with pytest.raises(TunefleetError, match="unknown hardware class"):
        costmodel.retrain(db, store, "riscv", table=table)


# -- real exported measurements ------------------------------------------------------------------------------
def test_retrain_on_exported_mlp_dataset(db_url: str, tmp_path, mlp_workloads) -> None:  # type: ignore[no-untyped-def]
    """Export real mlp traces (hand-made run times, one build error) and retrain from the store."""
    from tests.dataset.test_dataset import _m, _setup

    db = Database(db_url)
    store = LocalStore(tmp_path / "artifacts")
    ids = _setup(db, mlp_workloads)
    batch = [_m(ids, w, i, trace, 1e-4 * (i + 1) * (j + 2))
             for i, w in enumerate(mlp_workloads) for j, trace in enumerate(w.traces)]
    batch.append(_m(ids, mlp_workloads[0], 0, mlp_workloads[0].traces[1], None, repeat=1, error="build"))
    db.commit_measurements(batch)
    v1 = dataset.export(db, store)
    assert v1 is not None

    result = costmodel.retrain(db, store, "x86", holdout_fraction=0.34, num_boost_round=10)
    assert result.metrics["dataset_versions"] == [1]
    # hand-made run times are barely learnable across workloads: the model becomes current only if
    # it ranks the held-out workloads better than a random ranking does (the transfer guard)
    beats_random = result.metrics["heldout"]["pairwise_accuracy"] > max(
        b["pairwise_accuracy"] for b in result.metrics["baselines"].values())
    assert result.promoted is beats_random
    if not beats_random:
        assert "random or untrained ranking" in result.reason
    row = db.current_cost_model(ids["hw"]["x86"])
    assert (row is not None) is beats_random
    split = result.metrics["split"]
    assert split["train_workloads"] + split["test_workloads"] == len(mlp_workloads)
    assert result.metrics["heldout"]["n_workloads"] == split["test_workloads"]
    table = dataset.load(db, store)
    stored = costmodel._load_artifact(store, result.artifact_uri)  # registered either way
    np.testing.assert_array_equal(stored.predict(table), result.model.predict(table))
    db.upsert_hardware_class("arm", host_cpu_target(2), "arm")
    with pytest.raises(CostModelError, match="no dataset rows for hardware class 'arm'"):
        costmodel.retrain(db, store, "arm")


def test_holdout_by_model(db_url: str) -> None:
    """Held-out workloads are those only the held-out model has; a shared one stays in training."""
    db = _db(db_url)
    table = synthetic(4, 3)
    short = pa.array([h[:16] for h in table["workload_hash"].to_pylist()], pa.string())  # the db's hash length
    table = table.set_column(table.schema.get_field_index("workload_hash"), "workload_hash", short)
    hashes = sorted(set(table["workload_hash"].to_pylist()))
    ids = [db.add_workload(structural_hash=h, name=h[:6], op_kind="matmul", flops=1.0, tir_json="{}")[0].id
           for h in hashes]
    a = db.add_model(name="a", source="zoo:a", format="relax-nn", sha256="a" * 64, artifact_uri="u")[0]
    b = db.add_model(name="b", source="zoo:b", format="relax-nn", sha256="b" * 64, artifact_uri="u")[0]
    for i in (0, 1, 2):
        db.link_model_workload(a.id, ids[i], 1)
    for i in (2, 3):
        db.link_model_workload(b.id, ids[i], 1)
    assert costmodel.model_holdout(db, ["b"]) == {hashes[3]}
    train_t, test_t = costmodel.split_by_workload(table, heldout=costmodel.model_holdout(db, ["b"]))
    assert set(test_t["workload_hash"].to_pylist()) == {hashes[3]}
    assert hashes[3] not in set(train_t["workload_hash"].to_pylist()) and train_t.num_rows == 9
    with pytest.raises(CostModelError, match="cannot hold out 4 of the dataset's 4 workloads"):
        costmodel.split_by_workload(table, heldout=set(hashes))
    db.close()
