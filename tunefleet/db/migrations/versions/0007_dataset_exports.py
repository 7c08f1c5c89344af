"""Dataset exports mark the measurements they took: ``dataset_rows`` (one row per measurement).

Before this revision an export took the measurements above a per-class high-water mark (the
largest id of the previous versions), which misses a row whose transaction got a lower id and
committed after an export started. Now every measurement an export read is marked with the
version that took it, and the next export takes the unmarked ones.

Existing versions are carried over: for each complete version, in version order, the
measurements of each class it exported (ids above the class's previous mark, up to the
version's own mark) are marked with it, as ``skipped`` when its manifest lists them so,
``filtered`` when they were filtered candidates, ``row`` otherwise.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels = None
depends_on = None


def _manifest(value: Any) -> dict[str, Any]:
    # psycopg2 decodes JSON columns; SQLite hands back the text.
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def upgrade() -> None:
    table = op.create_table(
        "dataset_rows",
        sa.Column("measurement_id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=False,
                  nullable=False),
        sa.Column("dataset_id", sa.Integer(), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(["dataset_id"], ["datasets.id"], name=op.f("fk_dataset_rows_dataset_id_datasets"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["measurement_id"], ["measurements.id"],
                                name=op.f("fk_dataset_rows_measurement_id_measurements"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("measurement_id", name=op.f("pk_dataset_rows")),
    )
    op.create_index("ix_dataset_rows_dataset_id", "dataset_rows", ["dataset_id"], unique=False)
    _mark_exported(op.get_bind(), table)


def _mark_exported(conn: sa.Connection, table: sa.Table) -> None:
    """Mark what the existing complete versions covered, version by version (set-based, no row loop)."""
    marks: dict[str, int] = {}
    for dataset_id, manifest in conn.execute(sa.text("SELECT id, manifest FROM datasets ORDER BY version")).all():
        manifest = _manifest(manifest)
        if manifest.get("state") != "complete":
            continue  # a killed export: the old high-water logic never counted it either
        for name, entry in sorted((manifest.get("hardware") or {}).items()):
            if not isinstance(entry, dict) or entry.get("high_water") is None:
                continue
            low, high = marks.get(name, 0), int(entry["high_water"])
            marks[name] = max(low, high)
            params = {"dataset_id": dataset_id, "name": name, "low": low, "high": high}
            conn.execute(sa.text(
                "INSERT INTO dataset_rows (measurement_id, dataset_id, outcome) "
                "SELECT m.id, :dataset_id, CASE WHEN m.error_kind = 'filtered' THEN 'filtered' ELSE 'row' END "
                "FROM measurements m JOIN hardware_classes h ON h.id = m.hardware_class_id "
                "WHERE h.name = :name AND m.id > :low AND m.id <= :high "
                "AND NOT EXISTS (SELECT 1 FROM dataset_rows d WHERE d.measurement_id = m.id)"
            ), params)
            skipped = [int(i) for i in entry.get("skipped_ids") or []]
            if skipped:
                conn.execute(table.update().where(table.c.measurement_id.in_(skipped),
                                                  table.c.dataset_id == dataset_id).values(outcome="skipped"))


def downgrade() -> None:
    op.drop_index("ix_dataset_rows_dataset_id", table_name="dataset_rows")
    op.drop_table("dataset_rows")
