"""job shapes: a workload's workers (a gang), its elastic range, its job type and whether it checkpoints, and what a
resized run used before its current placement (accounting)

Revision ID: 0006
Revises: 0005

Workloads stored before this revision keep running as they did: one worker, rigid, no job type, and checkpointable
when their priority class makes them preemptible (the scheduler took those to resume from checkpoints).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.add_column(sa.Column("workers", sa.Integer(), nullable=False, server_default="1"))
        batch_op.add_column(sa.Column("elastic_min", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("elastic_max", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("job_type", sa.String(100), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("checkpointable", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column("gpu_s_settled", sa.Float(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("cpu_s_settled", sa.Float(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("settled_at", sa.Float(), nullable=True))
    op.execute(sa.text("UPDATE workloads SET checkpointable = preemptible"))


def downgrade() -> None:
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        for column in (
            "settled_at",
            "cpu_s_settled",
            "gpu_s_settled",
            "checkpointable",
            "job_type",
            "elastic_max",
            "elastic_min",
            "workers",
        ):
            batch_op.drop_column(column)
