"""Energy accounting: per-candidate usefulness, per-shard energy, node time and money.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.add_column(sa.Column("useful", sa.Boolean(), nullable=True))
    with op.batch_alter_table("shards", schema=None) as batch_op:
        batch_op.add_column(sa.Column("energy_j", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("energy_source", sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column("node_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("cpu_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("cost", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("shards", schema=None) as batch_op:
        batch_op.drop_column("cost")
        batch_op.drop_column("cpu_s")
        batch_op.drop_column("node_s")
        batch_op.drop_column("energy_source")
        batch_op.drop_column("energy_j")
    with op.batch_alter_table("measurements", schema=None) as batch_op:
        batch_op.drop_column("useful")
