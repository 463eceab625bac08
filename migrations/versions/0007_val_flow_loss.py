"""val_flow_loss: the held-out flow loss beside the LPIPS metrics (its per-image values and per-time means go in extra)

Revision ID: 0007
Revises: 0006
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('metrics', schema=None) as batch_op:
        batch_op.add_column(sa.Column('val_flow_loss', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('val_flow_loss_se', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('val_flow_loss_n', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('metrics', schema=None) as batch_op:
        batch_op.drop_column('val_flow_loss_n')
        batch_op.drop_column('val_flow_loss_se')
        batch_op.drop_column('val_flow_loss')
