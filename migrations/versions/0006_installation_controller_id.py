"""installation: this installation's controller id, the controller part of rented instances' labels

An installation that rented under the old default id "ablate" keeps it, so its reaper still knows the
instances it labelled before the upgrade; any other gets a generated id at first use.

Revision ID: 0006
Revises: 0005
"""
from collections.abc import Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    installation = op.create_table(
        'installation',
        sa.Column('id', sa.Integer(), autoincrement=False, nullable=False),
        sa.Column('controller_id', sa.String(length=32), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )
    rented_as_default = op.get_bind().execute(
        sa.text("SELECT 1 FROM rented_instances WHERE label LIKE 'ablate.ablate.s%' LIMIT 1")
    ).first()
    if rented_as_default is not None:
        op.bulk_insert(installation, [{'id': 1, 'controller_id': 'ablate', 'created_at': datetime.now(UTC)}])


def downgrade() -> None:
    op.drop_table('installation')
