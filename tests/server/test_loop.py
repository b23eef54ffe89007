"""The scheduler loop's own rules, in process with the fake backend: decisions are stored before anything acts on
them, a preemptor starts only after its victims have exited, and a preempted workload is requeued."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from server_harness import ADMIN, Harness, MakeHarness

from tessera.core.scheduler import Preempt, StepPlan


def _queue(h: Harness, name: str, gpus: float, cohort: str = "lab") -> None:
    body = {"name": name, "tenant": name, "cohort": cohort, "nominal": {"*": {"gpus": gpus}}}
    response = h.http.post("/v1/queues", json=body, headers=h.as_(ADMIN))
    assert response.status_code == 201, response.text


def _token(h: Harness, tenant: str) -> str:
    return str(h.http.post("/v1/tokens", json={"tenant": tenant}, headers=h.as_(ADMIN)).json()["token"])


def test_reclaim_preempts_the_borrower_and_the_owner_starts_after_the_victim_exits(make_harness: MakeHarness) -> None:
    h = make_harness("2xA100-80GB")
    _queue(h, "team-a", 1)
    _queue(h, "team-b", 1)
    a, b = _token(h, "team-a"), _token(h, "team-b")
    borrowed = [h.submit(a, gpus=1, priority="training")["id"] for _ in range(2)]  # team-a borrows team-b's GPU
    h.step()
    assert [h.get(w)["state"] for w in borrowed] == ["running", "running"]

    owner = h.submit(b, gpus=1, priority="training")["id"]
    h.step()  # reclaim: one of team-a's workloads is preempted, team-b's is bound but not launched yet
    stopped = [w for w, _ in h.backend.stops]
    assert len(stopped) == 1 and int(stopped[0]) in borrowed
    owner_row = h.get(owner)
    assert owner_row["state"] == "running"  # the decision is stored ...
    assert str(owner) not in {s.workload_id for s in h.backend.launched}  # ... but it waits for the victim to exit
    events = h.http.get(f"/v1/workloads/{stopped[0]}/events", headers=h.as_(ADMIN)).json()
    assert events[-1]["kind"] == "preempted" and "reclaim" in events[-1]["message"]

    h.step()  # the fake ends the victim (SIGTERM honoured); now the owner launches and the victim waits again
    assert str(owner) in {s.workload_id for s in h.backend.launched}
    victim = h.get(stopped[0], a)
    assert victim["state"] == "pending" and victim["attempts"] == 1
    kinds = [e["kind"] for e in h.http.get(f"/v1/workloads/{stopped[0]}/events", headers=h.as_(ADMIN)).json()]
    assert kinds[-2:] == ["preempted", "requeued"]


def test_a_cancel_that_arrives_while_the_step_plans_wins(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    wid = h.submit(gpus=1, gpu_fraction=0.5)["id"]
    loop = h.server.ctx.loop
    plan = loop.scheduler.plan
    cancelled: list[object] = []

    def plan_then_cancel(*args: Any, **kwargs: Any) -> StepPlan:
        result = plan(*args, **kwargs)  # the step has chosen to bind it; the user cancels before the write
        h.http.post(f"/v1/workloads/{wid}/cancel", headers=h.as_(ADMIN))
        cancelled.append(wid)
        return result

    loop.scheduler.plan = plan_then_cancel  # type: ignore[method-assign]
    h.step()
    assert cancelled == [wid]
    assert h.get(wid)["state"] == "cancelled"
    assert h.backend.launched == []
    assert int(loop.state.gpu_free_milli[0, 0]) == 1000  # the undone bind gave its share back
    assert [e["kind"] for e in h.http.get(f"/v1/workloads/{wid}/events", headers=h.as_(ADMIN)).json()] == [
        "submitted",
        "cancelled",
    ]


def test_the_memory_watchdog_stops_only_the_workload_over_its_share(tmp_path: Path) -> None:
    from server_harness import HOST, LOCKSTEP_S, FakeClock

    from tessera.backends.fake import FakeBackend, fake_pid
    from tessera.gpu.fakes import FakeGpu, FakeNvml
    from tessera.gpu.nvml import NvmlProbe
    from tessera.server.loop_values import LoopConfig
    from tessera.server.up import UpConfig, build_server

    gpu = FakeGpu("NVIDIA A100-SXM4-80GB", 81920, "GPU-real-0")
    nvml = FakeNvml([gpu])
    nvml.nvmlInit()
    backend, clock = FakeBackend(), FakeClock()
    config = UpConfig(data_dir=tmp_path, loop=LoopConfig(run_dir=tmp_path, launch_wait_s=LOCKSTEP_S))
    server = build_server(config, probe=NvmlProbe(nvml), backend=backend, host=HOST, clock=clock)
    loop = server.ctx.loop
    assert loop.memory_watch is not None  # real (NVML) GPUs: the watchdog is on
    store = server.ctx.store
    from tessera.api import WorkloadSpec
    from tessera.server.submit import Principal, workload_row

    admin = Principal(None, True)
    ids = []
    for _ in range(2):
        row = workload_row(
            WorkloadSpec(command=["x"], gpus=1, gpu_fraction=0.25), admin, store.queues(), server.ctx.pool, clock()
        )
        ids.append(store.add_workload(row, clock()).id)
    loop.step()
    pids: dict[str, int] = {}
    for s in backend.launched:
        handle = loop.running[int(s.workload_id)].handle
        assert handle is not None
        pids[s.workload_id] = fake_pid(handle)
    # 0.25 of 80 GiB is 20 GiB: the first uses 19 GiB, the second 30 GiB.
    gpu.processes = [(pids[str(ids[0])], 19 * 1024), (pids[str(ids[1])], 30 * 1024)]
    clock.advance(5)
    loop.step()
    assert [w for w, _ in backend.stops] == [str(ids[1])]
    loop.step()
    over = store.get_workload(ids[1])
    assert over is not None and over.state == "failed" and over.reason.startswith("watchdog: ")
    fine = store.get_workload(ids[0])
    assert fine is not None and fine.state == "running"


def test_a_restart_reads_the_stored_stop_reason_back_and_the_end_keeps_its_meaning(make_harness: MakeHarness) -> None:
    from tessera.server.store.changes import StopChange, StopReason

    h = make_harness("1xA100-80GB")
    wid = h.submit(gpus=1, gpu_fraction=0.5)["id"]
    h.step()
    # The watchdog's stop was stored, then the server died before the workload ended.
    h.server.ctx.store.update_workloads([StopChange(wid, StopReason.watchdog("uses 30 GiB of 20"))], [], 1.0)
    h2 = make_harness("1xA100-80GB", db_url=h.db_url, backend=h.backend)
    assert h2.server.ctx.loop.running[wid].stop_sent == StopReason.watchdog("uses 30 GiB of 20")
    assert (str(wid), 10.0) in h2.backend.stops  # the stop is sent again
    h2.step()
    row = h2.get(wid)
    assert row["state"] == "failed" and row["reason"] == "watchdog: uses 30 GiB of 20"


def test_a_bind_preempted_by_a_later_plan_of_the_same_tick_never_starts_and_waits_again(
    make_harness: MakeHarness,
) -> None:
    # A reclaim may preempt a run that an earlier plan of the same instant bound: the server had not recorded it as
    # running yet (a KeyError stopped the tick); the bind is now taken back before anything is stored or launched.
    h = make_harness("1xA100-80GB")
    wid = h.submit(gpus=1, gpu_fraction=0.5)["id"]
    other = h.submit(gpus=1, gpu_fraction=0.5)["id"]  # the same shape: the tick's next plan would bind it
    loop = h.server.ctx.loop
    plan = loop.scheduler.plan
    calls = [0]

    def bind_then_preempt(*args: Any, **kwargs: Any) -> StepPlan:
        calls[0] += 1
        if calls[0] == 2:  # the tick's next plan takes the fresh bind back, as a reclaim would
            return StepPlan(preempts=(Preempt(str(wid), "reclaim: test"),))
        return plan(*args, **kwargs)

    loop.scheduler.plan = bind_then_preempt  # type: ignore[method-assign]
    h.step()
    assert calls[0] >= 2
    assert h.get(wid)["state"] == "pending"
    started = len(h.backend.launched)
    assert started == (h.get(other)["state"] == "running")  # the taken-back bind did not start
    assert int(loop.state.gpu_free_milli[0, 0]) == 1000 - 500 * started  # and its share went back
    loop.scheduler.plan = plan  # type: ignore[method-assign]
    h.clock.advance(1)  # offered again from the next instant, as a preempted workload is
    h.step()
    assert h.get(wid)["state"] == "running" and h.get(other)["state"] == "running"
    assert len(h.backend.launched) == 2
