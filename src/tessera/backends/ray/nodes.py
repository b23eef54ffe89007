"""How a Ray cluster describes its nodes and GPUs to Tessera, and how a node is declared so.

Ray's own GPU accounting is left out (every node starts with ``--num-gpus 0``): Ray cannot be told which GPU to use
and packs fractions badly (ray#52133). Instead each GPU is one custom resource of capacity 1, named
``tessera/<GPU-UUID>``, and a workload's actor asks for exactly the share Tessera granted of exactly the GPU
Tessera chose, so Ray enforces nothing Tessera did not decide. Two node labels name the node and its GPU model
(one model per Ray node; a host with two models runs two Ray nodes):

- ``tessera.io/node``: the node's name in Tessera (``GpuDevice.node``); without it, ``ray-<first 12 hex digits of
  the Ray node id>``;
- ``tessera.io/gpu-model``: the catalog model of its GPUs (``A100-80GB``). Simulated GPUs (``SIM-...`` UUIDs,
  ``tessera up --backend ray --gpus SPEC``) need it too.

Pure functions over ``ray.nodes()``'s dictionaries: no Ray import here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.core.catalog import resolve_model
from tessera.core.errors import InvalidRequestError

GPU_RESOURCE_PREFIX = "tessera/"
NODE_LABEL = "tessera.io/node"
MODEL_LABEL = "tessera.io/gpu-model"
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class RayNode:
    """One alive Ray node as Tessera sees it."""

    name: str
    node_id: str  # Ray's hex node id, for NodeAffinitySchedulingStrategy
    address: str
    cpu_milli: int
    mem_mib: int
    gpu_uuids: tuple[str, ...]  # in index order (sorted); the server makes its ``GpuDevice``s of them
    gpu_model: str | None  # the catalog name of their model; None without GPUs


def gpu_resource(uuid: str) -> str:
    """The custom resource that stands for one GPU."""
    return f"{GPU_RESOURCE_PREFIX}{uuid}"


def node_name(info: Mapping[str, Any]) -> str:
    labels = info.get("Labels") or {}
    name = labels.get(NODE_LABEL)
    return str(name) if name else f"ray-{str(info['NodeID'])[:12]}"


def parse_node(info: Mapping[str, Any]) -> RayNode:
    """A ``ray.nodes()`` entry as a ``RayNode``; ``InvalidRequestError`` for GPUs without a known model."""
    name = node_name(info)
    resources: Mapping[str, float] = info.get("Resources") or {}
    uuids = sorted(key[len(GPU_RESOURCE_PREFIX) :] for key in resources if key.startswith(GPU_RESOURCE_PREFIX))
    model: str | None = None
    if uuids:
        label = (info.get("Labels") or {}).get(MODEL_LABEL)
        if not label:
            raise InvalidRequestError("ray node", f"{name}: GPUs declared without the {MODEL_LABEL} label")
        model = resolve_model(str(label)).name
    return RayNode(
        name=name,
        node_id=str(info["NodeID"]),
        address=str(info.get("NodeManagerAddress", "")),
        cpu_milli=int(float(resources.get("CPU", 0)) * 1000),
        mem_mib=int(float(resources.get("memory", 0)) // MIB),
        gpu_uuids=tuple(uuids),
        gpu_model=model,
    )


def alive_nodes(infos: Sequence[Mapping[str, Any]]) -> list[RayNode]:
    """The alive nodes, by name; a name seen twice (a node that came back) keeps its newest alive entry."""
    nodes = {parse_node(info).name: parse_node(info) for info in infos if info.get("Alive")}
    return [nodes[name] for name in sorted(nodes)]


def declare_node(name: str, gpus: Sequence[tuple[str, str]]) -> tuple[dict[str, float], dict[str, str]]:
    """(resources, labels) that declare a node's GPUs, given as (UUID, model), to Ray (``ray start --resources``
    and ``--labels``); one model per node."""
    models = {model for _, model in gpus}
    if len(models) > 1:
        raise InvalidRequestError("gpus", f"a Ray node has one GPU model; {name} would have {sorted(models)}")
    labels = {NODE_LABEL: name}
    if gpus:
        labels[MODEL_LABEL] = gpus[0][1]
    return {gpu_resource(uuid): 1.0 for uuid, _ in gpus}, labels


def start_arguments(name: str, gpus: Sequence[tuple[str, str]]) -> list[str]:
    """The ``ray start`` options that declare a node so (besides ``--head`` or ``--address``)."""
    resources, labels = declare_node(name, gpus)
    label_text = ",".join(f"{key}={value}" for key, value in labels.items())
    return ["--num-gpus", "0", "--resources", json.dumps(resources), "--labels", label_text]
