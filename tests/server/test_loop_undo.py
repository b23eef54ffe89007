"""A tick whose decisions are not stored is undone whole (issue 25, defect 5): whatever raises between a tick's first
plan and the write of its decisions (a later plan's ``Scheduler.commit``, a store error), the books, the intake and
the running workloads are as they were before the tick, and the next step decides again from there. Each workload
is bound once, no capacity leaks, a victim keeps the service it attained (LAS) and a bind keeps its place in line.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
from server_harness import ADMIN, Harness, MakeHarness

from tessera.core.decisions import Decision, RunningWorkload, StepPlan
from tessera.core.scheduler import Scheduler
from tessera.core.workload import MILLI_PER_GPU

log = logging.getLogger(__name__)
Hook = Callable[[Decision, RunningWorkload], None]


class CommitFault(RuntimeError):
    """What ``fail_commit`` raises."""


def fail_commit(monkeypatch: pytest.MonkeyPatch, scheduler: Scheduler, plan: int, after: int = 0) -> list[int]:
    """Make ``scheduler.commit`` raise once, at its ``plan``-th call: before it applies anything (``after`` 0), or
    once it has applied ``after`` decisions of that plan. Returns the count of calls (a list of one)."""
    real = scheduler.commit
    calls = [0]

    def commit(step_plan: StepPlan, now_s: float, on_applied: Hook | None = None) -> None:
        calls[0] += 1
        if calls[0] != plan:
            real(step_plan, now_s, on_applied)
            return
        if after == 0:
            raise CommitFault(f"commit of plan {plan} failed")
        applied = [0]

        def hook(decision: Decision, entry: RunningWorkload) -> None:
            if on_applied is not None:
                on_applied(decision, entry)
            applied[0] += 1
            if applied[0] == after:
                raise CommitFault(f"commit of plan {plan} failed after {after} decisions")

        real(step_plan, now_s, hook)

    monkeypatch.setattr(scheduler, "commit", commit)
    return calls


def _serve(h: Harness) -> None:
    """One step as ``SchedulerLoop.run_forever`` runs it: a step that raises is logged, and the next one follows."""
    try:
        h.step()
    except Exception:
        log.exception("the step failed (as run_forever logs it)")


def _events(h: Harness, workload_id: int) -> list[str]:
    events: list[dict[str, Any]] = h.http.get(f"/v1/workloads/{workload_id}/events", headers=h.as_(ADMIN)).json()
    return [e["kind"] for e in events]


def _launches(h: Harness, workload_id: int) -> int:
    return sum(spec.workload_id == str(workload_id) for spec in h.backend.launched)


def _assert_books_match_the_running(h: Harness, gpus: int) -> None:
    """The books hold exactly the running workloads, and their GPUs are free but for what those hold."""
    loop = h.server.ctx.loop
    held = sum(p.gpu_milli_each * len(p.gpu_indices) for e in loop.running.values() for p in e.placements)
    assert int(loop.state.gpu_free_milli.sum()) == gpus * MILLI_PER_GPU - held
    assert set(loop.scheduler.books.running) == {str(w) for w, e in loop.running.items() if e.placements}


def test_a_commit_that_fails_at_a_later_plan_undoes_the_earlier_plans_of_its_tick(
    make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the first plan's bind stayed in the books and in the tick: the next step bound the workload again
    (its GPU counted twice, one of them never given back), and stored and launched it twice."""
    h = make_harness("3xA100-80GB")
    loop = h.server.ctx.loop
    jobs = [h.submit(gpus=1, command=["sleep", "600"])["id"] for _ in range(2)]  # one shape: one plan each
    calls = fail_commit(monkeypatch, loop.scheduler, plan=2)
    _serve(h)  # plan 1 binds the first job; the commit of plan 2 (the second job) raises
    assert calls[0] == 2 and h.backend.launched == []
    assert all(h.get(w)["state"] == "pending" for w in jobs)
    _assert_books_match_the_running(h, 3)
    h.clock.advance(1)
    _serve(h)
    _serve(h)
    for wid in jobs:
        assert h.get(wid)["state"] == "running", _events(h, wid)
        assert _events(h, wid).count("bound") == 1 and _launches(h, wid) == 1
    _assert_books_match_the_running(h, 3)


def test_a_commit_that_fails_within_a_plan_undoes_what_it_had_applied(
    make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan of two binds whose commit raises after the first: that bind is in the books though no plan of the tick
    was recorded as applied. Before, it stayed there: its GPU counted as taken for ever and the workload bound again."""
    h = make_harness("3xA100-80GB")
    loop = h.server.ctx.loop
    jobs = [h.submit(gpus=1, command=["sleep", "600"])["id"], h.submit(gpus=2, command=["sleep", "600"])["id"]]
    fail_commit(monkeypatch, loop.scheduler, plan=1, after=1)
    _serve(h)
    assert h.backend.launched == [] and all(h.get(w)["state"] == "pending" for w in jobs)
    _assert_books_match_the_running(h, 3)
    h.clock.advance(1)
    _serve(h)
    for wid in jobs:
        assert h.get(wid)["state"] == "running", _events(h, wid)
        assert _events(h, wid).count("bound") == 1 and _launches(h, wid) == 1
    _assert_books_match_the_running(h, 3)


def _attained_gpu_s(h: Harness, workload_id: int) -> float:
    """The LAS service of ``workload_id`` as of now (GPU-seconds), as the books count it."""
    las = h.server.ctx.loop.scheduler.books.las
    assert las is not None
    attained = las.attained_gpu_s.get(str(workload_id), 0.0)
    started = las.run_started.get(str(workload_id))
    return attained + (h.clock() - started if started is not None else 0.0)


def test_a_preemption_whose_write_failed_leaves_the_victims_service_as_it_was(
    make_harness: MakeHarness, fail_at: Any
) -> None:
    """Tiresias (LAS): the victim's service up to the preemption was counted when the books preempted it. Before, the
    undo took it back into the books with its run starting at its old start again: its service counted twice, and it
    dropped a LAS level it had not reached."""
    h = make_harness("1xA100-80GB", policy="tiresias")
    loop = h.server.ctx.loop
    long_run = h.submit(gpus=1, command=["sleep", "100000"])["id"]
    h.step()
    ran_s = 4000.0  # past the first LAS threshold (1 GPU-hour): a newcomer preempts it
    h.clock.advance(ran_s)
    h.step()
    assert _attained_gpu_s(h, long_run) == pytest.approx(ran_s)
    newcomer = h.submit(gpus=1, command=["true"])["id"]
    fail_at("decisions-write")
    _serve(h)  # the newcomer preempts the long run; the write of that decision fails
    assert h.backend.stops == [] and loop.running[long_run].stop_sent is None
    assert _attained_gpu_s(h, long_run) == pytest.approx(ran_s)
    h.clock.advance(1)
    _serve(h)  # planned again and stored: the long run is stopped for the newcomer
    assert [w for w, _ in h.backend.stops] == [str(long_run)]
    assert _attained_gpu_s(h, long_run) == pytest.approx(ran_s + 1)
    _serve(h)
    assert h.get(newcomer)["state"] == "running" and h.get(long_run)["state"] == "pending"


def test_a_bind_whose_write_failed_keeps_its_place_in_line(make_harness: MakeHarness, fail_at: Any) -> None:
    """Before, the undone bind was added again at the end of its line: the workload submitted after it ran first."""
    h = make_harness("1xA100-80GB")
    first, second = (h.submit(gpus=1, command=["sleep", "600"])["id"] for _ in range(2))
    fail_at("decisions-write")
    _serve(h)  # the first is bound; the write fails
    assert h.get(first)["state"] == "pending" and h.backend.launched == []
    h.clock.advance(1)
    _serve(h)
    assert h.get(first)["state"] == "running" and h.get(second)["state"] == "pending"
    _assert_books_match_the_running(h, 1)


def test_undone_binds_of_one_line_go_back_to_its_head_in_their_order(
    make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two binds of one shape undone together (plans 1 and 2 of a tick, the commit of plan 3 raised) wait again
    before the workloads behind them, in their order."""
    h = make_harness("2xA100-80GB")
    loop = h.server.ctx.loop
    jobs = [h.submit(gpus=1, command=["sleep", "600"])["id"] for _ in range(3)]
    fail_commit(monkeypatch, loop.scheduler, plan=3)  # the third job's plan (no GPU left for it: it would wait)
    _serve(h)
    assert all(h.get(w)["state"] == "pending" for w in jobs)
    h.clock.advance(1)
    _serve(h)
    assert [h.get(w)["state"] for w in jobs] == ["running", "running", "pending"]


def test_a_step_that_fails_after_its_decisions_were_stored_still_launches_them(
    make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stored decisions are not undone: a bind whose write went through is running, in the books and in the loop's
    running table, whatever raises after the write. Before, the bound workload joined the running table only after
    its LAS rechecks were set up; when that raised, it was stored running, held its GPU and was never launched."""
    h = make_harness("1xA100-80GB")
    loop = h.server.ctx.loop
    wid = h.submit(gpus=1, command=["sleep", "600"])["id"]
    started = loop.intake.started
    calls = [0]

    def fails_once(workload_id: str, now_s: float) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise CommitFault("after the write")
        started(workload_id, now_s)

    monkeypatch.setattr(loop.intake, "started", fails_once)
    _serve(h)
    assert calls[0] == 1 and h.get(wid)["state"] == "running"
    _serve(h)
    assert _launches(h, wid) == 1 and wid in loop.running and loop.running[wid].handle is not None
    _assert_books_match_the_running(h, 1)
