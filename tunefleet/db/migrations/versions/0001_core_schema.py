"""Core schema: models, workloads, hardware classes, shards, measurements.

Revision ID: 0001
Revises: 
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels = None
depends_on = None

def upgrade() -> None:
    op.create_table('hardware_classes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('target', sa.JSON(), nullable=False),
    sa.Column('node_pool', sa.String(length=128), nullable=False),
    sa.Column('watts_per_core', sa.Float(), nullable=False),
    sa.Column('idle_watts', sa.Float(), nullable=False),
    sa.Column('watts_per_gpu', sa.Float(), nullable=False),
    sa.Column('price_per_hour', sa.Float(), nullable=False),
    sa.Column('capabilities', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_hardware_classes')),
    sa.UniqueConstraint('name', name=op.f('uq_hardware_classes_name'))
    )
    op.create_table('models',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('source', sa.String(length=20), nullable=False),
    sa.Column('format', sa.String(length=20), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('artifact_uri', sa.Text(), nullable=False),
    sa.Column('input_info', sa.JSON(), nullable=False),
    sa.Column('meta', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_models')),
    sa.UniqueConstraint('sha256', name=op.f('uq_models_sha256'))
    )
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_models_name'), ['name'], unique=False)
    op.create_table('workloads',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('structural_hash', sa.String(length=32), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('op_kind', sa.String(length=50), nullable=False),
    sa.Column('flops', sa.Float(), nullable=False),
    sa.Column('tir_json', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_workloads')),
    sa.UniqueConstraint('structural_hash', name=op.f('uq_workloads_structural_hash'))
    )
    with op.batch_alter_table('workloads', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_workloads_op_kind'), ['op_kind'], unique=False)
    op.create_table('model_workloads',
    sa.Column('model_id', sa.Integer(), nullable=False),
    sa.Column('workload_id', sa.Integer(), nullable=False),
    sa.Column('weight', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_model_workloads_model_id_models'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['workload_id'], ['workloads.id'], name=op.f('fk_model_workloads_workload_id_workloads'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('model_id', 'workload_id', name=op.f('pk_model_workloads'))
    )
    op.create_table('shards',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('workload_id', sa.Integer(), nullable=False),
    sa.Column('hardware_class_id', sa.Integer(), nullable=False),
    sa.Column('trials', sa.Integer(), nullable=False),
    sa.Column('priority', sa.Float(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('lease_owner', sa.String(length=200), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('history', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['hardware_class_id'], ['hardware_classes.id'], name=op.f('fk_shards_hardware_class_id_hardware_classes'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['workload_id'], ['workloads.id'], name=op.f('fk_shards_workload_id_workloads'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_shards'))
    )
    with op.batch_alter_table('shards', schema=None) as batch_op:
        batch_op.create_index('ix_shards_queue', ['hardware_class_id', 'state', 'priority'], unique=False)
    op.create_table('measurements',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('workload_id', sa.Integer(), nullable=False),
    sa.Column('hardware_class_id', sa.Integer(), nullable=False),
    sa.Column('shard_id', sa.Integer(), nullable=True),
    sa.Column('trace_json', sa.Text(), nullable=False),
    sa.Column('trace_sha256', sa.String(length=64), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('args_info', sa.JSON(), nullable=True),
    sa.Column('run_secs', sa.JSON(), nullable=True),
    sa.Column('mean_run_s', sa.Float(), nullable=True),
    sa.Column('build_s', sa.Float(), nullable=True),
    sa.Column('error_kind', sa.String(length=16), nullable=True),
    sa.Column('error_msg', sa.Text(), nullable=True),
    sa.Column('energy_j', sa.Float(), nullable=True),
    sa.Column('energy_source', sa.String(length=16), nullable=True),
    sa.Column('tvm_version', sa.String(length=64), nullable=False),
    sa.Column('target', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['hardware_class_id'], ['hardware_classes.id'], name=op.f('fk_measurements_hardware_class_id_hardware_classes'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['shard_id'], ['shards.id'], name=op.f('fk_measurements_shard_id_shards'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['workload_id'], ['workloads.id'], name=op.f('fk_measurements_workload_id_workloads'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_measurements')),
    sa.UniqueConstraint('workload_id', 'hardware_class_id', 'trace_sha256', 'attempt', name='uq_measurements_candidate')
    )
    with op.batch_alter_table('measurements', schema=None) as batch_op:
        batch_op.create_index('ix_measurements_best', ['workload_id', 'hardware_class_id', 'mean_run_s'], unique=False)
        batch_op.create_index('ix_measurements_shard_id', ['shard_id'], unique=False)

    _prefer_lz4("measurements", "trace_json")


def _prefer_lz4(table: str, column: str) -> None:
    """Traces are the bulk of the data; lz4 TOAST compression is much cheaper than pglz.

    PostgreSQL >= 14 built with lz4 only; elsewhere the default compression stays.
    """
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    with bind.begin_nested():
        supported = bind.exec_driver_sql(
            "SELECT current_setting('server_version_num')::int >= 140000 "
            "AND EXISTS (SELECT 1 FROM pg_settings WHERE name = 'default_toast_compression' "
            "AND 'lz4' = ANY(enumvals))"
        ).scalar()
    if supported:
        op.execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET COMPRESSION lz4")


def downgrade() -> None:
    with op.batch_alter_table('measurements', schema=None) as batch_op:
        batch_op.drop_index('ix_measurements_shard_id')
        batch_op.drop_index('ix_measurements_best')
    op.drop_table('measurements')
    with op.batch_alter_table('shards', schema=None) as batch_op:
        batch_op.drop_index('ix_shards_queue')
    op.drop_table('shards')
    op.drop_table('model_workloads')
    with op.batch_alter_table('workloads', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_workloads_op_kind'))
    op.drop_table('workloads')
    with op.batch_alter_table('models', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_models_name'))
    op.drop_table('models')
    op.drop_table('hardware_classes')
