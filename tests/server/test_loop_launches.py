"""A scheduling step does not wait for the backend's launches (issue 17, defect 5): while a launch is stuck, steps
still return, collect ends and apply cancels; a workload cancelled or preempted while its launch is queued is never
started, and one cancelled while its launch is being made is stopped as soon as the launch returns.

The slow launch is a gate, not a clock: ``GatedBackend.launch`` of a held workload blocks until the test opens it, so
nothing here depends on how fast the machine is. A step that waited for the launch would never return; each step
runs on a thread of its own with a generous join so that such a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from server_harness import ADMIN, Harness, MakeHarness

from tessera.backends.base import Handle, LaunchSpec
from tessera.backends.fake import FakeBackend
from tessera.server.store.changes import StopReason

GUARD_S = 30.0  # only to fail instead of hanging: a bounded step returns in milliseconds


class GatedBackend(FakeBackend):
    """The fake backend, except that the launch of a workload in ``held`` blocks until ``gate`` opens."""

    def __init__(self) -> None:
        super().__init__()
        self.held: set[str] = set()
        self.gate = threading.Event()
        self.blocked = threading.Event()  # a held launch has begun and waits at the gate
        self.begun: list[str] = []  # every launch begun, in order

    def launch(self, spec: LaunchSpec) -> Handle:
        self.begun.append(spec.workload_id)
        if spec.workload_id in self.held:
            self.blocked.set()
            assert self.gate.wait(GUARD_S), "the test never opened the gate"
        return super().launch(spec)


@pytest.fixture
def gated(make_harness: MakeHarness) -> Iterator[tuple[Harness, GatedBackend]]:
    backend = GatedBackend()
    yield _unlocked(make_harness("4xA100-80GB", backend=backend)), backend
    backend.gate.set()  # whatever the test did, no launch stays blocked


def _unlocked(h: Harness) -> Harness:
    """The server's own setting: a step does not wait for its launches (the harness's lockstep waits for them)."""
    loop = h.server.ctx.loop
    loop.config = dataclasses.replace(loop.config, launch_wait_s=0.0)
    return h


def _step(h: Harness) -> None:
    """One step, which must return while a launch is blocked."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            h.step()
        except BaseException as error:  # noqa: BLE001 - re-raised on the test's thread
            failed.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(GUARD_S)
    assert not thread.is_alive(), "the scheduling step waited for a blocked launch"
    if failed:
        raise failed[0]


def _settle(h: Harness) -> None:
    """Let the launcher finish what it can, then a step records it."""
    assert h.server.ctx.loop.launcher.worker.wait(GUARD_S)
    _step(h)


def _cancel(h: Harness, workload_id: int) -> None:
    response = h.http.post(f"/v1/workloads/{workload_id}/cancel", headers=h.as_(ADMIN))
    assert response.status_code == 200, response.text


def _events(h: Harness, workload_id: int) -> list[str]:
    events: list[dict[str, Any]] = h.http.get(f"/v1/workloads/{workload_id}/events", headers=h.as_(ADMIN)).json()
    return [e["kind"] for e in events]


def test_steps_collect_ends_and_apply_cancels_while_a_launch_is_stuck(
    gated: tuple[Harness, GatedBackend],
) -> None:
    h, backend = gated
    early = h.submit(gpus=1)["id"]
    _step(h)
    _settle(h)
    assert h.get(early)["state"] == "running" and "started" in _events(h, early)

    stuck, queued, later = (h.submit(gpus=1)["id"] for _ in range(3))
    backend.held.add(str(stuck))
    _step(h)  # all three are decided and stored; the launcher is stuck in the first launch, the others queued
    assert backend.blocked.wait(GUARD_S)
    assert [h.get(w)["state"] for w in (stuck, queued, later)] == ["running"] * 3
    assert backend.begun == [str(early), str(stuck)]

    backend.finish(str(early), 0)
    _cancel(h, queued)  # its launch is still queued
    _cancel(h, stuck)  # its launch is being made
    _step(h)
    assert h.get(early)["state"] == "succeeded"  # an end is collected while the launch is stuck
    cancelled = h.get(queued)
    assert cancelled["state"] == "cancelled" and cancelled["reason"] == "cancelled before it started"
    loop = h.server.ctx.loop
    assert loop.running[stuck].stop_sent == StopReason.cancel()  # decided and stored, to be sent once it exists
    assert h.get(stuck)["state"] == "running"
    assert int(loop.state.gpu_free_milli.sum()) == 2000  # the ended and the never-started one gave theirs back

    backend.gate.set()  # the slow launch returns; the queue drains
    _settle(h)
    assert (str(stuck), loop.config.stop_grace_s) in backend.stops  # stopped as soon as its handle came back
    _step(h)
    assert h.get(stuck)["state"] == "cancelled"
    assert h.get(later)["state"] == "running" and "started" in _events(h, later)
    assert str(queued) not in backend.begun  # cancelled before its launch: never started
    assert "started" not in _events(h, queued)


def _tenant(h: Harness, name: str) -> str:
    """A queue of one GPU in cohort ``lab`` for tenant ``name``, and its token."""
    body = {"name": name, "tenant": name, "cohort": "lab", "nominal": {"*": {"gpus": 1}}}
    assert h.http.post("/v1/queues", json=body, headers=h.as_(ADMIN)).status_code == 201
    return str(h.http.post("/v1/tokens", json={"tenant": name}, headers=h.as_(ADMIN)).json()["token"])


def test_a_workload_preempted_while_its_launch_is_queued_is_never_started(make_harness: MakeHarness) -> None:
    backend = GatedBackend()
    h = _unlocked(make_harness("2xA100-80GB", backend=backend))
    try:
        a, b = _tenant(h, "team-a"), _tenant(h, "team-b")
        plug = h.submit(gpus=0, cpu="100m")["id"]  # no GPU: it only keeps the launcher busy
        backend.held.add(str(plug))
        _step(h)
        assert backend.blocked.wait(GUARD_S)
        borrowed = [h.submit(a, gpus=1, priority="training")["id"] for _ in range(2)]  # team-a borrows team-b's
        _step(h)  # both bound; their launches wait behind the stuck one
        assert [h.get(w)["state"] for w in borrowed] == ["running", "running"]

        owner = h.submit(b, gpus=1, priority="training")["id"]
        _step(h)  # reclaim: a victim that never started has nothing to stop, it waits again at once
        requeued = [w for w in borrowed if _events(h, w)[-2:] == ["preempted", "requeued"]]
        assert len(requeued) == 1 and h.get(requeued[0], a)["state"] == "pending"
        assert backend.stops == []
        assert h.get(owner)["state"] == "running"

        backend.gate.set()
        _settle(h)
        _settle(h)  # the owner is launched once its victim is gone, and recorded
        assert str(owner) in {s.workload_id for s in backend.launched}
        assert str(requeued[0]) not in backend.begun
        assert "started" in _events(h, owner)
    finally:
        backend.gate.set()


def test_a_cancel_through_the_api_wakes_the_loop_instead_of_waiting_out_its_interval(gated: Any) -> None:
    """The loop sleeps a whole interval between steps; a cancel posted meanwhile wakes it, so the cancel takes
    effect now. The interval here is an hour: without the wake, the workload would still be running at the end."""
    h, _ = gated
    loop = h.server.ctx.loop
    loop.config = dataclasses.replace(loop.config, interval_s=3600.0)
    wid = h.submit(gpus=1, gpu_fraction=0.5, command=["sleep", "600"])["id"]
    h.step()
    h.step()
    assert h.get(wid)["state"] == "running"
    steps: list[int] = []
    loop.on_step = lambda report: steps.append(1)
    stopped = threading.Event()
    runner = threading.Thread(target=loop.run_forever, args=(stopped.is_set,), daemon=True)
    runner.start()
    try:
        assert _wait_until(lambda: len(steps) >= 1)  # the first step of run_forever, then an hour's sleep
        cancelled = h.http.post(f"/v1/workloads/{wid}/cancel", headers=h.as_(ADMIN))
        assert cancelled.status_code == 200, cancelled.text
        assert _wait_until(lambda: len(steps) >= 2), "the cancel did not wake the loop"
        assert loop.running[wid].stop_sent == StopReason.cancel()
    finally:
        stopped.set()
        loop.wake()
        runner.join(GUARD_S)
    assert not runner.is_alive()


def _wait_until(condition: Any, timeout_s: float = GUARD_S) -> bool:
    deadline_s = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline_s:
            return False
        time.sleep(0.01)
    return True
