"""sweeps: one row per schedule firing (nodes, grid, spend, outcome)

Revision ID: 0002
Revises: 0001
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        'sweeps',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('schedule_id', sa.Integer(), nullable=False),
        sa.Column('scheduled_for', sa.DateTime(timezone=True), nullable=False),
        sa.Column('fired_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('late', sa.Boolean(), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('grid_id', sa.Integer(), nullable=True),
        sa.Column('nodes', sa.JSON(), nullable=False),
        sa.Column('price_per_hour', sa.Float(), nullable=False),
        sa.Column('budget', sa.Float(), nullable=True),
        sa.Column('spend', sa.Float(), nullable=False),
        sa.Column('stop_reason', sa.Text(), nullable=True),
        sa.Column('stop_requested_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('results_dir', sa.Text(), nullable=True),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['grid_id'], ['grids.id'], ondelete='SET NULL'),
        sa.ForeignKeyConstraint(['schedule_id'], ['schedules.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_sweeps_schedule_id'), ['schedule_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_sweeps_state'), ['state'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('sweeps', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_sweeps_state'))
        batch_op.drop_index(batch_op.f('ix_sweeps_schedule_id'))
    op.drop_table('sweeps')
