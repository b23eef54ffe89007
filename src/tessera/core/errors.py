"""Exception hierarchy shared by every layer.

Lives in ``tessera.core`` because the core validates requests and must not import anything outside itself;
``tessera.errors`` re-exports these names for callers outside the core.
"""

from __future__ import annotations


class TesseraError(Exception):
    """Base of every error Tessera raises on purpose."""


class InvalidRequestError(TesseraError):
    """A request or spec is malformed; ``field`` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple[type[InvalidRequestError], tuple[str, str]]:
        # Rebuild from the fields, so that the error crosses process boundaries (sweep workers) intact.
        return type(self), (self.field, self.message)


class UnknownGpuModelError(InvalidRequestError):
    """A GPU model name that the catalog does not know."""


class InputFileError(TesseraError):
    """Bad content in an input file, located by path, line and field."""

    def __init__(self, path: str, line: int | None, field: str | None, message: str) -> None:
        where = path if line is None else f"{path}:{line}"
        what = f"{field}: {message}" if field else message
        super().__init__(f"{where}: {what}")
        self.path = path
        self.line = line
        self.field = field
        self.message = message

    def __reduce__(self) -> tuple[type[InputFileError], tuple[str, int | None, str | None, str]]:
        return type(self), (self.path, self.line, self.field, self.message)
