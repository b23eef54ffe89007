"""Tessera's default placement: FGD's fragmentation descent, made CPU-, memory- and sliver-aware and priced.

The node measure ``F`` adds four terms to FGD's fragmentation against the typical pods:

- **Gap prices** (``gap_prices``): each GPU's free share is charged the milli the sharing mix could not use in its
  best packing, at the dual prices of the fluid bin-packing LP of the typical pods' shares (weight 12). Unlike the
  terms below it sees how scarce each share is: the 190 milli an 810 leaves is waste when 160s are rare, and a
  share that would break a combination the mix fills exactly (two 300s in a 600) costs what that combination loses.
- **CPU stranding**: idle GPU milli that the node's free CPU and host memory could not feed, averaged over the
  typical GPU pods. FGD counts a GPU as usable for a typical pod as long as the node has that pod's CPU *once*; a
  node with eight free GPUs and twelve free cores will in fact host one or two more pods, not eight. Charging the
  stranded milli steers CPU-heavy pods (CPU-only ones above all) to CPU-rich nodes and keeps CPU where GPUs need it.
  A typical pod's memory is the mean memory of the requests of its shape.
- **Joint fill waste** (``joint_waste``): for each typical pod, the idle milli left if only that pod kept arriving
  until the node's GPUs (counted per GPU) or its CPU ran out; averaged over the typical pods.
- **Sliver waste**: for each GPU, the expected milli that typical pods would never fill if they kept arriving at
  random (``random_fill_waste``). FGD only asks whether the next pod fits a GPU; this looks down the whole sequence
  of shares that could still land there, so a remainder that only rare small pods can use counts as waste.

A placement's score is the raw decrease ``F_before - F_after`` (higher is better): unlike FGD's integer sigmoid,
close candidates are not lumped into ties. On top, at decision time, a placement that takes away one of the last
nodes able to host a multi-GPU shape seen so far pays for it (``placement.reserve``, weight 100). One parameter set
serves every workload.

``online=True`` learns the typical pods from the requests it is asked to place instead of being given them: it
refits after 64, 128, ... 1,024 requests and then every 1,024 (each refit re-solves the LP, under 10 ms idle), and
bumps ``model_version`` so the engine drops its cached scores. Until the first refit it has no workload model and
places on the first feasible node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tessera.core.cluster import ClusterState, IntArray
from tessera.core.fragmentation import (
    FloatArray,
    FragmentationModel,
    Shape,
    TypicalPod,
    random_fill_waste,
    shape_of,
    typical_pods_from_counts,
)
from tessera.core.gap_prices import typical_gap_waste
from tessera.core.placement import tessera_jit, tessera_scores
from tessera.core.placement.base import NodeScores
from tessera.core.placement.fgd import FgdPolicy
from tessera.core.placement.reserve import MAX_SHAPE_BITS, ShapeReserve
from tessera.core.placement.type_pressure import TypePressure
from tessera.core.workload import MILLI_PER_GPU, Request

DEDUP_FROM = 256  # node_frag measures each distinct node state once in batches of at least this many nodes


@dataclass(frozen=True, slots=True)
class TesseraParams:
    cpu_stranding_weight: float = 2.0  # weight of GPU milli the node's CPU cannot feed
    sliver_weight: float = 1.0  # weight of the expected never-filled milli per GPU
    gap_price_weight: float = 12.0  # weight of each GPU's gap waste at the sharing mix's LP prices (gap_prices)
    reserve_weight: float = 100.0  # weight of the charge for taking one of the last hosts of a multi-GPU shape
    joint_weight: float = 0.5  # weight of the idle milli a run of one typical pod would leave (GPU and CPU)
    type_pressure_weight: float = 1.0  # weight of the charge for taking GPU types that constrained pods need
    memory: bool = True  # host memory, like CPU, limits how many typical pods a node can still feed
    coverage: float = 0.95  # share of requests the typical pods cover (as FGD)
    first_refit: int = 64  # online mode: requests seen before the first model
    refit_every: int = 1024  # online mode: refit period once past the doubling phase


def _weighted(values: npt.NDArray[np.float64] | IntArray, weight: FloatArray) -> FloatArray:
    """``values @ weight`` row by row, summed in the same order whatever the number of rows.

    A BLAS matrix-vector product may round a row differently depending on how many rows it is given (it blocks
    rows), so the same node could score a unit in the last place apart when scored alone or with others; equally
    good nodes would then not tie, and cached scores would differ from fresh ones.
    """
    return np.asarray(np.einsum("km,m->k", values, weight), dtype=np.float64)


def _waste_table(pods: Sequence[TypicalPod], params: TesseraParams) -> FloatArray:
    """``waste[free]``: the weighted sliver and gap waste of a GPU with ``free`` milli, for the mix ``pods``."""
    waste = params.sliver_weight * random_fill_waste(pods)
    if params.gap_price_weight:
        waste = waste + params.gap_price_weight * typical_gap_waste(pods)
    return np.asarray(waste, dtype=np.float64)


class TesseraFragmentation(FragmentationModel):
    """FGD's node fragmentation plus gap-price waste, CPU stranding, joint fill waste and expected sliver waste, in
    milli-GPU."""

    def __init__(self, pods: Sequence[TypicalPod], model_names: Sequence[str], params: TesseraParams) -> None:
        super().__init__(pods, model_names)
        self.params = params
        # Both per-GPU waste tables in one, so that a node costs one lookup per GPU.
        self._gpu_waste = _waste_table(pods, params)
        # _fit_counts[free, t]: how many pods of the t-th distinct per-GPU share fit a GPU with ``free`` milli.
        free = np.arange(MILLI_PER_GPU + 1)[:, None]
        self._fit_counts = (free // np.maximum(self._thresholds[None, :], 1)).astype(np.int64)
        # _fit_packed: that count, whether the share fits at all and the free milli if it does, in one integer so
        # that one sum over a node's GPUs gives all three (fields of 16, 16 and 32 bits).
        fits = free >= self._thresholds[None, :]
        self._fit_packed = self._fit_counts | (fits.astype(np.int64) << 16) | (np.where(fits, free, 0) << 32)
        # The same per typical pod (its share's column), and what the fit field must reach for the pod's GPUs.
        self._fit_packed_pod = np.ascontiguousarray(self._fit_packed[:, self._pod_threshold])
        self._gpus_field = self._pod_gpus << 16
        self._cpu_each = np.maximum(self._pod_cpu, 1)
        self._mem_each = np.maximum(self._pod_mem, 1)
        self._mem_known = self._pod_mem > 0
        self._gpu_each = (self._thresholds[self._pod_threshold] * self._pod_gpus).astype(np.float64)
        self._positive_shares = bool((self._thresholds > 0).all())  # a zero share fits a GPU with 0 free
        self._all_mem_known = bool(self._mem_known.all())
        self._gpu_each_int = self._thresholds[self._pod_threshold] * self._pod_gpus
        joint_idle = params.joint_weight * self._pod_weight.sum() if params.joint_weight else 0.0
        self._idle_weight = self._cpu_only_weight + joint_idle
        self.kernel_tables = self._kernel_tables()

    def _kernel_tables(self) -> tessera_jit.Tables | None:
        """The fused measure's tables for the compiled scoring (``tessera_jit``), or ``None`` when the fused
        measure does not apply (no typical GPU pod, or a zero share)."""
        if self._pod_weight.size == 0 or not self._positive_shares:
            return None
        p = self.params
        pods = np.zeros((7, self._pod_weight.size), dtype=np.int64)
        pods[tessera_jit.POD_GPUS_FIELD] = self._gpus_field
        pods[tessera_jit.POD_CPU] = self._pod_cpu
        pods[tessera_jit.POD_CPU_EACH] = self._cpu_each
        pods[tessera_jit.POD_MEM_EACH] = self._mem_each
        pods[tessera_jit.POD_MEM_KNOWN] = self._mem_known
        pods[tessera_jit.POD_GPU_EACH] = self._gpu_each_int
        pods[tessera_jit.POD_GPUS] = self._pod_gpus
        return tessera_jit.Tables(
            fit_packed_pod=self._fit_packed_pod,
            pods=pods,
            allowed=np.ascontiguousarray(self._allowed),
            gpu_waste=self._gpu_waste,
            weights=np.array([p.cpu_stranding_weight, p.joint_weight, self._idle_weight], dtype=np.float64),
            pod_weight=self._pod_weight,
            use_mem=p.memory,
            all_mem_known=self._all_mem_known,
        )

    def node_frag(
        self, cpu_free: IntArray, gpu_free: IntArray, model_idx: IntArray, mem_free: IntArray | None = None
    ) -> FloatArray:
        """``F`` of K node states; ``mem_free`` (free host memory) feeds the stranding term when given."""
        if self._pod_weight.size == 0 or not self._positive_shares:
            return self._node_frag_unfused(cpu_free, gpu_free, model_idx, mem_free)
        if cpu_free.size >= DEDUP_FROM:
            # Many nodes of a large batch are in the same state (idle nodes of one kind above all): measure each
            # distinct state once. Exact, since a node's F does not depend on the nodes measured with it.
            mem = mem_free if mem_free is not None else np.zeros_like(cpu_free)
            rows = np.ascontiguousarray(np.column_stack([cpu_free, mem, model_idx, gpu_free]), dtype=np.int64)
            keys = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
            _, first, back = np.unique(keys, return_index=True, return_inverse=True)
            if first.size <= cpu_free.size // 2:
                at = first
                distinct = self._node_frag_fused(
                    cpu_free[at], gpu_free[at], model_idx[at], mem_free[at] if mem_free is not None else None
                )
                return np.asarray(distinct[back.ravel()], dtype=np.float64)
        return self._node_frag_fused(cpu_free, gpu_free, model_idx, mem_free)

    def _node_frag_fused(
        self, cpu_free: IntArray, gpu_free: IntArray, model_idx: IntArray, mem_free: IntArray | None
    ) -> FloatArray:
        p = self.params
        # FGD's measure (FragmentationModel.node_frag, the same arithmetic), CPU stranding (cpu_stranded, with
        # memory) and the joint fill waste, sharing one table lookup of how many of each share fit each GPU, and
        # summed over the typical pods in one weighted sum: sum_m p_m (fgd_m + w_s stranded_m - w_j used_m),
        # with the joint term's idle part (w_j idle sum_m p_m) folded into the per-node constant.
        idle_int = gpu_free.sum(axis=1)
        idle = idle_int.astype(np.float64)
        idle_col, cpu_col = idle_int[:, None], cpu_free[:, None]
        allowed = self._allowed[model_idx]
        packed = self._fit_packed_pod[gpu_free].sum(axis=1)  # K x M
        cpu_fit = cpu_col // self._cpu_each
        # (packed & 0xFFFF0000) is the fit field alone: at least the pod's GPUs fit its share.
        fits = ((packed & 0xFFFF0000) >= self._gpus_field) & (cpu_col >= self._pod_cpu) & allowed
        per_pod = idle_col - np.where(fits, packed >> 32, 0)
        fed = cpu_fit
        if mem_free is not None and p.memory:
            by_mem = mem_free[:, None] // self._mem_each
            fed = (
                np.minimum(cpu_fit, by_mem)
                if self._all_mem_known
                else np.where(self._mem_known, np.minimum(cpu_fit, by_mem), cpu_fit)
            )
        extra = p.cpu_stranding_weight * np.maximum(idle_col - fed * self._gpu_each_int, 0)
        if p.joint_weight:
            used = np.minimum((packed & 0xFFFF) // self._pod_gpus, cpu_fit) * self._gpu_each_int
            extra = extra - p.joint_weight * used
        terms = per_pod + np.where(allowed, extra, 0.0)
        frag = idle * self._idle_weight + _weighted(terms, self._pod_weight)
        return np.asarray(frag + self._gpu_waste[gpu_free].sum(axis=1), dtype=np.float64)

    def _node_frag_unfused(
        self, cpu_free: IntArray, gpu_free: IntArray, model_idx: IntArray, mem_free: IntArray | None
    ) -> FloatArray:
        p = self.params
        frag = super().node_frag(cpu_free, gpu_free, model_idx)
        frag = frag + self._gpu_waste[np.clip(gpu_free, 0, MILLI_PER_GPU)].sum(axis=1)
        if self._pod_weight.size == 0:
            return np.asarray(frag, dtype=np.float64)
        stranded = self.cpu_stranded(cpu_free, gpu_free, model_idx, mem_free if p.memory else None)
        frag = frag + p.cpu_stranding_weight * stranded
        if p.joint_weight:
            frag = frag + p.joint_weight * self.joint_waste(cpu_free, gpu_free, model_idx)
        return np.asarray(frag, dtype=np.float64)

    def joint_waste(self, cpu_free: IntArray, gpu_free: IntArray, model_idx: IntArray) -> FloatArray:
        """Idle milli left if only typical pod ``m`` kept arriving until no GPU or no CPU fits it, averaged over ``m``.

        Unlike the stranding term it counts the GPUs pod ``m`` fits one by one (three 300-milli pods on a free GPU
        leave 100), and unlike FGD's measure it counts how many more of ``m`` the CPU admits.
        """
        idle = gpu_free.sum(axis=1).astype(np.float64)
        if self._pod_weight.size == 0:
            return np.zeros_like(idle)
        cpu_fit = cpu_free[:, None] // self._cpu_each[None, :]
        pods_per_share = self._fit_counts[gpu_free].sum(axis=1)
        return self._joint(idle, self._allowed[model_idx], cpu_fit, pods_per_share)

    def _joint(
        self, idle: FloatArray, allowed: npt.NDArray[np.bool_], cpu_fit: IntArray, pods_per_share: IntArray
    ) -> FloatArray:
        """``joint_waste`` from ``pods_per_share[K, T]``: how many pods of each distinct share the node's GPUs fit."""
        gpu_fit = pods_per_share[:, self._pod_threshold] // self._pod_gpus[None, :]
        used = np.where(allowed, np.minimum(gpu_fit, cpu_fit) * self._gpu_each[None, :], 0.0)
        return np.asarray(idle * self._pod_weight.sum() - _weighted(used, self._pod_weight), dtype=np.float64)


class TesseraPolicy(FgdPolicy):
    name = "tessera"

    def __init__(
        self,
        typical: Sequence[TypicalPod],
        model_names: Sequence[str],
        *,
        online: bool = False,
        params: TesseraParams = TesseraParams(),
        cached: bool = True,
    ) -> None:
        self.params = params
        # cached=False scores every node afresh on every decision: the reference the caches must agree with.
        self.cached = cached
        self.node_local = cached
        self._known = tessera_scores.NodeFrag()  # F of each node as it is now, shared by every request shape
        # The compiled scoring (tessera_jit; None without numba), compiled or loaded now, not in a decision.
        self.kernels = tessera_jit.compiled() if cached else None
        self._lost = tessera_scores.LostShapes()  # per request and node: the reserve's shapes it would stop hosting
        self.online = online
        self._model_names = tuple(model_names)
        self._seen: Counter[Shape] = Counter()
        self._seen_mem: Counter[Shape] = Counter()  # summed host memory per shape
        self._requests_seen = 0
        self.model_version = 0
        self.reserve = ShapeReserve(params.reserve_weight)
        self.reserve.kernels = self.kernels
        self.type_pressure = TypePressure(params.type_pressure_weight)
        super().__init__(TesseraFragmentation(() if online else typical, model_names, params))
        if online:
            self.name = "tessera-online"

    def use_kernels(self, kernels: tessera_jit.Kernels | None) -> None:
        """Score with ``kernels`` (``None``: the NumPy code); the tests compare them."""
        self.kernels = self.reserve.kernels = kernels

    def delta_score(self, before: FloatArray, after: FloatArray) -> FloatArray:
        return before - after

    def adjust(
        self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray, scored: NodeScores
    ) -> FloatArray:
        score = scored.score
        type_charge = self.type_pressure.charge(state, request, nodes, need_milli)
        if type_charge is not None:
            score = score - type_charge
        if not self.cached:
            return score - self.reserve.charge(state, request, nodes, need_milli, scored.gpu)
        if not self.reserve.weight or not self.reserve.shapes or nodes.size == 0:
            return score
        bits, shapes_known = self._lost.arrays(state, request)

        def lost_of(which: IntArray) -> IntArray | None:
            """The reserve's lost shapes of ``nodes[which]`` (kept by ``score_nodes``), completed for shapes
            learnt since."""
            at = nodes[which]
            behind = (shapes_known[at] != self.reserve.shapes).nonzero()[0]
            if behind.size:
                late, pos = at[behind], which[behind]
                taken = self.reserve.whole_gpus_taken(
                    request, state.gpu_free_milli[late], need_milli[pos], scored.gpu[pos]
                )
                fresh = self.reserve.lost_bits(state, request, late, taken)
                if fresh is None:
                    return None
                bits[late] = fresh
                shapes_known[late] = self.reserve.shapes
            return bits[at]

        if self.kernels is not None and self.reserve.shapes <= MAX_SHAPE_BITS:
            return self._adjust_compiled(self.kernels, state, score, nodes, bits, shapes_known, lost_of)
        final = self.reserve.adjust_best_bits(state, lost_of, score)
        if final is None:  # more shapes than bits
            return self.reserve.adjust_best(state, request, nodes, need_milli, score, scored.gpu)
        return final

    def _adjust_compiled(
        self,
        kernels: tessera_jit.Kernels,
        state: ClusterState,
        score: FloatArray,
        nodes: IntArray,
        bits: IntArray,
        shapes_known: IntArray,
        lost_of: Callable[[IntArray], IntArray | None],
    ) -> FloatArray:
        """``ShapeReserve.adjust_best_bits`` with the kept ``bits``, choosing the nodes to charge in compiled loops
        (``reserve_jit.charge_candidates``); ``lost_of`` completes the bits of nodes kept before the reserve
        learnt its last shapes (at most ``MAX_SHAPE_BITS`` shapes: it never returns ``None`` here)."""
        shapes, no_top = self.reserve.shapes, tessera_scores.NO_POSITIONS
        _, top, top_bits, status = kernels.charge_candidates(score, nodes, bits, shapes_known, shapes, no_top, score)
        if status < 0:
            top_bits = lost_of(top)
            assert top_bits is not None
            status = int(top_bits.any())
        if status == 0:
            return score
        charge = self.reserve.charge_bits(state, top_bits)
        final, rest, rest_bits, status = kernels.charge_candidates(
            score, nodes, bits, shapes_known, shapes, top, charge
        )
        if status < 0:
            rest_bits = lost_of(rest)
            assert rest_bits is not None
            status = int(rest_bits.any())
        if status > 0:
            final[rest] = score[rest] - self.reserve.charge_bits(state, rest_bits)
        return np.asarray(final, dtype=np.float64)

    def score_nodes(self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray) -> NodeScores:
        if not self.cached:
            return super().score_nodes(state, request, nodes, need_milli)
        with_reserve = self.reserve.weight > 0
        return tessera_scores.score_nodes(
            self.frag,
            self._known,
            state,
            request,
            nodes,
            need_milli,
            self.reserve if with_reserve else None,
            self._lost if with_reserve else None,
            self.kernels,
        )

    def observe(self, request: Request) -> None:
        self.reserve.observe(request)
        self.type_pressure.observe(request)
        if not self.online:
            return
        shape = shape_of(request)
        self._seen[shape] += 1
        self._seen_mem[shape] += request.mem_mib
        self._requests_seen += 1
        if self._due_for_refit(self._requests_seen):
            pods = typical_pods_from_counts(self._seen, self.params.coverage, self._seen_mem)
            self.frag = TesseraFragmentation(pods, self._model_names, self.params)
            self.model_version += 1
            self._known = tessera_scores.NodeFrag()  # F changed with the model

    def _due_for_refit(self, seen: int) -> bool:
        first, every = self.params.first_refit, self.params.refit_every
        if seen < first:
            return False
        if seen <= every:
            return seen & (seen - 1) == 0  # 64, 128, ..., 1024
        return seen % every == 0
