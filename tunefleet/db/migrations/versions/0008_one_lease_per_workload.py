"""One leased shard per (workload, hardware class): a partial unique index on shards.

Two workers searching one workload at once would each measure candidates the other has in flight
(each round starts from what is committed, not from what the other is building). Leasing skips a
workload that has a leased shard on the class; this index makes that hold under races on both
backends. Extra leases a database may hold already (from before this revision) are given back to
pending first, the lease not counted, so the index can be built.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels = None
depends_on = None

_LEASED = "state = 'leased'"


def upgrade() -> None:
    shards = sa.table("shards", sa.column("id", sa.Integer), sa.column("workload_id", sa.Integer),
                      sa.column("hardware_class_id", sa.Integer), sa.column("state", sa.String),
                      sa.column("lease_owner", sa.String), sa.column("lease_expires_at", sa.DateTime))
    conn = op.get_bind()
    keep: set[tuple[int, int]] = set()
    for shard_id, wl, hw in conn.execute(sa.select(shards.c.id, shards.c.workload_id, shards.c.hardware_class_id)
                                         .where(shards.c.state == "leased").order_by(shards.c.id)):
        if (wl, hw) in keep:
            conn.execute(sa.update(shards).where(shards.c.id == shard_id)
                         .values(state="pending", lease_owner=None, lease_expires_at=None))
        keep.add((wl, hw))
    op.create_index("uq_shards_one_lease_per_workload", "shards", ["workload_id", "hardware_class_id"], unique=True,
                    postgresql_where=sa.text(_LEASED), sqlite_where=sa.text(_LEASED))


def downgrade() -> None:
    op.drop_index("uq_shards_one_lease_per_workload", table_name="shards")
