"""Keep hosts for multi-GPU pods: do not spend the last nodes that can take a big shape on small pods.

Fragmentation terms look at the typical pods, and multi-GPU pods are rarely among them. On the openb trace, five of
8,152 pods ask for eight GPUs and 120 cores: only the 39 G3 nodes (8 GPUs, 128 cores) can take them, and those are
also the nodes that CPU-heavy single-GPU pods fit best. Left alone, tessera spent every G3 node on such pods before
10% of the trace had arrived, and each later 8-GPU, 120-core pod was rejected.

``ShapeReserve`` learns the multi-GPU shapes (GPUs, CPU, memory, GPU types) from the requests it sees. For each
candidate node it charges, per shape ``m`` that the node can host now but not after the placement,
``p_m * 1000 * g_m / N_m``: ``p_m`` is the share of the requests seen that had shape ``m``, ``g_m`` its GPUs and
``N_m`` how many nodes can host it now. Losing one of few hosts of a shape costs much, one of many little. The
charge depends on the whole cluster (``N_m``), so it is added at decision time on top of the engine's cached
node-local scores (``PlacementPolicy.adjust``); which nodes can host each shape is kept per node and refreshed only
for nodes whose version changed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from tessera.core.cluster import ClusterState, IntArray
from tessera.core.fragmentation import FloatArray
from tessera.core.placement import tessera_jit
from tessera.core.placement.base import NO_GPU_CHOICE
from tessera.core.workload import MILLI_PER_GPU, Request

BigShape = tuple[int, int, int, frozenset[str]]  # (GPUs, CPU milli, memory MiB, GPU types)
_NO_NODES = np.zeros(0, dtype=np.int64)
MAX_SHAPE_BITS = 62  # lost_bits packs the shapes into one int64 per node
FEW = 4  # up to this many nodes, plain Python beats a dozen NumPy calls on tiny arrays


class ShapeReserve:
    """Learns multi-GPU shapes from arrivals and charges placements that take away one of their last hosts."""

    def __init__(self, weight: float, min_gpus: int = 2) -> None:
        self.weight = weight
        self.min_gpus = min_gpus
        self._index: dict[BigShape, int] = {}  # shape -> its row
        self._requests_seen = 0
        self._shapes: list[BigShape] = []
        # Derived from _shapes and the cluster, rebuilt when a new shape appears or the cluster changes:
        self._hosts: npt.NDArray[np.bool_] | None = None  # [shape, node]: can host the shape now
        self._allowed: npt.NDArray[np.bool_] | None = None  # [shape, model]: may run on that GPU model
        self._seen_version: IntArray | None = None
        self._state: ClusterState | None = None
        self._gpus = self._cpu = self._mem = np.zeros(0, dtype=np.int64)  # per shape
        self._count_of_shape = np.zeros(0)  # requests seen per shape
        self._host_count = np.zeros(0, dtype=np.int64)  # per shape: how many nodes can host it now
        self._bit_index = np.arange(MAX_SHAPE_BITS, dtype=np.int64)
        self._bit = np.left_shift(1, self._bit_index)
        self._host_bits = np.zeros(0, dtype=np.int64)  # per node: the shapes it can host now, as bits
        self._allowed_bits: list[int] = []  # per GPU model: the shapes that may run on it, as bits
        self._shape_needs: list[tuple[int, int, int]] = []  # per shape: (GPUs, CPU milli, memory MiB)
        self._needs = np.zeros((0, 3), dtype=np.int64)  # the same as an array, and _allowed_bits, for the kernels
        self._allowed_bits_array = np.zeros(0, dtype=np.int64)
        # The compiled loops (tessera_jit) that refresh the hosted shapes and find the lost ones; None: NumPy.
        self.kernels: tessera_jit.Kernels | None = None

    def observe(self, request: Request) -> None:
        self._requests_seen += 1
        if request.num_gpus >= self.min_gpus:
            shape = (request.num_gpus, request.cpu_milli, request.mem_mib, request.gpu_types)
            if shape not in self._index:
                self._index[shape] = len(self._shapes)
                self._shapes.append(shape)
                self._count_of_shape = np.append(self._count_of_shape, 0.0)
                self._gpus = np.array([s[0] for s in self._shapes], dtype=np.int64)
                self._cpu = np.array([s[1] for s in self._shapes], dtype=np.int64)
                self._mem = np.array([s[2] for s in self._shapes], dtype=np.int64)
                self._hosts = self._allowed = None  # a new row: rebuild
            self._count_of_shape[self._index[shape]] += 1

    def charge(
        self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray, gpu: IntArray
    ) -> FloatArray:
        """The charge (in milli-GPU, to subtract from the score) of placing ``request`` on each of ``nodes``."""
        if not self.weight or not self._shapes or nodes.size == 0:
            return np.zeros(nodes.size)
        # A node loses a shape when it has room for it now and not after; whether it may host it at all (GPU model,
        # not drained) is what the kept ``hosts`` adds. Only when something is lost are the host counts needed.
        free = state.gpu_free_milli[nodes]
        whole = (free == MILLI_PER_GPU).sum(axis=1)
        cpu, mem = state.cpu_free_milli[nodes], state.mem_free_mib[nodes]
        taken = self.whole_gpus_taken(request, free, need_milli, gpu)
        lost = self._room_for(whole, cpu, mem) & ~self._room_for(
            whole - taken, cpu - request.cpu_milli, mem - request.mem_mib
        )
        if not lost.any():
            return np.zeros(nodes.size)
        hosts = self._refresh(state)
        lost &= hosts[:, nodes]
        if not lost.any():
            return np.zeros(nodes.size)
        share = self._count_of_shape / self._requests_seen
        per_host = share * MILLI_PER_GPU * self._gpus / np.maximum(self._host_count, 1)
        # Summed shape by shape for each node, in the same order whichever nodes are charged together.
        return np.asarray(self.weight * np.einsum("s,sn->n", per_host, lost.astype(np.float64)), dtype=np.float64)

    def adjust_best(
        self,
        state: ClusterState,
        request: Request,
        nodes: IntArray,
        need_milli: IntArray,
        score: FloatArray,
        gpu: IntArray,
    ) -> FloatArray:
        """``score`` less the charge, exact for every node that can reach the best final score; the others keep
        their uncharged score, already below that best (a charge is never negative).

        Charging every feasible node costs a shapes-by-nodes comparison on each decision; the best node is almost
        always among the few highest scores, so this charges the highest first and then only the nodes whose
        uncharged score reaches the best final score found.
        """
        if not self.weight or not self._shapes or nodes.size == 0:
            return score
        top = np.flatnonzero(score == score.max())
        top_charge = self.charge(state, request, nodes[top], need_milli[top], gpu[top])
        if not top_charge.any():
            return score  # an uncharged best: no other node reaches it
        final = score.copy()
        final[top] = score[top] - top_charge
        bar = final[top].max()
        rest = np.flatnonzero(score >= bar)
        rest = rest[score[rest] != score[top[0]]]  # the top is charged already
        if rest.size:
            final[rest] = score[rest] - self.charge(state, request, nodes[rest], need_milli[rest], gpu[rest])
        return final

    @property
    def shapes(self) -> int:
        return len(self._shapes)

    def lost_bits(
        self,
        state: ClusterState,
        request: Request,
        nodes: IntArray,
        taken: IntArray | int,
        free: IntArray | None = None,
    ) -> IntArray | None:
        """For each of ``nodes``, the shapes it would stop hosting if ``request`` took ``taken`` whole GPUs there,
        as bits (shape ``s`` is bit ``s``); ``None`` when there are more shapes than bits. It depends only on the
        nodes' states, so a caller may keep it per node version and charge with ``charge_bits`` later."""
        if len(self._shapes) > MAX_SHAPE_BITS:
            return None
        if not self._shapes:
            return np.zeros(nodes.size, dtype=np.int64)
        if self.kernels is not None:
            self._refresh_compiled(self.kernels, state, nodes)
            if isinstance(taken, int):
                taken = np.full(nodes.size, taken, dtype=np.int64)
            return np.asarray(
                self.kernels.lost_bits(
                    nodes,
                    taken,
                    state.gpu_free_milli,
                    state.cpu_free_milli,
                    state.mem_free_mib,
                    self._host_bits,
                    self._needs,
                    request.cpu_milli,
                    request.mem_mib,
                ),
                dtype=np.int64,
            )
        self._refresh(state, nodes)
        hosted = self._host_bits[nodes]
        hosting = hosted.nonzero()[0]
        if not hosting.size:  # hosts no shape now: nothing to lose
            return hosted
        if free is None:
            free = state.gpu_free_milli[nodes]
        if hosting.size <= FEW:
            return self._lost_few(state, request, nodes, hosted, hosting, taken, free)
        whole = (free == MILLI_PER_GPU).sum(axis=1)
        cpu, mem = state.cpu_free_milli[nodes], state.mem_free_mib[nodes]
        room_after = self._room_for(whole - taken, cpu - request.cpu_milli, mem - request.mem_mib)
        return np.asarray(hosted & ~(room_after * self._bit[: len(self._shapes), None]).sum(axis=0), dtype=np.int64)

    def _lost_few(
        self,
        state: ClusterState,
        request: Request,
        nodes: IntArray,
        hosted: IntArray,
        hosting: IntArray,
        taken: IntArray | int,
        free: IntArray,
    ) -> IntArray:
        """``lost_bits`` in plain Python when only a few of ``nodes`` (``hosting``, positions) host a shape."""
        lost = hosted.copy()
        for i in hosting.tolist():
            node = int(nodes[i])
            whole = free[i].tolist().count(MILLI_PER_GPU) - int(taken if isinstance(taken, int) else taken[i])
            cpu = int(state.cpu_free_milli[node]) - request.cpu_milli
            mem = int(state.mem_free_mib[node]) - request.mem_mib
            bits = int(hosted[i])
            for bit, (g, c, m) in enumerate(self._shape_needs):
                if bits >> bit & 1 and whole >= g and cpu >= c and mem >= m:
                    bits &= ~(1 << bit)
            lost[i] = bits
        return lost

    def charge_bits(self, state: ClusterState, bits: IntArray) -> FloatArray:
        """``charge`` of nodes whose lost shapes are ``bits`` (from ``lost_bits`` on their current states)."""
        if not bits.any():
            return np.zeros(bits.size)
        if self.kernels is not None:
            self._refresh_compiled(self.kernels, state, None)
            per_host, lost_01 = self.kernels.charge_terms(
                bits, self._count_of_shape, self._requests_seen, self._gpus, self._host_count
            )
            # The same operands as below (lost as float rows of 0 and 1), so einsum rounds the sum the same way.
            return np.asarray(self.weight * np.einsum("s,sn->n", per_host, lost_01), dtype=np.float64)
        self._refresh(state)
        lost = (bits[None, :] >> self._bit_index[: len(self._shapes), None]) & 1
        share = self._count_of_shape / self._requests_seen
        per_host = share * MILLI_PER_GPU * self._gpus / np.maximum(self._host_count, 1)
        return np.asarray(self.weight * np.einsum("s,sn->n", per_host, lost.astype(np.float64)), dtype=np.float64)

    def adjust_best_bits(
        self, state: ClusterState, lost_of: Callable[[IntArray], IntArray | None], score: FloatArray
    ) -> FloatArray | None:
        """``adjust_best`` with the nodes' lost shapes known: ``lost_of(positions)`` gives them (``lost_bits``) for
        those positions of ``score``, or ``None`` when there are more shapes than bits (then this returns ``None``).
        The same final scores; only the positions that can reach the best are looked up."""
        top = (score == score.max()).nonzero()[0]
        top_bits = lost_of(top)
        if top_bits is None:
            return None
        if not top_bits.any():
            return score
        final = score.copy()
        final[top] = score[top] - self.charge_bits(state, top_bits)
        bar = final[top].max()
        rest = (score >= bar).nonzero()[0]
        rest = rest[score[rest] != score[top[0]]]  # the top is charged already
        if rest.size:
            rest_bits = lost_of(rest)
            if rest_bits is None:
                return None
            final[rest] = score[rest] - self.charge_bits(state, rest_bits)
        return final

    def _refresh_compiled(self, kernels: tessera_jit.Kernels, state: ClusterState, nodes: IntArray | None) -> None:
        """``_refresh`` (of every node when ``nodes`` is ``None``) by the compiled loop, once the tables are built."""
        seen = self._seen_version
        if self._hosts is None or self._state is not state or seen is None or seen.size != state.num_nodes:
            self._refresh(state)  # rebuilds everything
            return
        kernels.refresh_hosts(
            _NO_NODES if nodes is None else nodes,
            nodes is None,
            state.version,
            seen,
            state.drained,
            state.gpu_free_milli,
            state.cpu_free_milli,
            state.mem_free_mib,
            state.model_idx,
            self._needs,
            self._allowed_bits_array,
            self._host_bits,
            self._host_count,
            self._hosts,
        )

    def _room_for(self, whole: IntArray, cpu: IntArray, mem: IntArray) -> npt.NDArray[np.bool_]:
        """``[shape, node]``: whether nodes with ``whole`` free GPUs, ``cpu`` and ``mem`` free have room for each
        shape (``ClusterState.feasible`` for whole-GPU requests, without the GPU-model check, for all shapes at
        once)."""
        return (
            (whole[None, :] >= self._gpus[:, None])
            & (cpu[None, :] >= self._cpu[:, None])
            & (mem[None, :] >= self._mem[:, None])
        )

    def whole_gpus_taken(self, request: Request, free: IntArray, need_milli: IntArray, gpu: IntArray) -> IntArray:
        if request.num_gpus != 1:
            return np.full(free.shape[0], request.num_gpus, dtype=np.int64)
        sharing = need_milli < MILLI_PER_GPU
        if not sharing.any():
            return np.ones(free.shape[0], dtype=np.int64)
        rows = np.arange(free.shape[0])
        chosen = free[rows, np.maximum(gpu, 0)]
        # Without a GPU choice the engine best-fits: it takes a whole GPU only when no partly used one fits.
        partly = ((free < MILLI_PER_GPU) & (free >= need_milli[:, None])).sum(axis=1)
        takes_whole = np.where(gpu != NO_GPU_CHOICE, chosen == MILLI_PER_GPU, partly == 0)
        return np.where(sharing, takes_whole.astype(np.int64), 1)

    def _refresh_one(
        self, state: ClusterState, node: int, hosts: npt.NDArray[np.bool_], allowed: npt.NDArray[np.bool_]
    ) -> None:
        """``_refresh`` of one node in plain Python: for a node or two, a dozen NumPy calls cost more than this."""
        now = 0
        if not state.drained[node]:
            whole = state.gpu_free_milli[node].tolist().count(MILLI_PER_GPU)
            cpu, mem = int(state.cpu_free_milli[node]), int(state.mem_free_mib[node])
            may = self._allowed_bits[int(state.model_idx[node])]
            for bit, (g, c, m) in enumerate(self._shape_needs):
                if whole >= g and cpu >= c and mem >= m:
                    now |= 1 << bit
            now &= may
        before = int(self._host_bits[node])
        if now != before:
            changed = now ^ before
            for bit in range(len(self._shapes)):
                if changed >> bit & 1:
                    self._host_count[bit] += 1 if now >> bit & 1 else -1
                    hosts[bit, node] = bool(now >> bit & 1)
            self._host_bits[node] = now

    def _refresh(self, state: ClusterState, nodes: IntArray | None = None) -> npt.NDArray[np.bool_]:
        """``[shape, node]``: can host the shape now, brought up to date for the nodes that changed (of ``nodes``
        only, when given: each node's entry and its part of the host counts are its own)."""
        seen = self._seen_version
        if self._hosts is None or self._state is not state or seen is None or seen.size != state.num_nodes:
            stale = np.arange(state.num_nodes)
            self._allowed = np.array(
                [
                    state.allowed_models(
                        Request(num_gpus=g, gpu_milli=MILLI_PER_GPU, cpu_milli=c, mem_mib=m, gpu_types=t)
                    )
                    for g, c, m, t in self._shapes
                ]
            )
            self._allowed_bits = [
                sum(1 << s for s in range(len(self._shapes)) if self._allowed[s, model])
                for model in range(self._allowed.shape[1])
            ]
            self._shape_needs = [(g, c, m) for g, c, m, _ in self._shapes]
            self._needs = np.array(self._shape_needs, dtype=np.int64).reshape(len(self._shapes), 3)
            if len(self._shapes) <= MAX_SHAPE_BITS:  # beyond, no bits are kept (and no int64 holds them)
                self._allowed_bits_array = np.array(self._allowed_bits, dtype=np.int64)
            self._hosts = np.zeros((len(self._shapes), state.num_nodes), dtype=np.bool_)
            self._host_bits = np.zeros(state.num_nodes, dtype=np.int64)
            self._host_count = np.zeros(len(self._shapes), dtype=np.int64)
            self._state = state
            self._seen_version = seen = np.full(state.num_nodes, -1, dtype=np.int64)
        else:
            stale = (
                (seen != state.version).nonzero()[0]
                if nodes is None
                else nodes[(seen[nodes] != state.version[nodes]).nonzero()[0]]
            )
        hosts, allowed = self._hosts, self._allowed
        assert hosts is not None and allowed is not None
        if 0 < stale.size <= FEW and len(self._shapes) <= MAX_SHAPE_BITS:
            for node in stale.tolist():
                self._refresh_one(state, node, hosts, allowed)
            seen[stale] = state.version[stale]
        elif stale.size:
            whole = (state.gpu_free_milli[stale] == MILLI_PER_GPU).sum(axis=1)
            room = self._room_for(whole, state.cpu_free_milli[stale], state.mem_free_mib[stale])
            now = allowed[:, state.model_idx[stale]] & room & ~state.drained[stale]
            self._host_count += now.sum(axis=1) - hosts[:, stale].sum(axis=1)
            hosts[:, stale] = now
            if len(self._shapes) <= MAX_SHAPE_BITS:
                self._host_bits[stale] = (now * self._bit[: len(self._shapes), None]).sum(axis=0)
            seen[stale] = state.version[stale]
        return hosts
