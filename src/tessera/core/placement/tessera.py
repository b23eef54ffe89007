"""Tessera's default placement: FGD's fragmentation descent, made CPU-aware and sliver-aware.

The node measure ``F`` adds two terms to FGD's fragmentation against the typical pods:

- **CPU stranding**: idle GPU milli that the node's free CPU could not feed, averaged over the typical GPU pods.
  FGD counts a GPU as usable for a typical pod as long as the node has that pod's CPU *once*; a node with eight free
  GPUs and twelve free cores will in fact host one or two more pods, not eight. Charging the stranded milli steers
  CPU-heavy pods (CPU-only ones above all) to CPU-rich nodes and keeps CPU where GPUs need it.
- **Sliver waste**: for each GPU, the expected milli that typical pods would never fill if they kept arriving at
  random (``random_fill_waste``). FGD only asks whether the next pod fits a GPU; this looks down the whole sequence
  of shares that could still land there, so a remainder that only rare small pods can use counts as waste.

A placement's score is the raw decrease ``F_before - F_after`` (higher is better): unlike FGD's integer sigmoid,
close candidates are not lumped into ties. One parameter set serves every workload.

``online=True`` learns the typical pods from the requests it is asked to place instead of being given them: it
refits after 64, 128, ... 1,024 requests and then every 1,024, and bumps ``model_version`` so the engine drops its
cached scores. Until the first refit it has no workload model and places on the first feasible node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tessera.core.cluster import IntArray
from tessera.core.fragmentation import (
    FloatArray,
    FragmentationModel,
    Shape,
    TypicalPod,
    random_fill_waste,
    shape_of,
    typical_pods_from_counts,
)
from tessera.core.placement.fgd import FgdPolicy
from tessera.core.workload import MILLI_PER_GPU, Request


@dataclass(frozen=True, slots=True)
class TesseraParams:
    cpu_stranding_weight: float = 2.0  # weight of GPU milli the node's CPU cannot feed
    sliver_weight: float = 1.0  # weight of the expected never-filled milli per GPU
    coverage: float = 0.95  # share of requests the typical pods cover (as FGD)
    first_refit: int = 64  # online mode: requests seen before the first model
    refit_every: int = 1024  # online mode: refit period once past the doubling phase


class TesseraFragmentation(FragmentationModel):
    """FGD's node fragmentation plus CPU stranding plus expected sliver waste, in milli-GPU."""

    def __init__(self, pods: Sequence[TypicalPod], model_names: Sequence[str], params: TesseraParams) -> None:
        super().__init__(pods, model_names)
        self.params = params
        self._waste = random_fill_waste(pods)

    def node_frag(self, cpu_free: IntArray, gpu_free: IntArray, model_idx: IntArray) -> FloatArray:
        base = super().node_frag(cpu_free, gpu_free, model_idx)
        stranded = self.cpu_stranded(cpu_free, gpu_free, model_idx)
        slivers = np.asarray(self._waste[np.clip(gpu_free, 0, MILLI_PER_GPU)].sum(axis=1), dtype=np.float64)
        return base + self.params.cpu_stranding_weight * stranded + self.params.sliver_weight * slivers


class TesseraPolicy(FgdPolicy):
    name = "tessera"

    def __init__(
        self,
        typical: Sequence[TypicalPod],
        model_names: Sequence[str],
        online: bool = False,
        params: TesseraParams = TesseraParams(),
    ) -> None:
        self.params = params
        self.online = online
        self._model_names = tuple(model_names)
        self._seen: Counter[Shape] = Counter()
        self._requests_seen = 0
        self.model_version = 0
        super().__init__(TesseraFragmentation(() if online else typical, model_names, params))
        if online:
            self.name = "tessera-online"

    def delta_score(self, before: FloatArray, after: FloatArray) -> FloatArray:
        return before - after

    def observe(self, request: Request) -> None:
        if not self.online:
            return
        self._seen[shape_of(request)] += 1
        self._requests_seen += 1
        if self._due_for_refit(self._requests_seen):
            pods = typical_pods_from_counts(self._seen, self.params.coverage)
            self.frag = TesseraFragmentation(pods, self._model_names, self.params)
            self.model_version += 1

    def _due_for_refit(self, seen: int) -> bool:
        first, every = self.params.first_refit, self.params.refit_every
        if seen < first:
            return False
        if seen <= every:
            return seen & (seen - 1) == 0  # 64, 128, ..., 1024
        return seen % every == 0
