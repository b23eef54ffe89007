"""A submission's job options turned into stored rows (``tessera submit --chdir --time --hold --dependency --array``):
one row, or one per task of a job array, each validated once for all. Every rejection is an ``InvalidRequestError``
naming the field. The loop enforces them (``server.gates``); the launcher gives an array's task its index.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from tessera.api import WorkloadSpec
from tessera.api.job_options import Dependency, parse_array, parse_dependency, parse_duration
from tessera.errors import InvalidRequestError
from tessera.server.pool import Pool
from tessera.server.store.jobs import array_tasks, copy_row
from tessera.server.store.models import QueueRow, WorkloadRow
from tessera.server.store.store import Store
from tessera.server.submit import Principal, workload_row

ARRAY_ENV = ("TESSERA_ARRAY_ID", "SLURM_ARRAY_JOB_ID", "TESSERA_ARRAY_INDEX", "SLURM_ARRAY_TASK_ID")


def workload_rows(
    spec: WorkloadSpec,
    principal: Principal,
    queues: list[QueueRow],
    pool: Pool,
    store: Store,
    now_s: float,
    job_types: Collection[str] = (),
) -> list[WorkloadRow]:
    """The rows to store for ``spec``: its own, or its array's tasks in index order (their ``array_id`` is set when
    they are stored: the first task's id). ``job_types``: what ``spec.job_type`` may name."""
    row = workload_row(spec, principal, queues, pool, now_s, job_types)
    row.cwd = spec.cwd
    row.time_limit_s = None if spec.time_limit is None else parse_duration(spec.time_limit)
    row.held = spec.hold
    if spec.hold:
        row.reason = "held"
    if spec.dependency is not None:
        row.dependency = resolved(parse_dependency(spec.dependency), principal, store).text()
    if spec.array is None:
        return [row]
    array = parse_array(spec.array)
    return [copy_row(row, array_index=index, array_limit=array.limit) for index in array.indices]


def resolved(dependency: Dependency, principal: Principal, store: Store) -> Dependency:
    """``dependency`` with each id checked (it exists and is the caller's to see) and an array's id replaced by
    its tasks' ids (``afterok:ARRAY`` waits for every task, as in Slurm)."""
    owners = store.tenants_of(dependency.ids)
    for wid in dependency.ids:
        if wid not in owners or not (principal.is_admin or owners[wid] == principal.tenant):
            raise InvalidRequestError("dependency", f"no workload {wid}")
    tasks = array_tasks(store, dependency.ids)
    ids = [task for wid in dependency.ids for task in tasks.get(wid, [wid])]
    return Dependency(dependency.kind, tuple(dict.fromkeys(ids)))


def array_env(row: WorkloadRow) -> Mapping[str, str]:
    """What an array's task finds in its environment: the array's id and its own index (Tessera's and Slurm's
    names); nothing for a workload outside an array."""
    if row.array_id is None or row.array_index is None:
        return {}
    ids = (str(row.array_id), str(row.array_id), str(row.array_index), str(row.array_index))
    return dict(zip(ARRAY_ENV, ids, strict=True))
