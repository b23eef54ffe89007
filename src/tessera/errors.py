"""Tessera's exception hierarchy; the CLI turns these into one line and exit code 2."""

from tessera.core.errors import (
    InputFileError,
    InvalidRequestError,
    TesseraError,
    UnknownGpuModelError,
)

__all__ = ["InputFileError", "InvalidRequestError", "TesseraError", "UnknownGpuModelError"]
