"""The local backend's handle and files: what a handle of kind ``local`` holds (``LocalProcess``), how it is read
back from a handle or a reference file, and the small file helpers (safe file names from workload ids, atomic
writes, exit files). Only ``tessera.backends.local`` and its helpers use them."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tessera.backends.base import Handle, JsonScalar
from tessera.core.errors import InvalidRequestError

logger = logging.getLogger(__name__)

KIND = "local"


@dataclass(frozen=True, slots=True)
class LocalProcess:
    """What a local handle holds: enough to find the workload's processes again after a server restart."""

    workload_id: str
    pid: int  # the supervising process (leader of the workload's process group); 0: none known, it ended
    pgid: int
    started_marker: str  # the process's start time as the OS reports it: guards against a reused PID
    exit_file: str  # where the supervisor writes the exit code when the workload ends

    def handle(self) -> Handle:
        data: dict[str, JsonScalar] = {
            "pid": self.pid,
            "pgid": self.pgid,
            "started_marker": self.started_marker,
            "exit_file": self.exit_file,
        }
        return Handle(self.workload_id, KIND, data)


def process_of(handle: Handle) -> LocalProcess:
    """The process fields of a local handle; ``InvalidRequestError`` for another backend's or a malformed one."""
    if handle.backend != KIND:
        raise InvalidRequestError("handle", f"{handle.workload_id}: a {handle.backend!r} handle, not a local one")
    data = handle.data
    pid, pgid, marker, exit_file = (data.get(k) for k in ("pid", "pgid", "started_marker", "exit_file"))
    ints = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (pid, pgid))
    if not ints or not isinstance(marker, str) or not isinstance(exit_file, str):
        raise InvalidRequestError("handle", f"{handle.workload_id}: not a local process handle: {dict(data)}")
    assert isinstance(pid, int) and isinstance(pgid, int)
    return LocalProcess(handle.workload_id, pid, pgid, marker, exit_file)


def handle_of_file(value: Any) -> Handle:
    """A handle as ``launch`` writes it, or as servers before handles wrote it (the process fields, flat)."""
    if isinstance(value, dict) and "data" not in value and "workload_id" in value:
        fields = {k: value.get(k) for k in ("pid", "pgid", "started_marker", "exit_file")}
        return Handle(str(value["workload_id"]), KIND, fields)
    return Handle.from_json(value)


def file_stem(workload_id: str) -> str:
    """A single, safe file name component for any workload id."""
    return quote(workload_id, safe="")


def write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def read_exit_file(path: Path) -> int | None:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    try:
        return int(text.strip())
    except ValueError:
        logger.warning("%s does not hold an exit code: %r", path, text[:80])
        return None
