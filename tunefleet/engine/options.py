"""Everything a tuning run can be told, as one validated object.

:class:`TuneOptions` has exactly the fields of :class:`tunefleet.config.TuneKnobs` (each also a
setting, ``TUNEFLEET_<NAME>``). It is built once per run from the settings and the entry point's
parameters (CLI flags, flow parameters, bench arguments) of the same names, and validated here
only: a bad value is one :class:`~tunefleet.errors.ParameterError` line naming the field. The
engine reads its knobs from it and from nowhere else, so a new knob is a new ``TuneKnobs`` field
and the entry points that expose it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import ConfigDict, ValidationError

from tunefleet.config import TuneKnobs
from tunefleet.errors import ParameterError
from tunefleet.planning.preemption import PreemptionPolicy

if TYPE_CHECKING:
    from tunefleet.config import Settings


class TuneOptions(TuneKnobs):
    """The knobs of one tuning run (see :class:`tunefleet.config.TuneKnobs` for each field)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> TuneOptions:
        """The settings' knobs, with ``overrides`` (a None override leaves the setting)."""
        values = {name: getattr(settings, name) for name in TuneKnobs.model_fields}
        return cls.validated(**{**values, **{k: v for k, v in overrides.items() if v is not None}})

    @classmethod
    def validated(cls, **values: Any) -> TuneOptions:
        """Build and check the options; the first bad field is one line naming it."""
        try:
            return cls(**values)
        except ValidationError as exc:
            err = exc.errors()[0]
            name = ".".join(str(x) for x in err.get("loc") or ("?",))
            if err.get("type") == "extra_forbidden":
                raise ParameterError(f"unknown tuning option {name!r}") from None
            raise ParameterError(f"invalid {name}: {err.get('input')!r} ({err.get('msg', 'invalid value')})") from None

    def replace(self, **changes: Any) -> TuneOptions:
        """A validated copy with ``changes``."""
        return self.validated(**{**self.model_dump(), **changes})

    def efficient(self) -> TuneOptions:
        """Plateau preemption, cost-model filtering (at most half of each round) and energy-aware
        leasing with the recommended figures, what ``tune --efficient`` uses. The parallel runner
        stays opt-in (``parallel_measure``): it pays only on many-core nodes or GPUs
        (``docs/performance.md``)."""
        return self.replace(preempt=True, energy_aware=True, filter_fraction=min(self.filter_fraction, 0.5))

    def population(self, round_size: int) -> int:
        """The evolutionary search's population for rounds of ``round_size`` candidates."""
        if self.search_population is not None:
            return self.search_population
        return min(512, max(64, 4 * round_size))

    @property
    def policy(self) -> PreemptionPolicy:
        """The plateau preemption policy (disabled unless ``preempt``)."""
        return PreemptionPolicy(epsilon=self.preempt_epsilon, patience=self.preempt_patience,
                                min_gain_us_per_kj=self.preempt_min_gain_us_per_kj, enabled=self.preempt)

    @property
    def filtering(self) -> bool:
        """Whether the class's trained cost model filters candidates before they are measured."""
        return self.filter_fraction < 1.0

    @property
    def wants_trained_model(self) -> bool:
        """Whether a shard needs the class's trained cost model (to warm-start or to filter)."""
        return self.warm_start or self.filtering
