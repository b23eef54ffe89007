"""Workload variants derived from one pod list, to test a placement policy on mixes it was not tuned on.

A variant changes the pod list in three seeded steps, in this order (each one optional):

1. **CPU-only pods** (``cpu_only_factor``): below 1, a random ``1 - factor`` of the CPU-only pods is dropped; above 1,
   random copies of CPU-only pods (uniform, with replacement) are added until there are ``factor`` times as many.
2. **Multi-GPU pods** (``multi_gpu_share``): random pods with one GPU (whole or shared) are replaced, one at a time,
   by copies of random multi-GPU pods of the list, until multi-GPU pods ask for at least that share of the list's
   total GPU request (milli). The pod count stays; the default list's share is 7.3%.
3. **GPU-type constraints** (``constrained_share``): that share of the GPU pods, drawn at random, may run only on
   one GPU type. The type is drawn with probability proportional to the type's GPUs in the cluster (the popular
   types get most constrained pods, so demand roughly follows capacity), among the types with a node that could
   host the pod when empty (enough GPUs, CPU and memory); a pod no type could host is left unconstrained.

Every draw comes from one ``numpy`` generator seeded with ``VARIANT_SEED`` and the variant's name, so a variant is
the same pod list on every run and machine. ``TUNING`` and ``HELD_OUT`` split the variants: policies are tuned
on ``TUNING`` only; ``HELD_OUT`` holds one variant of each kind, at levels the tuning set does not have, and a
combination of all three.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tessera.core.cluster import NodeSpec
from tessera.core.workload import Request

VARIANT_SEED = 2024


@dataclass(frozen=True, slots=True)
class Variant:
    name: str
    constrained_share: float = 0.0  # share of GPU pods limited to one GPU type
    multi_gpu_share: float = 0.0  # least share of the GPU request from multi-GPU pods (0: as in the list)
    cpu_only_factor: float = 1.0  # CPU-only pods: this many times as many


TUNING: tuple[Variant, ...] = (
    Variant("spec10", constrained_share=0.10),
    Variant("spec33", constrained_share=0.33),
    Variant("multi20", multi_gpu_share=0.20),
    Variant("multi50", multi_gpu_share=0.50),
    Variant("cpu50", cpu_only_factor=0.5),
    Variant("cpu200", cpu_only_factor=2.0),
    Variant("spec20+multi35", constrained_share=0.20, multi_gpu_share=0.35),
    Variant("spec33+cpu200", constrained_share=0.33, cpu_only_factor=2.0),
)
HELD_OUT: tuple[Variant, ...] = (
    Variant("spec25", constrained_share=0.25),
    Variant("multi35", multi_gpu_share=0.35),
    Variant("cpu150", cpu_only_factor=1.5),
    Variant("spec15+multi25+cpu50", constrained_share=0.15, multi_gpu_share=0.25, cpu_only_factor=0.5),
)
VARIANTS: dict[str, Variant] = {v.name: v for v in TUNING + HELD_OUT}


def derive(variant: Variant, requests: Sequence[Request], nodes: Sequence[NodeSpec]) -> list[Request]:
    """The variant of ``requests`` (on the cluster ``nodes``, whose GPU types the constraints draw from)."""
    digest = hashlib.sha256(variant.name.encode()).digest()
    rng = np.random.default_rng([VARIANT_SEED, int.from_bytes(digest[:8], "little")])
    pods = _scale_cpu_only(list(requests), variant.cpu_only_factor, rng)
    pods = _raise_multi_gpu(pods, variant.multi_gpu_share, rng)
    return _constrain(pods, variant.constrained_share, nodes, rng)


def multi_gpu_share(requests: Sequence[Request]) -> float:
    """Share of the total GPU request (milli) that multi-GPU pods ask for."""
    total = sum(r.total_gpu_milli for r in requests)
    return sum(r.total_gpu_milli for r in requests if r.num_gpus > 1) / total if total else 0.0


def _scale_cpu_only(pods: list[Request], factor: float, rng: np.random.Generator) -> list[Request]:
    cpu_only = [i for i, r in enumerate(pods) if r.num_gpus == 0]
    if factor == 1.0 or not cpu_only:
        return pods
    if factor < 1.0:
        drop = set(rng.choice(cpu_only, size=round((1.0 - factor) * len(cpu_only)), replace=False).tolist())
        return [r for i, r in enumerate(pods) if i not in drop]
    extra = rng.choice(cpu_only, size=round((factor - 1.0) * len(cpu_only)), replace=True)
    return pods + [pods[i] for i in extra]


def _raise_multi_gpu(pods: list[Request], share: float, rng: np.random.Generator) -> list[Request]:
    multi = [r for r in pods if r.num_gpus > 1]
    if share <= 0.0 or not multi:
        return pods
    pods = list(pods)
    single = [i for i, r in enumerate(pods) if r.num_gpus == 1]
    order = rng.permutation(len(single))
    total = sum(r.total_gpu_milli for r in pods)
    multi_milli = sum(r.total_gpu_milli for r in multi)
    for k in order:
        if multi_milli >= share * total:
            break
        i = single[int(k)]
        copy = multi[int(rng.integers(len(multi)))]
        total += copy.total_gpu_milli - pods[i].total_gpu_milli
        multi_milli += copy.total_gpu_milli
        pods[i] = copy
    return pods


def _constrain(pods: list[Request], share: float, nodes: Sequence[NodeSpec], rng: np.random.Generator) -> list[Request]:
    gpu_pods = [i for i, r in enumerate(pods) if r.num_gpus > 0]
    if share <= 0.0 or not gpu_pods:
        return pods
    gpus_of: Counter[str] = Counter()
    for node in nodes:
        if node.gpu_count and node.gpu_model:
            gpus_of[node.gpu_model] += node.gpu_count
    types = sorted(gpus_of)
    weight = np.array([gpus_of[t] for t in types], dtype=np.float64)
    model = np.array([n.gpu_model for n in nodes])
    count = np.array([n.gpu_count for n in nodes])
    cpu = np.array([n.cpu_milli for n in nodes])
    mem = np.array([n.mem_mib for n in nodes])
    hostable: dict[tuple[int, int, int], npt.NDArray[np.bool_]] = {}
    pods = list(pods)
    for i in rng.choice(gpu_pods, size=round(share * len(gpu_pods)), replace=False):
        pod = pods[int(i)]
        key = (pod.num_gpus, pod.cpu_milli, pod.mem_mib)
        if key not in hostable:  # the types with a node that could host the pod when empty
            fits = (count >= pod.num_gpus) & (cpu >= pod.cpu_milli) & (mem >= pod.mem_mib)
            hostable[key] = np.array([bool((fits & (model == t)).any()) for t in types])
        can = hostable[key]
        if not can.any():
            continue
        p = np.where(can, weight, 0.0)
        chosen = types[int(rng.choice(len(types), p=p / p.sum()))]
        pods[int(i)] = dataclasses.replace(pod, gpu_types=frozenset({chosen}))
    return pods
