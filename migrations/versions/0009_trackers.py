"""trackers: the experiment trackers a grid forwards to, and how far each run has been forwarded

Revision ID: 0009
Revises: 0008
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('grids', schema=None) as batch_op:
        batch_op.add_column(sa.Column('trackers', sa.JSON(), nullable=True))
    op.create_table(
        'tracker_runs',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('tracker', sa.String(length=16), nullable=False),
        sa.Column('grid_id', sa.Integer(), nullable=False),
        sa.Column('run_id', sa.Integer(), nullable=True),
        sa.Column('external_id', sa.String(length=255), nullable=True),
        sa.Column('step', sa.Integer(), nullable=True),
        sa.Column('event_id', sa.Integer(), nullable=True),
        sa.Column('closed', sa.Boolean(), nullable=False),
        sa.Column('failures', sa.Integer(), nullable=False),
        sa.Column('last_error', sa.Text(), nullable=True),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['grid_id'], ['grids.id'], ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('tracker', 'grid_id', 'run_id', name='uq_tracker_runs_tracker_grid_run'),
    )
    with op.batch_alter_table('tracker_runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tracker_runs_grid_id'), ['grid_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_tracker_runs_run_id'), ['run_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('tracker_runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tracker_runs_run_id'))
        batch_op.drop_index(batch_op.f('ix_tracker_runs_grid_id'))
    op.drop_table('tracker_runs')
    with op.batch_alter_table('grids', schema=None) as batch_op:
        batch_op.drop_column('trackers')
