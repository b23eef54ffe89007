"""Co-location physics of the timeline simulator: how fast training jobs run when they share one GPU.

A training job that takes part of one GPU (a sharing request with a job type) runs at its isolated throughput while
no other such job shares its GPU. With partners it is slowed by the measured co-location factors
(``ColocationModel.factors``, co-located ÷ isolated throughput): with one partner B, job A runs at
``factors(A, B)[0]`` of its isolated speed. The table measures pairs only; with several partners the replay assumes
the slowdowns compound and multiplies the pairwise factors (a GPU with three jobs is slower for each than any pair).
A pair measured with a factor of 0 cannot run together (in the Gavel table: it did not fit in the GPU's memory): the
job that joined later makes no progress until the other leaves, and the earlier one runs as if alone.
Workloads without a job type (services, trace pods) neither slow nor are slowed: the model has no data for them.

The same physics applies to every policy; what differs is whether a policy lets a losing pair share a GPU at all
(``tessera.core.placement.hetero``: tessera does not). ``SharedGpus`` keeps, per GPU, the jobs sharing it and
answers which jobs' speeds a join or a leave changed, so that the replay can re-time exactly those.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tessera.core.throughput import ColocationModel

GpuKey = tuple[int, int]  # (node index, GPU index)


@dataclass(frozen=True, slots=True)
class _Member:
    job: int
    job_type: str


class SharedGpus:
    """The typed sharing jobs on each GPU and the speed factor each gets from its partners."""

    def __init__(self, model: ColocationModel) -> None:
        self.model = model
        self._members: dict[GpuKey, list[_Member]] = {}
        self._gpu_of: dict[int, tuple[GpuKey, str]] = {}  # job -> (its GPU, that GPU's model)

    def join(self, job: int, job_type: str, gpu: GpuKey, gpu_model: str) -> list[int]:
        """``job`` starts sharing ``gpu``; returns the jobs whose speed factor this changed (``job`` included)."""
        if job in self._gpu_of:
            raise ValueError(f"job {job} already shares a GPU")
        members = self._members.setdefault(gpu, [])
        members.append(_Member(job, job_type))
        self._gpu_of[job] = (gpu, gpu_model)
        return [m.job for m in members]

    def leave(self, job: int) -> list[int]:
        """``job`` stops; returns the jobs left on its GPU (their speed factor may have changed). No-op for a job
        that shares nothing."""
        found = self._gpu_of.pop(job, None)
        if found is None:
            return []
        gpu, _ = found
        members = [m for m in self._members[gpu] if m.job != job]
        if members:
            self._members[gpu] = members
        else:
            del self._members[gpu]
        return [m.job for m in members]

    def factor(self, job: int) -> float:
        """The job's speed as a share of its isolated speed: 1.0 alone (or not sharing), else the product of its
        pairwise co-location factors with every partner (a pair that cannot run together stops the later one)."""
        found = self._gpu_of.get(job)
        if found is None:
            return 1.0
        gpu, gpu_model = found
        members = self._members[gpu]  # in join order
        position = next(k for k, m in enumerate(members) if m.job == job)
        own = members[position]
        factors = []
        for k, other in enumerate(members):
            if k == position:
                continue
            mine, theirs = self.model.factors(own.job_type, other.job_type, gpu_model)
            if mine > 0 and theirs > 0:
                factors.append(mine)
            else:  # they cannot run together: whoever came first runs, the other waits
                factors.append(1.0 if position < k else 0.0)
        return math.prod(factors)
