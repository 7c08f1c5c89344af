"""Winograd convolutions: a hardware class's ``winograd`` setting, and room for longer recipe names.

``nhwc+prepack+fastmath+fold+winograd`` is 35 characters; ``model_workloads.recipe`` held 32.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Not batch mode on hardware_classes: on SQLite it would recreate the table, and with foreign
    # keys on, dropping the old one cascades to every measurement (as in 0005).
    op.add_column("hardware_classes", sa.Column("winograd", sa.Boolean(), nullable=False, server_default=sa.false()))
    # SQLite cannot alter a column's type: batch mode recreates model_workloads, which nothing
    # references, so nothing cascades.
    with op.batch_alter_table("model_workloads") as batch:
        batch.alter_column("recipe", existing_type=sa.String(length=32), type_=sa.String(length=64),
                           existing_nullable=False)


def downgrade() -> None:
    # The older schema knows no Winograd recipe and cannot hold its name: a model's links to the
    # workloads it was extracted into under one go (PostgreSQL would refuse to shorten the column
    # with them in it). The workloads and their measurements stay; extracting the model again
    # under the class's recipe links it again.
    op.execute(sa.text("DELETE FROM model_workloads WHERE length(recipe) > 32"))
    with op.batch_alter_table("model_workloads") as batch:
        batch.alter_column("recipe", existing_type=sa.String(length=64), type_=sa.String(length=32),
                           existing_nullable=False)
    op.drop_column("hardware_classes", "winograd")
