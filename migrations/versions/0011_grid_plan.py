"""grid plan: the night plan a grid was submitted with (orchestrator/grids/night.py), redrawn by the launcher

Revision ID: 0011
Revises: 0010
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0011'
down_revision: str | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('grids', schema=None) as batch_op:
        batch_op.add_column(sa.Column('plan', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('grids', schema=None) as batch_op:
        batch_op.drop_column('plan')
