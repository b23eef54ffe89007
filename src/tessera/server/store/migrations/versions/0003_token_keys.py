"""tokens: the hash scheme (keyed HMAC-SHA256 from now on) and when each token was last used

Revision ID: 0003
Revises: 0002

The rows already stored hold a plain SHA-256 of their secret; they get ``hash_scheme = 'sha256'`` (the column's
server default) and keep working: the store rehashes such a token under the server's key the first time it is
presented (a migration cannot, it never sees the secrets). ``last_used_at`` starts empty.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("hash_scheme", sa.String(20), nullable=False, server_default="sha256"))
        batch_op.add_column(sa.Column("last_used_at", sa.Float(), nullable=True))


def downgrade() -> None:
    """Back to plain SHA-256 hashes only: keyed rows cannot be converted without their secrets, so they are dropped
    (their tokens must be created again; the admin token is stored again by the next start)."""
    tokens = sa.table("tokens", sa.column("hash_scheme", sa.String(20)))
    op.get_bind().execute(sa.delete(tokens).where(tokens.c.hash_scheme != "sha256"))
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.drop_column("last_used_at")
        batch_op.drop_column("hash_scheme")
