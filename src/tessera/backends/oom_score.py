"""Keeps the kernel's OOM killer on a workload's processes rather than on their supervisor, and tells when it struck.

The supervisor joins its workload's cgroups so that the command is born in them, and so shares the workload's
memory limit. Where the workload's memory is in no process's resident set (files in ``/dev/shm`` or another tmpfs,
which the kernel charges to the cgroup that wrote them), the supervisor, a Python process of a few MiB, is the
biggest process of the cgroup and the OOM killer's choice: the workload then ends with no exit code and no last
lines in its log. So the supervisor starts the command within ``spared``:

- where it may lower its score (root with ``CAP_SYS_RESOURCE``), it sets its own ``oom_score_adj`` to -1000 once
  the command is started (the command keeps the score it inherited);
- where it may not (a container without ``CAP_SYS_RESOURCE``), the command is started with ``oom_score_adj`` 1000,
  which anyone may raise (so it and what it starts go first), and the supervisor returns to its own score. A
  workload may lower its own score back to the supervisor's: it only harms itself.

``oom_kills`` counts the kills in the workload's memory cgroup (v2 ``memory.events``, v1 ``memory.oom_control``),
so that the supervisor can say why its command was killed. Imports only the standard library (the supervisor's).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

logger = logging.getLogger(__name__)

OWN_SCORE = Path("/proc/self/oom_score_adj")
OWN_STATUS = Path("/proc/self/status")
CAP_SYS_RESOURCE = 24
SPARED = -1000
FIRST = 1000
_COUNTERS = ("memory.events", "memory.oom_control")  # cgroup v2, v1: each has a line "oom_kill N"


def may_lower_score(status: Path = OWN_STATUS) -> bool:
    """Whether this process has ``CAP_SYS_RESOURCE``, which lowering an ``oom_score_adj`` takes."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_RESOURCE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


@contextlib.contextmanager
def spared(score_file: Path = OWN_SCORE, privileged: bool | None = None) -> Iterator[None]:
    """Start the command inside: see the module's doc. Never fails: what cannot be done is logged."""
    privileged = may_lower_score() if privileged is None else privileged
    own = None
    if not privileged:
        own = _read(score_file)
        if own is not None and not _write(score_file, FIRST, "make the command the OOM killer's first choice"):
            own = None
    try:
        yield
    finally:
        if privileged:
            _write(score_file, SPARED, "keep the OOM killer off the supervisor")
        elif own is not None:
            _write(score_file, own, "return the supervisor to its own OOM score")


def _read(score_file: Path) -> int | None:
    try:
        return int(score_file.read_text())
    except (OSError, ValueError) as error:
        logger.warning("cannot read the supervisor's OOM score (%s): it may be killed first", error)
        return None


def _write(score_file: Path, score: int, doing: str) -> bool:
    try:
        score_file.write_text(f"{score}\n")
    except OSError as error:
        logger.warning("cannot %s (%s): the supervisor may be killed first", doing, error.strerror or error)
        return False
    return True


def oom_kills(cgroups: Iterable[Path]) -> int:
    """The processes the OOM killer has killed in these cgroups (their memory ones: the others have no counter)."""
    kills = 0
    for cgroup in cgroups:
        for name in _COUNTERS:
            with contextlib.suppress(OSError, ValueError, IndexError):
                for line in (cgroup / name).read_text().splitlines():
                    if line.startswith("oom_kill "):
                        kills += int(line.split()[1])
    return kills
