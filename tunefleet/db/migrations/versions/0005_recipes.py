"""Extraction recipes: a hardware class's conv2d layout, and model-workload links per class.

A model's workloads depend on the recipe its hardware class extracts with (NHWC and weight
prepacking on CPU classes; see tunefleet.tvm.extract.Recipe), so ``model_workloads`` gains the
hardware class and the recipe name. Links made before this revision were extracted with the
frontend's layout and no prepacking: they are copied to every class with recipe ``native``, so
``plan`` can say that they no longer match the class's recipe.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels = None
depends_on = None


def _model_workloads(with_class: bool) -> list[sa.Column]:
    return [
        sa.Column("model_id", sa.Integer(), nullable=False),
        *([sa.Column("hardware_class_id", sa.Integer(), nullable=False)] if with_class else []),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("weight", sa.Integer(), nullable=False),
        *([sa.Column("recipe", sa.String(length=32), nullable=False)] if with_class else []),
        sa.ForeignKeyConstraint(["model_id"], ["models.id"], name=op.f("fk_model_workloads_model_id_models"),
                                ondelete="CASCADE"),
        *([sa.ForeignKeyConstraint(["hardware_class_id"], ["hardware_classes.id"],
                                   name=op.f("fk_model_workloads_hardware_class_id_hardware_classes"),
                                   ondelete="CASCADE")] if with_class else []),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"], name=op.f("fk_model_workloads_workload_id_workloads"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("model_id", *(["hardware_class_id"] if with_class else []), "workload_id",
                                name=op.f("pk_model_workloads")),
    ]


# The links are few (a model has tens of workloads): read them, recreate the table under the
# same constraint names (PostgreSQL's primary-key index name is schema-wide), write them back.
def upgrade() -> None:
    op.add_column("hardware_classes", sa.Column("layout", sa.String(length=16), nullable=True))
    conn = op.get_bind()
    links = conn.execute(sa.text("SELECT model_id, workload_id, weight FROM model_workloads")).all()
    classes = conn.scalars(sa.text("SELECT id FROM hardware_classes")).all()
    op.drop_table("model_workloads")
    table = op.create_table("model_workloads", *_model_workloads(with_class=True))
    rows = [{"model_id": m, "hardware_class_id": hw, "workload_id": w, "weight": weight, "recipe": "native"}
            for m, w, weight in links for hw in classes]
    if rows:
        op.bulk_insert(table, rows)


def downgrade() -> None:
    conn = op.get_bind()
    links = conn.execute(sa.text("SELECT model_id, workload_id, MAX(weight) FROM model_workloads "
                                 "GROUP BY model_id, workload_id")).all()
    op.drop_table("model_workloads")
    table = op.create_table("model_workloads", *_model_workloads(with_class=False))
    if links:
        op.bulk_insert(table, [{"model_id": m, "workload_id": w, "weight": weight} for m, w, weight in links])
    # Not batch mode: on SQLite it would recreate hardware_classes, and with foreign keys on,
    # dropping the old table cascades to every measurement. SQLite >= 3.35 drops a column itself.
    op.drop_column("hardware_classes", "layout")
