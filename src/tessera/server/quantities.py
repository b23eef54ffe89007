"""Parsing of the quantities users type: memory (``10GiB``, ``512Mi``, ``16G``, a bare number = MiB) and CPU
(``4``, ``0.5``, ``500m``). Shared by the API (bodies) and the queue configuration.
"""

from __future__ import annotations

import math
import re

from tessera.errors import InvalidRequestError

_BINARY = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)
_MIB = 2**20


def parse_mem_mib(value: int | float | str, field: str) -> int:
    """MiB in ``value``: a number is MiB; ``Ki/Mi/Gi/Ti`` (with or without ``B``) are binary, ``K/M/G/T`` (``KB``...)
    decimal, rounded up to whole MiB."""
    if isinstance(value, bool):
        raise InvalidRequestError(field, f"{value!r} is not a memory size")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value < 0:
            raise InvalidRequestError(field, f"must be a size >= 0, got {value!r}")
        return math.ceil(value)
    match = _MEMORY.match(value)
    if match is None:
        raise InvalidRequestError(field, f"{value!r} is not a memory size (examples: 512MiB, 10GiB, 16G)")
    number, prefix, binary, _ = match.groups()
    if not prefix:
        if binary:
            raise InvalidRequestError(field, f"{value!r} is not a memory size (examples: 512MiB, 10GiB, 16G)")
        return math.ceil(float(number))
    scale = (_BINARY if binary else _DECIMAL)[prefix.lower()]
    return math.ceil(float(number) * scale / _MIB)


def parse_cpu_milli(value: int | float | str, field: str) -> int:
    """Thousandths of a core in ``value``: ``4`` or ``0.5`` cores, or ``500m``."""
    if isinstance(value, bool):
        raise InvalidRequestError(field, f"{value!r} is not a CPU amount")
    if isinstance(value, str):
        text = value.strip().lower()
        try:
            cores = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
        except ValueError:
            raise InvalidRequestError(field, f"{value!r} is not a CPU amount (examples: 4, 0.5, 500m)") from None
    else:
        cores = float(value)
    if not math.isfinite(cores) or cores < 0:
        raise InvalidRequestError(field, f"must be >= 0 cores, got {value!r}")
    return math.ceil(round(cores * 1000, 6))
