"""The ranking metric every cost-model judgement uses: pairwise credit and agreement.

A leaf module (numpy only). The retrain's held-out metrics (:mod:`tunefleet.learning.costmodel`), the
filter's audit and the warm start's audit (:mod:`tunefleet.learning.filter_audit`) all count the same
pairs the same way.
"""

from __future__ import annotations

import numpy as np


def group_credits(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> list[tuple[float, int, int]]:
    """(credit, pairs, rows) of each group, over its pairs with different labels.

    A pair earns 1 when the higher label has the higher score, 0.5 when the scores tie; a group's
    pairwise accuracy is its credit / pairs.
    """
    out = []
    for g in np.unique(groups):
        idx = np.flatnonzero(groups == g)
        lab, sc = labels[idx], scores[idx]
        credit, pairs = 0.0, 0
        for start in range(0, len(idx), 512):  # bounded memory for large groups
            dl = np.sign(lab[start:start + 512, None] - lab[None, :])
            ds = np.sign(sc[start:start + 512, None] - sc[None, :])
            valid = dl > 0  # each unordered pair counted once, from its better row
            pairs += int(valid.sum())
            credit += float((ds[valid] > 0).sum()) + 0.5 * float((ds[valid] == 0).sum())
        out.append((credit, pairs, len(idx)))
    return out


def total_credit(per_group: list[tuple[float, int, int]]) -> tuple[float, int]:
    """(sum of credit, number of pairs) of :func:`group_credits`' groups."""
    return sum(c for c, _, _ in per_group), sum(p for _, p, _ in per_group)


def pairwise_credit(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> tuple[float, int]:
    """(sum of credit, number of pairs) over pairs in the same group with different labels
    (:func:`group_credits` summed; the pairwise accuracy is credit / pairs, also :func:`agreement`)."""
    return total_credit(group_credits(labels, scores, groups))


def agreement(scores: np.ndarray, mean_s: np.ndarray) -> tuple[float | None, int]:
    """Share of pairs with different run times that ``scores`` order right, and how many pairs.

    A higher score means predicted faster, so a pair is right when the higher-scored one has the
    lower run time; equal scores count half: :func:`pairwise_credit` with the negated run time as
    the label and one group. None when no pair has different run times.
    """
    t = np.asarray(mean_s, dtype=np.float64)
    credit, pairs = pairwise_credit(-t, np.asarray(scores, dtype=np.float64), np.zeros(len(t), dtype=np.int64))
    return (credit / pairs if pairs else None), pairs
