"""The digital twin's promise: a trace replayed through the timeline simulator and through the server makes the same
decisions, because both plan with one ``core`` scheduler built from one named preset and apply every plan with
``Scheduler.commit``; only the clock and the backend differ.

Each preset replays one trace twice: in the simulator (``run_timeline(record_decisions=True)``) and through the
control plane's API and scheduler loop (a test clock; the fake backend here, real processes in the e2e test below).
The server is stepped at every instant at which the simulator scheduled, each arrival is a submission, each run
ends after its remaining duration (a preempted run keeps what it has left, as the simulator's checkpointed jobs do),
and both journals (``Scheduler.journal``: every bind, preemption, shrink and grow with its quota change) must be
equal, decision by decision.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
from server_harness import ADMIN, Harness, MakeHarness

from tessera.core.decisions import Bind, Grow, Preempt, Shrink
from tessera.core.presets import PRESET_NAMES
from tessera.core.queueing import QueueSpec
from tessera.core.queueing.priority import BUILTIN_PRIORITY_CLASSES
from tessera.core.scheduler import Applied
from tessera.core.workload import Request
from tessera.sim.replay.timeline import run_timeline
from tessera.sim.workloads.jobs import TimelineJob

GPUS = "4xA100-80GB,2xT4"
SHAPES = (
    Request(num_gpus=1, gpu_milli=250, cpu_milli=1000, mem_mib=2048),
    Request(num_gpus=1, gpu_milli=500, cpu_milli=2000, mem_mib=4096),
    Request(num_gpus=1, gpu_milli=1000, cpu_milli=4000, mem_mib=8192),
    Request(num_gpus=2, gpu_milli=1000, cpu_milli=4000, mem_mib=8192),
    Request(num_gpus=1, gpu_milli=300, gpu_types=frozenset({"T4"}), cpu_milli=1000, mem_mib=1024),
    Request(cpu_milli=500, mem_mib=512),
)
CLASSES = ("training", "best-effort", "inference-critical")
TEAMS = ("team-a", "team-b")
# Two queues of one cohort, each with half the pool's GPUs: they borrow from each other and reclaim by preemption.
QUEUES = [{"name": team, "tenant": team, "cohort": "org", "nominal": {"*": {"gpus": 3}}} for team in TEAMS]

Decision = tuple[float, str, str, tuple[tuple[str, tuple[int, ...], int], ...], tuple[object, ...] | None]


def trace(
    seed: int, count: int, teams: Sequence[str] = ("default",), durations_s: tuple[int, int] = (60, 600)
) -> list[TimelineJob]:
    """Jobs of mixed shapes, priority classes and queues, arriving faster than the pool drains them."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(12.0, count)).round(3)
    jobs = []
    for i in range(count):
        cls = BUILTIN_PRIORITY_CLASSES[CLASSES[int(rng.integers(len(CLASSES)))]]
        queue = teams[int(rng.integers(len(teams)))]
        shape = SHAPES[int(rng.integers(len(SHAPES)))]
        jobs.append(
            TimelineJob(
                id=f"job-{i}",
                arrival_s=float(arrivals[i]),
                # The server's requests carry their workload's priority and queue (server.records.request_of).
                request=dataclasses.replace(shape, priority=cls.value, queue=queue),
                duration_s=float(rng.integers(*durations_s)),
                queue=queue,
                priority=cls.value,
                preemptible=cls.preemptible,
                checkpointed=cls.preemptible,  # as the server takes a workload of a preemptible class by default
            )
        )
    return jobs


def normalised(applied: Sequence[Applied], name_of: Callable[[str], str], nodes: Sequence[str]) -> list[Decision]:
    """Journal entries with job names, node names and times relative to the first decision."""
    origin = applied[0].time_s if applied else 0.0
    out: list[Decision] = []
    for entry in applied:
        d = entry.decision
        kind = {Bind: "bind", Preempt: "preempt", Shrink: "shrink", Grow: "grow"}[type(d)]
        where = tuple((nodes[p.node], p.gpu_indices, p.gpu_milli_each) for p in getattr(d, "placements", ()))
        a = entry.admission
        quota = None if a is None else (a.queue, a.flavor_key, a.from_nominal, a.borrowed)
        out.append((round(entry.time_s - origin, 3), kind, name_of(d.workload_id), where, quota))
    return out


@dataclass
class ServerReplay:
    """Drives a harness through a trace on the simulator's instants; runs end after their remaining duration."""

    h: Harness
    jobs: Sequence[TimelineJob]
    finish: Callable[[Harness, int], None]  # end workload id's run (its process exits with code 0)
    wait_for_exits: Callable[[Harness], None] = lambda h: None
    command: list[str] | None = None  # each workload's command (None: the harness's, which exits at once)
    # Job id -> when the simulator ended it: runs end then (elastic jobs' runtimes follow their workers, which only
    # the simulator's physics knows). None: after their remaining duration.
    ends: dict[str, float] | None = None
    workload_of: dict[str, int] = field(default_factory=dict)
    job_of: dict[int, str] = field(default_factory=dict)

    def run(self, instants: Sequence[float], tokens: dict[str, str]) -> None:
        origin = self.h.clock.now_s
        by_id = {j.id: j for j in self.jobs}
        events: list[tuple[float, int, str]] = [(j.arrival_s, 1, j.id) for j in self.jobs]
        if self.ends is not None:
            events += [(end, 0, job_id) for job_id, end in self.ends.items()]
        events += [(t, 2, "") for t in instants]
        heapq.heapify(events)
        left = {j.id: float(j.duration_s or 0.0) for j in self.jobs}
        started: dict[str, float] = {}
        seen = 0
        journal = self.h.server.ctx.loop.scheduler.journal
        assert journal is not None
        while events:
            now = events[0][0]
            self.h.clock.now_s = origin + now
            while events and events[0][0] == now:
                _, kind, job_id = heapq.heappop(events)
                if kind == 0 and self.ends is not None:
                    self.finish(self.h, self.workload_of[job_id])
                    started.pop(job_id, None)
                elif kind == 0 and job_id in started and started[job_id] + left[job_id] == now:
                    self.finish(self.h, self.workload_of[job_id])
                    del started[job_id]
                elif kind == 1:
                    self._submit(by_id[job_id], tokens)
            self.wait_for_exits(self.h)
            for _ in range(50):  # as the simulator does: step until a step changes nothing
                before = len(journal)
                self.h.step()
                for entry in journal[seen:]:
                    job_id = self.job_of[int(entry.decision.workload_id)]
                    if isinstance(entry.decision, Bind):
                        started[job_id] = now
                        if self.ends is None:
                            heapq.heappush(events, (now + left[job_id], 0, job_id))
                    elif isinstance(entry.decision, Preempt) and self.ends is None:
                        left[job_id] -= now - started.pop(job_id)
                seen = len(journal)
                self.wait_for_exits(self.h)
                if len(journal) == before and not self._victims_exiting():
                    break

    def _victims_exiting(self) -> bool:
        return any(e.stop_sent is not None for e in self.h.server.ctx.loop.running.values())

    def _submit(self, job: TimelineJob, tokens: dict[str, str]) -> None:
        r = job.request
        cls = next(name for name, c in BUILTIN_PRIORITY_CLASSES.items() if c.value == job.priority)
        body: dict[str, object] = {"gpus": r.num_gpus, "cpu": f"{r.cpu_milli}m", "mem": r.mem_mib, "name": job.id}
        body["priority"] = cls
        if self.command is not None:
            body["command"] = self.command
        if r.num_gpus:
            body["gpu_milli"] = r.gpu_milli
            body["gpu_types"] = sorted(r.gpu_types)
        if job.queue != "default":
            body["queue"] = job.queue
        body["checkpointable"] = job.checkpointed
        if job.gang > 1 or job.elastic_min is not None:
            body["workers"] = job.gang
        if job.elastic_min is not None:
            body["elastic_min"], body["elastic_max"] = job.elastic_min, job.elastic_max
        if job.job_type:
            body["job_type"] = job.job_type
        wid = int(self.h.submit(tokens.get(job.queue, ADMIN), **body)["id"])
        self.workload_of[job.id], self.job_of[wid] = wid, job.id


def make_queues(h: Harness) -> tuple[list[QueueSpec], dict[str, str]]:
    """The tenant queues created through the API, as the loop reads them back, and a token per team."""
    tokens = {}
    for queue in QUEUES:
        assert h.http.post("/v1/queues", json=queue, headers=h.as_(ADMIN)).status_code == 201
        created = h.http.post("/v1/tokens", json={"tenant": queue["tenant"]}, headers=h.as_(ADMIN))
        assert created.status_code == 201, created.text
        tokens[str(queue["name"])] = str(created.json()["token"])
    h.step()
    return list(h.server.ctx.loop.queue_specs), tokens


def compare(
    h: Harness, policy: str, jobs: list[TimelineJob], queues: list[QueueSpec], tokens: dict[str, str], **replay: object
) -> tuple[list[Decision], list[Decision]]:
    nodes = [n.name for n in h.server.ctx.pool.nodes]
    # Workloads submitted to the server declare no runtime: the simulator's scheduler is not told them either.
    loop = h.server.ctx.loop
    simulated = run_timeline(
        h.server.ctx.pool.nodes, jobs, policy, queues=queues, record_decisions=True, runtimes_known=False,
        placement=loop.config.placement, throughput=loop.throughput, colocation=loop.colocation,
        knobs=loop.config.knobs,
    )  # fmt: skip
    assert simulated.unfinished == 0
    if replay.pop("sim_ends", False):  # runs end when the simulator ended them
        replay["ends"] = {job.id: float(end) for job, end in zip(jobs, simulated.finish_s, strict=True)}
    h.server.ctx.loop.scheduler.journal = []
    driver = ServerReplay(h, jobs, **replay)  # type: ignore[arg-type]
    driver.run(sorted({float(t) for t in simulated.alloc_times_s}), tokens)
    sim_nodes = sorted(nodes)
    sim = normalised(simulated.decisions, lambda i: jobs[int(i)].id, sim_nodes)
    served = normalised(h.server.ctx.loop.scheduler.journal, lambda w: driver.job_of[int(w)], nodes)
    return sim, served


def fake_finish(h: Harness, workload_id: int) -> None:
    h.backend.finish(str(workload_id), 0)


@pytest.mark.parametrize("policy", PRESET_NAMES)
def test_simulator_and_server_make_the_same_decisions_in_the_default_queue(
    make_harness: MakeHarness, policy: str
) -> None:
    h = make_harness(GPUS, policy=policy)
    h.step()
    queues = list(h.server.ctx.loop.queue_specs)  # the server's own default queue, without a quota
    jobs = trace(1, 60)
    sim, served = compare(h, policy, jobs, queues, {}, finish=fake_finish)
    assert len(sim) >= len(jobs)
    assert served == sim


@pytest.mark.parametrize("policy", PRESET_NAMES)
def test_simulator_and_server_make_the_same_decisions_and_quota_charges_with_tenant_queues(
    make_harness: MakeHarness, policy: str
) -> None:
    h = make_harness(GPUS, policy=policy)
    queues, tokens = make_queues(h)
    jobs = trace(2, 60, TEAMS)
    sim, served = compare(h, policy, jobs, queues, tokens, finish=fake_finish)
    assert all(quota is not None for *_, quota in sim)  # every decision moved quota
    assert served == sim


@pytest.mark.parametrize("policy", PRESET_NAMES)
def test_simulator_and_server_make_the_same_decisions_when_las_ages_and_preempts(
    make_harness: MakeHarness, policy: str
) -> None:
    """Runs of up to four hours: LAS levels drop (1 and 10 GPU-hours) and guards expire while jobs run, so tiresias
    and tessera preempt by LAS; the server steps at the simulator's recheck instants like at any other."""
    h = make_harness(GPUS, policy=policy)
    h.step()
    queues = list(h.server.ctx.loop.queue_specs)
    jobs = trace(3, 40, durations_s=(600, 14_400))
    sim, served = compare(h, policy, jobs, queues, {}, finish=fake_finish)
    if policy.startswith(("tiresias", "tessera")):
        assert any(kind == "preempt" for _, kind, *_ in sim)
    assert served == sim


@pytest.mark.parametrize(("policy", "placement"), [("tessera", "packing"), ("fifo-share", "dotprod")])
def test_a_placement_named_for_the_server_and_for_the_simulator_gives_the_same_decisions(
    make_harness: MakeHarness, policy: str, placement: str
) -> None:
    """``tessera up --placement`` and ``tessera simulate timeline --placement`` build the same scheduler: one
    registry of placements (``core.placement.PLACEMENTS``), the same override in ``build_scheduler``."""
    h = make_harness(GPUS, policy=policy, placement=placement)
    queues, tokens = make_queues(h)
    jobs = trace(2, 60, TEAMS)
    sim, served = compare(h, policy, jobs, queues, tokens, finish=fake_finish)
    default = run_timeline(h.server.ctx.pool.nodes, jobs, policy, queues=queues, record_decisions=True,
                           runtimes_known=False)  # fmt: skip
    assert served == sim and sim != normalised(default.decisions, lambda i: jobs[int(i)].id, sorted(sim_nodes(h)))


def sim_nodes(h: Harness) -> list[str]:
    return [n.name for n in h.server.ctx.pool.nodes]


def test_the_comparison_sees_a_different_policy(make_harness: MakeHarness, tmp_path: Path) -> None:
    """The check can fail: the server running fifo-share is compared with the simulator running static."""
    h = make_harness(GPUS, policy="fifo-share")
    h.step()
    jobs = trace(1, 40)
    queues = list(h.server.ctx.loop.queue_specs)
    simulated = run_timeline(h.server.ctx.pool.nodes, jobs, "static", queues=queues, record_decisions=True)
    h.server.ctx.loop.scheduler.journal = []
    driver = ServerReplay(h, jobs, fake_finish)
    driver.run(sorted(set(float(t) for t in simulated.alloc_times_s)), {})
    nodes = [n.name for n in h.server.ctx.pool.nodes]
    sim = normalised(simulated.decisions, lambda i: jobs[int(i)].id, sorted(nodes))
    served = normalised(h.server.ctx.loop.scheduler.journal, lambda w: driver.job_of[int(w)], nodes)
    assert served != sim


@pytest.mark.e2e
@pytest.mark.parametrize("policy", ["tessera", "tiresias"])
def test_the_same_decisions_with_real_processes(make_harness: MakeHarness, tmp_path: Path, policy: str) -> None:
    """As above through the local backend: every workload is a real process that runs until the test lets it end
    (a flag file), and a preempted one is stopped by a real signal."""
    import os
    import time

    from tessera.backends.local import LocalBackend

    flags = tmp_path / "flags"
    flags.mkdir()
    backend = LocalBackend(tmp_path / "procs")
    h = make_harness(GPUS, policy=policy, backend=backend)
    h.step()
    queues, tokens = make_queues(h)
    jobs = trace(4, 24, TEAMS, durations_s=(600, 14_400))
    command = ["sh", "-c", f'while [ ! -e "{flags}/$TESSERA_WORKLOAD_ID" ]; do sleep 0.02; done']

    def finish(harness: Harness, workload_id: int) -> None:
        (flags / str(workload_id)).touch()

    def wait_for_exits(harness: Harness) -> None:
        """Until every workload told to end (flag or signal) has ended whole, so that the next poll reports it: its
        exit code written and no process of its group left (what ``LocalBackend.poll`` waits for)."""
        deadline = time.monotonic() + 60
        for entry in list(harness.server.ctx.loop.running.values()):
            told = entry.stop_sent is not None or (flags / str(entry.row.id)).exists()
            handle = entry.handle
            if told and handle is not None:
                exit_file = str(handle.data["exit_file"])
                while not os.path.exists(exit_file) or backend.pids(handle):
                    assert time.monotonic() < deadline, f"workload {entry.row.id} did not end"
                    time.sleep(0.01)

    sim, served = compare(
        h, policy, jobs, queues, tokens, finish=finish, wait_for_exits=wait_for_exits, command=command
    )
    assert any(kind == "preempt" for _, kind, *_ in sim)
    assert served == sim


JOB_TYPES = ("ResNet-50", "Transformer", "A3C", "LM")


def shaped_trace(seed: int, count: int, teams: Sequence[str] = ("default",)) -> list[TimelineJob]:
    """Jobs of every shape the API takes: gangs of whole GPUs, elastic jobs (their work in steps of a job type, so
    that their runtime follows their workers), typed shares, checkpointable and not, in mixed priority classes."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(20.0, count)).round(3)
    jobs = []
    for i in range(count):
        cls = BUILTIN_PRIORITY_CLASSES[CLASSES[int(rng.integers(len(CLASSES)))]]
        queue = teams[int(rng.integers(len(teams)))]
        job_type = JOB_TYPES[int(rng.integers(len(JOB_TYPES)))]
        kind = int(rng.integers(4))
        base = {"id": f"job-{i}", "arrival_s": float(arrivals[i]), "queue": queue, "priority": cls.value}
        flags = {"preemptible": cls.preemptible, "checkpointed": cls.preemptible and bool(rng.integers(2))}
        extra: dict[str, object]
        if kind == 0:  # a rigid gang of whole GPUs
            shape = Request(num_gpus=1, gpu_milli=1000, cpu_milli=2000, mem_mib=4096)
            gang, extra = int(rng.integers(2, 4)), {"duration_s": float(rng.integers(60, 900))}
        elif kind == 1:  # elastic: 1..3 workers, its work in steps
            shape = Request(num_gpus=1, gpu_milli=1000, cpu_milli=2000, mem_mib=4096)
            low = int(rng.integers(1, 3))
            gang = low
            extra = {
                "duration_s": None,
                "work_steps": float(rng.integers(500, 3000)),
                "elastic_min": low,
                "elastic_max": 3,
            }
        elif kind == 2:  # a typed share (co-location rule)
            shape = Request(num_gpus=1, gpu_milli=int(rng.choice([250, 500])), cpu_milli=1000, mem_mib=2048)
            gang, extra = 1, {"duration_s": float(rng.integers(60, 900))}
        else:  # a typed single GPU
            shape = Request(num_gpus=1, gpu_milli=1000, cpu_milli=2000, mem_mib=4096)
            gang, extra = 1, {"duration_s": float(rng.integers(60, 900))}
        request = dataclasses.replace(shape, priority=cls.value, queue=queue, job_type=job_type)
        jobs.append(TimelineJob(**base, request=request, job_type=job_type, gang=gang, **flags, **extra))  # type: ignore[arg-type]
    return jobs


@pytest.mark.parametrize("policy", PRESET_NAMES)
def test_gangs_elastic_jobs_and_job_types_make_the_same_decisions(make_harness: MakeHarness, policy: str) -> None:
    """Submitted with ``workers``, ``elastic_min``/``elastic_max``, ``job_type`` and ``checkpointable``, the server's
    workloads are the simulator's jobs: the same binds (gangs whole, on the GPU type the job type runs fastest on),
    preemptions, and, under tessera, the same shrinks and grows of the elastic ones."""
    h = make_harness(GPUS, policy=policy)
    queues, tokens = make_queues(h)
    jobs = shaped_trace(5, 50, TEAMS)
    sim, served = compare(h, policy, jobs, queues, tokens, finish=fake_finish, sim_ends=True)
    kinds = {kind for _, kind, *_ in sim}
    assert any(len(where) > 1 for _, kind, _, where, _ in sim if kind == "bind")  # gangs were bound whole
    if policy == "tessera":
        assert {"shrink", "grow"} <= kinds  # elastic jobs were resized
    assert served == sim


@pytest.mark.parametrize(
    ("policy", "knobs"),
    [("tessera", ("elastic=false", "head_reservation=true")), ("fifo-share", ("discipline=BestEffortFIFO",))],
)
def test_knobs_set_for_the_server_and_for_the_simulator_give_the_same_decisions(
    make_harness: MakeHarness, policy: str, knobs: tuple[str, ...]
) -> None:
    """``tessera up --set`` and ``tessera simulate timeline --set`` change the preset the same way
    (``core.preset_knobs``): the same decisions, which differ from the preset's own."""
    h = make_harness(GPUS, policy=policy, knobs=knobs)
    queues, tokens = make_queues(h)
    jobs = shaped_trace(6, 50, TEAMS)
    sim, served = compare(h, policy, jobs, queues, tokens, finish=fake_finish, sim_ends=True)
    assert served == sim
    loop = h.server.ctx.loop
    default = run_timeline(
        loop.pool.nodes, jobs, policy, queues=queues, record_decisions=True, runtimes_known=False,
        throughput=loop.throughput, colocation=loop.colocation,
    )  # fmt: skip
    assert sim != normalised(default.decisions, lambda i: jobs[int(i)].id, sorted(sim_nodes(h)))
    config = h.http.get("/v1/config", headers=h.as_(ADMIN)).json()
    assert config["knobs"] == list(knobs) and set(config["knob_names"]) >= {"elastic", "discipline"}
