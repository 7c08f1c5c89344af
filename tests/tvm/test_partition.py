"""A Winograd schedule's batched products split by tile (tunefleet.tvm.partition): the trace rewrite,
the build's preference, and the tuning policy that measures the rewrite (on a real SQLite database)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tunefleet.tvm import partition


def trace(eps: list[int], nu: list[int], p: list[int], o: list[int], first: str = "eps",
          at_p: bool = False) -> str:
    """The instructions of a bgemm's tiling as MultiLevelTiling records them (a real trace's shape):
    each axis sampled and split, the outer loops reordered (``first``: P's outer loop first, or the
    order MultiLevelTiling gives, eps first), and the accumulator's write-back at the last outer
    loop (``at_p``: at P's outer loop instead)."""
    insts = [["GetSBlock", [], ["data_pack", "main"], ["b0"]],
             ["GetSBlock", [], ["bgemm", "main"], ["b1"]],
             ["GetLoops", ["b0"], [], ["l2", "l3", "l4", "l5"]],
             ["SamplePerfectTile", ["l4"], [2, 64], ["v6", "v7"]],
             ["GetLoops", ["b1"], [], ["l8", "l9", "l10", "l11", "l12"]]]
    decisions = [[3, [196, 1]]]
    levels: dict[str, list[str]] = {}
    for name, loop, tiles in (("eps", "l8", eps), ("nu", "l9", nu), ("p", "l10", p), ("o", "l11", o),
                              ("ci", "l12", [8, 8])):
        factors = [f"v{loop}{k}" for k in range(len(tiles))]
        insts.append(["SamplePerfectTile", [loop], [len(tiles), 64], factors])
        decisions.append([len(insts) - 1, tiles])
        levels[name] = [f"{loop}_{k}" for k in range(len(tiles))]
        insts.append(["Split", [loop, *factors], [True, False], levels[name]])
    spatial = ["eps", "nu", "p", "o"]
    outer = [levels[a][0] for a in (["p", "eps", "nu", "o"] if first == "p" else spatial)]
    insts.append(["Reorder", [*outer, *(levels[a][1] for a in spatial), levels["ci"][0],
                              *(levels[a][2] for a in spatial), levels["ci"][1], *(levels[a][3] for a in spatial)],
                  [], []])
    insts.append(["CacheWrite", ["b1", []], [0, "global"], ["b99"]])
    insts.append(["ReverseComputeAt", ["b99", levels["p"][0] if at_p else outer[-1]], [1, -1], []])
    return json.dumps([insts, decisions], separators=(",", ":"))


def decisions(trace_json: str) -> list:
    return [d for _, d in json.loads(trace_json)[1]]


# the measured best of resnet18's 56x56 Winograd workload on Zen 4 (x86-avx2): eps and nu first
EPS_FIRST = trace([2, 3, 1, 1], [6, 1, 1, 1], [1, 196, 1, 1], [1, 1, 4, 16])
BY_TILE = trace([2, 3, 1, 1], [6, 1, 1, 1], [2, 98, 1, 1], [1, 1, 4, 16], first="p")
NO_WINOGRAD = json.dumps([[["GetSBlock", [], ["conv2d_nhwc", "main"], ["b0"]],
                           ["GetLoops", ["b0"], [], ["l1", "l2"]]], []])


def test_the_products_split_by_tile_and_keep_their_micro_kernel() -> None:
    out = partition.thread_local(EPS_FIRST, 2)
    assert out == BY_TILE  # P's outer loop first, split in two; every other tile as it was
    assert decisions(out) == [[196, 1], [2, 3, 1, 1], [6, 1, 1, 1], [2, 98, 1, 1], [1, 1, 4, 16], [8, 8]]
    # P's outer factor: the smallest divisor at least the thread count, or kept where it is that large
    odd = partition.thread_local(trace([1, 6, 1, 1], [1, 6, 1, 1], [1, 49, 1, 1], [2, 1, 4, 16]), 4)
    assert odd is not None and decisions(odd)[3:5] == [[7, 7, 1, 1], [2, 1, 4, 16]]
    kept = partition.thread_local(trace([2, 3, 1, 1], [2, 1, 3, 1], [2, 1, 98, 1], [1, 1, 1, 64]), 2)
    assert kept == trace([2, 3, 1, 1], [2, 1, 3, 1], [2, 1, 98, 1], [1, 1, 1, 64], first="p")


@pytest.mark.parametrize("trace_json, threads", [
    (BY_TILE, 2),  # split by tile already
    (trace([1, 6, 1, 1], [1, 6, 1, 1], [4, 49, 1, 1], [1, 1, 4, 16]), 2),  # in more shares than threads: still so
    (trace([2, 3, 1, 1], [6, 1, 1, 1], [2, 98, 1, 1], [1, 1, 4, 16], at_p=True), 2),  # written back at P's loop
    (trace([2, 3, 1, 1], [6, 1, 1, 1], [1, 1, 196, 1], [1, 1, 4, 16]), 2),  # P all in the inner levels
    (trace([6, 1, 1, 1], [1, 6, 1, 1], [1, 1, 1, 1], [1, 1, 4, 16]), 2),  # one tile: nothing to split
    (NO_WINOGRAD, 2),
    (EPS_FIRST, 1),  # one thread: nothing is handed between threads
])
def test_nothing_to_rewrite_is_none(trace_json: str, threads: int) -> None:
    assert partition.thread_local(trace_json, threads) is None


def test_which_traces_split_by_tile() -> None:
    assert partition.splits_by_tile(BY_TILE) is True
    assert partition.splits_by_tile(EPS_FIRST) is False
    assert partition.splits_by_tile(trace([1, 6, 1, 1], [1, 6, 1, 1], [2, 98, 1, 1], [2, 1, 2, 16])) is False
    assert partition.splits_by_tile(trace([1, 6, 1, 1], [1, 6, 1, 1], [2, 98, 1, 1], [2, 1, 2, 16], first="p")) is True
    assert partition.splits_by_tile(trace([2, 3, 1, 1], [6, 1, 1, 1], [1, 196, 1, 1], [1, 1, 4, 16], first="p")) is False
    assert partition.splits_by_tile(NO_WINOGRAD) is None


def _row(trace_json: str, run_s: float | None, mode: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(trace_json=trace_json, trace_sha256=hashlib.sha256(trace_json.encode()).hexdigest(),
                           mean_run_s=run_s, measure_mode=mode)


def _first(rows: list[SimpleNamespace]) -> SimpleNamespace | None:
    order = partition.build_order(rows, {}, 2)
    return order[0] if order else None


def test_a_build_prefers_a_schedule_split_by_tile_within_a_few_percent() -> None:
    other_eps_first = trace([3, 2, 1, 1], [6, 1, 1, 1], [1, 196, 1, 1], [1, 1, 4, 16])
    within = [_row(EPS_FIRST, 1.00), _row(other_eps_first, 1.01), _row(BY_TILE, 1.02)]
    assert _first(within) is within[2]
    assert [r.mean_run_s for r in partition.prefer_split_by_tile(within, lambda r: r.trace_json,
                                                                 lambda r: r.mean_run_s)] == [1.02, 1.00, 1.01]
    beyond = [_row(EPS_FIRST, 1.00), _row(BY_TILE, 1.00 * (1 + partition.PREFER_WITHIN) + 0.001)]
    assert _first(beyond) is beyond[0]
    fastest_by_tile = [_row(BY_TILE, 1.00), _row(EPS_FIRST, 1.01)]
    assert _first(fastest_by_tile) is fastest_by_tile[0]
    plain = [_row(NO_WINOGRAD, 1.0), _row(BY_TILE, 1.0)]  # not a Winograd workload's: as they were
    assert _first(plain) is plain[0]
    assert _first([]) is None


def test_a_pairing_decides_between_the_fastest_schedule_and_its_rewrite() -> None:
    """The fastest schedule and its rewrite timed side by side at a slow moment (both figures far
    above every record's): the rewrite goes first while it ran at most PREFER_WITHIN slower in that
    pairing, and is left out when slower, whatever its own record says; a pairing of another
    schedule than the fastest decides nothing."""
    rewrite = partition.thread_local(EPS_FIRST, 2)
    assert rewrite is not None
    other = trace([3, 2, 1, 1], [6, 1, 1, 1], [1, 196, 1, 1], [1, 1, 4, 16])
    rows = [_row(EPS_FIRST, 1.00), _row(other, 1.10), _row(rewrite, 1.50)]

    def paired(fastest_s: float, rewrite_s: float | None) -> dict[str, SimpleNamespace]:
        return {r.trace_sha256: r for r in (_row(EPS_FIRST, fastest_s, "paired:3"), _row(rewrite, rewrite_s, "paired:3"))}

    won = partition.build_order(rows, paired(2.00, 2.00 * (1 + partition.PREFER_WITHIN) - 0.001), 2)
    assert won[0].trace_json == rewrite and won[0].measure_mode == "paired:3"
    assert [r.mean_run_s for r in won[1:]] == [1.00, 1.10]
    lost = partition.build_order(rows, paired(2.00, 2.00 * (1 + partition.PREFER_WITHIN) + 0.001), 2)
    assert [r.mean_run_s for r in lost] == [1.00, 1.10]
    as_tuned = [_row(EPS_FIRST, 1.00), _row(rewrite, 1.01)]  # within PREFER_WITHIN as tuned, slower paired
    assert partition.build_order(as_tuned, paired(2.00, 2.50), 2) == [as_tuned[0]]
    assert partition.build_order(as_tuned, paired(2.00, None), 2) == [as_tuned[0]]  # its pairing failed
    only_rewrite = {k: v for k, v in paired(2.00, 2.50).items() if v.trace_json == rewrite}
    assert partition.build_order(as_tuned, only_rewrite, 2)[0] is as_tuned[1]  # no pairing of the fastest


def test_the_tuning_policy_seeds_the_rewrite_of_the_fastest_once(tmp_path: Path) -> None:
    from tunefleet.config import load_settings
    from tunefleet.db import Database, NewMeasurement
    from tunefleet.engine.policies import ThreadLocal
    from tunefleet.hardware import seed_hardware_classes
    from tunefleet.tvm.threads import class_threads

    settings = load_settings(home=tmp_path / "home")
    db = Database.from_settings(settings)
    seed_hardware_classes(db, settings)
    # two cores named in the target: the seeds do not depend on the cores this test process may use
    # (one per worker in the suite's parallel phase, where one thread has nothing to rewrite)
    stored = db.hardware_class("x86")
    x86 = SimpleNamespace(id=stored.id, target={**stored.target, "num-cores": 2})
    wl, _ = db.add_workload(structural_hash="w" * 16, name="fused_conv2d_winograd_add_relu", op_kind="conv2d",
                            flops=1e8, tir_json="{}")
    db.commit_measurements([NewMeasurement(wl.id, x86.id, EPS_FIRST, [1e-3])])
    known = db.measured_trace_hashes(wl.id, x86.id)

    def view(remaining: int, hw: object = x86) -> SimpleNamespace:
        return SimpleNamespace(db=db, wl=wl, hw=hw, known=known, remaining=remaining, shard=SimpleNamespace(id=1))

    expected = partition.thread_local(EPS_FIRST, class_threads(x86.target))
    assert expected is not None
    assert ThreadLocal().seeds(view(8)) == [expected]
    assert ThreadLocal().seeds(view(3)) == []  # a quarter of 3 trials is none
    assert ThreadLocal().seeds(SimpleNamespace(**{**vars(view(8)), "known": set()})) == []  # nothing measured yet
    gpu = SimpleNamespace(id=x86.id, target={**x86.target, "kind": "cuda"})
    assert ThreadLocal().seeds(view(8, gpu)) == []
    one_core = SimpleNamespace(id=x86.id, target={**x86.target, "num-cores": 1})
    assert ThreadLocal().seeds(view(8, one_core)) == []  # one thread hands nothing between threads
    db.commit_measurements([NewMeasurement(wl.id, x86.id, expected, [1.01e-3])])
    known = db.measured_trace_hashes(wl.id, x86.id)
    assert hashlib.sha256(expected.encode()).hexdigest() in known  # the stored identity of the text
    assert ThreadLocal().seeds(view(8)) == []  # measured once: not again
    db.close()
