"""Which thread works on which data: a Winograd schedule's batched products split by tile.

A Winograd convolution runs in stages, each a parallel loop whose iterations TVM hands out to the
threads in contiguous shares: the data transform (``data_pack``, ``[alpha, alpha, P, C]``), the
batched products (``bgemm``, ``[alpha, alpha, P, CO]``) and the inverse transform, each over the
tile axis P but the products, whose tiling puts the transform positions (``eps``, ``nu``) first.
When the products' outermost tiles split ``eps`` or ``nu`` between the threads, each thread reads
transformed tiles the other wrote and writes products the other transforms back: on a machine
whose two cores share no cache (a VM whose vCPUs the host placed on two dies) those bytes cross
between them twice per convolution, and where the cores share one, nothing shows it. A VM may move
between the two in minutes, so the tuner's measurements of a workload mix them.

:func:`thread_local` rewrites such a trace so that P's outer loop leads the products' outer loops,
split in at least as many parts as threads: the threads share the fused outer loop in contiguous
shares, so each keeps its own tiles through the three stages. Only P's tiling and the order of the
outer loops change; every other tile, and so what each outer iteration holds (the accumulator
written back at the last outer loop), stays as it was. (A first version moved the other axes'
outer factors inward instead, which enlarged each outer iteration's accumulator up to four times
and measured 2.0-2.4x slower on some tuned schedules.) On large feature maps the variant runs as
fast as the original with the cores sharing a cache and much faster with them apart; on small ones
(a few tiles a thread) it can lose a little (docs/performance.md, "What crosses between the
threads", "The rewrite since"). The tuner measures it as a seed
(:class:`tunefleet.engine.policies.ThreadLocal`); a build times each Winograd workload's fastest
schedule beside its rewrite, side by side, so both figures come from one placement
(:func:`tunefleet.delivery.confirm.confirm_by_tile`), and that pairing decides between the two
(:func:`build_order`); without one, a schedule that splits by tile is preferred over a faster one
that does not while it is within :data:`PREFER_WITHIN` (:func:`prefer_split_by_tile`). No TVM:
traces are read as JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

PREFER_WITHIN = 0.03
"""A schedule whose batched products split by tile is built instead of the fastest record of its
workload when its measured run time is at most this fraction above it."""

_AXES = ("eps", "nu", "p", "o")  # bgemm's spatial axes, in the order its loops come


def _bgemm_tiles(insts: list[Any], decisions: dict[int, Any]) -> dict[str, int] | None:
    """Where each spatial axis of the ``bgemm`` block is tiled (the instruction's index), or None
    without such a block or a four-level tiling of each axis."""
    block = next((inst[3][0] for inst in insts
                  if inst[0] == "GetSBlock" and inst[2] and inst[2][0] == "bgemm"), None)
    if block is None:
        return None
    loops = next((inst[3] for inst in insts if inst[0] == "GetLoops" and inst[1] == [block]), None)
    if loops is None or len(loops) < len(_AXES):
        return None
    axis_of = dict(zip(loops[:len(_AXES)], _AXES, strict=True))
    tiles = {axis_of[inst[1][0]]: i for i, inst in enumerate(insts)
             if inst[0] == "SamplePerfectTile" and inst[1] and inst[1][0] in axis_of}
    if set(tiles) != set(_AXES) or any(len(decisions.get(i) or []) != 4 for i in tiles.values()):
        return None
    return tiles


def _parse(trace_json: str) -> tuple[list[Any], list[Any], dict[int, Any], dict[str, int] | None]:
    insts, decisions = json.loads(trace_json)
    decided = {i: d for i, d in decisions}
    return insts, decisions, decided, _bgemm_tiles(insts, decided)


def _outer_order(insts: list[Any], tiles: dict[str, int]) -> tuple[int, list[str], dict[str, str]] | None:
    """The ``Reorder`` instruction of the ``bgemm`` tiling (its index), its outer loops' axes in
    loop order, and each axis's outer loop (the first output of its ``Split``); None without them."""
    outer: dict[str, str] = {}
    for axis, i in tiles.items():
        loop = insts[i][1][0]
        split = next((inst for inst in insts if inst[0] == "Split" and inst[1] and inst[1][0] == loop), None)
        if split is None or not split[3]:
            return None
        outer[axis] = split[3][0]
    axis_of = {rv: axis for axis, rv in outer.items()}
    for k, inst in enumerate(insts):
        if inst[0] == "Reorder" and set(outer.values()) <= set(inst[1]):
            return k, [axis_of[rv] for rv in inst[1] if rv in axis_of], outer
    return None


def splits_by_tile(trace_json: str) -> bool | None:
    """Whether the trace's batched products split between the threads by the tile axis P at their
    outermost level (None: a trace without Winograd's batched products): P's outer loop split (a
    factor above 1) and either the only one split there, or the first of the outer loops (the
    threads share the fused outer loop in contiguous halves: P's first, each thread its own
    tiles)."""
    insts, _, decided, tiles = _parse(trace_json)
    return None if tiles is None else _by_tile(decided, tiles, _outer_order(insts, tiles))


def _by_tile(decided: dict[int, Any], tiles: dict[str, int],
             order: tuple[int, list[str], dict[str, str]] | None) -> bool:
    """:func:`splits_by_tile` of a parsed trace (``order``: :func:`_outer_order`'s)."""
    if decided[tiles["p"]][0] <= 1:
        return False
    if all(decided[tiles[axis]][0] == 1 for axis in ("eps", "nu", "o")):
        return True
    return order is not None and order[1][0] == "p"


def _smallest_divisor_from(n: int, at_least: int) -> int:
    return next((d for d in range(max(1, at_least), n + 1) if n % d == 0), n)


def thread_local(trace_json: str, threads: int) -> str | None:
    """The trace with its batched products' outer loops led by the tile axis P, split in at least
    ``threads`` parts, or None: one thread (nothing is handed between threads), no such block or
    tiling, P's outer two levels too short to split between ``threads`` threads, a block computed
    at P's outer loop (moving that loop out would change what it computes at each step), or split
    by tile already.

    Only P changes: its first two tile levels are merged and re-split so that the outer one is the
    smallest divisor of their product at least ``threads`` (kept where it is that large already),
    and its outer loop goes first among the outer loops. The other axes' tiles, the inner levels
    (the micro-kernel) and every tile's footprint at the outer level stay as they were: the
    threads, which share the fused outer loop in contiguous halves, then split it by P."""
    insts, decisions, decided, tiles = _parse(trace_json)
    if threads < 2 or tiles is None:
        return None
    found = _outer_order(insts, tiles)
    if found is None or _by_tile(decided, tiles, found):
        return None
    k, axes, outer = found
    if any(inst[0] in ("ComputeAt", "ReverseComputeAt") and len(inst[1]) > 1 and inst[1][1] == outer["p"]
           for inst in insts):
        return None
    f = decided[tiles["p"]]
    merged = f[0] * f[1]
    first = f[0] if f[0] >= threads else _smallest_divisor_from(merged, threads)
    if first < threads:  # no divisor that large: P's outer levels hold fewer tiles than threads
        return None
    new_p = [first, merged // first, f[2], f[3]]
    loops = insts[k][1]
    outer_rvs = set(outer.values())
    led = iter([outer["p"], *(outer[a] for a in axes if a != "p")])
    new_insts = [list(inst) for inst in insts]
    new_insts[k] = [insts[k][0], [next(led) if rv in outer_rvs else rv for rv in loops], insts[k][2], insts[k][3]]
    return json.dumps([new_insts, [[i, new_p if i == tiles["p"] else d] for i, d in decisions]], separators=(",", ":"))


def rewrite_of(trace_json: str, threads: int) -> tuple[str, str] | None:
    """:func:`thread_local`'s rewrite of the trace and its sha256 (the database's trace identity,
    by which a measurement of it is found), or None where it has none."""
    variant = thread_local(trace_json, threads)
    if variant is None:
        return None
    from tunefleet.db.database import sha256_text  # the database package is heavy: only where a rewrite exists

    return variant, sha256_text(variant)


R = TypeVar("R")

PREFER_DEPTH = 16
"""Records of a workload, fastest first, among which :func:`build_order` looks for one that splits by tile."""


def prefer_split_by_tile(rows: Sequence[R], trace_of: Any, run_s_of: Any,
                         within: float = PREFER_WITHIN) -> list[R]:
    """``rows`` (fastest first) with the fastest one whose batched products split by tile moved to
    the front, when the first does not split so and that one ran at most ``within`` slower; as they
    were otherwise (and for any workload without Winograd's batched products)."""
    if not rows or splits_by_tile(trace_of(rows[0])) is not False:
        return list(rows)
    limit = run_s_of(rows[0]) * (1 + within)
    for k, row in enumerate(rows[1:], start=1):
        if run_s_of(row) > limit:
            break
        if splits_by_tile(trace_of(row)):
            return [row, *rows[:k], *rows[k + 1:]]
    return list(rows)


def build_order(rows: Sequence[R], paired: Mapping[str, Any], threads: int,
                within: float = PREFER_WITHIN) -> list[R]:
    """The order a build takes a workload's schedules in: ``rows`` (fastest first, ranked by the
    figures they were tuned with: ``trace_json``, ``trace_sha256``, ``mean_run_s``) with its choice first.

    When the fastest does not split by tile and a build timed it beside its rewrite
    (:func:`thread_local` for ``threads``; ``paired``: each paired schedule's latest paired
    measurement by trace sha256, :meth:`~tunefleet.db.measurements.MeasurementsMixin.paired_measurements`),
    that pairing decides, its two figures being of one moment: the rewrite (its paired
    measurement) goes first when it ran at most ``within`` slower, and is left out otherwise, a
    figure of its own from another moment saying nothing against the pairing. Without a pairing:
    :func:`prefer_split_by_tile`.
    """
    if paired and rows and splits_by_tile(rows[0].trace_json) is False:
        first = paired.get(rows[0].trace_sha256)
        found = rewrite_of(rows[0].trace_json, threads)
        rewrite = None if found is None else paired.get(found[1])
        if first is not None and first.mean_run_s is not None and rewrite is not None:
            rest = [r for r in rows if r.trace_sha256 != rewrite.trace_sha256]
            if rewrite.mean_run_s is not None and rewrite.mean_run_s <= first.mean_run_s * (1 + within):
                return [rewrite, *rest]
            rows = rest
    return prefer_split_by_tile(rows, lambda r: r.trace_json, lambda r: r.mean_run_s, within)


def ordered_for_build(db: Any, workload_id: int, hardware_class_id: int, threads: int, n: int) -> list[Any]:
    """:func:`build_order` of a workload's ``n`` fastest measurements on a class (the paired ones
    read, and the fastest's trace parsed, only where it is a Winograd schedule that does not split
    by tile: every ``get_top_k`` of the search comes through here)."""
    rows = db.best_measurements(workload_id, hardware_class_id, n)
    if not rows or splits_by_tile(rows[0].trace_json) is not False:
        return rows  # not a Winograd schedule that hands data between the threads: nothing to prefer
    return build_order(rows, db.paired_measurements(workload_id, hardware_class_id), threads)
