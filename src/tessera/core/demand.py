"""What a workload costs its queue, and why it waits, in words: helpers of the scheduling step (``core.step``) and
the scheduler (``core.scheduler``). Without configured queues a step runs on one implicit, unlimited queue
(``implicit_ledger``). Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from tessera.core.decisions import PendingWorkload, RunningWorkload, SchedulerConfig
from tessera.core.elastic import placements_charge
from tessera.core.queueing.quotas import Admission, QueueSpec, QuotaLedger
from tessera.core.queueing.resources import ANY_FLAVOR, Flavor, ResourceVector
from tessera.core.workload import Request

IMPLICIT_QUEUE = "(all)"  # the one queue of a scheduler configured without queues
_UNLIMITED = ResourceVector(2**62, 2**62, 2**62)


def implicit_ledger(
    config: SchedulerConfig, running: Sequence[RunningWorkload]
) -> tuple[QuotaLedger, list[RunningWorkload]]:
    """The ledger of the one implicit queue, charged with ``running`` (re-labelled into that queue)."""
    spec = QueueSpec(IMPLICIT_QUEUE, None, {ANY_FLAVOR: _UNLIMITED}, strategy=config.discipline.value)
    ledger = QuotaLedger([spec])
    relabelled = []
    for r in running:
        charge = placements_charge(r.placements)
        ledger.admit(IMPLICIT_QUEUE, ANY_FLAVOR, charge)
        admission = Admission(IMPLICIT_QUEUE, ANY_FLAVOR, charge, ResourceVector.zero())
        relabelled.append(dataclasses.replace(r, queue=IMPLICIT_QUEUE, admission=admission))
    return ledger, relabelled


def demand_of(workload: PendingWorkload) -> ResourceVector:
    """What a workload is charged to its queue: GPU milli, CPU and memory of all its workers."""
    r = workload.request
    return ResourceVector(r.total_gpu_milli * workload.gang, r.cpu_milli * workload.gang, r.mem_mib * workload.gang)


def flavor_of(spec: QueueSpec, request: Request) -> Flavor:
    """The GPU model the request is limited to when the queue has a quota for exactly that model, else ``"*"``."""
    if len(request.gpu_types) == 1:
        (model,) = request.gpu_types
        if model in spec.nominal:
            return model
    return ANY_FLAVOR


def no_fit_reason(workload: PendingWorkload) -> str:
    r = workload.request
    if r.num_gpus == 0:
        what = f"{r.cpu_milli / 1000:g} CPUs free"
    elif r.is_sharing:
        what = f"a GPU with {r.gpu_milli / 10:g}% free"
    else:
        what = f"{r.num_gpus} free GPU{'s' if r.num_gpus > 1 else ''}"
    types = f" of type {'/'.join(sorted(r.gpu_types))}" if r.gpu_types and r.num_gpus else ""
    gang = f" for each of {workload.gang} workers" if workload.gang > 1 else ""
    cpus = f" and {r.cpu_milli / 1000:g} CPUs free" if r.num_gpus and r.cpu_milli else ""
    return f"no node has {what}{types}{cpus}{gang}"


def amount_text(demand: ResourceVector) -> str:
    """A quota demand in words: "0.3 GPU, 2 CPUs, 4096 MiB"."""
    parts = [f"{demand.gpu_milli / 1000:g} GPU"] if demand.gpu_milli else []
    if demand.cpu_milli:
        parts.append(f"{demand.cpu_milli / 1000:g} CPUs")
    if demand.mem_mib:
        parts.append(f"{demand.mem_mib} MiB")
    return ", ".join(parts) or "nothing"
