"""evaluations: a grid's stored checkpoints evaluated again on more held-out images, one result per run

Revision ID: 0012
Revises: 0011
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0012'
down_revision: str | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The metric columns of the `metrics` table as of 0007, which an evaluation result repeats.
METRIC_COLUMNS = [
    ('train_loss', sa.Float()), ('grad_norm', sa.Float()), ('lr', sa.Float()),
    ('recon_lpips', sa.Float()), ('recon_lpips_se', sa.Float()), ('recon_lpips_n', sa.Integer()),
    ('text_lpips', sa.Float()), ('text_lpips_se', sa.Float()), ('text_lpips_n', sa.Integer()),
    ('text_manip_delta', sa.Float()), ('text_manip_delta_se', sa.Float()), ('text_manip_delta_n', sa.Integer()),
    ('val_flow_loss', sa.Float()), ('val_flow_loss_se', sa.Float()), ('val_flow_loss_n', sa.Integer()),
    ('iter_per_sec', sa.Float()), ('samples_per_sec', sa.Float()), ('tokens_per_sec', sa.Float()),
    ('peak_memory_gb', sa.Float()), ('wall_time_s', sa.Float()), ('gpu_hours', sa.Float()),
    ('lpips_backbone', sa.String(length=32)),
]


def upgrade() -> None:
    op.create_table(
        'evaluations',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('grid_id', sa.Integer(), nullable=False),
        sa.Column('images', sa.Integer(), nullable=False),
        sa.Column('step', sa.String(length=16), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['grid_id'], ['grids.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
    )
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_evaluations_grid_id'), ['grid_id'], unique=False)
    op.create_table(
        'evaluation_results',
        *[sa.Column(name, kind, nullable=True) for name, kind in METRIC_COLUMNS],
        sa.Column('extra', sa.JSON(), nullable=False),
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('evaluation_id', sa.Integer(), nullable=False),
        sa.Column('run_id', sa.Integer(), nullable=False),
        sa.Column('step', sa.Integer(), nullable=False),
        sa.Column('state', sa.String(length=16), nullable=False),
        sa.Column('attempt', sa.Integer(), nullable=False),
        sa.Column('node', sa.String(length=200), nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('gpu_seconds', sa.Float(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(['evaluation_id'], ['evaluations.id'], ondelete='CASCADE'),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('evaluation_id', 'run_id', name='uq_evaluation_results_evaluation_run'),
    )
    with op.batch_alter_table('evaluation_results', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_evaluation_results_evaluation_id'), ['evaluation_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_evaluation_results_state'), ['state'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('evaluation_results', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_evaluation_results_state'))
        batch_op.drop_index(batch_op.f('ix_evaluation_results_evaluation_id'))
    op.drop_table('evaluation_results')
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_evaluations_grid_id'))
    op.drop_table('evaluations')
