"""Keep GPU types for the pods that may run only there: charge flexible pods for the capacity they take from them.

When a share of the GPU pods may run on one GPU type only, a pod that may run anywhere and lands on a type that
such pods need takes capacity they cannot replace. On the openb cluster with a third of the GPU pods limited to one
type (types drawn by their share of the cluster's GPUs), fgd and tessera both fill the small types (T4, P100, G3,
the V100s) with flexible pods early and then reject the pods limited to them, while hundreds of G2 GPUs stay idle.

``TypePressure`` learns from the requests it sees, as a live scheduler would, the share ``c_t`` of the GPU request
(milli) that may run only on type ``t`` (a pod allowed on ``k`` types counts ``1/k`` on each). A placement of a pod
allowed on more than one type on a node of type ``t`` pays ``weight * c_t * I / I_t`` per GPU milli it takes:
``I_t`` is the idle GPU milli of type ``t``, ``I`` all idle GPU milli. While idle capacity follows the constrained
demand the charge is the same everywhere and changes nothing; as a type runs short of what its pods will ask, its
charge grows and flexible pods go elsewhere. Pods allowed on one type only are never charged (all their candidates
would pay the same). The charge depends on the whole cluster, so it is added at decision time
(``PlacementPolicy.adjust``); the idle milli per type is kept and updated only for nodes that changed.
"""

from __future__ import annotations

import numpy as np

from tessera.core.cluster import ClusterState, IntArray
from tessera.core.fragmentation import FloatArray
from tessera.core.workload import Request


class TypePressure:
    """Learns the GPU demand bound to each GPU type and charges flexible pods for taking scarce types."""

    def __init__(self, weight: float) -> None:
        self.weight = weight
        self._bound_milli: dict[str, float] = {}  # GPU milli seen that may run only on the type (split by types)
        self._gpu_milli_seen = 0.0
        self._state: ClusterState | None = None
        self._idle_by_node = np.zeros(0, dtype=np.int64)
        self._seen_version = np.zeros(0, dtype=np.int64)
        self._idle_by_model = np.zeros(0, dtype=np.int64)

    def observe(self, request: Request) -> None:
        milli = request.total_gpu_milli
        if not milli:
            return
        self._gpu_milli_seen += milli
        for t in request.gpu_types:
            self._bound_milli[t] = self._bound_milli.get(t, 0.0) + milli / len(request.gpu_types)

    def charge(self, state: ClusterState, request: Request, nodes: IntArray, need_milli: IntArray) -> FloatArray | None:
        """The charge (milli-GPU) of placing ``request`` on each of ``nodes``, or ``None`` when there is none."""
        if not self.weight or not self._bound_milli or request.num_gpus == 0:
            return None
        allowed = state.allowed_models(request)[:-1]
        if int(allowed.sum()) < 2:
            return None
        idle = self._idle(state)
        total = float(idle.sum())
        bound = np.array([self._bound_milli.get(m, 0.0) for m in state.model_names]) / self._gpu_milli_seen
        per_milli = self.weight * bound * total / np.maximum(idle, 1.0)
        per_milli = np.append(per_milli, 0.0)  # the trailing no-GPU model
        return np.asarray(per_milli[state.model_idx[nodes]] * (need_milli * request.num_gpus), dtype=np.float64)

    def _idle(self, state: ClusterState) -> FloatArray:
        """Idle GPU milli per GPU model, brought up to date for the nodes that changed."""
        if self._state is not state or self._seen_version.size != state.num_nodes:
            self._state = state
            self._idle_by_node = state.gpu_free_milli.sum(axis=1)
            self._seen_version = state.version.copy()
            self._idle_by_model = np.bincount(
                state.model_idx, weights=self._idle_by_node, minlength=len(state.model_names) + 1
            ).astype(np.int64)
        else:
            changed = np.flatnonzero(self._seen_version != state.version)
            if changed.size:
                now = state.gpu_free_milli[changed].sum(axis=1)
                np.add.at(self._idle_by_model, state.model_idx[changed], now - self._idle_by_node[changed])
                self._idle_by_node[changed] = now
                self._seen_version[changed] = state.version[changed]
        return np.asarray(self._idle_by_model[:-1], dtype=np.float64)
