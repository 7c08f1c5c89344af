"""The live line's index holds the measurement's attempt.

``build --confirm-top`` re-times stored schedules as later attempts while the run's live line is
still counting the rows committed since the run started
(:meth:`tunefleet.db.reports.ReportsMixin.model_progress`). A re-timing is no candidate, so the
count keeps first attempts only; with the attempt in ``ix_measurements_recent`` that count still
reads the index alone, not the rows with their traces.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels = None
depends_on = None

_BEFORE = ["hardware_class_id", "created_at", "workload_id", "error_kind"]


def upgrade() -> None:
    op.drop_index("ix_measurements_recent", table_name="measurements")
    op.create_index("ix_measurements_recent", "measurements", [*_BEFORE, "attempt"])


def downgrade() -> None:
    op.drop_index("ix_measurements_recent", table_name="measurements")
    op.create_index("ix_measurements_recent", "measurements", _BEFORE)
