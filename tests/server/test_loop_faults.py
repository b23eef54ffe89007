"""A step is a transaction of observations and effects (issue 25, defects 5 and 8): whatever fails in a step, the next
step recovers. An end the backend reported is kept until it is stored, a launch that could not be handed to the
launch worker is made at the next step, a launch worker that could not start its thread is started again, a step's
decisions whose write failed leave nothing behind in the books; and a workload that ended before its handle was
stored is never launched a second time by a server restarted after a crash.

Faults come from ``tessera.faults`` (``TESSERA_FAIL_AT`` raises at a named point, as a host out of threads or a lost
database connection does); the crash is a server abandoned between two writes and a new one started on the same
store and backend, as ``test_store.py`` restarts them.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from server_harness import ADMIN, Harness, MakeHarness

from tessera import faults
from tessera.backends.base import Handle, LaunchSpec
from tessera.backends.fake import FakeBackend
from tessera.server.launch_worker import Launched, LaunchWorker

GUARD_S = 30.0  # only to fail instead of hanging
WAIT_S = 5.0  # a step's wait for its launches: a wedged launcher makes it wait this long (and the test fail)
log = logging.getLogger(__name__)
STOPS_LOGGER = "tessera.server.loop_stops"


def _events(h: Harness, workload_id: int) -> list[str]:
    events: list[dict[str, Any]] = h.http.get(f"/v1/workloads/{workload_id}/events", headers=h.as_(ADMIN)).json()
    return [e["kind"] for e in events]


def _launches(backend: FakeBackend, workload_id: int) -> int:
    return sum(spec.workload_id == str(workload_id) for spec in backend.launched)


def _serve(h: Harness) -> None:
    """One step as ``SchedulerLoop.run_forever`` runs it: a step that raises is logged, and the next one follows."""
    try:
        h.step()
    except Exception:
        log.exception("the step failed (as run_forever logs it)")


def _short_waits(h: Harness) -> Harness:
    loop = h.server.ctx.loop
    loop.config = dataclasses.replace(loop.config, launch_wait_s=WAIT_S)
    return h


def test_a_host_out_of_threads_at_a_launch_does_not_wedge_the_loop(make_harness: MakeHarness, fail_at: Any) -> None:
    """The incident: a replica's engine aborted (-6) during a host-wide thread exhaustion, and the launch worker could
    not start its thread for the restart. Before, the worker kept a thread that never ran: the restart stayed queued
    for ever, the replica ``running`` in the store with no process, and nothing else was ever launched."""
    h = _short_waits(make_harness("1xA100-80GB"))
    replica = h.submit(gpus=1, gpu_fraction=0.5, kind="service", command=["serve"])["id"]
    h.step()
    assert h.get(replica)["state"] == "running" and _launches(h.backend, replica) == 1

    fail_at("launch-submit")  # the next thread the launch worker starts: can't start new thread
    h.backend.finish(str(replica), -6)
    _serve(h)  # the end is recorded (a service restarts), the restart bound again; its launch cannot be handed over
    assert _events(h, replica)[-2:] == ["requeued", "bound"]
    _serve(h)  # the next step hands it over again
    _serve(h)
    assert _launches(h.backend, replica) == 2, "the restart was never launched"
    row = h.get(replica)
    assert row["state"] == "running" and row["attempts"] == 2
    kinds = _events(h, replica)
    assert kinds.count("started") == 2 and kinds.index("requeued") < len(kinds) - 1
    requeued = h.http.get(f"/v1/workloads/{replica}/events", headers=h.as_(ADMIN)).json()
    assert any("killed by signal 6" in e["message"] for e in requeued if e["kind"] == "requeued")

    later = h.submit(gpus=1, gpu_fraction=0.5)["id"]  # and the loop goes on launching
    _serve(h)
    assert h.get(later)["state"] == "running" and _launches(h.backend, later) == 1


def test_an_end_whose_write_failed_is_recorded_at_the_next_step(make_harness: MakeHarness, fail_at: Any) -> None:
    """Before, the end left the books and the running table before its write, which failed: the workload stayed
    ``running`` in the store for ever, and the backend had reported it once."""
    h = make_harness("1xA100-80GB")
    first = h.submit(gpus=1)["id"]
    h.step()
    waiting = h.submit(gpus=1)["id"]
    h.step()
    assert h.get(waiting)["state"] == "pending"

    fail_at("end-write")
    h.backend.finish(str(first), 0)
    _serve(h)  # the end's transaction fails
    loop = h.server.ctx.loop
    assert h.get(first)["state"] == "running" and first in loop.running  # memory and store still agree
    assert int(loop.state.gpu_free_milli.sum()) == 0
    _serve(h)
    row = h.get(first)
    assert row["state"] == "succeeded" and row["exit_code"] == 0
    _serve(h)
    assert h.get(waiting)["state"] == "running"  # the GPU went back and to the next workload


def test_decisions_whose_write_failed_are_taken_back_out_of_the_books(make_harness: MakeHarness, fail_at: Any) -> None:
    """Before, the binds stayed in the books though not stored: the GPU counted as taken by a workload still pending,
    which was never offered a GPU again."""
    h = make_harness("1xA100-80GB")
    wid = h.submit(gpus=1)["id"]
    fail_at("decisions-write")
    _serve(h)
    loop = h.server.ctx.loop
    assert h.get(wid)["state"] == "pending" and h.backend.launched == []
    assert int(loop.state.gpu_free_milli.sum()) == 1000 and str(wid) not in loop.scheduler.books.running
    h.clock.advance(1)
    _serve(h)
    assert h.get(wid)["state"] == "running" and _launches(h.backend, wid) == 1


class HeldAfterStart(FakeBackend):
    """The fake backend, except that the launch of a workload in ``held`` starts it (the backend watches it from
    then on) and then waits for ``gate`` before it returns its handle: the local backend's window between the fork
    and the end of ``launch``, in which the workload may end and ``poll`` report it."""

    def __init__(self) -> None:
        super().__init__()
        self.held: set[str] = set()
        self.gate = threading.Event()
        self.started = threading.Event()

    def launch(self, spec: LaunchSpec) -> Handle:
        handle = super().launch(spec)
        if spec.workload_id in self.held:
            self.started.set()
            assert self.gate.wait(GUARD_S), "the test never opened the gate"
        return handle


def test_a_job_that_ended_before_its_handle_was_stored_does_not_run_again_after_a_crash(
    make_harness: MakeHarness,
) -> None:
    backend = HeldAfterStart()
    h = make_harness("1xA100-80GB", backend=backend)
    loop = h.server.ctx.loop
    loop.config = dataclasses.replace(loop.config, launch_wait_s=0.0)
    wid = h.submit(gpus=1)["id"]
    backend.held.add(str(wid))
    try:
        h.step()  # bound and stored; the launch started the job, its handle is not back yet
        assert backend.started.wait(GUARD_S)
        backend.finish(str(wid), 0)  # the job ends at once
        h.step()  # the end is reported before the handle: the step keeps it for the step that stores the handle
        assert h.get(wid)["state"] == "running" and "started" not in _events(h, wid)
        # The server is killed here, before its next commit: neither the handle nor the end reached the store.
        backend.close()
    finally:
        backend.gate.set()
    h2 = make_harness("1xA100-80GB", db_url=h.db_url, backend=backend)
    h2.step()
    h2.step()
    assert _launches(backend, wid) == 1, "the job was launched a second time"
    row = h2.get(wid)
    assert row["state"] == "succeeded" and row["exit_code"] == 0
    assert "found" in _events(h2, wid)


def test_a_preemption_whose_write_failed_leaves_its_victim_running_and_untouched(
    make_harness: MakeHarness, fail_at: Any
) -> None:
    h = make_harness("2xA100-80GB")
    for name in ("team-a", "team-b"):
        body = {"name": name, "tenant": name, "cohort": "lab", "nominal": {"*": {"gpus": 1}}}
        assert h.http.post("/v1/queues", json=body, headers=h.as_(ADMIN)).status_code == 201
    a = str(h.http.post("/v1/tokens", json={"tenant": "team-a"}, headers=h.as_(ADMIN)).json()["token"])
    b = str(h.http.post("/v1/tokens", json={"tenant": "team-b"}, headers=h.as_(ADMIN)).json()["token"])
    borrowed = [h.submit(a, gpus=1, priority="training")["id"] for _ in range(2)]  # team-a borrows team-b's GPU
    h.step()
    loop = h.server.ctx.loop
    placed = {w: loop.running[w].placements for w in borrowed}

    owner = h.submit(b, gpus=1, priority="training")["id"]
    fail_at("decisions-write")
    _serve(h)  # the reclaim is planned (a victim, the owner's bind), and its write fails
    assert h.backend.stops == [] and h.get(owner)["state"] == "pending"
    assert {w: loop.running[w].placements for w in borrowed} == placed
    assert all(loop.running[w].stop_sent is None for w in borrowed)
    assert int(loop.state.gpu_free_milli.sum()) == 0 and set(loop.scheduler.books.running) == {str(w) for w in borrowed}
    h.clock.advance(1)
    _serve(h)  # planned again, stored, acted on
    assert len(h.backend.stops) == 1 and int(h.backend.stops[0][0]) in borrowed
    _serve(h)
    assert h.get(owner)["state"] == "running" and _launches(h.backend, owner) == 1


class RefusesStops(FakeBackend):
    """The fake backend, except that its first ``refusals`` stops fail (no file descriptor left to signal the
    group)."""

    def __init__(self, refusals: int = 1) -> None:
        super().__init__()
        self.refusals = refusals
        self.refused = 0

    def stop(self, workload_id: str, grace_s: float) -> None:
        if self.refused < self.refusals:
            self.refused += 1
            raise OSError(24, "Too many open files")
        super().stop(workload_id, grace_s)


def test_a_stop_the_backend_refused_is_sent_again(make_harness: MakeHarness) -> None:
    """Before, the cancel counted as sent once stored: the next steps skipped it, and the workload ran on."""
    backend = RefusesStops()
    h = make_harness("1xA100-80GB", backend=backend)
    wid = h.submit(gpus=1, command=["sleep", "600"])["id"]
    h.step()
    assert h.http.post(f"/v1/workloads/{wid}/cancel", headers=h.as_(ADMIN)).status_code == 200
    _serve(h)  # the stop is stored, the backend refuses it; it is sent again (within this step or the next)
    assert backend.refused == 1
    _serve(h)
    assert [w for w, _ in backend.stops] == [str(wid)]
    _serve(h)
    assert h.get(wid)["state"] == "cancelled"


def test_a_stop_that_keeps_failing_logs_its_traceback_once(
    make_harness: MakeHarness, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, every resend that failed logged a full traceback: one per step (five a second) while it lasted."""
    backend = RefusesStops(refusals=3)
    h = make_harness("1xA100-80GB", backend=backend)
    wid = h.submit(gpus=1, command=["sleep", "600"])["id"]
    h.step()
    assert h.http.post(f"/v1/workloads/{wid}/cancel", headers=h.as_(ADMIN)).status_code == 200
    with caplog.at_level(logging.WARNING, logger=STOPS_LOGGER):
        for _ in range(4):
            _serve(h)
    assert backend.refused == 3 and h.get(wid)["state"] == "cancelled"
    failed = [r for r in caplog.records if r.name == STOPS_LOGGER and "stop failed" in r.getMessage()]
    assert [r.exc_info is not None for r in failed] == [True, False, False]
    assert all(f"workload {wid}" in r.getMessage() and "Too many open files" in r.getMessage() for r in failed[1:])


class DiesOnLaunch(FakeBackend):
    """The fake backend, except that launching workload 1 waits for ``gate`` and then ends the thread that makes it
    (a ``BaseException``, which the launch worker does not expect)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def launch(self, spec: LaunchSpec) -> Handle:
        if spec.workload_id == "1":
            assert self.gate.wait(GUARD_S)
            raise SystemExit("the launch thread ends")
        return super().launch(spec)


def test_the_launch_worker_recovers_from_a_thread_it_could_not_start_and_from_one_that_died(fail_at: Any) -> None:
    backend = DiesOnLaunch()
    worker = LaunchWorker(backend)
    fail_at("launch-submit")
    with pytest.raises(faults.InjectedFault, match="can't start new thread"):
        worker.submit(3, LaunchSpec("3", ("x",)))
    assert worker.pending() == 0  # nothing queued that no thread would make
    worker.submit(3, LaunchSpec("3", ("x",)))
    assert worker.wait(GUARD_S)
    assert [(o.workload_id, o.handle is not None) for o in worker.results()] == [(3, True)]

    worker.submit(1, LaunchSpec("1", ("x",)))  # its thread dies making this one
    worker.submit(2, LaunchSpec("2", ("x",)))  # queued behind it
    backend.gate.set()
    outcomes: dict[int, Launched] = {}
    deadline_s = time.monotonic() + GUARD_S
    while 1 not in outcomes and time.monotonic() < deadline_s:
        outcomes.update((o.workload_id, o) for o in worker.results())
        time.sleep(0.01)
    assert outcomes[1].handle is None and "died" in (outcomes[1].error or "")
    worker.revive()  # a new thread takes the queue over
    assert worker.wait(GUARD_S)
    outcomes.update((o.workload_id, o) for o in worker.results())
    assert outcomes[2].handle is not None and [s.workload_id for s in backend.launched] == ["3", "2"]


def test_a_launch_whose_spec_cannot_be_made_fails_its_workload(make_harness: MakeHarness, tmp_path: Path) -> None:
    """The logs directory cannot be made (a file is in its way). Before, that error was taken for a host out of
    threads: the launch was retried at every step for ever, the workload ``running`` with no process."""
    (tmp_path / "logs").write_text("in the way of the logs directory")
    h = make_harness("1xA100-80GB")
    wid = h.submit(gpus=1)["id"]
    _serve(h)
    _serve(h)
    row = h.get(wid)
    assert row["state"] == "failed" and row["reason"].startswith("could not start: "), row
    assert "logs" in row["reason"] and h.backend.launched == []
    loop = h.server.ctx.loop
    assert wid not in loop.running and int(loop.state.gpu_free_milli.sum()) == 1000  # its GPU went back


def test_after_a_launch_that_could_not_be_handed_over_a_step_hands_over_no_later_one(
    make_harness: MakeHarness, fail_at: Any
) -> None:
    """No thread to make the first launch: the launches after it wait with it for the next step, which makes them in
    their order (before, each was tried in turn, and a later one could start before the first)."""
    h = make_harness("2xA100-80GB")
    loop = h.server.ctx.loop
    jobs = [h.submit(gpus=1, command=["sleep", "600"])["id"] for _ in range(2)]
    fail_at("launch-submit")  # the first thread the launch worker starts: can't start new thread
    _serve(h)
    assert h.backend.launched == [] and loop.launcher.worker.pending() == 0
    assert all(not loop.running[w].launched for w in jobs)
    _serve(h)
    assert [int(spec.workload_id) for spec in h.backend.launched] == jobs
    assert all(h.get(w)["state"] == "running" for w in jobs)


class DiesAfterStarting(FakeBackend):
    """The fake backend, except that a launch starts its workload and then ends the thread that makes it (a
    ``BaseException``, which the launch worker does not expect) before it returns the handle."""

    def launch(self, spec: LaunchSpec) -> Handle:
        super().launch(spec)
        raise SystemExit("the launch thread ends after the fork")


def test_a_launch_whose_thread_died_after_it_started_is_found_not_failed(make_harness: MakeHarness) -> None:
    """Before, the launch being made when its thread died came back failed without asking the backend: the workload
    was stored failed and its GPU given to the next while its process ran."""
    backend = DiesAfterStarting()
    h = make_harness("1xA100-80GB", backend=backend)
    wid = h.submit(gpus=1, command=["sleep", "600"])["id"]
    waiting = h.submit(gpus=1, command=["sleep", "600"])["id"]
    _serve(h)
    _serve(h)
    row = h.get(wid)
    assert row["state"] == "running", row
    assert "started" in _events(h, wid) and h.server.ctx.loop.running[wid].handle == backend.find(str(wid))
    assert h.get(waiting)["state"] == "pending" and _launches(backend, wid) == 1
