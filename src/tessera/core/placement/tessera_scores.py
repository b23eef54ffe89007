"""``tessera``'s node scores in one fragmentation measurement per decision.

A decision usually rescores one node (the one the last placement changed), and at that size the cost is the number
of NumPy calls, not the arithmetic. FGD's way (``FgdPolicy.score_nodes``) measures ``F`` twice: once for the nodes
as they are and once for their states after the placement. Here the nodes whose current ``F`` is not known yet
(kept per node version in ``NodeFrag``, shared by every request shape) and the after-states of every candidate go
into one ``node_frag`` call. The numbers are the same as FGD's way: ``node_frag`` measures each row on its own
(``TesseraFragmentation.node_frag`` is exact row by row), the candidates are the same (for a sharing request each
GPU that fits, skipping a GPU whose free share equals an earlier one's on the same node; the first best GPU wins)
and the score is ``F_before - F_after``.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tessera.core.cluster import ClusterState, IntArray
from tessera.core.fragmentation import FloatArray, FragmentationModel
from tessera.core.placement import tessera_jit
from tessera.core.placement.base import NodeScores, no_gpu_choice
from tessera.core.placement.fgd import take_whole_gpus
from tessera.core.placement.reserve import ShapeReserve
from tessera.core.workload import MILLI_PER_GPU, Request

NO_POSITIONS = np.zeros(0, dtype=np.int64)
_EARLIER = [np.tri(g, g, -1, dtype=np.bool_) for g in range(65)]  # [g][i, j]: GPU j comes before GPU i


class NodeFrag:
    """``F`` of each node of one ``ClusterState``, valid for the node versions it was measured at."""

    def __init__(self) -> None:
        self.state: ClusterState | None = None
        self.at = np.zeros(0, dtype=np.int64)  # node version F was measured at; -1: not known
        self.frag = np.zeros(0)

    def bind(self, state: ClusterState) -> None:
        """Start over for ``state`` (or for nodes that joined it since)."""
        if self.state is not state or self.at.size != state.num_nodes:
            self.state = state
            self.at = np.full(state.num_nodes, -1, dtype=np.int64)
            self.frag = np.zeros(state.num_nodes)


def score_nodes(
    frag_model: FragmentationModel,
    known: NodeFrag,
    state: ClusterState,
    request: Request,
    nodes: IntArray,
    need: IntArray,
    reserve: ShapeReserve | None = None,
    lost: LostShapes | None = None,
    kernels: tessera_jit.Kernels | None = None,
) -> NodeScores:
    """Scores ``F_before - F_after`` of placing ``request`` on each of the feasible ``nodes`` (``need``: its per-GPU
    share on each), with the GPU a sharing request takes; ``known`` supplies and keeps ``F_before``. With
    ``reserve`` and ``lost``, also keeps in ``lost`` the shapes of ``reserve`` each node would stop hosting. With
    ``kernels``, the compiled loops do it (the same numbers) where ``frag_model`` has the tables for them."""
    known.bind(state)
    tables: tessera_jit.Tables | None = getattr(frag_model, "kernel_tables", None)
    if kernels is not None and tables is not None and state.gpu_free_milli.shape[1] <= tessera_jit.PAIRWISE_MAX:
        return _score_compiled(kernels, tables, known, state, request, nodes, need, reserve, lost)
    version = state.version[nodes]
    unknown = (known.at[nodes] != version).nonzero()[0]
    k, u = nodes.size, unknown.size
    free = state.gpu_free_milli[nodes]
    sharing = need < MILLI_PER_GPU if request.num_gpus == 1 else None
    if sharing is not None and sharing.any():
        share_rows, share_cols = _sharing_candidates(free, need, sharing)
        whole = (~sharing).nonzero()[0]
        rows = np.concatenate((unknown, share_rows, whole))
    else:
        sharing = None
        share_rows = share_cols = whole = np.arange(k)
        rows = np.concatenate((unknown, whole)) if u else whole
    # One measurement of [nodes whose F is unknown] + [sharing candidates] + [whole-GPU or CPU-only placements].
    at = nodes[rows]
    gpu_rows = state.gpu_free_milli[at]
    cpu_rows = state.cpu_free_milli[at]
    mem_rows = state.mem_free_mib[at]
    cpu_rows[u:] -= request.scoring_cpu_milli
    mem_rows[u:] -= request.mem_mib
    s = u  # where the whole-GPU rows start
    if sharing is not None:
        s = u + share_rows.size
        gpu_rows[np.arange(u, s), share_cols] -= need[share_rows]
    if request.num_gpus and s < rows.size:
        gpu_rows[s:] = take_whole_gpus(gpu_rows[s:], request.num_gpus)
    measured = frag_model.node_frag(cpu_rows, gpu_rows, state.model_idx[at], mem_rows)
    if u:
        known.frag[at[:u]] = measured[:u]
        known.at[at[:u]] = version[unknown]
    before = known.frag[nodes]
    gpu = no_gpu_choice(k)
    if sharing is None:
        score = before - measured[u:]
    else:
        score = np.empty(k)
        _best_share(score, gpu, before, measured[u:s], share_rows, share_cols, sharing.nonzero()[0])
        if whole.size:
            score[whole] = before[whole] - measured[s:]
    if lost is not None and reserve is not None:
        taken: IntArray | int = request.num_gpus
        if sharing is not None:
            taken = np.where(sharing, free[np.arange(k), np.maximum(gpu, 0)] == MILLI_PER_GPU, request.num_gpus)
        bits = reserve.lost_bits(state, request, nodes, taken, free)
        if bits is not None:
            lost_bits, shapes_known = lost.arrays(state, request)
            lost_bits[nodes] = bits
            shapes_known[nodes] = reserve.shapes
    return NodeScores(score, gpu)


def _score_compiled(
    kernels: tessera_jit.Kernels,
    tables: tessera_jit.Tables,
    known: NodeFrag,
    state: ClusterState,
    request: Request,
    nodes: IntArray,
    need: IntArray,
    reserve: ShapeReserve | None,
    lost: LostShapes | None,
) -> NodeScores:
    """``score_nodes`` in three compiled calls and NumPy's weighted sum (``tessera_jit``)."""
    ask = np.array(
        [
            request.num_gpus,
            request.scoring_cpu_milli,
            request.mem_mib,
            request.cpu_milli,
            tables.use_mem,
            tables.all_mem_known,
        ],
        dtype=np.int64,
    )
    gpu_all = state.gpu_free_milli
    terms, parts, layout, _ = kernels.measure_rows(
        gpu_all,
        state.cpu_free_milli,
        state.mem_free_mib,
        state.model_idx,
        state.version,
        known.at,
        nodes,
        need,
        ask,
        tables.fit_packed_pod,
        tables.pods,
        tables.allowed,
        tables.gpu_waste,
        tables.weights,
    )
    weighted = np.einsum("km,m->k", terms, tables.pod_weight)  # as TesseraFragmentation's _weighted sums
    score, gpu, taken = kernels.finish_scores(
        gpu_all, state.version, known.at, known.frag, nodes, parts, weighted, layout, request.num_gpus
    )
    if lost is not None and reserve is not None:
        bits = reserve.lost_bits(state, request, nodes, taken)
        if bits is not None:
            lost_bits, shapes_known = lost.arrays(state, request)
            lost_bits[nodes] = bits
            shapes_known[nodes] = reserve.shapes
    return NodeScores(score, gpu)


def _sharing_candidates(free: IntArray, need: IntArray, sharing: npt.NDArray[np.bool_]) -> tuple[IntArray, IntArray]:
    """(node row, GPU) of each sharing candidate, as ``FgdPolicy._score_sharing`` chooses them."""
    g = free.shape[1]
    fits = (free >= need[:, None]) & sharing[:, None]
    same_as_earlier = ((free[:, :, None] == free[:, None, :]) & _EARLIER[g]).any(axis=2)
    rows, cols = (fits & ~same_as_earlier).nonzero()
    return rows, cols


def _best_share(
    score: FloatArray,
    gpu: IntArray,
    before: FloatArray,
    after: FloatArray,
    rows: IntArray,
    cols: IntArray,
    nodes: IntArray,
) -> None:
    """Fill ``score`` and ``gpu`` for the sharing ``nodes`` (each has a candidate: it is feasible) from their
    candidates' ``after`` (first best GPU wins)."""
    table = np.full((score.size, int(cols.max()) + 1), -np.inf)
    table[rows, cols] = before[rows] - after
    best = np.argmax(table[nodes], axis=1)
    score[nodes] = table[nodes, best]
    gpu[nodes] = best


class LostShapes:
    """Per request shape and node: which multi-GPU shapes the node would stop hosting (``ShapeReserve.lost_bits``)
    and how many shapes the reserve knew then (-1: not known). Kept beside the engine's score cache: a node the
    engine has scored at its current version has its bits here, so a decision charges the reserve with a lookup."""

    def __init__(self) -> None:
        self.state: ClusterState | None = None
        self.by_request: dict[Request, tuple[IntArray, IntArray]] = {}

    def arrays(self, state: ClusterState, request: Request) -> tuple[IntArray, IntArray]:
        """(bits, shapes known) of ``request`` on every node of ``state``."""
        if self.state is not state:
            self.state = state
            self.by_request.clear()
        entry = self.by_request.get(request)
        n = state.num_nodes
        if entry is None or entry[0].size < n:
            bits, known = np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64)
            if entry is not None:  # nodes joined: the old ones keep what they had
                bits[: entry[0].size], known[: entry[1].size] = entry
            entry = self.by_request[request] = (bits, known)
        return entry
