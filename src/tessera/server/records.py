"""Conversions between stored rows and the core's values: requests, placements, admissions, queue specs, and the
backend's handles (stored as the JSON of ``Handle.to_json``, read by nothing but the backend).

Stored forms are plain JSON so that a restarted server (or another version of it) reads them back exactly.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from tessera.backends.base import Handle
from tessera.core.queueing import QueueSpec, ResourceVector
from tessera.core.queueing.quotas import Admission
from tessera.core.workload import Placement, Request
from tessera.server.pool import Pool
from tessera.server.store.models import QueueRow, WorkloadRow
from tessera.server.store.store import PendingRow

log = logging.getLogger(__name__)

NO_LIMIT = 2**40  # a quota component left out is not limited


def request_of(row: WorkloadRow | PendingRow) -> Request:
    """The request of a stored workload (a whole row, or the columns of ``Store.pending_requests``). Equal requests
    are one shared object: thousands of pending workloads usually have a handful of shapes."""
    return _request(
        row.num_gpus,
        row.gpu_milli,
        row.gpu_mem_mib,
        row.gpu_types,
        row.cpu_milli,
        row.mem_mib,
        row.priority,
        row.queue,
        row.job_type or "",
    )


@functools.lru_cache(maxsize=4096)
def _request(
    num_gpus: int,
    gpu_milli: int,
    gpu_mem_mib: int,
    gpu_types: str,
    cpu_milli: int,
    mem_mib: int,
    priority: int,
    queue: str,
    job_type: str,
) -> Request:
    return Request(
        num_gpus=num_gpus,
        gpu_milli=gpu_milli,
        gpu_mem_mib=gpu_mem_mib,
        gpu_types=gpu_types_of(gpu_types),
        cpu_milli=cpu_milli,
        mem_mib=mem_mib,
        priority=priority,
        queue=queue,
        job_type=job_type,
    )


def gpu_types_of(stored: str) -> frozenset[str]:
    """The allowed GPU models of a workload as stored (comma-joined; "" = any)."""
    return frozenset(t for t in stored.split(",") if t)


def unlimited_queue(name: str, tenant: str, now_s: float) -> QueueRow:
    """A queue without quota limits (the pool is its limit), as the default queue and a new tenant's get."""
    return QueueRow(name=name, tenant=tenant, nominal={}, weight=1.0, strategy="BestEffortFIFO", created_at=now_s)


def placement_record(placement: Placement, pool: Pool) -> dict[str, Any]:
    return {
        "node": pool.nodes[placement.node].name,
        "gpus": list(placement.gpu_indices),
        "gpu_milli": placement.gpu_milli_each,
        "uuids": [pool.device(placement.node, g).uuid for g in placement.gpu_indices],
    }


def placement_of(record: dict[str, Any], request: Request, pool: Pool) -> Placement:
    """The core placement of a stored record; raises ``KeyError`` when its node is no longer in the pool."""
    node = pool.node_index[record["node"]]
    return Placement(node, tuple(int(g) for g in record["gpus"]), request, int(record["gpu_milli"]))


def admission_record(admission: Admission | None) -> dict[str, Any] | None:
    if admission is None:
        return None
    return {
        "queue": admission.queue,
        "flavor_key": admission.flavor_key,
        "from_nominal": _vector_list(admission.from_nominal),
        "borrowed": _vector_list(admission.borrowed),
    }


def admission_of(record: dict[str, Any] | None) -> Admission | None:
    if record is None:
        return None
    return Admission(
        record["queue"],
        record["flavor_key"],
        ResourceVector(*record["from_nominal"]),
        ResourceVector(*record["borrowed"]),
    )


def _vector_list(vector: ResourceVector) -> list[int]:
    return [vector.gpu_milli, vector.cpu_milli, vector.mem_mib]


def queue_spec(row: QueueRow) -> QueueSpec:
    """The core spec of a stored queue; an empty nominal quota, or a component left out of a quota entry, means no
    limit (the pool itself is the limit)."""
    nominal = _quota(row.nominal) or {"*": ResourceVector(NO_LIMIT, NO_LIMIT, NO_LIMIT)}
    return QueueSpec(
        row.name,
        row.cohort,
        nominal,
        borrowing_limit=_quota(row.borrowing_limit) if row.borrowing_limit is not None else None,
        lending_limit=_quota(row.lending_limit) if row.lending_limit is not None else None,
        weight=row.weight,
        strategy=row.strategy,  # type: ignore[arg-type]  # validated when the queue was stored
    )


def _quota(stored: dict[str, dict[str, int]] | None) -> dict[str, ResourceVector]:
    return {
        flavor: ResourceVector(v.get("gpu_milli", NO_LIMIT), v.get("cpu_milli", NO_LIMIT), v.get("mem_mib", NO_LIMIT))
        for flavor, v in (stored or {}).items()
    }


def handle_of(row: WorkloadRow) -> Handle | None:
    """The backend handle stored with ``row``; None when there is none (or it cannot be read, which is logged)."""
    if row.handle is None:
        return None
    try:
        return Handle.from_json(row.handle)
    except ValueError as exc:
        log.warning("workload %s: stored backend handle unreadable (%s)", row.id, exc)
        return None
