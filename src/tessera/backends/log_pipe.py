"""The supervisor's end of a workload's output: the command writes to a pipe, a thread of the supervisor copies what
comes into the log under its cap (``capped_log.CappedLog``). So the workload never holds the log file itself: it
cannot write past the cap, truncate it or seek in it, and a rotation is a rename done by the one writer.

``LogPipe.start`` makes the pipe the supervisor's own stdout and stderr (its messages go the same way, in order), so
the command, which inherits them, writes there too. A gang's rank that logs apart (``gang_ranks``) gets a pipe of its
own instead: its write end (``writer_fd``) is the rank's stdout and stderr, and the supervisor then closes its own
(``release_writer``). ``finish`` (the command has ended) reads what is left in the pipe
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
        """``log_fd``: the log file, open for appending (the supervisor's stdout as the server started it); it is
        duplicated, the caller keeps its own."""
        self.log = CappedLog(log_path, max_bytes, fd=os.dup(log_fd))
        self._read_fd, self._write_fd = os.pipe()
        self._wake_read_fd, self._wake_write_fd = os.pipe()  # ``finish`` wakes the thread (no polling meanwhile)
        self._thread = threading.Thread(target=self._copy, name="tessera-log-pipe", daemon=True)
        self._own_output = False  # the pipe is fd 1 and 2 (``start``), not one child's (``start_apart``)

    def start(self) -> None:
        """The copying thread starts, then the pipe becomes fd 1 and 2 (inherited by the command). Raises
        ``RuntimeError`` when no thread can be started (the workload's pids limit): then nothing has changed."""
        self._thread.start()
        os.dup2(self._write_fd, 1)
        os.dup2(self._write_fd, 2)
        self.release_writer()
        self._own_output = True

    def start_apart(self) -> None:
        """The copying thread starts; the pipe's write end (``writer_fd``) is for one child's stdout and stderr (close
        it with ``release_writer`` once the child started). ``RuntimeError`` as for ``start``."""
        self._thread.start()

    @property
    def writer_fd(self) -> int:
        """The pipe's write end in this process (-1 once released)."""
        return self._write_fd

    def release_writer(self) -> None:
        """Closes this process's write end (once): the copy ends when the last writer's end is closed."""
        if self._write_fd >= 0:
            os.close(self._write_fd)
            self._write_fd = -1

    def finish(self) -> None:
        """Copies what is left (see the module's doc), then writes fd 1 and 2 straight to the log file (a pipe
        started apart closes its log instead)."""
        finish_all([self])

    def stop_writing(self) -> None:
        """Drops this process's ends of the pipe and wakes the thread: without other writers, it sees the end."""
        if self._own_output:
            null = os.open(os.devnull, os.O_WRONLY)
            for fd in (1, 2):
                os.dup2(null, fd)
            os.close(null)
        self.release_writer()
        os.write(self._wake_write_fd, b"x")

    def complete(self) -> None:
        """Waits for the copy (``stop_writing`` first), then points fd 1 and 2 at the log, or closes it."""
        self._thread.join(DRAIN_S + 1.0)
        if self._thread.is_alive():  # it still copies: its file may change under us
            return
        self.log.flush_held()
        if self._own_output:
            for fd in (1, 2):
                os.dup2(self.log.fd, fd)
        else:
            self.log.close()
        if self.log.dropped_bytes:
            which = "the log" if self._own_output else f"the log {self.log.path}"
            logger.warning(
                "%d bytes of the command's output were dropped: %s could not be written or rotated",
                self.log.dropped_bytes,
                which,
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


def finish_all(pipes: list[LogPipe]) -> None:
    """``finish`` for several pipes at once: each drains for at most ``DRAIN_S``, side by side."""
    for pipe in pipes:
        pipe.stop_writing()
    for pipe in pipes:
        pipe.complete()
