"""What a tuning budget is: a number of trials or a wall time, parsed from user text.

How a request's budget is checked and spent — in rounds, each split over a model's workloads —
is :mod:`tunefleet.planning.spend`'s. A leaf module, so the settings can validate a budget too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tunefleet.errors import ParameterError

_DURATION = re.compile(r"(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+(?:\.\d+)?)s)?")
_BUDGET_HELP = "give a trial count such as 2000, or a wall time such as 90s, 15m, 1h or 1h30m"
# Past these a budget is a typo, not a plan (and a trial count must fit the database's integers):
# one line saying the limit.
MAX_TRIALS = 1_000_000_000
MAX_SECONDS = 366 * 24 * 3600.0


@dataclass(frozen=True)
class Budget:
    """A tuning budget: a number of trials (over every worker) or a wall time in seconds.

    Parse user text with :meth:`parse` (``"2000"``, ``"90s"``, ``"15m"``, ``"1h30m"``);
    ``str(budget)`` gives that text back.
    """

    trials: int | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if (self.trials is None) == (self.seconds is None):
            raise ValueError("a budget is a number of trials or a duration, exactly one of them")
        if (self.trials is not None and self.trials < 1) or (self.seconds is not None and not self.seconds > 0):
            raise ValueError(f"a budget must be positive: {self!r}")

    @classmethod
    def parse(cls, value: str | int | Budget, *, name: str = "budget") -> Budget:
        """The budget a text (or a trial count) says; one :class:`ParameterError` line naming
        ``name`` if it says none."""
        if isinstance(value, Budget):
            return value
        text = str(value).strip().lower().replace(" ", "") if not isinstance(value, bool) else ""
        if text.isdigit() and int(text) >= 1:
            if int(text) > MAX_TRIALS:
                raise ParameterError(f"invalid {name}: {value!r} (at most {MAX_TRIALS:,} trials)")
            return cls(trials=int(text))
        match = _DURATION.fullmatch(text) if text else None
        if match is not None and any(match.groupdict().values()):
            h, m, s = (float(match[k] or 0) for k in ("h", "m", "s"))
            seconds = h * 3600 + m * 60 + s
            if seconds > MAX_SECONDS:
                raise ParameterError(f"invalid {name}: {value!r} (a wall time of at most {MAX_SECONDS / 86400:.0f} days)")
            if seconds > 0:
                return cls(seconds=seconds)
        raise ParameterError(f"invalid {name}: {value!r} ({_BUDGET_HELP})")

    @property
    def is_duration(self) -> bool:
        return self.seconds is not None

    @property
    def kind(self) -> str:
        """``"duration"`` or ``"trials"`` (how summaries name it)."""
        return "duration" if self.is_duration else "trials"

    def __str__(self) -> str:
        return str(self.trials) if self.seconds is None else format_duration(self.seconds)

    def describe(self) -> str:
        """``2000 trials`` or ``15m of wall time``."""
        return f"{self.trials} trials" if self.seconds is None else f"{self} of wall time"


def format_duration(seconds: float) -> str:
    """``900`` -> ``15m``, ``5400`` -> ``1h30m``, ``90`` -> ``1m30s`` (what :meth:`Budget.parse` reads)."""
    whole = int(seconds)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    frac = seconds - whole
    parts = [f"{h}h" if h else "", f"{m}m" if m else "",
             (f"{s + frac:g}s" if frac else f"{s}s") if (s or frac) else ""]
    return "".join(parts) or "0s"
