"""Fault injection for crash tests: ``TESSERA_CRASH_AT=<point>[:N]`` makes the process SIGKILL itself the N-th time
(the first by default) it reaches the named point, so a test can kill the server exactly where a crash hurts most;
``TESSERA_FAIL_AT=<point>[:N]`` makes the N-th visit of a named point raise ``InjectedFault`` instead (once: a
transient fault, as a host out of threads or a lost database connection gives), so a test can check that the
server recovers at its next step.

Without the variables every ``crash_point`` and ``fail_point`` is a no-op (one dictionary lookup). Each variable is
read once, when it is first needed; ``check_environment`` reads both at start-up (``tessera up``), so an unknown
point is refused then, with an error naming the variable, rather than never firing. A point is a plain name, not a
module path: the backend, the store and the loop all reach theirs, and so this module sits outside the layers
(beside ``tessera.errors``) and imports nothing of Tessera's but the errors.

The crash points (``POINTS``):

- ``after-launch``: a workload's supervisor has just been started, and nothing else is recorded yet (no reference
  file, no handle in the store): ``LocalBackend.launch`` right after the fork. Only the launch intent was written.
- ``before-end``: a workload's end was collected from the backend and is about to be written to the store.
- ``mid-commit``: inside the transaction that stores a step's decisions, after the binds were written and before
  the commit (the database must roll all of them back).

The failure points (``FAIL_POINTS``):

- ``launch-submit``: the launch worker starts its thread (``LaunchWorker.submit``); fails as Python does when the
  host has no thread left (``can't start new thread``).
- ``end-write``: the store transaction that records workloads' ends or requeues, before anything is written.
- ``decisions-write``: the store transaction of a step's decisions, before anything is written.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from dataclasses import dataclass

from tessera.errors import InvalidRequestError

logger = logging.getLogger(__name__)

ENV = "TESSERA_CRASH_AT"
POINTS = {
    "after-launch": "a workload's process started; nothing recorded yet but the launch intent",
    "before-end": "a workload's end is about to be written to the store",
    "mid-commit": "inside the store transaction of a step's decisions, after the binds, before the commit",
}
FAIL_ENV = "TESSERA_FAIL_AT"
FAIL_POINTS = {
    "launch-submit": "the launch worker starts its thread: can't start new thread",
    "end-write": "the store transaction that records workloads' ends or requeues fails before it writes",
    "decisions-write": "the store transaction of a step's decisions fails before it writes",
}


class InjectedFault(RuntimeError):
    """What a ``fail_point`` raises (a ``RuntimeError``, as ``Thread.start`` raises when no thread can be made)."""


@dataclass(frozen=True, slots=True)
class CrashPlan:
    point: str
    nth: int  # crash the nth time the point is reached (1: the first)


def parse(text: str, env: str = ENV) -> CrashPlan | None:
    """``point`` or ``point:N`` as ``env`` (``TESSERA_CRASH_AT`` or ``TESSERA_FAIL_AT``) holds it; None for an empty
    value. ``InvalidRequestError`` (naming the variable) for an unknown point or an N that is not a positive
    integer."""
    text = text.strip()
    if not text:
        return None
    point, colon, count = text.partition(":")
    points, what = (FAIL_POINTS, "failure point") if env == FAIL_ENV else (POINTS, "crash point")
    if point not in points:
        raise InvalidRequestError(env, f"unknown {what} {point!r} (known: {', '.join(points)})")
    if not colon:
        return CrashPlan(point, 1)
    if not count.isdigit() or int(count) < 1:
        raise InvalidRequestError(env, f"expected {point}:N with N a positive integer, got {text!r}")
    return CrashPlan(point, int(count))


class _Switch:
    """The process's one plan for ``env`` and how often its point was reached; thread-safe."""

    def __init__(self, env: str) -> None:
        self._env = env
        self._lock = threading.Lock()
        self._loaded = False
        self._plan: CrashPlan | None = None
        self._reached = 0

    def plan(self) -> CrashPlan | None:
        with self._lock:
            if not self._loaded:
                self._plan = parse(os.environ.get(self._env, ""), self._env)
                self._loaded = True
            return self._plan

    def reached(self, point: str) -> bool:
        """True when this visit of ``point`` is the one to crash at."""
        plan = self._plan if self._loaded else self.plan()  # read once; no lock on the common path
        if plan is None or plan.point != point:
            return False
        with self._lock:
            self._reached += 1
            return self._reached == plan.nth

    def reset(self) -> None:
        """Read the variable again at the next use (tests)."""
        with self._lock:
            self._loaded, self._plan, self._reached = False, None, 0


_switch = _Switch(ENV)
_fail_switch = _Switch(FAIL_ENV)


def check_environment() -> CrashPlan | None:
    """The crash plan ``TESSERA_CRASH_AT`` asks for (None: none); raises ``InvalidRequestError`` for a bad value of
    it or of ``TESSERA_FAIL_AT`` (see ``check_failures``)."""
    check_failures()
    return _switch.plan()


def check_failures() -> CrashPlan | None:
    """The failure plan ``TESSERA_FAIL_AT`` asks for (None: none); raises ``InvalidRequestError`` for a bad value."""
    return _fail_switch.plan()


def crash_point(point: str) -> None:
    """SIGKILL this process if ``TESSERA_CRASH_AT`` names ``point`` and this is the visit it counts to."""
    if point not in POINTS:  # a typo in the code, not in the environment
        raise ValueError(f"unknown crash point {point!r}")
    if _switch.reached(point):
        logger.critical("%s: crashing at %s (pid %d)", ENV, point, os.getpid())  # handlers flush each record
        os.kill(os.getpid(), signal.SIGKILL)


def fail_point(point: str, message: str = "injected fault") -> None:
    """Raise ``InjectedFault(message)`` if ``TESSERA_FAIL_AT`` names ``point`` and this is the visit it counts to."""
    if point not in FAIL_POINTS:  # a typo in the code, not in the environment
        raise ValueError(f"unknown failure point {point!r}")
    if _fail_switch.reached(point):
        logger.error("%s: failing at %s", FAIL_ENV, point)
        raise InjectedFault(f"{message} ({FAIL_ENV}={point})")


def reset() -> None:
    """Forget what was read and counted; the next ``crash_point`` or ``fail_point`` reads the variables again
    (tests)."""
    _switch.reset()
    _fail_switch.reset()
