"""The cost-efficiency levers of tuning, as one options object (all off by default).

* ``policy`` — plateau preemption and the gain-per-joule stop (:mod:`tunefleet.preemption`);
  preempted workloads' unused trials are reallocated (:func:`tunefleet.budget.reallocate`);
* ``filter_fraction`` — measure only that fraction of each round, best-scored by the class's trained cost model
  (``tunefleet.tvm.tune.ResumingSearch``), once and while that model ranks the shard's measured candidates
  right (``filter_min_agreement``, :mod:`tunefleet.filter_audit`);
* ``energy_aware`` — lease shards in order of expected model-latency gain per joule
  (:func:`tunefleet.budget.reprioritise`);
* ``parallel`` — measure candidates with the adaptive parallel runner
  (``tunefleet.tvm.parallel_runner``), at most ``max_degree`` at once.

Off, tuning measures every trial of its budget in plan order, serially, like stock MetaSchedule.
``tunefleet tune --efficient`` turns on the first three; the settings (``TUNEFLEET_PREEMPT``,
``_FILTER_FRACTION``, ``_ENERGY_AWARE``, ``_PARALLEL_MEASURE``) set them one by one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tunefleet.vocab import DEFAULT_MIN_AGREEMENT
from tunefleet.preemption import PreemptionPolicy

if TYPE_CHECKING:
    from tunefleet.config import Settings


@dataclass(frozen=True)
class Efficiency:
    policy: PreemptionPolicy = field(default_factory=lambda: PreemptionPolicy(enabled=False))
    filter_fraction: float = 1.0
    filter_min_agreement: float = DEFAULT_MIN_AGREEMENT
    energy_aware: bool = False
    parallel: bool = False
    max_degree: int | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.filter_fraction <= 1.0:
            raise ValueError(f"filter_fraction must be in (0, 1], not {self.filter_fraction}")
        if not 0.0 <= self.filter_min_agreement <= 1.0:
            raise ValueError(f"filter_min_agreement must be in [0, 1], not {self.filter_min_agreement}")

    @classmethod
    def on(cls, **overrides: object) -> Efficiency:
        """Preemption, filtering and energy-aware leasing with the recommended figures (what
        ``tune --efficient`` uses). The parallel runner stays opt-in (``parallel=True``): it pays
        only on many-core nodes or GPUs, and on the 2-core development machine its control loop
        stays at degree 1 for most batches (see the README)."""
        base: dict[str, object] = {"policy": PreemptionPolicy(), "filter_fraction": 0.5, "energy_aware": True}
        base.update(overrides)
        return cls(**base)  # type: ignore[arg-type]

    @classmethod
    def from_settings(cls, settings: Settings) -> Efficiency:
        return cls(
            policy=PreemptionPolicy(epsilon=settings.preempt_epsilon, patience=settings.preempt_patience,
                                    min_gain_us_per_kj=settings.preempt_min_gain_us_per_kj,
                                    enabled=settings.preempt),
            filter_fraction=settings.filter_fraction,
            filter_min_agreement=settings.filter_min_agreement,
            energy_aware=settings.energy_aware,
            parallel=settings.parallel_measure,
            max_degree=settings.parallel_max_degree,
        )
