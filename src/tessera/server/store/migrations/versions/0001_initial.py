"""initial schema: workloads, events, tokens, queues, meta

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "meta",
        sa.Column("key", sa.String(length=100), nullable=False),
        sa.Column("value", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("key"),
    )
    op.create_table(
        "queues",
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("tenant", sa.String(length=100), nullable=False),
        sa.Column("cohort", sa.String(length=100), nullable=True),
        sa.Column("nominal", sa.JSON(), nullable=False),
        sa.Column("borrowing_limit", sa.JSON(), nullable=True),
        sa.Column("lending_limit", sa.JSON(), nullable=True),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("strategy", sa.String(length=20), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    with op.batch_alter_table("queues", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_queues_tenant"), ["tenant"], unique=False)

    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("token_hash", sa.String(length=64), nullable=False),
        sa.Column("tenant", sa.String(length=100), nullable=True),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("label", sa.String(length=200), nullable=False),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("token_hash"),
    )
    op.create_table(
        "workloads",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("tenant", sa.String(length=100), nullable=False),
        sa.Column("queue", sa.String(length=100), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("priority_class", sa.String(length=50), nullable=False),
        sa.Column("preemptible", sa.Boolean(), nullable=False),
        sa.Column("num_gpus", sa.Integer(), nullable=False),
        sa.Column("gpu_milli", sa.Integer(), nullable=False),
        sa.Column("gpu_mem_mib", sa.Integer(), nullable=False),
        sa.Column("gpu_types", sa.String(length=200), nullable=False),
        sa.Column("cpu_milli", sa.Integer(), nullable=False),
        sa.Column("mem_mib", sa.Integer(), nullable=False),
        sa.Column("gpu_compute_pct", sa.Integer(), nullable=True),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=False),
        sa.Column("submitted_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("stop_reason", sa.String(length=200), nullable=True),
        sa.Column("placement", sa.JSON(), nullable=True),
        sa.Column("admission", sa.JSON(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("pgid", sa.Integer(), nullable=True),
        sa.Column("started_marker", sa.String(length=100), nullable=True),
        sa.Column("exit_file", sa.String(length=500), nullable=True),
        sa.Column("log_path", sa.String(length=500), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_workloads_queue"), ["queue"], unique=False)
        batch_op.create_index(batch_op.f("ix_workloads_state"), ["state"], unique=False)
        batch_op.create_index(batch_op.f("ix_workloads_tenant"), ["tenant"], unique=False)

    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(length=50), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["workload_id"],
            ["workloads.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_events_workload_id"), ["workload_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("events", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_events_workload_id"))

    op.drop_table("events")
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_workloads_tenant"))
        batch_op.drop_index(batch_op.f("ix_workloads_state"))
        batch_op.drop_index(batch_op.f("ix_workloads_queue"))

    op.drop_table("workloads")
    op.drop_table("tokens")
    with op.batch_alter_table("queues", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_queues_tenant"))

    op.drop_table("queues")
    op.drop_table("meta")
