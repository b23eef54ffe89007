"""model router: the gateway's router of each deployed model

Revision ID: 0007
Revises: 0006

Models deployed before this revision keep the router the gateway gave every model then: least-load.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("served_models", schema=None) as batch_op:
        batch_op.add_column(sa.Column("router", sa.String(30), nullable=False, server_default="least-load"))


def downgrade() -> None:
    with op.batch_alter_table("served_models", schema=None) as batch_op:
        batch_op.drop_column("router")
