"""model engine settings: each deployed model's own engine arguments, CPU request and binding, KV options

Revision ID: 0009
Revises: 0008

Models deployed before this revision have none: no engine arguments of their own (the server-wide
``TESSERA_<ENGINE>_ARGS`` still apply), no CPU request, cores picked among all, no KV offloading or events.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

COLUMNS = ("engine_args", "cpu_milli", "cpu_bind", "kv_offload_gib", "kv_events")


def upgrade() -> None:
    with op.batch_alter_table("served_models", schema=None) as batch_op:
        batch_op.add_column(sa.Column("engine_args", sa.JSON(), nullable=False, server_default="[]"))
        batch_op.add_column(sa.Column("cpu_milli", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("cpu_bind", sa.String(200), nullable=False, server_default=""))
        batch_op.add_column(sa.Column("kv_offload_gib", sa.Float(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("kv_events", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table("served_models", schema=None) as batch_op:
        for column in reversed(COLUMNS):
            batch_op.drop_column(column)
