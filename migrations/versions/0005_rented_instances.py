"""rented instances: schedules may ask for nodes (a request) instead of naming them; what each sweep rented

Revision ID: 0005
Revises: 0004
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('schedules', schema=None) as batch_op:
        batch_op.add_column(sa.Column('request', sa.JSON(), nullable=True))
    op.create_table(
        'rented_instances',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('sweep_id', sa.Integer(), nullable=True),
        sa.Column('provider', sa.String(length=32), nullable=False),
        sa.Column('instance_id', sa.String(length=128), nullable=False),
        sa.Column('offer_id', sa.String(length=128), nullable=True),
        sa.Column('gpu_name', sa.String(length=128), nullable=False),
        sa.Column('gpus', sa.Integer(), nullable=False),
        sa.Column('price_per_hour', sa.Float(), nullable=False),
        sa.Column('label', sa.String(length=64), nullable=False),
        sa.Column('node_name', sa.String(length=200), nullable=True),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('host_key', sa.String(length=128), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('destroy_confirmed_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('last_error', sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(['sweep_id'], ['sweeps.id'], ondelete='SET NULL'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('provider', 'instance_id', name='uq_rented_provider_instance'),
    )
    with op.batch_alter_table('rented_instances', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rented_instances_state'), ['state'], unique=False)
        batch_op.create_index(batch_op.f('ix_rented_instances_sweep_id'), ['sweep_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('rented_instances', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rented_instances_sweep_id'))
        batch_op.drop_index(batch_op.f('ix_rented_instances_state'))
    op.drop_table('rented_instances')
    with op.batch_alter_table('schedules', schema=None) as batch_op:
        batch_op.drop_column('request')
