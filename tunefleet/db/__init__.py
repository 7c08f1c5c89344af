"""The tunefleet database: SQLAlchemy models, Alembic migrations, one access class.

Public API: :class:`Database`, :class:`NewMeasurement`, and the schema helpers
:func:`upgrade`, :func:`downgrade`, :func:`current_revision`, :func:`head_revision`.
"""

from __future__ import annotations

from tunefleet.db.database import Database, NewMeasurement
from tunefleet.db.engine import current_revision, downgrade, head_revision, upgrade

__all__ = ["Database", "NewMeasurement", "current_revision", "downgrade", "head_revision", "upgrade"]
