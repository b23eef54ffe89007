"""Alembic environment: runs on the connection that ``tessera.server.store.db.upgrade`` passes in."""

from __future__ import annotations

from alembic import context

from tessera.server.store.models import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through tessera.server.store.db.upgrade (it passes the connection)")
context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
