"""evaluations.measures: the per-image metrics an evaluation's jobs measure (every one, or the flow loss alone
where a deciding grid's look decides on nothing else); NULL for an evaluation stored before: every one

Revision ID: 0016
Revises: 0015
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0016'
down_revision: str | None = '0015'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('measures', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.drop_column('measures')
