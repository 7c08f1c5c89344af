"""Fenced leases: a lease generation (fencing token), lost leases counted apart from attempts,
a backoff before a lost shard is leased again, and the candidates in flight per shard.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Not batch mode: on SQLite it would recreate shards, and with foreign keys on, dropping the
    # old table cascades to measurements (see 0005). Plain ADD COLUMN keeps the table.
    op.add_column("shards", sa.Column("lease_generation", sa.Integer(), server_default="0", nullable=False))
    op.add_column("shards", sa.Column("lost_leases", sa.Integer(), server_default="0", nullable=False))
    op.add_column("shards", sa.Column("not_before", sa.DateTime(), nullable=True))
    op.create_table(
        "in_flight",
        sa.Column("shard_id", sa.Integer(), nullable=False),
        sa.Column("trace_sha256", sa.String(length=64), nullable=False),
        sa.Column("trace_json", sa.Text(), nullable=False),
        sa.Column("args_info", sa.JSON(), nullable=True),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("tvm_version", sa.String(length=64), nullable=False),
        sa.Column("current", sa.Boolean(), nullable=False),
        sa.Column("deaths", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["shard_id"], ["shards.id"], name=op.f("fk_in_flight_shard_id_shards"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("shard_id", "trace_sha256", name=op.f("pk_in_flight")),
    )


def downgrade() -> None:
    op.drop_table("in_flight")
    # SQLite >= 3.35 drops a column itself (no batch mode: see upgrade).
    op.drop_column("shards", "not_before")
    op.drop_column("shards", "lost_leases")
    op.drop_column("shards", "lease_generation")
