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

:func:`thread_local` rewrites such a trace so that the products' outermost tiles split only P,
each thread keeping its own tiles through the three stages; the inner tiles, the micro-kernel, stay
as they were. On large feature maps that variant runs as fast as the original with the cores
sharing a cache and much faster with them apart; on small ones (a few tiles a thread) it can lose
(docs/performance.md, "What crosses between the threads"). The tuner measures it as a seed
(:class:`tunefleet.engine.policies.ThreadLocal`); a build times each Winograd workload's fastest
schedule beside its rewrite, side by side, so both figures come from one placement
(:func:`tunefleet.delivery.confirm.confirm_by_tile`), and prefers a schedule that splits by tile
over a faster one that does not while it is within :data:`PREFER_WITHIN`
(:func:`prefer_split_by_tile`). Pure JSON: no TVM.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
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


def splits_by_tile(trace_json: str) -> bool | None:
    """Whether the trace's batched products split only the tile axis P at their outermost level
    (None: a trace without Winograd's batched products)."""
    _, _, decided, tiles = _parse(trace_json)
    if tiles is None:
        return None
    return all(decided[tiles[axis]][0] == 1 for axis in ("eps", "nu", "o")) and decided[tiles["p"]][0] > 1


def _smallest_divisor_from(n: int, at_least: int) -> int:
    return next((d for d in range(max(1, at_least), n + 1) if n % d == 0), n)


def thread_local(trace_json: str, threads: int) -> str | None:
    """The trace with its batched products' outermost tiles splitting only the tile axis P, or
    None: one thread (nothing is handed between threads), no such block, P's outer two levels too
    short to split between ``threads`` threads, or split so already. The first two tile levels of
    each axis are merged and re-split: P's outer factor becomes the smallest divisor of their
    product that is at least ``threads``, the other axes' becomes 1; the inner two levels are left
    as they were."""
    insts, decisions, decided, tiles = _parse(trace_json)
    if threads < 2 or tiles is None or (all(decided[tiles[a]][0] == 1 for a in ("eps", "nu", "o"))
                         and decided[tiles["p"]][0] >= threads):
        return None
    new = {}
    for axis, i in tiles.items():
        f = decided[i]
        outer = f[0] * f[1]
        first = _smallest_divisor_from(outer, threads) if axis == "p" else 1
        new[i] = [first, outer // first, f[2], f[3]]
    if new[tiles["p"]][0] < threads:  # no divisor that large: P's outer levels hold fewer tiles than threads
        return None
    return json.dumps([insts, [[i, new.get(i, d)] for i, d in decisions]], separators=(",", ":"))


R = TypeVar("R")

PREFER_DEPTH = 16
"""Records of a workload, fastest first, among which :func:`built_first` looks for one that splits by tile."""


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


def built_first(rows: Sequence[R]) -> R | None:
    """Which of a workload's measurements (``trace_json``, ``mean_run_s``; fastest first, at least
    :data:`PREFER_DEPTH` of them where there are) a build uses: :func:`prefer_split_by_tile`'s first."""
    ordered = prefer_split_by_tile(rows, lambda r: r.trace_json, lambda r: r.mean_run_s)
    return ordered[0] if ordered else None
