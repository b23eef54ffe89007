"""The durable store: SQLAlchemy 2 models, Alembic migrations, and the ``Store`` the API and the loop go through.

SQLite (WAL mode) under ``.tessera/`` by default; any ``postgresql://`` URL works too.
"""
