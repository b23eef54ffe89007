"""What one replay of the serving twin produces, and what a study (policies x seeds) summarises.

``PolicyRun`` is one (policy, seed) replay; ``summarise`` folds the runs of one policy over seeds into the
``summary.json`` entry the CLI writes (means over seeds; ``peak_gpus``, ``dropped`` and ``cold_starts`` as the
worst / total where the issue's schema asks for an int).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class ModelOutcome:
    model: str
    requests: int
    served: int
    dropped: int
    slo_met: int  # served requests that met both their TTFT and TPOT targets
    ttft_p99_s: float
    tpot_p99_s: float

    @property
    def slo_attainment_pct(self) -> float:
        return 100.0 * self.slo_met / self.requests if self.requests else 100.0


@dataclass(frozen=True, slots=True)
class PolicyRun:
    policy: str
    seed: int
    gpus: int  # the cluster's GPUs (the cap the policy ran under)
    gpu_hours: float  # integral of GPUs holding at least one replica (loading or ready)
    peak_gpus: int
    requests: int
    dropped: int
    cold_starts: int  # replica starts that loaded weights from disk or host memory
    slo_attainment_pct: float  # over all requests (a dropped request misses its SLO)
    worst_model_slo_attainment_pct: float
    ttft_p99_s: float
    tpot_p99_s: float
    sim_wall_s: float
    models: tuple[ModelOutcome, ...] = ()
    # Time series for the plots: sample times (s), GPUs in use, arrivals per second over the preceding interval.
    times_s: FloatArray = field(default_factory=lambda: np.zeros(0))
    gpus_in_use: FloatArray = field(default_factory=lambda: np.zeros(0))
    arrival_rate: FloatArray = field(default_factory=lambda: np.zeros(0))
    ttft_s: FloatArray = field(default_factory=lambda: np.zeros(0))  # every served request's TTFT, for the CDF

    def meets_slo(self, min_pct: float = 99.0) -> bool:
        return self.worst_model_slo_attainment_pct >= min_pct


def summarise(runs: list[PolicyRun]) -> dict[str, float | int]:
    """The ``summary.json`` entry of one policy over its seeds."""
    if not runs:
        raise ValueError("no runs to summarise")

    def mean(name: str) -> float:
        return round(float(np.mean([getattr(r, name) for r in runs])), 4)

    return {
        "gpu_hours": mean("gpu_hours"),
        "peak_gpus": max(r.peak_gpus for r in runs),
        "slo_attainment_pct": mean("slo_attainment_pct"),
        "worst_model_slo_attainment_pct": round(min(r.worst_model_slo_attainment_pct for r in runs), 4),
        "ttft_p99_s": mean("ttft_p99_s"),
        "tpot_p99_s": mean("tpot_p99_s"),
        "requests": sum(r.requests for r in runs) // len(runs),
        "dropped": sum(r.dropped for r in runs),
        "cold_starts": sum(r.cold_starts for r in runs),
        "sim_wall_s": mean("sim_wall_s"),
    }
