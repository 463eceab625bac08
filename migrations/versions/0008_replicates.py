"""replicates: a grid's number of training seeds per arm, and each run's training seed

Revision ID: 0008
Revises: 0007
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('grids', schema=None) as batch_op:
        batch_op.add_column(sa.Column('seeds', sa.Integer(), nullable=False, server_default='1'))
    with op.batch_alter_table('runs', schema=None) as batch_op:
        # Rows before replicates trained one seed each: 0 (their spec's data.seed stays what it was).
        batch_op.add_column(sa.Column('seed', sa.Integer(), nullable=False, server_default='0'))


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_column('seed')
    with op.batch_alter_table('grids', schema=None) as batch_op:
        batch_op.drop_column('seeds')
