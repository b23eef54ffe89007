"""The GPU pool the server schedules on: GPU devices (from ``tessera.gpu``) grouped into the core's nodes.

The core's ``NodeSpec`` has one GPU model per node, so a host with mixed models (``4xA100-80GB,2xT4``) becomes one
logical node per model (``local/A100-80GB``, ``local/T4``) and the host's CPU and memory are split between them in
proportion to their GPU counts. ``Pool.device(node_index, gpu_index)`` maps a placement back to the device (its UUID
for ``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.core.cluster import NodeSpec
from tessera.gpu.gpus import GpuDevice


@dataclass(frozen=True, slots=True)
class HostResources:
    cpu_milli: int
    mem_mib: int


def detect_host() -> HostResources:
    """This host's CPU cores and memory (Linux ``/proc/meminfo``; 16 GiB assumed when it cannot be read)."""
    mem_mib = 16 * 1024
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_mib = int(line.split()[1]) // 1024
                break
    except OSError:
        pass
    return HostResources((os.cpu_count() or 1) * 1000, mem_mib)


class Pool:
    def __init__(self, nodes: Sequence[NodeSpec], devices: Sequence[Sequence[GpuDevice]]) -> None:
        """``devices[i]`` are the GPUs of ``nodes[i]`` in index order."""
        if len(nodes) != len(devices):
            raise ValueError("one device list per node")
        self.nodes: tuple[NodeSpec, ...] = tuple(nodes)
        self.devices: tuple[tuple[GpuDevice, ...], ...] = tuple(tuple(d) for d in devices)
        self.node_index = {n.name: i for i, n in enumerate(self.nodes)}
        self.gone: frozenset[int] = frozenset()  # removed nodes: an empty entry keeps their index

    @classmethod
    def from_devices(cls, devices: Sequence[GpuDevice], host: HostResources) -> Pool:
        groups: dict[tuple[str, str], list[GpuDevice]] = defaultdict(list)
        for device in devices:
            groups[(device.node, device.model)].append(device)
        hosts = {node for node, _ in groups}
        nodes: list[NodeSpec] = []
        grouped: list[list[GpuDevice]] = []
        for host_name in sorted(hosts):
            keys = sorted(k for k in groups if k[0] == host_name)
            total = sum(len(groups[k]) for k in keys)
            for key in keys:
                share = len(groups[key]) / total
                name = host_name if len(keys) == 1 else f"{host_name}/{key[1]}"
                gpus = sorted(groups[key], key=lambda d: d.index)
                nodes.append(NodeSpec(name, int(host.cpu_milli * share), int(host.mem_mib * share), len(gpus), key[1]))
                grouped.append(gpus)
        return cls(nodes, grouped)

    def add_node(self, spec: NodeSpec, devices: Sequence[GpuDevice]) -> int:
        """Append a node that joined; returns its index (the next one, as ``ClusterState.add_node`` gives it)."""
        self.devices = (*self.devices, tuple(devices))
        self.nodes = (*self.nodes, spec)
        self.node_index[spec.name] = len(self.nodes) - 1
        return len(self.nodes) - 1

    def remove_node(self, index: int) -> None:
        """A node that left: its entry stays, empty (no GPUs, CPUs or memory), and its name maps to it no more."""
        name = self.nodes[index].name
        self.gone = self.gone | {index}
        if self.node_index.get(name) == index:
            del self.node_index[name]
        self.devices = tuple(() if i == index else d for i, d in enumerate(self.devices))
        self.nodes = tuple(NodeSpec(name, 0, 0, 0, None) if i == index else n for i, n in enumerate(self.nodes))

    @property
    def simulated(self) -> bool:
        return any(d.simulated for devs in self.devices for d in devs)

    def split_notice(self) -> str | None:
        """A line for the operator when a host's GPUs of several models became several nodes, each with a part of
        the host's CPUs and memory (a workload then gets at most its node's part), else None."""
        parts = [n for n in self.nodes if "/" in n.name]
        if not parts:
            return None
        shown = ", ".join(f"{n.name} ({n.gpu_count} GPU, {n.cpu_milli / 1000:g} CPUs, {n.mem_mib} MiB)" for n in parts)
        return (
            f"mixed GPU models on one host are scheduled as one node per model, each with a share of the host's CPUs "
            f"and memory in proportion to its GPUs: {shown}; a workload can use at most its node's share"
        )

    def device(self, node: int, gpu: int) -> GpuDevice:
        return self.devices[node][gpu]

    def describe(self) -> list[dict[str, object]]:
        """A JSON-able summary (stored with the data so a restart can notice a changed pool)."""
        return [
            {"node": n.name, "model": n.gpu_model, "uuids": [d.uuid for d in devs]}
            for i, (n, devs) in enumerate(zip(self.nodes, self.devices, strict=True))
            if i not in self.gone
        ]
