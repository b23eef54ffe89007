"""``ApiError``, in a module of its own so that code which only names it (the CLI's commands) does not load httpx
and pydantic at import time."""

from __future__ import annotations

from tessera.errors import TesseraError


class ApiError(TesseraError):
    """An error answer of the server (``status``, its one-line ``detail`` and the ``field`` it names), or status 0
    when the server could not be reached or answered something this SDK cannot read."""

    def __init__(self, status: int, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.field = field
