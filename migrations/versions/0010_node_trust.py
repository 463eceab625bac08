"""node trust: which nodes' values may stop another node's arm, the GPUs the operator declared for a
node, and a grid's wish that its control run on a trusted node

Revision ID: 0010
Revises: 0009
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        # No node was trusted before: its values warn, never stop another node's arm, until the operator says so.
        batch_op.add_column(sa.Column('trusted', sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column('declared_gpus', sa.Integer(), nullable=True))
    with op.batch_alter_table('grids', schema=None) as batch_op:
        batch_op.add_column(sa.Column('control_on_trusted', sa.Boolean(), nullable=False, server_default=sa.false()))
    # A node registered before declared its GPUs only through its probe: that count becomes its declaration,
    # so it keeps the GPUs it has today and no later probe can raise them. A node never probed declares
    # none: it takes no arm until the operator declares them (`ablate nodes set NAME --gpus N`).
    nodes = sa.table('nodes', sa.column('id', sa.Integer()), sa.column('gpus', sa.JSON()),
                     sa.column('declared_gpus', sa.Integer()))
    conn = op.get_bind()
    for node_id, gpus in conn.execute(sa.select(nodes.c.id, nodes.c.gpus)).all():
        if isinstance(gpus, list) and gpus:
            conn.execute(nodes.update().where(nodes.c.id == node_id).values(declared_gpus=len(gpus)))


def downgrade() -> None:
    with op.batch_alter_table('grids', schema=None) as batch_op:
        batch_op.drop_column('control_on_trusted')
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.drop_column('declared_gpus')
        batch_op.drop_column('trusted')
