"""Turning API bodies into stored rows: a submission into a ``WorkloadRow`` (validated against the catalog, the
queues and the pool), a queue body into a ``QueueRow``. Every rejection is an ``InvalidRequestError`` naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from tessera.api import QueueIn, QuotaIn, WorkloadSpec
from tessera.core.catalog import resolve_allowed
from tessera.core.cluster import ClusterState
from tessera.core.placement.gang import gpu_worker_slots
from tessera.core.queueing import resolve_priority_class
from tessera.core.workload import MILLI_PER_GPU, Request, WorkloadState
from tessera.errors import InvalidRequestError
from tessera.server.pool import Pool
from tessera.server.quantities import parse_cpu_milli, parse_mem_mib
from tessera.server.records import queue_spec
from tessera.server.store.models import QueueRow, WorkloadRow

DEFAULT_QUEUE = "default"
# What Linux can pass to ``execve``: one argument or ``NAME=value`` entry of at most MAX_ARG_STRLEN bytes (32 pages,
# its NUL included). The totals are Tessera's own, well under ARG_MAX (a quarter of the 8 MiB stack limit), leaving
# room for the isolation variables the launcher adds; they also keep every listing of workloads small.
MAX_ARG_BYTES = 128 * 1024
MAX_COMMAND_BYTES = 256 * 1024
MAX_ENV_BYTES = 256 * 1024
_INTEGER = re.compile(r"^\s*[-+]?[0-9]+\s*$")  # ASCII digits only: str.isdigit() also takes "²"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who calls: an admin (every queue) or a tenant (only its own queues and workloads)."""

    tenant: str | None
    is_admin: bool

    def may_use(self, queue: QueueRow) -> bool:
        return self.is_admin or queue.tenant == self.tenant


def workload_row(
    spec: WorkloadSpec,
    principal: Principal,
    queues: list[QueueRow],
    pool: Pool,
    now_s: float,
    job_types: Collection[str] = (),
) -> WorkloadRow:
    """The row of ``spec``; ``job_types``: the names ``spec.job_type`` may take (the server's throughput model)."""
    check_exec_limits(spec.command, spec.env)
    queue = queue_for(spec.queue, principal, queues)
    request = _request(spec, queue.name)
    shape = job_shape(spec, job_types)
    reason = never_fits(request, pool) or gang_never_fits(request, shape.fewest, pool)
    if reason is not None:
        raise InvalidRequestError(reason[0], reason[1])
    priority, priority_class, preemptible = _priority(spec.priority)
    return WorkloadRow(
        name=spec.name,
        tenant=queue.tenant,
        queue=queue.name,
        kind=spec.kind,
        state=WorkloadState.PENDING.value,
        priority=priority,
        priority_class=priority_class,
        preemptible=preemptible,
        num_gpus=request.num_gpus,
        gpu_milli=request.gpu_milli,
        gpu_mem_mib=request.gpu_mem_mib,
        gpu_types=",".join(sorted(request.gpu_types)),
        cpu_milli=request.cpu_milli,
        mem_mib=request.mem_mib,
        gpu_compute_pct=spec.gpu_compute,
        command=list(spec.command),
        env=dict(spec.env),
        submitted_at=now_s,
        reason="waiting for the next scheduling step",
        attempts=0,
        cancel_requested=False,
        workers=shape.workers,
        elastic_min=shape.elastic_min,
        elastic_max=shape.elastic_max,
        job_type=shape.job_type,
        checkpointable=preemptible if spec.checkpointable is None else spec.checkpointable,
    )


@dataclass(frozen=True, slots=True)
class JobShape:
    """A submission's workers, elastic range and job type, checked."""

    workers: int
    elastic_min: int | None
    elastic_max: int | None
    job_type: str

    @property
    def fewest(self) -> int:
        """The fewest workers it can start with."""
        return self.workers if self.elastic_min is None else self.elastic_min


def job_shape(spec: WorkloadSpec, job_types: Collection[str]) -> JobShape:
    """``spec``'s workers (default 1, or the elastic minimum), elastic range (both bounds or none, min <= workers
    <= max) and job type (one ``job_types`` names, matched without regard to case; a clear error lists them)."""
    low, high = spec.elastic_min, spec.elastic_max
    if (low is None) != (high is None):
        given = "elastic_min" if high is None else "elastic_max"
        raise InvalidRequestError(given, "an elastic range needs both elastic_min and elastic_max (e.g. 1-4)")
    if low is not None and high is not None and low > high:
        raise InvalidRequestError("elastic_max", f"{high} is below elastic_min {low}")
    workers = spec.workers if spec.workers is not None else low if low is not None else 1
    if low is not None and high is not None and not low <= workers <= high:
        raise InvalidRequestError("workers", f"{workers} is outside the elastic range {low}-{high}")
    if spec.kind == "service" and (workers > 1 or low is not None):
        raise InvalidRequestError("workers", "a service runs one worker (deploy a model for replicas)")
    return JobShape(workers, low, high, _job_type(spec.job_type, job_types))


def _job_type(name: str | None, known: Collection[str]) -> str:
    if not name:
        return ""
    by_key = {k.casefold(): k for k in known}
    found = by_key.get(name.strip().casefold())
    if found is None:
        listed = ", ".join(sorted(known)) or "none (the server has no throughput model)"
        raise InvalidRequestError("job_type", f"unknown job type {name!r} (known: {listed})")
    return found


def gang_never_fits(request: Request, workers: int, pool: Pool) -> tuple[str, str] | None:
    """(field, reason) when ``workers`` copies of ``request`` could not all be placed at once even on an empty pool
    (across every node: the core's gang rules spread a gang that no node holds); None when they could."""
    if workers <= 1:
        return None
    empty = ClusterState(pool.nodes)
    slots = np.minimum(
        empty.cpu_cap_milli // request.cpu_milli if request.cpu_milli else workers,
        empty.mem_cap_mib // request.mem_mib if request.mem_mib else workers,
    )
    if request.num_gpus:
        need = empty.milli_by_model(request)[empty.model_idx]
        allowed = empty.allowed_models(request)[empty.model_idx] & (need <= MILLI_PER_GPU)
        free = np.where(allowed[:, None], empty.gpu_free_milli, 0)
        slots = np.minimum(slots, gpu_worker_slots(free, need[:, None], request.num_gpus))
    total = int(np.asarray(slots).sum())
    if total >= workers:
        return None
    return "workers", f"{workers} workers of this size never fit at once: the whole pool holds {total}"


def check_exec_limits(command: list[str], env: dict[str, str]) -> None:
    """Refuse at submission what ``execve`` would refuse at launch (or what would bloat every listing): an empty
    program name, an argument or environment entry over ``MAX_ARG_BYTES``, too many bytes in all."""
    if not command or not command[0]:
        raise InvalidRequestError("command.0", "the program to run must not be empty")
    total = 0
    for index, argument in enumerate(command):
        size = len(argument.encode()) + 1
        if size > MAX_ARG_BYTES:
            raise InvalidRequestError(f"command.{index}", f"{size} bytes; the OS takes at most {MAX_ARG_BYTES} each")
        total += size
    if total > MAX_COMMAND_BYTES:
        raise InvalidRequestError("command", f"{total} bytes in all; at most {MAX_COMMAND_BYTES} are accepted")
    total = 0
    for name, value in env.items():
        size = len(name.encode()) + len(value.encode()) + 2  # NAME=value and its NUL
        if size > MAX_ARG_BYTES:
            raise InvalidRequestError(f"env.{name}", f"{size} bytes; the OS takes at most {MAX_ARG_BYTES} each")
        total += size
    if total > MAX_ENV_BYTES:
        raise InvalidRequestError("env", f"{total} bytes in all; at most {MAX_ENV_BYTES} are accepted")


def queue_for(name: str | None, principal: Principal, queues: list[QueueRow]) -> QueueRow:
    usable = [q for q in queues if principal.may_use(q)]
    if name is None:
        own = sorted(usable, key=lambda q: (q.name != (principal.tenant or DEFAULT_QUEUE), q.name))
        if not own:
            raise InvalidRequestError("queue", "no queue is available to this tenant; ask an admin for one")
        return own[0]
    for queue in usable:
        if queue.name == name:
            return queue
    known = ", ".join(q.name for q in usable) or "none"
    raise InvalidRequestError("queue", f"unknown queue {name!r} (yours: {known})")


def _request(spec: WorkloadSpec, queue: str) -> Request:
    shares = [f for f in ("gpu_milli", "gpu_fraction") if getattr(spec, f) is not None]
    if len(shares) > 1:
        raise InvalidRequestError("gpu_fraction", "give gpu_milli or gpu_fraction, not both")
    if spec.gpus == 0:
        for given in ("gpu_milli", "gpu_fraction", "gpu_compute", "gpu_mem"):
            if getattr(spec, given) is not None:
                raise InvalidRequestError(given, "a GPU share needs gpus >= 1")
        if spec.gpu_types:  # else a CPU-only workload, which a user asking for a GPU type did not mean
            raise InvalidRequestError("gpu_types", "GPU types need gpus >= 1 (a workload with gpus 0 runs on CPUs)")
    gpu_mem_mib = parse_mem_mib(spec.gpu_mem, "gpu_mem") if spec.gpu_mem is not None else 0
    milli = 0
    if spec.gpu_milli is not None:
        milli = spec.gpu_milli
    elif spec.gpu_fraction is not None:
        milli = max(1, round(spec.gpu_fraction * MILLI_PER_GPU))
    elif spec.gpu_compute is not None:
        milli = spec.gpu_compute * 10
    elif spec.gpus > 0 and not gpu_mem_mib:
        milli = MILLI_PER_GPU  # whole GPUs
    if spec.gpus > 1 and 0 < milli < MILLI_PER_GPU:
        raise InvalidRequestError("gpu_milli", "a share of a GPU is only possible with gpus = 1")
    if spec.gpus > 1 and gpu_mem_mib and not milli:
        milli = MILLI_PER_GPU
    return Request(
        num_gpus=spec.gpus,
        gpu_milli=milli,
        gpu_mem_mib=gpu_mem_mib,
        gpu_types=_gpu_types(spec.gpu_types),
        cpu_milli=parse_cpu_milli(spec.cpu, "cpu") if spec.cpu is not None else 0,
        mem_mib=parse_mem_mib(spec.mem, "mem") if spec.mem is not None else 0,
        queue=queue,
    )


def _gpu_types(names: list[str]) -> frozenset[str]:
    try:
        return resolve_allowed(list(names)) if names else frozenset()
    except InvalidRequestError as exc:
        raise InvalidRequestError("gpu_types", exc.message) from None


DEFAULT_PRIORITY_CLASS = "training"  # a plain submit: above best-effort work, below inference-critical


def _priority(value: int | str | None) -> tuple[int, str, bool]:
    if value is None:
        value = DEFAULT_PRIORITY_CLASS
    if isinstance(value, int):
        if abs(value) > 1_000_000:
            raise InvalidRequestError("priority", f"must be within +-1000000, got {value}")
        return value, "", True
    if _INTEGER.match(value):
        return _priority(int(value))
    try:
        cls = resolve_priority_class(value)
    except InvalidRequestError as exc:
        raise InvalidRequestError("priority", exc.message) from None
    return cls.value, cls.name, cls.preemptible


def never_fits(request: Request, pool: Pool) -> tuple[str, str] | None:
    """(field, reason) when no node of the pool could hold ``request`` even if it were empty, else None."""
    empty = ClusterState(pool.nodes)
    nodes = np.arange(empty.num_nodes)
    milli = empty.milli_by_model(request)[empty.model_idx]
    if bool(empty.feasible(request, nodes, milli).any()):
        return None
    if request.num_gpus:
        allowed = empty.allowed_models(request)[empty.model_idx] & (empty.gpu_count > 0)
        if not allowed.any():
            have = ", ".join(empty.model_names) or "none"
            return "gpu_types", f"no GPU of the allowed types in the pool (it has: {have})"
        if int(empty.gpu_count[allowed].max()) < request.num_gpus:
            return "gpus", f"{request.num_gpus} GPUs requested but the largest node has {int(empty.gpu_count.max())}"
        if bool((milli[allowed] > MILLI_PER_GPU).all()):
            return "gpu_mem", f"{request.gpu_mem_mib} MiB is more than any allowed GPU's memory"
    if request.cpu_milli > int(empty.cpu_cap_milli.max()):
        largest = int(empty.cpu_cap_milli.max()) / 1000
        return "cpu", f"{request.cpu_milli / 1000:g} CPUs requested but the largest node has {largest:g}"
    return "mem", f"{request.mem_mib} MiB of memory requested but no node that fits the rest has that much"


def queue_row(body: QueueIn, now_s: float) -> QueueRow:
    row = QueueRow(
        name=body.name,
        tenant=body.tenant,
        cohort=body.cohort,
        nominal=_quota_json(body.nominal, "nominal"),
        borrowing_limit=None if body.borrowing_limit is None else _quota_json(body.borrowing_limit, "borrowing_limit"),
        lending_limit=None if body.lending_limit is None else _quota_json(body.lending_limit, "lending_limit"),
        weight=body.weight,
        strategy=body.strategy,
        created_at=now_s,
    )
    queue_spec(row)  # the core's own checks (limits need a cohort, ...) raise InvalidRequestError
    return row


def _quota_json(quota: dict[str, QuotaIn], field: str) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for flavor, amount in quota.items():
        key = flavor if flavor == "*" else _one_model(flavor, field)
        entry: dict[str, int] = {}
        if amount.gpus is not None:
            entry["gpu_milli"] = round(amount.gpus * MILLI_PER_GPU)
        if amount.cpu is not None:
            entry["cpu_milli"] = parse_cpu_milli(amount.cpu, f"{field}.{flavor}.cpu")
        if amount.mem is not None:
            entry["mem_mib"] = parse_mem_mib(amount.mem, f"{field}.{flavor}.mem")
        out[key] = entry
    return out


def _one_model(name: str, field: str) -> str:
    try:
        models = resolve_allowed([name])
    except InvalidRequestError as exc:
        raise InvalidRequestError(field, exc.message) from None
    if len(models) != 1:
        raise InvalidRequestError(field, f"{name!r} names several GPU models; quotas are per model or '*'")
    (model,) = models
    return model
