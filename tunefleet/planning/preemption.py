"""Plateau preemption (Trimmer): stop spending trials on a workload whose tuning has stopped paying.

After every measured round of a shard, :func:`observe_round` updates the persisted
:class:`~tunefleet.db.tables.TuningState` of its (workload, hardware class), and
:func:`stop_reason` says whether to stop:

* **plateau** — the best latency has not improved by more than ``epsilon`` (relative) for
  ``patience`` rounds in a row;
* **low gain per joule** — over the last ``patience`` rounds, the weighted model-latency gain
  (call count x seconds the best got faster) per joule spent fell below ``min_gain_us_per_kj``
  microseconds per kilojoule.

A stopped workload is marked ``preempted``: its shard ends early (:class:`tunefleet.engine.policies.Preemption`), the
trials it did not use go to workloads still improving (:func:`tunefleet.energy.priorities.reallocate`), its
later shards end at once, and planning skips it until ``tunefleet plan --reset-plateaus``.
Because the state lives in the database, a shard resumed by another worker after a crash keeps
counting from where the dead one stopped. No TVM and no Prefect here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from tunefleet.db.tables import TuningState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreemptionPolicy:
    """When a workload stops receiving trials.

    Parameters
    ----------
    epsilon:
        A round whose best improves the previous best by at most this fraction is *stale*.
    patience:
        Stale rounds in a row that make a plateau; also the window of the gain-per-joule rule.
    min_gain_us_per_kj:
        Below this weighted model-latency gain (microseconds per kilojoule) over the last
        ``patience`` rounds the workload stops; 0 turns the rule off.
    enabled:
        False: rounds are still recorded, nothing is ever preempted.
    """

    epsilon: float = 0.01
    patience: int = 3
    min_gain_us_per_kj: float = 0.0
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.epsilon < 0 or self.patience < 1 or self.min_gain_us_per_kj < 0:
            raise ValueError(f"invalid preemption policy {self}")


def new_state(workload_id: int, hardware_class_id: int, best_s: float | None = None) -> TuningState:
    return TuningState(workload_id=workload_id, hardware_class_id=hardware_class_id, rounds=0, stale_rounds=0,
                       best_s=best_s, recent=[], preempted=False, reason=None, freed_trials=0)


def observe_round(state: TuningState, round_best_s: float | None, joules: float, weight: int,
                  policy: PreemptionPolicy) -> TuningState:
    """Fold one measured round into the state (in place; also returned).

    ``round_best_s`` is the best mean run time among the round's candidates (None if all
    failed), ``joules`` the round's energy and ``weight`` the workload's total call count.
    """
    before = state.best_s
    after = before if round_best_s is None or (before is not None and round_best_s >= before) else round_best_s
    gain_s = 0.0 if before is None or after is None else (before - after) * weight
    improved = after is not None and (before is None or (before - after) > policy.epsilon * before)
    state.rounds = (state.rounds or 0) + 1
    state.stale_rounds = 0 if improved else (state.stale_rounds or 0) + 1
    state.best_s = after
    recent = list(state.recent or []) + [{"gain_s": gain_s, "joules": float(max(joules, 0.0)), "best_s": after}]
    state.recent = recent[-policy.patience:]
    return state


def stop_reason(state: TuningState, policy: PreemptionPolicy) -> str | None:
    """Why this workload should stop receiving trials now, or None to go on."""
    if not policy.enabled:
        return None
    if state.best_s is not None and (state.stale_rounds or 0) >= policy.patience:
        return (f"plateau: best {state.best_s * 1e3:.4g} ms improved by <= {policy.epsilon:.1%} "
                f"for {state.stale_rounds} rounds")
    recent = list(state.recent or [])
    if policy.min_gain_us_per_kj > 0 and len(recent) >= policy.patience and state.best_s is not None:
        joules = sum(r["joules"] for r in recent)
        gain_us = sum(r["gain_s"] for r in recent) * 1e6
        if joules > 0 and gain_us / (joules / 1e3) < policy.min_gain_us_per_kj:
            return (f"low gain: {gain_us / (joules / 1e3):.3g} us of weighted latency per kJ over the last "
                    f"{len(recent)} rounds (< {policy.min_gain_us_per_kj:g})")
    return None
