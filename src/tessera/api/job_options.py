"""The Slurm-style job options a submission may carry, parsed one way for the server (which validates the API body
with them) and the CLI (which checks its flags before it calls): walltime (``2h``, ``90m``, ``1:30:00``, seconds),
job arrays (``0-9``, ``0-9:2``, ``1,3,5``, ``0-99%4``) and dependencies (``afterok:12:13``, ``afterany:..``,
``afternotok:..``). Each parser raises ``ValueError`` with a message that reads after the field's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_TIME_LIMIT_S = 365 * 24 * 3600  # a year: beyond that a walltime is a typo
MAX_ARRAY_TASKS = 1000  # workloads one array submission makes (Slurm's default MaxArraySize is 1001)
MAX_ARRAY_INDEX = 1_000_000
DEPENDENCY_TYPES = ("afterok", "afterany", "afternotok")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_WITH_UNIT = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd])$")
_CLOCK = re.compile(r"^(?:([0-9]+)-)?([0-9]+(?::[0-9]+){0,2})$")  # [D-]H:MM:SS, MM:SS, or plain seconds
_RANGE = re.compile(r"^([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?$")


def parse_duration(value: str | int | float) -> float:
    """Seconds from ``7200``, ``"2h"``, ``"90m"``, ``"45s"``, ``"1d"``, ``"1:30:00"``, ``"30:00"`` or ``"1-00:00:00"``
    (Slurm's days-hours form); more than zero and at most a year."""
    if isinstance(value, bool):
        raise ValueError("a duration such as 2h, 90m, 1:30:00 or seconds")
    seconds = float(value) if isinstance(value, int | float) else _duration_text(value.strip().lower())
    if not seconds > 0:
        raise ValueError("must be more than zero")
    if seconds > MAX_TIME_LIMIT_S:
        raise ValueError(f"at most a year ({MAX_TIME_LIMIT_S} s)")
    return seconds


def _duration_text(text: str) -> float:
    unit = _WITH_UNIT.match(text)
    if unit is not None:
        return float(unit.group(1)) * _UNITS[unit.group(2)]
    clock = _CLOCK.match(text)
    if clock is None:
        raise ValueError(f"{text!r} is not a duration: use 2h, 90m, 45s, 1:30:00 or seconds")
    days, parts = int(clock.group(1) or 0), [int(p) for p in clock.group(2).split(":")]
    if len(parts) == 1:
        return float(days * 86400 + parts[0] * (3600 if clock.group(1) else 1))
    if any(p >= 60 for p in parts[1:]):
        raise ValueError(f"{text!r}: minutes and seconds must be below 60")
    if len(parts) == 3:
        hours, minutes, seconds = parts
    elif clock.group(1):  # D-HH:MM
        hours, minutes, seconds = parts[0], parts[1], 0
    else:  # MM:SS
        hours, minutes, seconds = 0, parts[0], parts[1]
    return float(days * 86400 + hours * 3600 + minutes * 60 + seconds)


def format_duration(seconds: float) -> str:
    """``7200`` -> ``2h``, ``5400`` -> ``1h30m``, ``90`` -> ``1m30s``: how a walltime is shown back."""
    whole = round(seconds)
    if whole != seconds or whole == 0:
        return f"{seconds:g}s"
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, whole = divmod(whole, size)
        if count:
            out += f"{count}{unit}"
    return out


@dataclass(frozen=True, slots=True)
class ArraySpec:
    indices: tuple[int, ...]  # ascending, distinct
    limit: int | None  # at most this many tasks run at once (``%N``); None: no limit


def parse_array(text: str) -> ArraySpec:
    """``0-9``, ``0-9:2`` (step), ``1,3,5`` and mixes (``0-3,8``), with ``%N`` at the end to run at most N at once."""
    body, _, limit_text = text.strip().partition("%")
    limit = None
    if limit_text:
        if not limit_text.isdigit() or not limit_text.isascii() or int(limit_text) < 1:
            raise ValueError(f"%{limit_text}: the limit after % must be a whole number of at least 1")
        limit = int(limit_text)
    indices: set[int] = set()
    for part in body.split(","):
        match = _RANGE.match(part.strip())
        if match is None:
            raise ValueError(f"{part.strip()!r} is not an index or a range: use 0-9, 0-9:2 or 1,3,5")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        step = int(match.group(3)) if match.group(3) is not None else 1
        if last < first or step < 1:
            raise ValueError(f"{part.strip()!r}: a range goes up, by a step of at least 1")
        if last > MAX_ARRAY_INDEX:
            raise ValueError(f"indices go up to {MAX_ARRAY_INDEX}")
        if (last - first) // step + 1 + len(indices) > MAX_ARRAY_TASKS:
            raise ValueError(f"at most {MAX_ARRAY_TASKS} tasks in one array")
        indices.update(range(first, last + 1, step))
    return ArraySpec(tuple(sorted(indices)), limit)


@dataclass(frozen=True, slots=True)
class Dependency:
    kind: str  # afterok | afterany | afternotok
    ids: tuple[int, ...]

    def text(self) -> str:
        return ":".join([self.kind, *map(str, self.ids)])


def parse_dependency(text: str) -> Dependency:
    """``afterok:12`` or ``afterok:12:13`` (also ``afterany``, ``afternotok``): wait for workloads 12 and 13."""
    kind, *ids = text.strip().split(":")
    if kind not in DEPENDENCY_TYPES:
        raise ValueError(f"{kind!r} is not a dependency type: use {', '.join(DEPENDENCY_TYPES)} (e.g. afterok:12)")
    if not ids or not all(i.isascii() and i.isdigit() and 0 < int(i) <= 2**62 for i in ids):
        raise ValueError(f"{text.strip()!r}: give workload ids after the type, e.g. {kind}:12 or {kind}:12:13")
    return Dependency(kind, tuple(dict.fromkeys(int(i) for i in ids)))
