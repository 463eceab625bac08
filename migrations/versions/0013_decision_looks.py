"""decision_looks: a deciding grid's looks (each comparison's decision after a wave, and the work it
added), and grids.decide (the body's `decide`)

Revision ID: 0013
Revises: 0012
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0013'
down_revision: str | None = '0012'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('grids', schema=None) as batch_op:
        batch_op.add_column(sa.Column('decide', sa.JSON(), nullable=True))
    op.create_table(
        'decision_looks',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('grid_id', sa.Integer(), nullable=False),
        sa.Column('wave', sa.Integer(), nullable=False),
        sa.Column('comparisons', sa.JSON(), nullable=False),
        sa.Column('actions', sa.JSON(), nullable=False),
        sa.Column('final', sa.Boolean(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(['grid_id'], ['grids.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('grid_id', 'wave', name='uq_decision_looks_grid_wave'),
    )
    with op.batch_alter_table('decision_looks', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_decision_looks_grid_id'), ['grid_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('decision_looks', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_decision_looks_grid_id'))
    op.drop_table('decision_looks')
    with op.batch_alter_table('grids', schema=None) as batch_op:
        batch_op.drop_column('decide')
