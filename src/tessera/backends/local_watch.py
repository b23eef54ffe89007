"""What the local backend keeps of each workload it watches (``Watch``), and the process-wide bookkeeping of the
supervisors a closed backend let go (reaped by any backend of this process when they end, so a server restarted
inside one process, as in tests, leaves no zombies). Only ``tessera.backends.local`` uses them."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterable
from dataclasses import dataclass

from tessera.backends.local_files import LocalProcess


@dataclass(slots=True)
class Watch:
    """One tracked workload; mutated only under ``LocalBackend._lock``."""

    ref: LocalProcess
    popen: subprocess.Popen[bytes] | None  # None: adopted from an earlier server, not our child
    term_sent: bool = False
    kill_at_s: float | None = None  # time.monotonic() deadline for SIGKILL, set by stop()
    kill_sent: bool = False
    ended: bool = False  # the supervisor is gone; waiting for the rest of the group to vanish
    exit_code: int | None = None
    report_by_s: float = 0.0  # report even if some process of the group is still there at this time


def group_exists(pgid: int) -> bool:
    """True while the process group has any process, zombies included (``killpg`` with signal 0 sends nothing)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # there is a process, not ours to signal
        return True
    return True


# Children of this process that a closed LocalBackend no longer watches; any LocalBackend's poll/launch reaps them
# when they end, so a server restarted inside the same process (tests) leaves no zombies. Process-wide by nature.
_released_children: list[subprocess.Popen[bytes]] = []
_released_lock = threading.Lock()


def reap_released_children() -> None:
    with _released_lock:
        _released_children[:] = [child for child in _released_children if child.poll() is None]


def release_children(children: Iterable[subprocess.Popen[bytes]]) -> None:
    """Supervisors a closing backend no longer watches: reaped later, when they end."""
    with _released_lock:
        _released_children.extend(children)
