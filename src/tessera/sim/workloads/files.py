"""Queues and jobs of a timeline replay read from JSON files (``tessera simulate timeline --queues/--jobs``).

``--queues FILE``: ``{"queues": [{"name": "team-a", "cohort": "org", "nominal_gpus": 40, "borrowing_limit_gpus":
24, "lending_limit_gpus": null, "weight": 1.0}, ...]}``. ``nominal_gpus`` is a number (the ``"*"`` flavor, any GPU
model) or an object of GPU model -> GPUs; limits are GPUs or null (no limit); ``cohort`` null means alone.

``--jobs FILE``: ``{"jobs": [{"id": "j1", "arrival_s": 0, "duration_s": 600, "queue": "team-a", "priority_class":
"training", "gpus": 1, "gpu_milli": 1000, "cpu_milli": 4000, "mem_mib": 16384, "gang": 2, "checkpointed": true},
...]}``. ``gpus`` / ``gpu_milli`` / ``cpu_milli`` / ``mem_mib`` are per worker; priority classes are those of
``tessera.sim.workloads.jobs.PRIORITY_CLASSES`` (inference-critical is not preemptible, the others are).

Every mistake (a negative quota, a borrowing limit without a cohort, an unknown priority class, a gang larger than
the cluster, a missing field) is an ``InputFileError`` naming the file and the field: one line, exit 2, in the CLI.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tessera.core.cluster import NodeSpec
from tessera.core.errors import InputFileError, InvalidRequestError
from tessera.core.workload import MILLI_PER_GPU, Request
from tessera.sim.traces.tables import read_text
from tessera.sim.workloads.jobs import PRIORITY_CLASSES, PRIORITY_INFERENCE, TimelineJob
from tessera.sim.workloads.tenants import ANY_FLAVOR, TenantQueue

T = TypeVar("T")


def load_queues(path: Path) -> list[TenantQueue]:
    return [_entry(path, "queues", k, item, _queue) for k, item in enumerate(_list(path, "queues"))]


def load_jobs(path: Path) -> list[TimelineJob]:
    return [_entry(path, "jobs", k, item, _job) for k, item in enumerate(_list(path, "jobs"))]


def check_gangs_fit(jobs: Sequence[TimelineJob], nodes: Sequence[NodeSpec], source: str) -> None:
    """A gang whose workers together ask for more GPUs than the cluster (of the allowed models) has is an error."""
    for job in jobs:
        r = job.request
        allowed = sum(n.gpu_count for n in nodes if not r.gpu_types or n.gpu_model in r.gpu_types)
        if job.gang > 1 and job.gang * r.num_gpus > allowed:
            raise InputFileError(
                source,
                None,
                "gang",
                f"job {job.id}: a gang of {job.gang} x {r.num_gpus} GPUs is larger than the "
                f"cluster ({allowed} GPUs it may use)",
            )


def _list(path: Path, key: str) -> list[Any]:
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise InputFileError(str(path), exc.lineno, None, f"not valid JSON: {exc.msg}") from exc
    items = data.get(key) if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise InputFileError(str(path), None, key, f'expected {{"{key}": [...]}}')
    return items


def _entry(path: Path, key: str, index: int, item: Any, build: Callable[[dict[str, Any]], T]) -> T:
    where = f"{key}[{index}]"
    if not isinstance(item, dict):
        raise InputFileError(str(path), None, where, "expected an object")
    try:
        return build(item)
    except InvalidRequestError as exc:
        raise InputFileError(str(path), None, f"{where}.{exc.field}", exc.message) from exc
    except KeyError as exc:
        raise InputFileError(str(path), None, f"{where}.{exc.args[0]}", "missing") from exc
    except (TypeError, ValueError) as exc:
        raise InputFileError(str(path), None, where, f"bad value: {exc}") from exc


def _milli(gpus: Any, field: str) -> int:
    value = float(gpus)
    if not math.isfinite(value):
        raise InvalidRequestError(field, f"must be a finite number, got {gpus}")
    return round(value * MILLI_PER_GPU)


def _queue(item: dict[str, Any]) -> TenantQueue:
    nominal = item["nominal_gpus"]
    by_flavor = nominal if isinstance(nominal, dict) else {ANY_FLAVOR: nominal}
    limits = [item.get(f) for f in ("borrowing_limit_gpus", "lending_limit_gpus")]
    return TenantQueue(
        str(item["name"]),
        item.get("cohort"),
        {str(k): _milli(v, "nominal_gpus") for k, v in by_flavor.items()},
        None if limits[0] is None else _milli(limits[0], "borrowing_limit_gpus"),
        None if limits[1] is None else _milli(limits[1], "lending_limit_gpus"),
        float(item.get("weight", 1.0)),
    )


def _job(item: dict[str, Any]) -> TimelineJob:
    name = str(item.get("priority_class", "training"))
    if name not in PRIORITY_CLASSES:
        known = ", ".join(PRIORITY_CLASSES)
        raise InvalidRequestError("priority_class", f"unknown priority class {name!r} (known: {known})")
    priority = PRIORITY_CLASSES[name]
    queue = str(item.get("queue", "default"))
    gpus = int(item.get("gpus", 1))
    request = Request(
        num_gpus=gpus,
        gpu_milli=int(item.get("gpu_milli", MILLI_PER_GPU if gpus else 0)),
        cpu_milli=int(item.get("cpu_milli", 1000)),
        mem_mib=int(item.get("mem_mib", 4096)),
        priority=priority,
        queue=queue,
    )
    return TimelineJob(
        str(item["id"]),
        float(item["arrival_s"]),
        request,
        float(item["duration_s"]),
        queue=queue,
        priority=priority,
        preemptible=priority != PRIORITY_INFERENCE,
        gang=int(item.get("gang", 1)),
        checkpointed=bool(item.get("checkpointed", False)),
    )
