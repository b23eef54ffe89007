"""the workload's backend handle: one JSON column instead of the local backend's pid, pgid, started_marker, exit_file

Revision ID: 0002
Revises: 0001

A row whose four columns were all set (a workload launched by a server before this revision) gets the handle the
local backend makes today: ``{"workload_id": "<id>", "backend": "local", "data": {"pid", "pgid", "started_marker",
"exit_file"}}``, so a server started on an old store re-adopts the workloads that still run. A row with any of them
missing (not launched yet, or ended) gets no handle, as the old code read it. The format is written out here, not
imported, so that this revision means the same whatever the backend does later. SQLite alters tables in batch mode
(copy and move); the conversion runs on both databases through SQLAlchemy's JSON type.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

OLD_COLUMNS = ("pid", "pgid", "started_marker", "exit_file")
LOCAL_BACKEND = "local"


def _workloads(*columns: sa.ColumnClause[Any]) -> sa.TableClause:
    return sa.table("workloads", sa.column("id", sa.Integer()), *columns)


def _old_columns() -> list[sa.ColumnClause[Any]]:
    return [
        sa.column("pid", sa.Integer()),
        sa.column("pgid", sa.Integer()),
        sa.column("started_marker", sa.String(100)),
        sa.column("exit_file", sa.String(500)),
    ]


def upgrade() -> None:
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.add_column(sa.Column("handle", sa.JSON(), nullable=True))
    table = _workloads(*_old_columns(), sa.column("handle", sa.JSON()))
    connection = op.get_bind()
    launched = sa.select(table.c.id, *(table.c[name] for name in OLD_COLUMNS)).where(
        *(table.c[name].is_not(None) for name in OLD_COLUMNS)
    )
    handles = [
        {
            "row_id": row.id,
            "handle": {
                "workload_id": str(row.id),
                "backend": LOCAL_BACKEND,
                "data": {name: getattr(row, name) for name in OLD_COLUMNS},
            },
        }
        for row in connection.execute(launched)
    ]
    if handles:
        statement = sa.update(table).where(table.c.id == sa.bindparam("row_id")).values(handle=sa.bindparam("handle"))
        connection.execute(statement, handles)
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        for name in OLD_COLUMNS:
            batch_op.drop_column(name)


def downgrade() -> None:
    """Back to the four columns; handles of other backends than the local one are dropped (0001 cannot hold them)."""
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pid", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("pgid", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("started_marker", sa.String(length=100), nullable=True))
        batch_op.add_column(sa.Column("exit_file", sa.String(length=500), nullable=True))
    table = _workloads(*_old_columns(), sa.column("handle", sa.JSON()))
    connection = op.get_bind()
    rows = []
    for row in connection.execute(sa.select(table.c.id, table.c.handle).where(table.c.handle.is_not(None))):
        handle = row.handle
        if isinstance(handle, dict) and handle.get("backend") == LOCAL_BACKEND:
            data = handle.get("data") or {}
            rows.append({"row_id": row.id, **{name: data.get(name) for name in OLD_COLUMNS}})
    if rows:
        values: dict[str, Any] = {name: sa.bindparam(name) for name in OLD_COLUMNS}
        connection.execute(sa.update(table).where(table.c.id == sa.bindparam("row_id")).values(values), rows)
    with op.batch_alter_table("workloads", schema=None) as batch_op:
        batch_op.drop_column("handle")
