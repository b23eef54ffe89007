"""The ``openb`` timeline workload: openb pods with their real creation and deletion times, on a scaled cluster.

``tessera.sim.workloads.inputs`` (``tessera simulate timeline --workload openb``) and the benchmarks call
``openb_timeline`` with the openb node and pod lists (``../shared/traces/openb``, read by path), or
``synthetic_openb_timeline`` for the embedded synthetic stand-in (``tessera.sim.workloads.synthetic``). The cluster
is scaled down to ``gpu_scale`` of its GPUs (``tessera.sim.workloads.clusters.scale_nodes``), so that queueing
appears; the jobs are sorted by (arrival, id).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

from tessera.core.cluster import NodeSpec
from tessera.core.workload import Request
from tessera.sim.traces.openb import TracePod
from tessera.sim.workloads.clusters import scale_nodes
from tessera.sim.workloads.jobs import PRIORITY_BEST_EFFORT, PRIORITY_INFERENCE, PRIORITY_TRAINING, TimelineJob
from tessera.sim.workloads.synthetic import synthetic_nodes, synthetic_pods

logger = logging.getLogger(__name__)

MIN_POD_DURATION_S = 1.0  # a pod deleted in the second it was created still runs this long
# openb QoS -> (priority, preemptible): latency-sensitive pods are inference-critical, best-effort ones lowest.
_QOS_CLASS: dict[str, tuple[int, bool]] = {
    "LS": (PRIORITY_INFERENCE, False),
    "Guaranteed": (PRIORITY_INFERENCE, False),
    "Burstable": (PRIORITY_TRAINING, True),
    "BE": (PRIORITY_BEST_EFFORT, True),
}


def openb_timeline(
    pods: Sequence[TracePod], nodes: Sequence[NodeSpec], gpu_scale: float = 1.0
) -> tuple[list[NodeSpec], list[TimelineJob]]:
    """openb pods with their real times on ``gpu_scale`` of the cluster's GPUs (node-model mix kept).

    Each pod becomes one single-worker job: ``arrival_s`` = creation time, ``duration_s`` = deletion − creation
    (at least ``MIN_POD_DURATION_S``). Pods without both times are skipped, and so are pods that no node of the
    scaled cluster could host even when empty (GPU count and type, CPU, memory); both counts are logged. QoS sets
    the priority class: LS and Guaranteed are inference-critical and not preemptible, Burstable is training, BE is
    best-effort (an unknown QoS counts as Burstable); the last two are preemptible. Nothing is checkpointed; every
    job is in queue ``default``.
    """
    scaled = scale_nodes(nodes, gpu_scale)
    jobs: list[TimelineJob] = []
    untimed = unfit = 0
    for pod in pods:
        if pod.creation_time_s is None or pod.deletion_time_s is None:
            untimed += 1
            continue
        if not _could_host(pod.request, scaled):
            unfit += 1
            continue
        priority, preemptible = _QOS_CLASS.get(pod.qos, (PRIORITY_TRAINING, True))
        duration_s = max(float(pod.deletion_time_s - pod.creation_time_s), MIN_POD_DURATION_S)
        request = replace(pod.request, priority=priority)
        arrival_s = float(pod.creation_time_s)
        job = TimelineJob(
            pod.name, arrival_s, request, duration_s, queue=request.queue, priority=priority, preemptible=preemptible
        )
        jobs.append(job)
    if untimed or unfit:
        logger.info("openb timeline: skipped %d pods without times and %d that fit no node", untimed, unfit)
    return scaled, _sorted(jobs)


def synthetic_openb_timeline(
    seed: int = 0, gpu_scale: float = 1.0, *, num_nodes: int = 300, num_pods: int = 2000
) -> tuple[list[NodeSpec], list[TimelineJob]]:
    """``openb_timeline`` on the embedded synthetic openb-shaped cluster and pods (``tessera.sim.workloads.synthetic``).

    Pods arrive with exponential gaps (mean 30 s) and live a lognormal time (median 1 h, sigma 1.5); see
    ``tessera.sim.workloads.synthetic`` for the request shapes and node mix.
    """
    nodes = synthetic_nodes(num_nodes, seed)
    return openb_timeline(synthetic_pods(num_pods, seed, nodes=nodes), nodes, gpu_scale)


def _could_host(request: Request, nodes: Sequence[NodeSpec]) -> bool:
    """Whether some node, empty, could run ``request`` (GPU count and type, CPU, host memory)."""
    for node in nodes:
        if node.cpu_milli < request.cpu_milli or node.mem_mib < request.mem_mib:
            continue
        if request.num_gpus == 0:
            return True
        if node.gpu_count >= request.num_gpus and (not request.gpu_types or node.gpu_model in request.gpu_types):
            return True
    return False


def _sorted(jobs: list[TimelineJob]) -> list[TimelineJob]:
    return sorted(jobs, key=lambda job: (job.arrival_s, job.id))
