"""Where stopping running workloads makes room: the placement side of ``preemption.select_victims_to_fit``.

Amounts alone do not say whether a pending workload fits once victims stop: a whole-GPU worker needs a GPU that
becomes entirely free, and a gang needs that on enough nodes. ``VictimFit`` answers the two questions the greedy
victim search asks, on the live ``ClusterState``: ``fits(victims)`` (release them, try the gang's placement, undo
the placement) and ``usefulness(c, chosen)`` (how many more workers would fit on ``c``'s nodes if ``c`` stopped too,
as a share of the gang). Victims stay released between calls (the search grows one set); ``restore`` binds them
back. Called by the scheduling step (``core.step``); pure apart from the state it is given, which it leaves as found.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tessera.core.cluster import ClusterState
from tessera.core.decisions import RunningWorkload
from tessera.core.placement.gang import gpu_worker_slots
from tessera.core.preemption import Candidate
from tessera.core.trial import Trial
from tessera.core.workload import MILLI_PER_GPU, Placement, Request


class VictimFit:
    """The placement oracle of one victim search for one pending workload (module docstring)."""

    def __init__(
        self,
        state: ClusterState,
        request: Request,
        gang: int,
        running: Mapping[str, RunningWorkload],
        place: Callable[[], tuple[Placement, ...] | None],
        trial: Trial,
    ) -> None:
        """``place`` places the gang on the state through ``trial`` (undone here), or returns None."""
        self.state = state
        self.request = request
        self.gang = gang
        self.running = running
        self.place = place
        self.trial = trial
        self.released: dict[str, RunningWorkload] = {}
        self.allowed = state.allowed_models(request)
        self.need_milli = state.milli_by_model(request)

    def fits(self, victims: Sequence[Candidate]) -> bool:
        self._sync(victims)
        mark = self.trial.mark()
        if self.place() is None:
            return False
        self.trial.rollback(mark)
        return True

    def usefulness(self, candidate: Candidate, chosen: Sequence[Candidate]) -> float:
        self._sync(chosen)
        victim = self.running[candidate.workload_id]
        gained = 0
        for node in {p.node for p in victim.placements}:
            on_node = [p for p in victim.placements if p.node == node]
            gained += min(self._slots(node, on_node), self.gang) - min(self._slots(node, ()), self.gang)
        return max(gained, 0) / self.gang

    def restore(self) -> None:
        self._sync(())

    def _sync(self, victims: Sequence[Candidate]) -> None:
        """Release exactly ``victims`` on the state (binding back the ones released before and not wanted now)."""
        wanted = {c.workload_id for c in victims}
        for workload_id in [w for w in self.released if w not in wanted]:
            for placement in self.released.pop(workload_id).placements:
                self.state.bind(placement)
        for workload_id in wanted - self.released.keys():
            victim = self.running[workload_id]
            for placement in victim.placements:
                self.state.release(placement)
            self.released[workload_id] = victim

    def _slots(self, node: int, freed: Sequence[Placement]) -> int:
        """How many workers of the request fit on ``node`` now, with ``freed`` released as well."""
        state, request = self.state, self.request
        model = int(state.model_idx[node])
        if not self.allowed[model]:
            return 0
        cpu = int(state.cpu_free_milli[node]) + sum(p.request.cpu_milli for p in freed)
        mem = int(state.mem_free_mib[node]) + sum(p.request.mem_mib for p in freed)
        slots = min(_per(cpu, request.cpu_milli), _per(mem, request.mem_mib))
        if request.num_gpus == 0:
            return slots
        free = state.gpu_free_milli[node].copy()
        for p in freed:
            free[list(p.gpu_indices)] += p.gpu_milli_each
        need = int(self.need_milli[model])
        if need > MILLI_PER_GPU:
            return 0
        return min(slots, int(gpu_worker_slots(free, need, request.num_gpus)))


def _per(free: int, each: int) -> int:
    return free // each if each > 0 else 1 << 30
