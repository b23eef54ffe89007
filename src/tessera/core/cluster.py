"""Cluster state: nodes with per-GPU free vectors, host CPU and memory, held as NumPy arrays.

Free capacity is tracked **per GPU** (``gpu_free_milli[node, gpu]``), never only per node: a 0.3-GPU request needs
one GPU with 0.3 free. GPU slots beyond a node's ``gpu_count`` are padding with zero free capacity, so they never
fit anything and never count as idle. Every bind or release bumps the node's ``version`` so that callers can cache
per-node results and recompute only what changed.

Nodes join, drain and leave (a cluster that grows and shrinks while workloads run):

- ``add_node(spec)`` appends a node; its index is the next one and every existing index stays valid. The arrays grow
  (and get wider when the node has more GPUs than any before). Its GPU model must be one the state knows: a model of
  the initial nodes or one declared up front with ``ClusterState(nodes, models=...)`` (model indices, which placement
  policies build their tables on, never change).
- ``drain(node)`` makes a node infeasible for new placements (``feasible``) while what runs there keeps running and
  is released as usual; ``undrain`` reverses it.
- ``remove_node(node)`` is allowed only when nothing is bound there. Indices stay stable: the node is not deleted but
  marked gone (``gone[node]``) with zero capacity (no GPUs, no CPU, no memory), so it fits nothing, counts nowhere and
  a placement made earlier can never name a different node. A node that comes back is added again, at a new index.

Each of these bumps the node's ``version``, so per-node caches (the Placer's score cache) recompute it; caches sized
by the node count must grow with ``num_nodes``.

The placement engine, the simulator and the control plane all read and change this one structure.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tessera.core.catalog import resolve_model
from tessera.core.errors import InvalidRequestError
from tessera.core.workload import MILLI_PER_GPU, Placement, Request

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    cpu_milli: int  # host CPU capacity, thousandths of a core
    mem_mib: int  # host memory capacity
    gpu_count: int  # GPUs on the node (0 = CPU-only)
    gpu_model: str | None  # canonical catalog name; None for a CPU-only node

    def __post_init__(self) -> None:
        for field_name in ("cpu_milli", "mem_mib", "gpu_count"):
            if getattr(self, field_name) < 0:
                raise InvalidRequestError(field_name, f"node {self.name}: must be >= 0")
        if self.gpu_count > 0 and not self.gpu_model:
            raise InvalidRequestError("model", f"node {self.name} has GPUs but no GPU model")


class ClusterState:
    """Mutable capacity bookkeeping for a set of nodes that may join, drain and leave (see the module docstring)."""

    def __init__(self, nodes: Sequence[NodeSpec], models: Sequence[str] = ()) -> None:
        """``models``: GPU models that nodes added later may have, besides those of ``nodes``."""
        if not nodes:
            raise InvalidRequestError("nodes", "a cluster needs at least one node")
        self.nodes: tuple[NodeSpec, ...] = tuple(nodes)
        names = {n.gpu_model for n in nodes if n.gpu_model and n.gpu_count > 0}
        models = sorted(names | {resolve_model(m).name for m in models})
        # Index len(models) stands for "no GPU" (CPU-only nodes).
        self.model_names: tuple[str, ...] = tuple(models)
        self.model_mem_mib: IntArray = np.array([resolve_model(m).mem_mib for m in models] + [0], dtype=np.int64)
        self._model_index = {m: i for i, m in enumerate(models)}
        self.max_gpus = max(1, max(n.gpu_count for n in nodes))
        self.gpu_count: IntArray = np.array([n.gpu_count for n in nodes], dtype=np.int64)
        self.model_idx: IntArray = np.array([self._model_of(n) for n in nodes], dtype=np.int64)
        self.cpu_cap_milli: IntArray = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.mem_cap_mib: IntArray = np.array([n.mem_mib for n in nodes], dtype=np.int64)
        self.gpu_exists: BoolArray = np.arange(self.max_gpus)[None, :] < self.gpu_count[:, None]
        self.gpu_cap_milli: IntArray = np.where(self.gpu_exists, MILLI_PER_GPU, 0).astype(np.int64)
        self.cpu_free_milli: IntArray = self.cpu_cap_milli.copy()
        self.mem_free_mib: IntArray = self.mem_cap_mib.copy()
        self.gpu_free_milli: IntArray = self.gpu_cap_milli.copy()
        self.version: IntArray = np.zeros(len(nodes), dtype=np.int64)
        # How many GPU workloads of each kind ("share", "2-gpu", ...) each node runs.
        self.gpu_kinds: list[Counter[str]] = [Counter() for _ in nodes]
        # Job types of the sharing workloads that state one, per (node, GPU): what co-location rules look at.
        self.gpu_job_types: dict[tuple[int, int], list[str]] = {}
        self.total_gpus = int(self.gpu_count.sum())
        self.bound: IntArray = np.zeros(len(nodes), dtype=np.int64)  # placements bound on each node now
        self.drained: BoolArray = np.zeros(len(nodes), dtype=np.bool_)  # no new placements (what runs stays)
        self.gone: BoolArray = np.zeros(len(nodes), dtype=np.bool_)  # removed (and drained): no capacity, index kept

    def _model_of(self, node: NodeSpec) -> int:
        if not node.gpu_model or node.gpu_count == 0:
            return len(self.model_names)
        index = self._model_index.get(node.gpu_model)
        if index is None:
            known = ", ".join(self.model_names) or "none"
            raise InvalidRequestError(
                "gpu_model", f"node {node.name}: GPU model {node.gpu_model} is not one this cluster knows ({known})"
            )
        return index

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def gpu_capacity_milli(self) -> int:
        return self.total_gpus * MILLI_PER_GPU

    def allowed_models(self, request: Request) -> BoolArray:
        """Which model indices (plus the trailing CPU-only index) may host ``request``'s GPUs."""
        allowed = np.ones(len(self.model_names) + 1, dtype=np.bool_)
        if request.gpu_types:
            allowed[:-1] = [m in request.gpu_types for m in self.model_names]
        if request.num_gpus > 0:
            allowed[-1] = False
        return allowed

    def milli_by_model(self, request: Request) -> IntArray:
        """GPU milli ``request`` takes on each model: a memory request becomes a share once the model is known."""
        milli = np.full(len(self.model_names) + 1, request.gpu_milli, dtype=np.int64)
        if request.gpu_mem_mib and request.num_gpus:
            mem = np.maximum(self.model_mem_mib, 1)
            from_mem = -(-request.gpu_mem_mib * MILLI_PER_GPU // mem)  # ceiling division
            milli = np.maximum(milli, from_mem)
            if request.num_gpus > 1:
                milli = np.where(milli <= MILLI_PER_GPU, MILLI_PER_GPU, milli)
        return milli

    def feasible(self, request: Request, nodes: IntArray, need_milli: IntArray) -> BoolArray:
        """Whether each node in ``nodes`` can host ``request`` now; ``need_milli`` is its per-GPU share there."""
        ok = (self.cpu_free_milli[nodes] >= request.cpu_milli) & (self.mem_free_mib[nodes] >= request.mem_mib)
        ok &= ~self.drained[nodes]  # removed nodes are drained too
        if request.num_gpus == 0:
            return ok
        ok &= self.allowed_models(request)[self.model_idx[nodes]] & (need_milli <= MILLI_PER_GPU)
        free = self.gpu_free_milli[nodes]
        sharing = (request.num_gpus == 1) & (need_milli < MILLI_PER_GPU)
        fits_share = free.max(axis=1) >= need_milli
        fits_whole = (free == MILLI_PER_GPU).sum(axis=1) >= request.num_gpus
        return np.asarray(ok & np.where(sharing, fits_share, fits_whole), dtype=np.bool_)

    def bind(self, placement: Placement) -> None:
        """Take the placement's capacity; raises ``InvalidRequestError`` if it does not fit (nothing changes). A
        drained node still accepts binds (what ran there is bound again after a restart); a removed one does not."""
        node, gpus, each = placement.node, list(placement.gpu_indices), placement.gpu_milli_each
        req = placement.request
        if not 0 <= node < self.num_nodes or self.gone[node]:
            raise InvalidRequestError("placement", f"node {node} is not in the cluster")
        if self.cpu_free_milli[node] < req.cpu_milli or self.mem_free_mib[node] < req.mem_mib:
            raise InvalidRequestError("placement", f"node {node} lacks CPU or memory")
        if gpus and (min(gpus) < 0 or max(gpus) >= self.gpu_count[node] or len(set(gpus)) != len(gpus)):
            raise InvalidRequestError("placement", f"bad GPU indices {gpus} on node {node}")
        if gpus and bool((self.gpu_free_milli[node, gpus] < each).any()):
            raise InvalidRequestError("placement", f"GPUs {gpus} of node {node} lack {each} milli")
        self.cpu_free_milli[node] -= req.cpu_milli
        self.mem_free_mib[node] -= req.mem_mib
        if gpus:
            self.gpu_free_milli[node, gpus] -= each
            self.gpu_kinds[node][req.kind] += 1
            if req.job_type and each < MILLI_PER_GPU:
                self.gpu_job_types.setdefault((node, gpus[0]), []).append(req.job_type)
        self.bound[node] += 1
        self.version[node] += 1

    def release(self, placement: Placement) -> None:
        """Give the placement's capacity back."""
        node, gpus = placement.node, list(placement.gpu_indices)
        self.cpu_free_milli[node] += placement.request.cpu_milli
        self.mem_free_mib[node] += placement.request.mem_mib
        if gpus:
            self.gpu_free_milli[node, gpus] += placement.gpu_milli_each
            kinds = self.gpu_kinds[node]
            kinds[placement.request.kind] -= 1
            if kinds[placement.request.kind] <= 0:
                del kinds[placement.request.kind]
            job_type = placement.request.job_type
            if job_type and placement.gpu_milli_each < MILLI_PER_GPU:
                sharing = self.gpu_job_types[(node, gpus[0])]
                sharing.remove(job_type)
                if not sharing:
                    del self.gpu_job_types[(node, gpus[0])]
        self.bound[node] -= 1
        self.version[node] += 1

    def job_types_on(self, node: int, gpu: int) -> list[str]:
        """Job types of the sharing workloads with a stated job type on that GPU (oldest first)."""
        return self.gpu_job_types.get((node, gpu), [])

    # ------------------------------------------------------------------------------- nodes that join and leave

    def add_node(self, spec: NodeSpec) -> int:
        """Append ``spec`` as a new, empty, schedulable node and return its index (the next one; existing indices
        stay valid). Raises ``InvalidRequestError`` for a GPU model the state does not know or a name that a node
        still in the cluster has."""
        if any(n.name == spec.name for i, n in enumerate(self.nodes) if not self.gone[i]):
            raise InvalidRequestError("name", f"node {spec.name} is already in the cluster")
        model = self._model_of(spec)
        if spec.gpu_count > self.max_gpus:
            self._widen(spec.gpu_count)
        exists = np.arange(self.max_gpus) < spec.gpu_count
        gpu_cap = np.where(exists, MILLI_PER_GPU, 0).astype(np.int64)
        self.nodes = (*self.nodes, spec)
        self.gpu_count = np.append(self.gpu_count, spec.gpu_count)
        self.model_idx = np.append(self.model_idx, model)
        self.cpu_cap_milli = np.append(self.cpu_cap_milli, spec.cpu_milli)
        self.mem_cap_mib = np.append(self.mem_cap_mib, spec.mem_mib)
        self.gpu_exists = np.vstack([self.gpu_exists, exists[None, :]])
        self.gpu_cap_milli = np.vstack([self.gpu_cap_milli, gpu_cap[None, :]])
        self.cpu_free_milli = np.append(self.cpu_free_milli, spec.cpu_milli)
        self.mem_free_mib = np.append(self.mem_free_mib, spec.mem_mib)
        self.gpu_free_milli = np.vstack([self.gpu_free_milli, gpu_cap[None, :]])
        self.version = np.append(self.version, 0)
        self.gpu_kinds.append(Counter())
        self.bound = np.append(self.bound, 0)
        self.drained = np.append(self.drained, False)
        self.gone = np.append(self.gone, False)
        self.total_gpus += spec.gpu_count
        return self.num_nodes - 1

    def drain(self, node: int) -> None:
        """No new placements on ``node`` (``feasible`` says no); what runs there keeps running."""
        self._check_present(node)
        self.drained[node] = True
        self.version[node] += 1

    def undrain(self, node: int) -> None:
        """``node`` takes new placements again."""
        self._check_present(node)
        self.drained[node] = False
        self.version[node] += 1

    def remove_node(self, node: int) -> None:
        """Take ``node`` out of the cluster; allowed only when nothing is bound on it (drain it first and wait).
        The index stays (marked ``gone``, with zero capacity): see the module docstring."""
        self._check_present(node)
        if self.bound[node] > 0:
            raise InvalidRequestError(
                "node", f"node {self.nodes[node].name} still holds {int(self.bound[node])} placements; drain it first"
            )
        self.total_gpus -= int(self.gpu_count[node])
        self.gone[node] = True
        self.drained[node] = True
        self.gpu_count[node] = 0
        self.gpu_exists[node] = False
        for array in (self.gpu_cap_milli, self.gpu_free_milli):
            array[node] = 0
        for array in (self.cpu_cap_milli, self.cpu_free_milli, self.mem_cap_mib, self.mem_free_mib):
            array[node] = 0
        self.version[node] += 1

    def _check_present(self, node: int) -> None:
        if not 0 <= node < self.num_nodes:
            raise InvalidRequestError("node", f"no node {node} (the cluster has {self.num_nodes})")
        if self.gone[node]:
            raise InvalidRequestError("node", f"node {self.nodes[node].name} was removed")

    def _widen(self, max_gpus: int) -> None:
        """Room for ``max_gpus`` GPU slots per node: the new slots of existing nodes are empty padding."""
        extra = max_gpus - self.max_gpus
        self.gpu_exists = np.pad(self.gpu_exists, ((0, 0), (0, extra)), constant_values=False)
        self.gpu_cap_milli = np.pad(self.gpu_cap_milli, ((0, 0), (0, extra)))
        self.gpu_free_milli = np.pad(self.gpu_free_milli, ((0, 0), (0, extra)))
        self.max_gpus = max_gpus
