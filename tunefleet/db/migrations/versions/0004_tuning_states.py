"""Cost-efficient tuning: the persisted plateau state of each (workload, hardware class), and how
each candidate was measured (serially, or in parallel and calibrated).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tuning_states",
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("hardware_class_id", sa.Integer(), nullable=False),
        sa.Column("rounds", sa.Integer(), nullable=False),
        sa.Column("stale_rounds", sa.Integer(), nullable=False),
        sa.Column("best_s", sa.Float(), nullable=True),
        sa.Column("recent", sa.JSON(), nullable=False),
        sa.Column("preempted", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("freed_trials", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["hardware_class_id"], ["hardware_classes.id"],
                                name=op.f("fk_tuning_states_hardware_class_id_hardware_classes"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"],
                                name=op.f("fk_tuning_states_workload_id_workloads"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("workload_id", "hardware_class_id", name=op.f("pk_tuning_states")),
    )
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.add_column(sa.Column("measure_mode", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.drop_column("measure_mode")
    op.drop_table("tuning_states")
