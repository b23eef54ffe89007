"""The fault-injection switch (``TESSERA_CRASH_AT``): read once, a no-op without it, the N-th visit of the named point
kills the process, and a bad value is refused when ``tessera up`` starts (one line naming the variable, exit 2)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera import faults
from tessera.errors import InvalidRequestError


@pytest.fixture
def kills(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """The (pid, signal) of every kill the switch would send; the switch re-reads the environment per test."""
    sent: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "kill", lambda pid, signum: sent.append((pid, signum)))
    faults.reset()
    yield sent
    faults.reset()


def test_parse_accepts_known_points_with_an_optional_count() -> None:
    assert faults.parse("") is None and faults.parse("  ") is None
    assert faults.parse("after-launch") == faults.CrashPlan("after-launch", 1)
    assert faults.parse("mid-commit:3") == faults.CrashPlan("mid-commit", 3)
    for bad in ("after-lunch", "mid-commit:", "before-end:0", "before-end:x", "before-end:-1"):
        with pytest.raises(InvalidRequestError, match=faults.ENV):
            faults.parse(bad)


def test_the_nth_visit_of_the_named_point_kills_the_process(
    kills: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(faults.ENV, "before-end:3")
    for _ in range(5):
        faults.crash_point("after-launch")  # another point: never
    faults.crash_point("before-end")
    faults.crash_point("before-end")
    assert kills == []
    faults.crash_point("before-end")
    assert kills == [(os.getpid(), signal.SIGKILL)]
    faults.crash_point("before-end")
    assert len(kills) == 1  # only the third
    monkeypatch.setenv(faults.ENV, "after-launch")  # read once: a change is not seen
    faults.crash_point("after-launch")
    assert len(kills) == 1
    with pytest.raises(ValueError):
        faults.crash_point("no-such-point")  # a typo in the code


def test_without_the_variable_nothing_happens(kills: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.ENV, raising=False)
    for point in faults.POINTS:
        faults.crash_point(point)
    assert kills == [] and faults.check_environment() is None


def test_tessera_up_refuses_an_unknown_point_at_start(tmp_path: Path) -> None:
    env = {**os.environ, faults.ENV: "after-lunch"}
    command = [sys.executable, "-m", "tessera.cli", "up", "--gpus", "1xA100-80GB", "--data-dir", str(tmp_path)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {faults.ENV}: unknown crash point 'after-lunch'")


def test_the_nth_visit_of_a_failure_point_raises_once(monkeypatch: pytest.MonkeyPatch) -> None:
    faults.reset()
    try:
        monkeypatch.setenv(faults.FAIL_ENV, "end-write:2")
        faults.fail_point("launch-submit")  # another point: never
        faults.fail_point("end-write")
        with pytest.raises(faults.InjectedFault, match=r"the store failed \(TESSERA_FAIL_AT=end-write\)"):
            faults.fail_point("end-write", "the store failed")
        faults.fail_point("end-write")  # transient: only the second visit
        with pytest.raises(ValueError):
            faults.fail_point("after-launch")  # a crash point is not a failure point
        assert isinstance(faults.InjectedFault("x"), RuntimeError)  # as Thread.start's "can't start new thread"
    finally:
        faults.reset()


def test_a_bad_failure_plan_is_refused_naming_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    assert faults.parse("launch-submit:2", faults.FAIL_ENV) == faults.CrashPlan("launch-submit", 2)
    for bad in ("before-end", "end-write:0", "nope"):
        with pytest.raises(InvalidRequestError, match=faults.FAIL_ENV):
            faults.parse(bad, faults.FAIL_ENV)
    faults.reset()
    try:
        monkeypatch.delenv(faults.ENV, raising=False)
        monkeypatch.setenv(faults.FAIL_ENV, "launch-sumbit")
        with pytest.raises(InvalidRequestError, match="unknown failure point 'launch-sumbit'"):
            faults.check_environment()  # what `tessera up` calls at start
    finally:
        faults.reset()
