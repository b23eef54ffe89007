"""model autoscaler: each deployed model's autoscaler, and its router may follow the server's serving setup

Revision ID: 0008
Revises: 0007

``served_models.autoscaler`` is new (NULL: the serving setup's); ``served_models.router`` may now be NULL (the
setup's). Models deployed before keep what they had: their stored router (least-load), and NULL autoscaler.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("served_models", schema=None) as batch_op:
        batch_op.add_column(sa.Column("autoscaler", sa.String(20), nullable=True))
        batch_op.alter_column(
            "router", existing_type=sa.String(30), nullable=True, server_default=None, existing_nullable=False
        )


def downgrade() -> None:
    op.execute("UPDATE served_models SET router = 'least-load' WHERE router IS NULL")
    with op.batch_alter_table("served_models", schema=None) as batch_op:
        batch_op.alter_column("router", existing_type=sa.String(30), nullable=False, server_default="least-load")
        batch_op.drop_column("autoscaler")
