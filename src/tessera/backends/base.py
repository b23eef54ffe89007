"""The backend seam: launch a workload's process, stop it, learn when it ends, re-adopt it after a server restart.

The server writes every decision to its store *before* it calls the backend, and keeps the ``ProcessRef`` that
``launch`` returns so that a restarted server can ``adopt`` processes that outlived it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    workload_id: str
    argv: tuple[str, ...]  # the command, argv[0] looked up on PATH
    env: Mapping[str, str] = field(default_factory=dict)  # added to the server's environment (CUDA_VISIBLE_DEVICES...)
    log_path: Path | None = None  # stdout and stderr together; None = discard
    workdir: Path | None = None  # working directory; None = the server's


@dataclass(frozen=True, slots=True)
class ProcessRef:
    """Enough to find a launched workload again after the server restarted (stored with the workload)."""

    workload_id: str
    pid: int  # the supervising process (leader of the workload's process group)
    pgid: int
    started_marker: str  # the process's start time as the OS reports it: guards against a reused PID
    exit_file: str  # where the supervisor writes the exit code when the workload ends


@dataclass(frozen=True, slots=True)
class ExitStatus:
    workload_id: str
    exit_code: int | None  # the command's exit code; negative = killed by that signal; None = unknown (vanished)


class Backend(Protocol):
    def launch(self, spec: LaunchSpec) -> ProcessRef:
        """Start the workload in its own process group; returns at once."""
        ...

    def adopt(self, ref: ProcessRef) -> None:
        """Track a workload launched by an earlier server; if it ended meanwhile, the next ``poll`` reports it."""
        ...

    def find(self, workload_id: str) -> ProcessRef | None:
        """The process of a workload launched earlier whose ``ProcessRef`` never reached the store (the server died
        between launch and write), or None when it was never launched."""
        ...

    def stop(self, workload_id: str, grace_s: float) -> None:
        """SIGTERM the workload's process group now and SIGKILL it after ``grace_s``; returns at once. Its end is
        reported by ``poll`` like any other."""
        ...

    def poll(self) -> list[ExitStatus]:
        """Workloads that ended since the last call (each reported once; nothing of theirs is left running)."""
        ...

    def tracked(self) -> set[str]:
        """Ids of the workloads this backend still watches."""
        ...

    def close(self) -> None:
        """Stop watching (the server is shutting down); workload processes keep running and can be re-adopted."""
        ...
