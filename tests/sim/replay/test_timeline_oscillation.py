"""Oscillating demand between three queues for a simulated day, replayed by the timeline simulator under ``tessera``.

Three queues of one cohort share 24 one-GPU slots (3 nodes of 8 T4), nominal 8 GPUs each. Every 30 minutes the
demand flips to the next queue: a burst of 24 one-GPU, checkpointed training jobs of 50 minutes arrives there
(three times its nominal quota: it borrows whatever the others leave idle). Each burst outlives its phase, so at
every flip the new queue finds its nominal quota borrowed and reclaims it while the previous queue still runs.

The offered load (24 jobs of 50 minutes every 30 minutes on 24 GPUs) is above 1, so a backlog builds and queues
keep borrowing and reclaiming between flips too.

**The bound.** Every preemption here is a reclaim: jobs of one queue have the same priority class and LAS level
(50 one-GPU minutes stay below the first LAS threshold of 1 GPU-hour), so none preempts another of its queue. A
reclaim is made only for a preemptor admitted within its queue's nominal quota, and a one-GPU preemptor needs one
one-GPU victim (the cheapest set is the smallest). A job admitted within nominal quota is never a reclaim victim
(victims run on borrowed capacity) and nothing else preempts it, so it runs to completion: each job is admitted
within nominal at most once. Hence ``preemptions <= admissions within nominal <= jobs = 24 x (flips + 1)``: at most
one preemption per job that arrives at a flip, whatever the backlog. The simulator checks the cluster and the
quota ledger after every step.
"""

from tessera.core.cluster import NodeSpec
from tessera.core.queueing import QueueSpec, ResourceVector
from tessera.core.workload import Request
from tessera.sim.replay.timeline import run_timeline
from tessera.sim.workloads.jobs import TimelineJob

DAY_S = 86_400.0
PHASE_S = 1_800.0
JOB_S = 3_000.0
QUEUES = ("a", "b", "c")
NOMINAL_GPUS = 8
BURST = 3 * NOMINAL_GPUS
NODES = [NodeSpec(f"n{i}", 64_000, 262_144, 8, "T4") for i in range(3)]


def queue(name: str) -> QueueSpec:
    return QueueSpec(name, "org", {"*": ResourceVector(NOMINAL_GPUS * 1000, 64_000, 262_144)})


def oscillating_day() -> list[TimelineJob]:
    jobs = []
    for phase in range(int(DAY_S // PHASE_S)):
        name = QUEUES[phase % len(QUEUES)]
        request = Request(num_gpus=1, gpu_milli=1000, cpu_milli=1000, mem_mib=4096, priority=100, queue=name)
        for k in range(BURST):
            job_id = f"{name}-{phase:02d}-{k:02d}"
            jobs.append(
                TimelineJob(
                    job_id,
                    phase * PHASE_S,
                    request,
                    JOB_S,
                    queue=name,
                    priority=100,
                    preemptible=True,
                    checkpointed=True,
                )
            )
    return jobs


def test_oscillating_demand_for_a_day_keeps_preemptions_bounded_and_every_queue_progressing() -> None:
    jobs = oscillating_day()
    flips = int(DAY_S // PHASE_S) - 1
    result = run_timeline(NODES, jobs, "tessera", queues=[queue(q) for q in QUEUES], check_invariants=True)
    assert result.unfinished == 0 and len(result.finish_s) == len(jobs)  # every job of every queue completes
    assert 0 < result.preemptions <= BURST * (flips + 1), result.preemptions
    assert result.reclaims == result.preemptions  # all of them reclaims, as argued above
    assert result.reclaim_latency_max_s == 0.0
    for name in QUEUES:  # progress: each queue receives at least 95% of what it is entitled to while it has demand
        assert result.queue_shares[name] >= 0.95, result.queue_shares
