"""Artifacts: what in the artifact store the database points to (``tunefleet gc`` deletes the rest).

A dataset version's files and a cost model's file are now written under a key no other write
uses, then registered in ``artifacts`` in the transaction that records the version or the model;
files no row lists are garbage. Existing registrations are carried over: every dataset version
with a URI owns the folder its export wrote (``datasets/v<N>/``), every cost model with an
artifact URI owns its file (``costmodels/<class>/v<N>.json``), the keys every earlier export and
retrain used. A version without a URI (an export killed before it completed) owns nothing: its
files, if any, are garbage.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "artifacts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("key", sa.String(length=1024), nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=True),
        sa.Column("cost_model_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(["cost_model_id"], ["cost_models.id"],
                                name=op.f("fk_artifacts_cost_model_id_cost_models"), ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"], name=op.f("fk_artifacts_dataset_id_datasets"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_artifacts")),
        sa.UniqueConstraint("key", name=op.f("uq_artifacts_key")),
    )
    # Set-based, as in 0007: the keys the exports and retrains before this revision wrote.
    op.execute(sa.text(
        "INSERT INTO artifacts (kind, key, dataset_id, created_at) "
        "SELECT 'dataset', 'datasets/v' || version || '/', id, created_at FROM datasets WHERE uri <> ''"))
    op.execute(sa.text(
        "INSERT INTO artifacts (kind, key, cost_model_id, created_at) "
        "SELECT 'cost_model', 'costmodels/' || h.name || '/v' || c.version || '.json', c.id, c.created_at "
        "FROM cost_models c JOIN hardware_classes h ON h.id = c.hardware_class_id WHERE c.artifact_uri <> ''"))


def downgrade() -> None:
    op.drop_table("artifacts")
