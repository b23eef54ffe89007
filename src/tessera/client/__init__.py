"""The Python SDK of Tessera's API (docs/cli.md, "Python SDK"): ``TesseraClient`` (one method per route; the
module ``client/http.py``), ``ApiError`` (``client/errors.py``) and ``wait_healthy``. No typer, no rich: the
``tessera`` command (``tessera.cli``) is built on it.

    from tessera.client import TesseraClient

    with TesseraClient("http://127.0.0.1:8470", token) as tessera:
        job = tessera.submit({"command": ["python", "train.py"], "gpus": 1, "gpu_fraction": 0.5})
        for text in tessera.follow_logs(job["id"]):
            print(text, end="")

``TesseraClient`` and ``wait_healthy`` load httpx when first used (``ApiError`` does not), so that the command line
can name the error without paying for the HTTP client at start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tessera.client.errors import ApiError

if TYPE_CHECKING:
    from tessera.client.http import TesseraClient, wait_healthy

__all__ = ["ApiError", "TesseraClient", "wait_healthy"]


def __getattr__(name: str) -> object:
    if name in ("TesseraClient", "wait_healthy"):
        from tessera.client import http

        return getattr(http, name)
    raise AttributeError(f"module 'tessera.client' has no attribute {name!r}")
