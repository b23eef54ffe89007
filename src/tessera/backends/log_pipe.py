"""The supervisor's end of a workload's output: the command writes to a pipe, a thread of the supervisor copies what
comes into the log under its cap (``capped_log.CappedLog``). So the workload never holds the log file itself: it
cannot write past the cap, truncate it or seek in it, and a rotation is a rename done by the one writer.

``LogPipe.start`` makes the pipe the supervisor's own stdout and stderr (its messages go the same way, in order), so
the command, which inherits them, writes there too. ``finish`` (the command has ended) reads what is left in the pipe
(for at most ``DRAIN_S``: a process of the workload that outlived the command may hold the pipe open and keep
writing; it is killed next), then points the supervisor's stdout and stderr at the log file itself for its last
words, the first of them how many bytes were dropped, if any (a full disk, a rotation refused). A pipe that is full
holds the writer until the thread has copied: a fast writer is slowed to the disk's pace, never lets the log pass
its cap.

Imports only the standard library (the supervisor's).
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from pathlib import Path

from tessera.backends.capped_log import CappedLog

logger = logging.getLogger(__name__)

CHUNK_BYTES = 64 * 1024
DRAIN_S = 1.0  # the most ``finish`` waits for output still coming once the command has ended
QUIET_S = 0.05  # ``finish`` stops after the pipe stayed empty this long


class LogPipe:
    def __init__(self, log_path: Path, max_bytes: int, log_fd: int) -> None:
        """``log_fd``: the log file, open for appending (the supervisor's stdout as the server started it)."""
        self.log = CappedLog(log_path, max_bytes, fd=os.dup(log_fd))
        self._read_fd, self._write_fd = os.pipe()
        self._wake_read_fd, self._wake_write_fd = os.pipe()  # ``finish`` wakes the thread (no polling meanwhile)
        self._thread = threading.Thread(target=self._copy, name="tessera-log-pipe", daemon=True)

    def start(self) -> None:
        """The copying thread starts, then the pipe becomes fd 1 and 2 (inherited by the command). Raises
        ``RuntimeError`` when no thread can be started (the workload's pids limit): then nothing has changed."""
        self._thread.start()
        os.dup2(self._write_fd, 1)
        os.dup2(self._write_fd, 2)
        os.close(self._write_fd)

    def finish(self) -> None:
        """Copies what is left (see the module's doc), then writes fd 1 and 2 straight to the log file."""
        null = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):  # drops this process's ends of the pipe: without other writers, the thread sees the end
            os.dup2(null, fd)
        os.close(null)
        os.write(self._wake_write_fd, b"x")
        self._thread.join(DRAIN_S + 1.0)
        if not self._thread.is_alive():  # else it still copies: its file may change under us
            self.log.flush_held()
            for fd in (1, 2):
                os.dup2(self.log.fd, fd)
            if self.log.dropped_bytes:
                logger.warning(
                    "%d bytes of the command's output were dropped: the log could not be written or rotated",
                    self.log.dropped_bytes,
                )

    def _copy(self) -> None:
        drain_until: float | None = None
        watched = [self._read_fd, self._wake_read_fd]
        while True:
            # Until ``finish``, waits for output or the wake-up; after it, a pipe quiet for QUIET_S ends the copy.
            readable, _, _ = select.select(watched, [], [], None if drain_until is None else QUIET_S)
            if self._wake_read_fd in readable:
                watched.remove(self._wake_read_fd)
                drain_until = time.monotonic() + DRAIN_S
            if self._read_fd not in readable:
                if drain_until is not None and not readable:
                    return
                continue
            chunk = os.read(self._read_fd, CHUNK_BYTES)
            if not chunk:
                return  # every writer is gone
            self.log.write(chunk)
            if drain_until is not None and time.monotonic() > drain_until:
                return
