"""Learning schema: datasets, cost models and their predictions (kept apart from measurements).

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = '0001'
branch_labels = None
depends_on = None

def upgrade() -> None:
    op.create_table('datasets',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('uri', sa.Text(), nullable=False),
    sa.Column('manifest', sa.JSON(), nullable=False),
    sa.Column('row_count', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_datasets')),
    sa.UniqueConstraint('version', name=op.f('uq_datasets_version'))
    )
    op.create_table('cost_models',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('hardware_class_id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('dataset_id', sa.Integer(), nullable=True),
    sa.Column('metrics', sa.JSON(), nullable=False),
    sa.Column('artifact_uri', sa.Text(), nullable=False),
    sa.Column('promoted', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['dataset_id'], ['datasets.id'], name=op.f('fk_cost_models_dataset_id_datasets'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['hardware_class_id'], ['hardware_classes.id'], name=op.f('fk_cost_models_hardware_class_id_hardware_classes'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_cost_models')),
    sa.UniqueConstraint('hardware_class_id', 'version', name='uq_cost_models_version')
    )
    op.create_table('predictions',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('workload_id', sa.Integer(), nullable=False),
    sa.Column('hardware_class_id', sa.Integer(), nullable=False),
    sa.Column('cost_model_id', sa.Integer(), nullable=True),
    sa.Column('trace_json', sa.Text(), nullable=False),
    sa.Column('trace_sha256', sa.String(length=64), nullable=False),
    sa.Column('args_info', sa.JSON(), nullable=True),
    sa.Column('score', sa.Float(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['cost_model_id'], ['cost_models.id'], name=op.f('fk_predictions_cost_model_id_cost_models'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['hardware_class_id'], ['hardware_classes.id'], name=op.f('fk_predictions_hardware_class_id_hardware_classes'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['workload_id'], ['workloads.id'], name=op.f('fk_predictions_workload_id_workloads'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_predictions')),
    sa.UniqueConstraint('workload_id', 'hardware_class_id', 'cost_model_id', 'trace_sha256', name='uq_predictions_candidate')
    )
    with op.batch_alter_table('predictions', schema=None) as batch_op:
        batch_op.create_index('ix_predictions_best', ['workload_id', 'hardware_class_id', 'score'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('predictions', schema=None) as batch_op:
        batch_op.drop_index('ix_predictions_best')
    op.drop_table('predictions')
    op.drop_table('cost_models')
    op.drop_table('datasets')
