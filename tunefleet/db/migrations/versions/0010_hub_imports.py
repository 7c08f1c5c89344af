"""Hub imports: which hub bundles a database has imported (``tunefleet hub import``).

The imported records themselves need no schema: they are measurements under hub classes
(hardware classes in the node pool ``tunefleet-hub``), so this revision only adds the table that
makes an import idempotent per bundle file and says when and from where each came.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hub_imports",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("source", sa.Text(), nullable=False),
        sa.Column("format_version", sa.Integer(), nullable=False),
        sa.Column("tvm_version", sa.String(length=64), nullable=False),
        sa.Column("bundle_created_at", sa.DateTime(), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("counts", sa.JSON(), nullable=False),
        sa.Column("imported_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_hub_imports")),
        sa.UniqueConstraint("sha256", name=op.f("uq_hub_imports_sha256")),
    )


def downgrade() -> None:
    op.drop_table("hub_imports")
