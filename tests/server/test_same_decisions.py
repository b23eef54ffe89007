"""The digital twin's promise: a trace replayed through the timeline simulator and through the server makes the
same placements, because both run the one ``core`` scheduling step; only the clock and the backend differ."""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np
import pytest
from server_harness import ADMIN, Harness, MakeHarness

from tessera.core.cluster import NodeSpec
from tessera.core.workload import Request
from tessera.sim import timeline
from tessera.sim.jobs import TimelineJob

SHAPES = (
    Request(num_gpus=1, gpu_milli=250, cpu_milli=1000, mem_mib=2048),
    Request(num_gpus=1, gpu_milli=500, cpu_milli=2000, mem_mib=4096),
    Request(num_gpus=1, gpu_milli=1000, cpu_milli=4000, mem_mib=8192),
    Request(num_gpus=2, gpu_milli=1000, cpu_milli=4000, mem_mib=8192),
    Request(num_gpus=1, gpu_milli=300, gpu_types=frozenset({"T4"}), cpu_milli=1000, mem_mib=1024),
    Request(cpu_milli=500, mem_mib=512),
)


def small_trace(seed: int, count: int = 60) -> list[TimelineJob]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(20.0, count)).round(3)
    return [
        TimelineJob(
            id=str(i),
            arrival_s=float(arrivals[i]),
            request=SHAPES[int(rng.integers(len(SHAPES)))],
            duration_s=float(rng.integers(30, 300)),
        )
        for i in range(count)
    ]


def simulated_placements(
    nodes: Sequence[NodeSpec], jobs: Sequence[TimelineJob], policy: str
) -> dict[str, list[tuple[str, tuple[int, ...], int]]]:
    result = timeline.run_timeline(nodes, jobs, policy)
    assert result.unfinished == 0
    return {start.job_id: list(start.placements) for start in result.starts}


def served_placements(h: Harness, jobs: Sequence[TimelineJob]) -> dict[str, list[tuple[str, tuple[int, ...], int]]]:
    """Replays the trace through the server: each arrival is a submission at its time, each run ends after its
    duration (the fake backend reports the exit), and the loop steps after every event, like the simulator."""
    origin = h.clock.now_s
    events: list[tuple[float, int, str, str]] = [(j.arrival_s, 1, "arrive", j.id) for j in jobs]
    heapq.heapify(events)
    by_id = {j.id: j for j in jobs}
    workload_of: dict[str, int] = {}
    job_of: dict[int, str] = {}
    started: set[str] = set()
    decided: dict[str, list[tuple[str, tuple[int, ...], int]]] = {}
    while events:
        now = events[0][0]
        h.clock.now_s = origin + now
        while events and events[0][0] == now:
            _, _, kind, job_id = heapq.heappop(events)
            if kind == "arrive":
                r = by_id[job_id].request
                body = {"gpus": r.num_gpus, "cpu": f"{r.cpu_milli}m", "mem": r.mem_mib, "name": job_id}
                if r.num_gpus:
                    body["gpu_milli"] = r.gpu_milli
                    body["gpu_types"] = sorted(r.gpu_types)
                wid = int(h.submit(ADMIN, **body)["id"])
                workload_of[job_id], job_of[wid] = wid, job_id
            else:
                h.backend.finish(str(workload_of[job_id]), 0)
        h.step()
        for entry in h.server.ctx.loop.running.values():
            job_id = job_of[entry.row.id]
            if job_id not in started:
                started.add(job_id)
                pool = h.server.ctx.pool
                decided[job_id] = [(pool.nodes[p.node].name, p.gpu_indices, p.gpu_milli_each) for p in entry.placements]
                duration_s = by_id[job_id].duration_s
                assert duration_s is not None  # small_trace's jobs run for a fixed time
                heapq.heappush(events, (now + duration_s, 0, "finish", job_id))
    return decided


@pytest.mark.parametrize("seed", [1, 2])
def test_simulator_and_server_place_a_small_trace_identically(make_harness: MakeHarness, seed: int) -> None:
    h = make_harness("4xA100-80GB,2xT4", policy="bestfit")
    default = {"name": "default", "tenant": "default", "strategy": "StrictFIFO"}
    assert h.http.post("/v1/queues", json=default, headers=h.as_(ADMIN)).status_code == 201
    jobs = small_trace(seed)
    simulated = simulated_placements(list(h.server.ctx.pool.nodes), jobs, "fifo-share")
    served = served_placements(h, jobs)
    assert len(served) == len(jobs)
    assert served == simulated
