"""A simulated day of demand oscillating between two queues: preemptions stay bounded and every queue progresses.

Pure and self-contained: a 16-GPU pool shared by queues ``a`` and ``b`` (nominal 8 GPUs each, one cohort). Every
hour a burst of 10 one-GPU jobs (4,800 s of work each; training and best-effort mixed, half checkpointed) arrives,
alternately in ``a`` and ``b``, so each queue borrows the other's idle GPUs and the other reclaims them when its
own burst comes. Every 60 s the scheduler below admits pending work in DRF order (StrictFIFO within a queue) with
``QuotaLedger`` and, when a job does not fit, asks ``select_victims``.
"""

from dataclasses import dataclass

from tessera.core.preemption import Candidate, PreemptionGuard, select_victims
from tessera.core.queueing import (
    BEST_EFFORT,
    TRAINING,
    QueueSpec,
    QuotaLedger,
    ResourceVector,
    drf_order,
    order_pending,
)

DAY_S = 86_400
STEP_S = 60
BURST_EVERY_S = 3_600
JOBS_PER_BURST = 10
WORK_S = 4_800
POOL = ResourceVector(gpu_milli=16_000)
ONE_GPU = ResourceVector(gpu_milli=1_000)
QUEUES = ("a", "b")


@dataclass
class Job:
    workload_id: str
    queue: str
    priority: int
    arrival_s: float
    checkpointed: bool
    done_s: float = 0.0  # work done (kept across a preemption only when checkpointed)
    started_s: float | None = None  # None while pending
    borrowed: bool = False
    finished_at_s: float | None = None


@dataclass
class Day:
    preemptions: int
    bursts: int
    jobs: list[Job]
    served_s: dict[str, list[float]]  # per queue, cumulative GPU-seconds of work done, one entry per step
    shortfall_steps: int  # steps after which a queue with unmet demand held less than min(demand, nominal)


def burst(index: int) -> list[Job]:
    queue = QUEUES[index % 2]
    return [
        Job(
            f"{queue}-{index:02d}-{j}",
            queue,
            (TRAINING if j % 3 else BEST_EFFORT).value,
            index * BURST_EVERY_S,
            checkpointed=j % 2 == 0,
        )
        for j in range(JOBS_PER_BURST)
    ]


def simulate_day() -> Day:
    ledger = QuotaLedger([QueueSpec(q, "lab", {"*": ResourceVector(gpu_milli=8_000)}) for q in QUEUES])
    guard = PreemptionGuard(min_runtime_s=600)
    jobs: list[Job] = []
    served = {q: 0.0 for q in QUEUES}
    served_s: dict[str, list[float]] = {q: [] for q in QUEUES}
    preemptions = shortfall_steps = bursts = 0
    for now in range(0, DAY_S, STEP_S):
        for job in jobs:  # progress over the last step, then completions
            if job.started_s is not None and job.finished_at_s is None:
                job.done_s += STEP_S
                served[job.queue] += STEP_S
                if job.done_s >= WORK_S:
                    job.finished_at_s, job.started_s = float(now), None
                    ledger.release(job.queue, "*", ONE_GPU)
                    guard = guard.forget([job.workload_id])
        if now % BURST_EVERY_S == 0:
            jobs += burst(bursts)
            bursts += 1
        running = [j for j in jobs if j.started_s is not None]
        for queue in drf_order([(q, 1.0, ledger.usage(q, "*")) for q in QUEUES], POOL):
            pending = order_pending(j for j in jobs if j.queue == queue and j.started_s is None and not j.finished_at_s)
            for job in pending:  # StrictFIFO: stop at the first job that cannot start
                victims, guard = try_start(job, running, ledger, guard, now)
                if victims is None:
                    break
                preemptions += len(victims)
        for q in QUEUES:
            served_s[q].append(served[q])
            demand = sum(1_000 for j in jobs if j.queue == q and j.finished_at_s is None)
            if ledger.usage(q, "*").gpu_milli < min(demand, 8_000):
                shortfall_steps += 1
    return Day(preemptions, bursts, jobs, served_s, shortfall_steps)


def try_start(
    job: Job, running: list[Job], ledger: QuotaLedger, guard: PreemptionGuard, now: int
) -> tuple[list[Job] | None, PreemptionGuard]:
    """Start ``job``, preempting if the rule allows; the victims (possibly none), or None when it cannot start."""
    free = POOL - sum((ONE_GPU for _ in running), ResourceVector.zero())
    victims: list[Job] = []
    if not (free >= ONE_GPU and ledger.can_admit(job.queue, "*", ONE_GPU)):
        need = ledger.quota_need(job.queue, "*", ONE_GPU)
        assert need is not None
        candidates = [
            Candidate(r.workload_id, r.queue, r.priority, True, r.started_s or 0.0, r.checkpointed, ONE_GPU, r.borrowed)
            for r in running
        ]
        ids = select_victims(
            job.queue, job.priority, (ONE_GPU - free).positive_part(), candidates, now, quota=need, guard=guard
        )
        if not ids:
            return None, guard
        victims = [r for r in running if r.workload_id in ids]
        trial = ledger.copy()
        for v in victims:
            trial.release(v.queue, "*", ONE_GPU)
        if trial.can_admit(job.queue, "*", ONE_GPU) is None:
            return None, guard
        for v in victims:
            ledger.release(v.queue, "*", ONE_GPU)
            v.started_s, v.borrowed = None, False
            v.done_s = v.done_s if v.checkpointed else 0.0
            running.remove(v)
        guard = guard.record(ids)
    admission = ledger.admit(job.queue, "*", ONE_GPU)
    job.started_s, job.borrowed = float(now), admission.is_borrowing
    running.append(job)
    return victims, guard


def test_oscillating_demand_keeps_preemptions_bounded_and_every_queue_progressing() -> None:
    day = simulate_day()
    assert day.bursts == DAY_S // BURST_EVERY_S
    # Bounded: far fewer preemptions than jobs (a preemption loop would preempt on every step).
    assert 0 < day.preemptions <= day.bursts * JOBS_PER_BURST
    # Borrowed capacity comes back within the step in which its owner asks for it.
    assert day.shortfall_steps == 0
    # No starvation: every queue's served work grows within every two-hour window, and every job that arrived
    # at least four hours before the end of the day has finished.
    window = 2 * BURST_EVERY_S // STEP_S
    for queue in QUEUES:
        series = day.served_s[queue]
        assert all(series[i + window] > series[i] for i in range(len(series) - window))
    late = DAY_S - 4 * BURST_EVERY_S
    assert all(j.finished_at_s is not None for j in day.jobs if j.arrival_s <= late)


def test_the_day_is_deterministic() -> None:
    assert simulate_day().preemptions == simulate_day().preemptions
