"""job options: a workload's working directory, walltime, hold, dependency and job array

Revision ID: 0005
Revises: 0004

Workloads stored before this revision keep running as they did: no directory of their own (the account's home or
the server's directory), no walltime, not held, no dependency, in no array.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.add_column(sa.Column("cwd", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("time_limit_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("held", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column("dependency", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("array_id", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("array_index", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("array_limit", sa.Integer(), nullable=True))
        batch_op.create_index("ix_workloads_array_id", ["array_id"])


def downgrade() -> None:
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.drop_index("ix_workloads_array_id")
        for column in ("array_limit", "array_index", "array_id", "dependency", "held", "time_limit_s", "cwd"):
            batch_op.drop_column(column)
