"""GPU fragmentation measured against a target workload of "typical pods" (the FGD paper's definition).

A node's fragmentation is ``F_n = sum_m p_m * frag_n(m)`` over typical pods ``m`` with popularity ``p_m``:

- if ``m`` asks for no GPU, or the node's GPU type is not allowed for ``m``, or ``m``'s GPUs do not fit the node,
  or the node lacks the CPU for ``m``: every idle GPU milli of the node is a fragment for ``m``;
- otherwise only the idle milli of GPUs whose free share is below ``m``'s per-GPU share is.

Host memory is ignored. Used by the FGD and Tessera placement policies (to score a candidate placement by how much
fragmentation it adds) and by the simulator (to report cluster fragmentation after every arrival).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tessera.core.workload import Request

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class TypicalPod:
    cpu_milli: int
    num_gpus: int
    gpu_milli: int
    gpu_types: frozenset[str]  # empty = any model
    popularity: float  # share of the target workload, the kept pods sum to 1
    mem_mib: int = 0  # mean host memory of the requests of this shape (0 = not known); FGD's measure ignores it


Shape = tuple[int, int, int, frozenset[str]]  # (scoring CPU milli, num_gpus, gpu_milli, gpu_types)


def shape_of(request: Request) -> Shape:
    """The key typical pods are grouped by."""
    return (request.scoring_cpu_milli, request.num_gpus, request.gpu_milli, request.gpu_types)


def typical_pods(requests: Iterable[Request], coverage: float = 0.95) -> tuple[TypicalPod, ...]:
    """The most popular request shapes covering at least ``coverage`` of ``requests``, renormalised.

    Shapes are grouped by (scoring CPU, num_gpus, gpu_milli, gpu_types); popularity ties are broken by larger CPU,
    then larger share, then more GPUs, then type names, so the cut is deterministic.
    """
    counts: Counter[Shape] = Counter()
    mem: Counter[Shape] = Counter()
    for r in requests:
        shape = shape_of(r)
        counts[shape] += 1
        mem[shape] += r.mem_mib
    return typical_pods_from_counts(counts, coverage, mem)


def typical_pods_from_counts(
    counts: Counter[Shape], coverage: float = 0.95, mem_totals: Counter[Shape] | None = None
) -> tuple[TypicalPod, ...]:
    """``typical_pods`` from a tally of shapes (what an online learner keeps); ``mem_totals``: summed host memory
    per shape, for the pods' mean memory."""
    total = sum(counts.values())
    if total == 0:
        return ()
    kept: list[tuple[Shape, int]] = []
    covered = 0
    ordered = sorted(
        counts.items(), key=lambda item: (-item[1], -item[0][0], -item[0][2], -item[0][1], sorted(item[0][3]))
    )
    for shape, count in ordered:
        kept.append((shape, count))
        covered += count
        if covered >= coverage * total:
            break
    mem = mem_totals if mem_totals is not None else Counter()
    return tuple(
        TypicalPod(c, n, g, t, count / covered, round(mem[(c, n, g, t)] / count)) for (c, n, g, t), count in kept
    )


class FragmentationModel:
    """Vectorised node fragmentation for one target workload on one cluster's model list."""

    def __init__(self, pods: Sequence[TypicalPod], model_names: Sequence[str]) -> None:
        self.pods = tuple(pods)
        gpu_pods = [p for p in self.pods if p.num_gpus > 0]
        # Idle GPU milli counts fully for CPU-only typical pods: fold them into one constant weight.
        self._cpu_only_weight = sum(p.popularity for p in self.pods if p.num_gpus == 0)
        self._thresholds: IntArray = np.array(sorted({p.gpu_milli for p in gpu_pods}), dtype=np.int64)
        threshold_index = {int(t): i for i, t in enumerate(self._thresholds)}
        self._pod_threshold: IntArray = np.array([threshold_index[p.gpu_milli] for p in gpu_pods], dtype=np.int64)
        self._pod_cpu: IntArray = np.array([p.cpu_milli for p in gpu_pods], dtype=np.int64)
        self._pod_mem: IntArray = np.array([p.mem_mib for p in gpu_pods], dtype=np.int64)
        self._pod_gpus: IntArray = np.array([p.num_gpus for p in gpu_pods], dtype=np.int64)
        self._pod_weight: FloatArray = np.array([p.popularity for p in gpu_pods], dtype=np.float64)
        # allowed[model, pod]; the trailing model row is "no GPU" and allows nothing.
        allowed = np.zeros((len(model_names) + 1, len(gpu_pods)), dtype=np.bool_)
        for j, pod in enumerate(gpu_pods):
            for i, model in enumerate(model_names):
                allowed[i, j] = not pod.gpu_types or model in pod.gpu_types
        self._allowed = allowed

    def node_frag(
        self, cpu_free: IntArray, gpu_free: IntArray, model_idx: IntArray, mem_free: IntArray | None = None
    ) -> FloatArray:
        """Fragmentation (milli-GPU) of K node states: ``cpu_free[K]``, ``gpu_free[K, G]``, ``model_idx[K]``.
        FGD's measure ignores ``mem_free`` (free host memory); models that add terms may use it."""
        idle = gpu_free.sum(axis=1).astype(np.float64)
        frag: FloatArray = idle * self._cpu_only_weight
        if self._pod_weight.size == 0:
            return frag
        # For each distinct per-GPU share t: how many GPUs have >= t free, and the idle milli on the others.
        fits_share = gpu_free[:, None, :] >= self._thresholds[None, :, None]  # K x T x G
        gpus_fitting = fits_share.sum(axis=2)
        milli_too_small = idle[:, None] - np.where(fits_share, gpu_free[:, None, :], 0).sum(axis=2)
        fits = (
            (gpus_fitting[:, self._pod_threshold] >= self._pod_gpus[None, :])
            & (cpu_free[:, None] >= self._pod_cpu[None, :])
            & self._allowed[model_idx]
        )  # K x M
        per_pod = np.where(fits, milli_too_small[:, self._pod_threshold], idle[:, None])
        frag = frag + np.asarray(per_pod @ self._pod_weight, dtype=np.float64)
        return frag

    def cpu_stranded(
        self, cpu_free: IntArray, gpu_free: IntArray, model_idx: IntArray, mem_free: IntArray | None = None
    ) -> FloatArray:
        """Idle GPU milli the node's free CPU (and host memory) could not feed, averaged over the typical GPU pods.

        For typical pod ``m`` the node's CPU admits ``cpu_free // cpu_m`` more such pods (and its memory, when
        ``mem_free`` is given and ``m`` states memory, ``mem_free // mem_m``), which can use at most that many times
        ``m``'s GPU request; whatever idle GPU milli is left beyond that is stranded for ``m``.
        """
        idle = gpu_free.sum(axis=1).astype(np.float64)
        if self._pod_weight.size == 0:
            return np.zeros_like(idle)
        pods_fed = cpu_free[:, None] // np.maximum(self._pod_cpu[None, :], 1)
        if mem_free is not None:
            by_mem = mem_free[:, None] // np.maximum(self._pod_mem[None, :], 1)
            pods_fed = np.where(self._pod_mem[None, :] > 0, np.minimum(pods_fed, by_mem), pods_fed)
        gpu_each = (self._thresholds[self._pod_threshold] * self._pod_gpus).astype(np.float64)
        stranded = np.maximum(idle[:, None] - pods_fed * gpu_each[None, :], 0.0)
        stranded = np.where(self._allowed[model_idx], stranded, 0.0)
        return np.asarray(stranded @ self._pod_weight, dtype=np.float64)


def random_fill_waste(pods: Sequence[TypicalPod]) -> FloatArray:
    """``waste[r]``: expected milli of a GPU with ``r`` milli free that typical pods never fill.

    Model: pods keep arriving with the typical popularity; each one that fits the GPU's remaining share lands
    on it, until none fits. ``waste[r] = r`` when no typical share fits ``r``; otherwise the popularity-weighted mean
    of ``waste[r - share]`` over the shares that fit. Whole-GPU pods count as a share of 1000.
    """
    gpu_pods = [p for p in pods if p.num_gpus > 0 and p.gpu_milli > 0]
    shares = np.array([min(p.gpu_milli, 1000) for p in gpu_pods], dtype=np.int64)
    weights = np.array([p.popularity for p in gpu_pods], dtype=np.float64)
    waste = np.zeros(1001)
    for r in range(1, 1001):
        fit = shares <= r
        total = weights[fit].sum()
        waste[r] = weights[fit] @ waste[r - shares[fit]] / total if total > 0 else r
    return waste
