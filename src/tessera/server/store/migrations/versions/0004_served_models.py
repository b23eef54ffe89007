"""served models: the ``served_models`` table and the ``model_id`` of a workload that is a model's replica

Revision ID: 0004
Revises: 0003

Workloads stored before this revision are nobody's replicas (``model_id`` stays empty).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "served_models",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("name", sa.String(100), nullable=False, unique=True),
        sa.Column("tenant", sa.String(100), nullable=False),
        sa.Column("queue", sa.String(100), nullable=False),
        sa.Column("engine", sa.String(20), nullable=False),
        sa.Column("weights", sa.Text(), nullable=False),
        sa.Column("num_gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_milli", sa.Integer(), nullable=False),
        sa.Column("gpu_mem_mib", sa.Integer(), nullable=False),
        sa.Column("min_replicas", sa.Integer(), nullable=False),
        sa.Column("max_replicas", sa.Integer(), nullable=False),
        sa.Column("idle_timeout_s", sa.Float(), nullable=False),
        sa.Column("slo", sa.String(20), nullable=False),
        sa.Column("desired_replicas", sa.Integer(), nullable=False),
        sa.Column("deleting", sa.Boolean(), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_served_models_tenant", "served_models", ["tenant"])
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.add_column(sa.Column("model_id", sa.Integer(), nullable=True))
        batch_op.create_index("ix_workloads_model_id", ["model_id"])


def downgrade() -> None:
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.drop_index("ix_workloads_model_id")
        batch_op.drop_column("model_id")
    op.drop_index("ix_served_models_tenant", "served_models")
    op.drop_table("served_models")
