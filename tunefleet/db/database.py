"""The tunefleet database: one class over SQLite and PostgreSQL, composed by concern.

Every method opens its own short transaction, so a caller never holds locks across TVM work.
Storage errors are never swallowed: connection problems surface as :class:`DatabaseError`
with one line naming the database (password masked) and the driver's reason.

The methods live in one module per concern: :mod:`~tunefleet.db.catalog` (hardware classes,
models, workloads), :mod:`~tunefleet.db.measurements` (measurements, plateau state),
:mod:`~tunefleet.db.shards` (shards and leases), :mod:`~tunefleet.db.learning` (predictions,
datasets, cost models) and :mod:`~tunefleet.db.reports` (aggregates), :mod:`~tunefleet.db.hub` (hub bundles), :mod:`~tunefleet.db.tokens` (the registry's
tokens). Only this package runs SQL.
"""

from __future__ import annotations

from tunefleet.db._base import sha256_text
from tunefleet.db.hub import HubMixin
from tunefleet.db.learning import LearningMixin
from tunefleet.db.measurements import MeasurementsMixin, NewMeasurement, SimilarWorkload
from tunefleet.db.reports import EnergyGroup, EnergyTotals, OutlookInputs, ReportsMixin, TimelinePoint
from tunefleet.db.shards import BudgetRow, BudgetView, PlanRow, ShardsMixin, TrialGrant
from tunefleet.db.tokens import TokensMixin
from tunefleet.vocab import FILTERED


class Database(MeasurementsMixin, ShardsMixin, LearningMixin, ReportsMixin, HubMixin, TokensMixin):
    """Access to the tunefleet schema on SQLite or PostgreSQL: one class composed of the concerns'
    methods (catalog, measurements, shards and leases, learning artifacts, reports, hub bundles, the
    registry's tokens) over one
    session factory; constructed as :class:`~tunefleet.db._base.DatabaseBase` says."""


__all__ = [
    "FILTERED",
    "BudgetRow",
    "BudgetView",
    "Database",
    "EnergyGroup",
    "EnergyTotals",
    "NewMeasurement",
    "OutlookInputs",
    "PlanRow",
    "SimilarWorkload",
    "TimelinePoint",
    "TrialGrant",
    "sha256_text",
]
