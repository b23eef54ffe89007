"""Cluster shapes for timeline workloads: the Alibaba PAI machine list, and down-scaling that keeps the GPU mix.

``tessera.sim.workloads.training`` calls ``pai_cluster`` for the ``training`` workload's heterogeneous cluster and
``tessera.sim.workloads.openb`` calls ``scale_nodes`` for the ``openb`` workload's ``--gpu-scale``. Both shrink a
cluster without randomness: nodes are grouped by GPU model, each group keeps its share, and within a group the
nodes, sorted largest first (by GPUs, CPU, memory, then input order), are cut into as many equal strata as nodes to
keep and the middle node of each stratum is kept, except that the first stratum gives its largest node: a stratified
pick that keeps the group's node shapes and always keeps its largest node (so a pod that fitted the largest node of
a model still fits).

``pai_machine_spec.csv`` (CC BY 4.0, Alibaba PAI v2020; read by path, never copied) has no header; its columns are
``machine, gpu_type, cap_cpu, cap_mem, cap_gpu`` with CPU in cores and memory in GiB (e.g. ``T4,96,512,2``).
GPU types map to the catalog (``V100`` → ``V100M16``); ``MISC`` (undisclosed mixed types) becomes
``misc_gpu_model``, by default the catalog's undisclosed placeholder ``G2`` (V100-class speed, 16 GiB); ``CPU``
machines and machines without GPUs are left out unless ``include_cpu_nodes``.

The embedded mix (when no file is given) has the file's node shapes and counts (1,897 machines, 6,742 GPUs):

=====  ========  =====  ========  ====
count  gpu type  cores  mem GiB   gpus
=====  ========  =====  ========  ====
798    P100      64     512       2
497    T4        96     512       2
59     V100      96     512       8
45     V100      96     384       8
135    V100M32   96     384       8
280    MISC      96     512       8
83     CPU       96     512       0
=====  ========  =====  ========  ====
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from pathlib import Path

from tessera.core.catalog import resolve_model
from tessera.core.cluster import NodeSpec
from tessera.core.errors import InputFileError, InvalidRequestError, UnknownGpuModelError
from tessera.sim.traces.tables import parse_count, read_text
from tessera.sim.workloads.synthetic import apportion

MIB_PER_GIB = 1024
PAI_MACHINE_FILE = "pai_machine_spec.csv"
PAI_COLUMNS = ("machine", "gpu_type", "cap_cpu", "cap_mem", "cap_gpu")

# (count, gpu type as written in the file, cores, memory GiB, GPUs): the shape summary of pai_machine_spec.csv.
PAI_MIX: tuple[tuple[int, str, int, int, int], ...] = (
    (798, "P100", 64, 512, 2),
    (497, "T4", 96, 512, 2),
    (59, "V100", 96, 512, 8),
    (45, "V100", 96, 384, 8),
    (135, "V100M32", 96, 384, 8),
    (280, "MISC", 96, 512, 8),
    (83, "CPU", 96, 512, 0),
)
_CPU_TYPES = frozenset({"CPU"})
_MISC_TYPES = frozenset({"MISC"})


def pai_cluster(
    path: str | Path | None = None,
    max_nodes: int | None = None,
    *,
    misc_gpu_model: str = "G2",
    include_cpu_nodes: bool = False,
) -> list[NodeSpec]:
    """PAI's nodes from ``path`` (or the embedded mix), down to ``max_nodes`` keeping the GPU-model mix."""
    misc = resolve_model(misc_gpu_model).name
    if path is None:
        nodes = _embedded_pai_nodes(misc, include_cpu_nodes)
    else:
        nodes = load_pai_nodes(path, misc_gpu_model=misc, include_cpu_nodes=include_cpu_nodes)
    if not nodes:
        raise InvalidRequestError("pai", "the PAI machine list has no node with GPUs")
    return nodes if max_nodes is None else subsample_nodes(nodes, max_nodes)


def load_pai_nodes(path: str | Path, *, misc_gpu_model: str = "G2", include_cpu_nodes: bool = False) -> list[NodeSpec]:
    """Every machine of a PAI machine list as a ``NodeSpec``; raises ``InputFileError`` for any bad value."""
    name = str(path)
    reader = csv.reader(io.StringIO(read_text(path), newline=""))
    nodes: list[NodeSpec] = []
    seen: dict[str, int] = {}
    try:
        for row in reader:
            if not row:
                continue
            line = reader.line_num
            node = _parse_machine(name, line, row, misc_gpu_model)
            if node.name in seen:
                message = f"duplicate machine {node.name!r} (first on line {seen[node.name]})"
                raise InputFileError(name, line, "machine", message)
            seen[node.name] = line
            if node.gpu_count > 0 or include_cpu_nodes:
                nodes.append(node)
    except csv.Error as exc:
        raise InputFileError(name, reader.line_num or None, None, f"bad CSV: {exc}") from exc
    if not seen:
        raise InputFileError(name, None, None, "empty file: no machines")
    return nodes


def _parse_machine(path: str, line: int, row: list[str], misc_gpu_model: str) -> NodeSpec:
    if len(row) != len(PAI_COLUMNS):
        expected = f"{len(PAI_COLUMNS)} ({', '.join(PAI_COLUMNS)})"
        raise InputFileError(path, line, None, f"{len(row)} fields, expected {expected}")
    machine, gpu_type = row[0].strip(), row[1].strip()
    if not machine:
        raise InputFileError(path, line, "machine", "missing value (a name is required)")
    cores, mem_gib, gpus = (
        parse_count(path, line, col, text) for col, text in zip(PAI_COLUMNS[2:], row[2:], strict=True)
    )
    model = _pai_model(path, line, gpu_type, gpus, misc_gpu_model)
    return NodeSpec(machine, cores * 1000, mem_gib * MIB_PER_GIB, gpus, model)


def _pai_model(path: str, line: int, gpu_type: str, gpus: int, misc_gpu_model: str) -> str | None:
    key = gpu_type.upper()
    if key in _CPU_TYPES:
        if gpus:
            raise InputFileError(path, line, "cap_gpu", f"a CPU machine with {gpus} GPUs")
        return None
    if gpus == 0:
        return None
    if key in _MISC_TYPES:
        return misc_gpu_model
    try:
        return resolve_model(gpu_type).name
    except UnknownGpuModelError as exc:
        raise InputFileError(path, line, "gpu_type", exc.message) from exc


def _embedded_pai_nodes(misc_gpu_model: str, include_cpu_nodes: bool) -> list[NodeSpec]:
    nodes: list[NodeSpec] = []
    for count, gpu_type, cores, mem_gib, gpus in PAI_MIX:
        model = _pai_model("embedded PAI mix", 0, gpu_type, gpus, misc_gpu_model)
        if gpus == 0 and not include_cpu_nodes:
            continue
        for _ in range(count):
            nodes.append(NodeSpec(f"pai-node-{len(nodes):04d}", cores * 1000, mem_gib * MIB_PER_GIB, gpus, model))
    return nodes


# ------------------------------------------------------------------------------------------------- down-scaling


def scale_nodes(nodes: Sequence[NodeSpec], gpu_scale: float) -> list[NodeSpec]:
    """About ``gpu_scale`` of each GPU model's nodes (and of CPU-only nodes), at least one per model; in input order."""
    if not 0 < gpu_scale <= 1:
        raise InvalidRequestError("gpu_scale", f"must be in (0, 1], got {gpu_scale}")
    groups = _groups(nodes)
    keep = {model: max(1, int(gpu_scale * len(group) + 0.5)) for model, group in groups.items()}
    return _pick(nodes, groups, keep)


def subsample_nodes(nodes: Sequence[NodeSpec], max_nodes: int) -> list[NodeSpec]:
    """At most ``max_nodes`` nodes, apportioned to GPU models by node count (largest remainder); in input order."""
    if max_nodes < 1:
        raise InvalidRequestError("max_nodes", f"must be >= 1, got {max_nodes}")
    if len(nodes) <= max_nodes:
        return list(nodes)
    groups = _groups(nodes)
    models = list(groups)
    counts = apportion([len(groups[m]) for m in models], max_nodes)
    return _pick(nodes, groups, dict(zip(models, counts, strict=True)))


def _groups(nodes: Sequence[NodeSpec]) -> dict[str | None, list[int]]:
    """Node indices by GPU model (None: CPU-only), models in order of first appearance."""
    groups: dict[str | None, list[int]] = {}
    for index, node in enumerate(nodes):
        groups.setdefault(node.gpu_model if node.gpu_count > 0 else None, []).append(index)
    return groups


def _pick(
    nodes: Sequence[NodeSpec], groups: dict[str | None, list[int]], keep: dict[str | None, int]
) -> list[NodeSpec]:
    """``keep[model]`` nodes of each group, evenly spaced over the group sorted largest first; in input order."""
    chosen: set[int] = set()
    for model, group in groups.items():
        ordered = sorted(group, key=lambda i: (-nodes[i].gpu_count, -nodes[i].cpu_milli, -nodes[i].mem_mib, i))
        count = min(keep[model], len(ordered))
        # The middle node of each of ``count`` equal strata, except that the first stratum gives its largest node.
        chosen.update(ordered[int((k + 0.5) * len(ordered) / count)] for k in range(1, count))
        chosen.add(ordered[0])
    return [node for index, node in enumerate(nodes) if index in chosen]
