"""The Python SDK of Tessera's API: ``TesseraClient`` (one method per route), ``ApiError`` and ``wait_healthy``
(``client/http.py``). No typer, no rich: the ``tessera`` command (``tessera.cli``) is built on it."""
