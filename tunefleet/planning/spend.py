"""What a request spends — a budget or a flat trial target — checked once, and how it is spent.

Every entry point builds one :class:`Spend` from what it was given: the CLI's ``run``, ``tune``
and ``plan`` (their ``--budget`` flag), the flows of the same names (their ``budget`` parameter),
and ``run``/``pipeline``'s default, the ``TUNEFLEET_BUDGET`` setting. :meth:`Spend.request` refuses a
bad request with one :class:`~tunefleet.errors.ParameterError` line in its caller's words; what
passes is spent from here down:

* a ``tune`` gets its rounds and deadline from :meth:`Spend.tuning` (rounds for a model's budget, a
  bare deadline for a wall time alone), which a worker's loop
  (:class:`tunefleet.engine.loop.TuneLoop`) runs;
* a ``plan`` passes :attr:`Spend.budget` (a number of trials) to
  :func:`tunefleet.planning.rounds.plan_once`, or :attr:`Spend.trials` to the flat planner;
* a ``run`` (the pipeline) tunes its classes one after another, each with
  :meth:`Spend.share_for` of the wall time left.

What a budget *is* (its text) is :class:`tunefleet.budget.Budget`'s; how a round is split over
workloads is :mod:`tunefleet.planning.allocation`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from tunefleet.budget import Budget
from tunefleet.errors import ParameterError
from tunefleet.planning.allocation import DEFAULT_MIN_TRIALS
from tunefleet.planning.rounds import Deadline, Rounds

Caller = Literal["run", "tune", "plan"]
RUN: Caller = "run"
"""``tunefleet run`` and the ``pipeline`` flow: a budget (default the setting) or a flat target."""
TUNE: Caller = "tune"
"""``tunefleet tune`` and the ``tune`` flow: a model's budget in rounds, or a wall time alone."""
PLAN: Caller = "plan"
"""``tunefleet plan`` and the ``plan`` flow: a trial budget split at once, or a flat target."""

SETTING = "TUNEFLEET_BUDGET"
"""The name of the default budget of a ``run``, for its error."""


@dataclass(frozen=True)
class _Words:
    """How one kind of caller names what it was given, for its errors."""

    models: str
    duration_example: str
    plan_duration: str
    models_need_budget: str


_FLAGS = _Words(
    models="--model", duration_example=" (e.g. 15m)",
    plan_duration="(e.g. 2000) — a duration is spent by `tunefleet run --budget` or `tunefleet tune --budget`",
    models_need_budget="--model needs --budget (tune drains the whole queue of the class otherwise)")
_PARAMETERS = _Words(
    models="model_ids", duration_example="",
    plan_duration="(a duration is spent by the tune or pipeline flow)",
    models_need_budget="invalid parameters: model_ids needs budget (tune drains the whole queue of the class "
                       "otherwise)")


@dataclass(frozen=True)
class Spend:
    """What one request spends, checked: a budget (trials or a wall time), or a flat target of
    ``trials`` per workload, on ``model_ids``, from ``started_at`` (seconds since the epoch).

    Build it with :meth:`request`, once per request; pass it (or, to a flow that is also an entry
    point, :attr:`budget`'s text and :attr:`started_at`) down.

    Attributes
    ----------
    caller : {"run", "tune", "plan"}
        What the request is (:data:`RUN`, :data:`TUNE`, :data:`PLAN`).
    budget : Budget or None
        The budget; None with a flat ``trials`` target (or a ``tune`` that drains the queue).
    trials : int or None
        A flat target of trials per workload (``run`` and ``plan`` only), or None.
    model_ids : tuple of int
        The models the budget is spent on (empty: none given).
    started_at : float
        When the budget's clock started: a wall time ends ``budget.seconds`` later.
    """

    caller: Caller
    budget: Budget | None = None
    trials: int | None = None
    model_ids: tuple[int, ...] = ()
    started_at: float = field(default_factory=time.time)

    @classmethod
    def request(cls, caller: Caller, budget: str | int | Budget | None = None, *, trials: int | None = None,
                model_ids: Sequence[int] | None = None, started_at: float | None = None, name: str = "budget",
                default: str | None = None) -> Spend:
        """What a request asks to spend, or one :class:`ParameterError` line saying what is wrong.

        Parameters
        ----------
        caller : {"run", "tune", "plan"}
            What the request is.
        budget : str, int or Budget, optional
            The budget's text as given (``"2000"``, ``"15m"``).
        trials : int, optional
            A flat target per workload instead of a budget (``run``, ``plan``).
        model_ids : sequence of int, optional
            The models to spend a ``tune``'s budget on (its rounds), or to plan for.
        started_at : float, optional
            When the budget's clock started (seconds since the epoch); default now.
        name : str
            What the caller calls the budget, for the errors: ``"--budget"`` (a flag: the errors
            name the CLI's flags) or ``"parameter budget"`` (a flow's parameter).
        default : str, optional
            A ``run``'s budget when given neither ``budget`` nor ``trials``: the
            ``TUNEFLEET_BUDGET`` setting (its errors name the setting).

        Raises
        ------
        ParameterError
            ``budget`` with ``trials``; a text that is no budget; a ``plan`` given neither, or a
            duration; a ``tune`` given a number of trials without models, or models without a
            budget.
        """
        words = _FLAGS if name.startswith("--") else _PARAMETERS
        models = tuple(model_ids or ())
        if budget is not None and trials is not None:
            raise ParameterError("invalid parameters: give trials (a target per workload) or budget, not both")
        text, source = (budget, name) if budget is not None else (default, SETTING) if trials is None else (None, name)
        parsed = Budget.parse(text, name=source) if text is not None else None
        if caller == PLAN:
            if parsed is None and trials is None:
                raise ParameterError("invalid parameters: give trials (a target per workload) or budget")
            if parsed is not None and parsed.is_duration:
                raise ParameterError(f"invalid {name}: {text!r} is a duration; a plan takes a number of trials "
                                     + words.plan_duration)
        if caller == TUNE:
            if parsed is None and models:
                raise ParameterError(words.models_need_budget)
            if parsed is not None and not parsed.is_duration and not models:
                raise ParameterError(f"invalid {name}: {text!r} is a number of trials; give {words.models} to spend "
                                     f"it on, or a duration{words.duration_example} to stop tuning at")
        return cls(caller, parsed, trials, models, time.time() if started_at is None else started_at)

    @property
    def ends_at(self) -> float | None:
        """When a wall-time budget ends (seconds since the epoch), before any time kept for a build."""
        return None if self.budget is None or self.budget.seconds is None else self.started_at + self.budget.seconds

    def tuning(self, hardware: str, *, batch: int = 64, energy_aware: bool = False, reserve_builds: int = 0,
               confirm_top: int = 0, min_trials: int = DEFAULT_MIN_TRIALS,
               clock: Callable[[], float] = time.time) -> tuple[Rounds | None, Deadline | None]:
        """A ``tune``'s rounds and deadline on ``hardware``: the rounds of the models' budget (with
        their deadline, which keeps time for ``reserve_builds`` builds after tuning, each re-timing
        ``confirm_top`` schedules per workload first), or a bare
        deadline for a wall time alone, or neither (drain the queue).

        ``batch`` (trials per search batch) and ``energy_aware`` are the tuning options'; the
        allocator plans in whole batches and, energy-aware, per joule.
        """
        if self.budget is None:
            return None, None
        if self.model_ids:
            rounds = Rounds(hardware, list(self.model_ids), self.budget, started_at=self.started_at,
                            reserve_builds=reserve_builds, confirm_top=confirm_top, min_trials=min_trials,
                            batch=batch, energy_aware=energy_aware, clock=clock)
            return rounds, rounds.deadline
        ends_at = self.ends_at
        return None, None if ends_at is None else Deadline(ends_at, clock=clock)

    def share_for(self, index: int, n_classes: int, now: float | None = None) -> Spend:
        """What the ``index``-th of ``n_classes`` hardware classes tuned one after another spends.

        A wall time is the whole run's, so each class gets an equal share of what is left when its
        turn comes (at least a second), its clock starting ``now``; a number of trials is spent on
        each class in full (it counts the trials of one class), as is a lone class's wall time.
        """
        if self.budget is None or self.budget.seconds is None or n_classes <= 1:
            return self
        now = time.time() if now is None else now
        left = self.started_at + self.budget.seconds - now
        return replace(self, budget=Budget(seconds=max(1.0, left / (n_classes - index))), started_at=now)
