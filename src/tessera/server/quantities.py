"""Parsing of the quantities users type: memory (``10GiB``, ``512Mi``, ``16G``, a bare number = MiB) and CPU
(``4``, ``0.5``, ``500m``). Shared by the API (bodies) and the queue configuration.

Both are bounded (``MAX_MEM_MIB``, ``MAX_CPU_CORES``): the results go into 32-bit integer columns (PostgreSQL) and
into the placement's int64 arrays, so a number such as ``1e308`` or ``10**30`` is refused here, naming the field.
"""

from __future__ import annotations

import math
import re

from tessera.errors import InvalidRequestError

_BINARY = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)
_MIB = 2**20
MAX_MEM_MIB = 2**30  # 1 PiB: far above any node, far below a 32-bit column's limit
MAX_CPU_CORES = 1_000_000  # a billion thousandths of a core: fits a 32-bit column


def parse_mem_mib(value: int | float | str, field: str) -> int:
    """MiB in ``value``: a number is MiB; ``Ki/Mi/Gi/Ti`` (with or without ``B``) are binary, ``K/M/G/T`` (``KB``...)
    decimal, rounded up to whole MiB."""
    if isinstance(value, bool):
        raise InvalidRequestError(field, f"{value!r} is not a memory size")
    if isinstance(value, int | float):
        if value < 0 or (isinstance(value, float) and not math.isfinite(value)):
            raise InvalidRequestError(field, f"must be a size >= 0, got {_short(value)}")
        return _bounded_mib(value, value, field)
    match = _MEMORY.match(value)
    if match is None:
        raise InvalidRequestError(field, f"{value!r} is not a memory size (examples: 512MiB, 10GiB, 16G)")
    number, prefix, binary, _ = match.groups()
    if not prefix:
        if binary:
            raise InvalidRequestError(field, f"{value!r} is not a memory size (examples: 512MiB, 10GiB, 16G)")
        return _bounded_mib(float(number), value, field)
    scale = (_BINARY if binary else _DECIMAL)[prefix.lower()]
    return _bounded_mib(float(number) * scale / _MIB, value, field)


def _bounded_mib(mib: float, given: object, field: str) -> int:
    if mib > MAX_MEM_MIB:  # also an overflow to infinity (1e308 GiB)
        raise InvalidRequestError(field, f"{_short(given)} is more than the largest size accepted ({MAX_MEM_MIB} MiB)")
    return math.ceil(mib)


def _short(value: object) -> str:
    """``value`` for an error message, cut short (a number of 300 digits is not worth repeating)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


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
    elif isinstance(value, int) and value > MAX_CPU_CORES:
        cores = math.inf  # float() of a huge int would overflow
    else:
        cores = float(value)
    if cores > MAX_CPU_CORES:
        raise InvalidRequestError(field, f"{_short(value)} is more than the largest amount accepted ({MAX_CPU_CORES})")
    if not math.isfinite(cores) or cores < 0:
        raise InvalidRequestError(field, f"must be >= 0 cores, got {_short(value)}")
    return math.ceil(round(cores * 1000, 6))


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$", re.IGNORECASE)
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
MAX_DURATION_S = 366 * 86400.0


def parse_duration_s(value: int | float | str, field: str) -> float:
    """Seconds in ``value``: a number is seconds; ``500ms``, ``30s``, ``5m``, ``2h``, ``1d``."""
    if isinstance(value, bool):
        raise InvalidRequestError(field, f"{value!r} is not a duration")
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match is None:
            raise InvalidRequestError(field, f"{value!r} is not a duration (examples: 30s, 5m, 2h)")
        seconds = float(match.group(1)) * _SECONDS[(match.group(2) or "s").lower()]
    else:
        seconds = float(value) if value <= MAX_DURATION_S else math.inf
    if not math.isfinite(seconds) or not 0 <= seconds <= MAX_DURATION_S:
        raise InvalidRequestError(field, f"must be between 0 and {MAX_DURATION_S:g} s, got {_short(value)}")
    return seconds
