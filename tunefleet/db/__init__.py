"""The tunefleet database: SQLAlchemy models, Alembic migrations, one access class.

Public API: :class:`Database`, :class:`NewMeasurement`, the records some of its methods take or
return (:class:`PlanRow`, :class:`BudgetView`, :class:`BudgetRow`, :class:`TrialGrant`,
:class:`EnergyTotals`, :class:`EnergyGroup`, :class:`OutlookInputs`, :class:`TimelinePoint`,
:class:`SimilarWorkload`), the schema helpers :func:`upgrade`, :func:`downgrade`,
:func:`current_revision`, :func:`head_revision`, and :func:`check_model_name` (a name the
``models`` table can hold, checked before the database on every backend).
"""

from __future__ import annotations

from tunefleet.db.catalog import check_model_name
from tunefleet.db.connection import current_revision, downgrade, head_revision, upgrade
from tunefleet.db.database import (
    BudgetRow,
    BudgetView,
    Database,
    EnergyGroup,
    EnergyTotals,
    NewMeasurement,
    OutlookInputs,
    PlanRow,
    SimilarWorkload,
    TimelinePoint,
    TrialGrant,
)

__all__ = [
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
    "check_model_name",
    "current_revision",
    "downgrade",
    "head_revision",
    "upgrade",
]
