"""An index for the measurements committed since a time, per hardware class.

The live line of ``tunefleet run`` counts, once a second, each workload's rows committed since the
run started (:meth:`tunefleet.db.reports.ReportsMixin.model_progress`). Without an index that
holds ``created_at``, the database reads every measurement row of the model's workloads, traces
included, to look at their times. The index holds the columns that count needs.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_measurements_recent", "measurements",
                    ["hardware_class_id", "created_at", "workload_id", "error_kind"])


def downgrade() -> None:
    op.drop_index("ix_measurements_recent", table_name="measurements")
