"""The filter checks its cost model against the measurements of the workload it filters.

Filtering (``TuneOptions.filter_fraction``) drops the worse-scored part of every round before it
is measured, and a dropped candidate spends its trial. That pays only if the class's trained
model can rank *this* workload's candidates; a model that ranks them no better than a coin
throws half of the trials away (``docs/performance.md`` has the efficiency bench's figures).

:class:`FilterAudit` keeps, for every scored search candidate that is measured, its score and then
its measured mean run time, and computes the *agreement*: the share of pairs with different run
times whose scores order them right (higher score = faster; equal scores count half).

* **Probation.** Until ``min_measured`` candidates are in and their agreement reaches
  ``min_agreement``, nothing is filtered: the rounds are scored and measured in full, so the model
  is first judged on an unbiased sample of this workload's candidates (or, for a workload that
  already has measurements on the class, on the fastest of those). A model that never passes never
  drops a candidate, so it costs no trial.
* **Trusted.** Once it passes, the filter drops the worse-scored part of every round. The check is
  repeated after every round on everything measured so far (from then on, the candidates the
  filter kept: where it decides).
* **Stopped.** Below ``min_agreement``, filtering stops for the rest of the shard and every later
  candidate is measured.

``min_agreement = 0`` turns the audit off: filtering starts at the first round and never stops.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from tunefleet.learning.ranking import agreement
from tunefleet.vocab import DEFAULT_MIN_AGREEMENT

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["DEFAULT_MIN_AGREEMENT", "FilterAudit", "agreement"]


class FilterAudit:
    """Lets a shard filter only once and while the filter's cost model ranks its measurements.

    Parameters
    ----------
    min_agreement:
        Filtering starts when the agreement reaches this (:attr:`trusted`) and stops for good when
        it falls below; 0: trusted from the start, never stopped.
    min_measured:
        Measured candidates needed before the first check (4 give 6 pairs).
    """

    def __init__(self, min_agreement: float = DEFAULT_MIN_AGREEMENT, min_measured: int = 4) -> None:
        if not 0.0 <= min_agreement <= 1.0:
            raise ValueError(f"min_agreement must be in [0, 1], not {min_agreement}")
        if min_measured < 2:
            raise ValueError(f"min_measured must be >= 2, not {min_measured}")
        self.min_agreement, self.min_measured = min_agreement, min_measured
        self._scores: dict[str, float] = {}
        self._measured: list[tuple[float, float]] = []
        self.stopped: str | None = None
        """Why filtering stopped (None while it goes on)."""
        self.passed: str | None = None
        """The check that ended the probation (None while on probation)."""

    @property
    def trusted(self) -> bool:
        """Whether the filter may drop candidates now: past its probation (or the audit is off), not stopped."""
        return self.stopped is None and (self.min_agreement <= 0.0 or self.passed is not None)

    def kept(self, keys: list[str], scores: list[float]) -> None:
        """These candidates (trace hashes) with these scores will be measured (all of a probation
        round, or the part the filter kept)."""
        self._scores.update(zip(keys, (float(s) for s in scores), strict=True))

    def measured(self, key: str, mean_s: float | None) -> None:
        """A candidate's measured mean run time (None: it failed; not counted)."""
        score = self._scores.pop(key, None)
        if score is not None:
            self.observe([score], [mean_s])

    def observe(self, scores: Sequence[float], means: Sequence[float | None]) -> None:
        """Candidates already scored and measured (e.g. committed before this shard, or a round the
        scores are taken of afterwards): each score with its mean run time (None: failed; not counted)."""
        for score, mean_s in zip(scores, means, strict=True):
            if mean_s is not None and math.isfinite(float(score)):
                self._measured.append((float(score), float(mean_s)))

    def check(self) -> str | None:
        """After a round: the reason filtering stops now, or None (also None once already stopped).

        A passing check on probation ends it (:attr:`passed`)."""
        if self.stopped is not None or self.min_agreement <= 0.0 or len(self._measured) < self.min_measured:
            return None
        share, pairs = self.agreement
        if share is None:
            return None
        if share >= self.min_agreement:
            if self.passed is None:
                self.passed = f"the cost model ordered {share:.0%} of {pairs} pairs right (>= {self.min_agreement:.0%})"
            return None
        self.stopped = (f"the cost model ordered {share:.0%} of {pairs} pairs of this workload's measured "
                        f"candidates right (< {self.min_agreement:.0%})")
        return self.stopped

    @property
    def agreement(self) -> tuple[float | None, int]:
        """The agreement over everything measured so far, and its number of pairs."""
        if len(self._measured) < 2:
            return None, 0
        import numpy as np

        scores, means = zip(*self._measured, strict=True)
        return agreement(np.asarray(scores), np.asarray(means))
