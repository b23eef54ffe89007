"""A gang across Ray nodes (``LaunchSpec.gang_parts``): what each part is, how its handle names it, what it runs with.

A gang placed on several nodes is one workload: rank 0's node runs the workload's own actor (``tessera-<id>``) with
``LaunchSpec.gang``; each ``GangPart`` runs in an actor of its own, ``tessera-<id>-part<k>`` (k = 1, 2, ... in the
order of ``gang_parts``), on its node, with its GPUs and CPUs. The handle keeps the workload actor's fields as for
one node and names the parts in four comma-joined strings (JSON scalars only): ``part_actors``, ``part_nodes``
(Tessera's names), ``part_node_ids`` (Ray's) and ``part_ranks`` (each part's ranks, parts separated by ``;``:
``"2,3;4"``). The workload actor is told the same four strings, so ``find`` rebuilds the whole handle from it.

Each part's supervisor messages (its own stdout, such as "rank 2 exited with code 3") go to ``<log>.part<k>`` next
to the workload's log; its ranks log to ``rank_log_path`` as on one node.

Pure: no Ray import (unit-tested without a cluster).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.backends.base import GangPart, JsonScalar, LaunchSpec
from tessera.backends.ray.nodes import RayNode
from tessera.core.errors import InvalidRequestError, TesseraError

PART_FIELDS = ("part_actors", "part_nodes", "part_node_ids", "part_ranks")
VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
MPS_MEMORY_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


@dataclass(frozen=True, slots=True)
class PartRef:
    """One part of a gang across nodes, as its workload's handle names it."""

    index: int  # 1, 2, ...: its place in ``gang_parts``
    actor: str
    node: str
    node_id: str
    ranks: tuple[int, ...]


def part_actor_name(main_actor: str, index: int) -> str:
    """The name of part ``index``'s actor, after its workload's actor (``tessera-7-part1``)."""
    return f"{main_actor}-part{index}"


def part_log_path(log_path: Path, index: int) -> Path:
    """Where part ``index``'s supervisor messages go on the server: ``<log>.part<k>``."""
    return log_path.with_name(f"{log_path.name}.part{index}")


def plan_parts(spec: LaunchSpec, main: RayNode, nodes: Mapping[str, RayNode], main_actor: str) -> list[PartRef]:
    """The parts of ``spec`` (none without ``gang_parts``), checked: rank 0 and the first ranks on ``main`` (the
    node of ``spec.node``), every rank of the gang once, each part's GPUs on its node. ``InvalidRequestError``
    naming the field for a launch that cannot be right; ``TesseraError`` for a part's node not in the cluster."""
    if not spec.gang_parts:
        return []
    if spec.gang is None or 0 not in spec.gang.ranks:
        raise InvalidRequestError("gang", f"{spec.workload_id}: a gang across nodes needs rank 0 on {main.name}")
    ranks = [*spec.gang.ranks, *(rank for part in spec.gang_parts for rank in part.ranks)]
    if sorted(ranks) != list(range(spec.gang.world_size)):
        raise InvalidRequestError(
            "gang_parts", f"{spec.workload_id}: ranks {sorted(ranks)} are not each rank of {spec.gang.world_size} once"
        )
    parts: list[PartRef] = []
    for index, part in enumerate(spec.gang_parts, start=1):
        node = nodes.get(part.node)
        if node is None:
            raise TesseraError(f"{spec.workload_id}: Ray node {part.node!r} is not in the cluster (lost?)")
        if not part.ranks:
            raise InvalidRequestError("gang_parts", f"{spec.workload_id}: part {index} on {part.node} has no rank")
        elsewhere = sorted({share.uuid for share in part.gpus} - set(node.gpu_uuids))
        if elsewhere:
            raise InvalidRequestError("gang_parts", f"{spec.workload_id}: GPUs {elsewhere} are not on node {node.name}")
        parts.append(PartRef(index, part_actor_name(main_actor, index), node.name, node.node_id, part.ranks))
    return parts


def part_env(env: Mapping[str, str], part: GangPart) -> dict[str, str]:
    """The workload's environment for a part: the launch's, made for rank 0's node, with the part's own GPUs in
    ``CUDA_VISIBLE_DEVICES`` (and MPS's per-device memory limit for as many devices), when the launch sets them.
    The shares and caps (``TESSERA_GPU_*``) stay: a gang's workers all have the same share."""
    out = dict(env)
    if VISIBLE_DEVICES in env:
        out[VISIBLE_DEVICES] = ",".join(share.uuid for share in part.gpus)
    limit = env.get(MPS_MEMORY_LIMIT)
    if limit:  # "0=1234M,1=1234M": the same allowance per device
        allowance = limit.split(",")[0].partition("=")[2]
        out[MPS_MEMORY_LIMIT] = ",".join(f"{i}={allowance}" for i in range(len(part.gpus)))
    return out


def part_fields(parts: Sequence[PartRef]) -> dict[str, str]:
    """The handle's fields that name ``parts`` (none for a workload on one node)."""
    if not parts:
        return {}
    return {
        "part_actors": ",".join(part.actor for part in parts),
        "part_nodes": ",".join(part.node for part in parts),
        "part_node_ids": ",".join(part.node_id for part in parts),
        "part_ranks": ";".join(",".join(str(rank) for rank in part.ranks) for part in parts),
    }


def parts_of(workload_id: str, data: Mapping[str, JsonScalar]) -> tuple[PartRef, ...]:
    """The parts a handle's ``data`` names (none: a workload on one node); ``InvalidRequestError`` for fields that
    do not name them."""
    values = [data.get(name) for name in PART_FIELDS]
    if all(value is None or value == "" for value in values):
        return ()
    if not all(isinstance(value, str) and value for value in values):
        raise InvalidRequestError("handle", f"{workload_id}: incomplete gang parts in its handle: {dict(data)}")
    actors, nodes, node_ids, ranks = (str(value) for value in values)
    lists = (actors.split(","), nodes.split(","), node_ids.split(","), ranks.split(";"))
    if len({len(values) for values in lists}) != 1:
        raise InvalidRequestError("handle", f"{workload_id}: its gang parts do not match: {dict(data)}")
    try:
        part_ranks = [tuple(int(rank) for rank in text.split(",")) for text in lists[3]]
    except ValueError:
        raise InvalidRequestError("handle", f"{workload_id}: part_ranks {ranks!r} is not a list of ranks") from None
    return tuple(
        PartRef(index, actor, node, node_id, part_ranks[index - 1])
        for index, (actor, node, node_id) in enumerate(zip(lists[0], lists[1], lists[2], strict=True), start=1)
    )
