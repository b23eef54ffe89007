"""STAND-IN, to be replaced when the serving-io branch is merged: the real ``run_study`` is written on another
branch. This one builds the real workload of every seed but invents every figure (no engine, no policy), so that
the command line and the report can be built and tested before the twin exists. Do not read its numbers.

Signature kept by the real module: ``run_study(config, progress) -> list[PolicyRun]``, one run per (policy, seed),
in the order of ``config.policies`` then ``config.seeds``; ``progress(label, fraction_done)`` with the label
``"{policy} seed {seed}"`` and the fraction of that run done, in [0, 1].
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from tessera.sim.serving.config import StudyConfig
from tessera.sim.serving.result import ModelOutcome, PolicyRun
from tessera.sim.serving.workload import build_workload

Progress = Callable[[str, float], None]

_FAKE_GPUS = {"static": 1.0, "static-autoscale": 0.7, "tessera": 0.45}  # invented GPU-hour factors


def run_study(config: StudyConfig, progress: Progress | None = None) -> list[PolicyRun]:
    """STAND-IN: fake runs over the real workloads (see the module docstring)."""
    trace = config.load_trace()
    runs: list[PolicyRun] = []
    for seed in config.seeds:
        workload = build_workload(trace, config.models, config.zipf, config.load, seed)
        arrivals = np.array([r.arrival_s for r in workload.requests])
        for policy in config.policies:
            label = f"{policy} seed {seed}"
            started = time.perf_counter()
            rng = np.random.default_rng([seed, config.policies.index(policy)])
            for step in range(4):
                if progress is not None:
                    progress(label, step / 4)
            times = np.arange(0.0, workload.duration_s, 60.0)
            rate = np.histogram(arrivals, np.append(times, workload.duration_s))[0] / 60.0
            gpus = np.ceil(_FAKE_GPUS.get(policy, 1.0) * (4 + rate))
            ttft = rng.lognormal(-1.5, 0.8, size=len(workload.requests))
            outcomes = tuple(
                ModelOutcome(m.name, n, n, 0, int(0.995 * n), 0.5, 0.05)
                for m, n in zip(workload.models, workload.requests_per_model.values(), strict=True)
            )
            if progress is not None:
                progress(label, 1.0)
            runs.append(
                PolicyRun(
                    policy,
                    seed,
                    int(gpus.max()),
                    float(gpus.sum() * 60.0 / 3600.0),
                    int(gpus.max()),
                    len(workload.requests),
                    0,
                    len(workload.models),
                    99.5,
                    min((o.slo_attainment_pct for o in outcomes), default=100.0),
                    float(np.percentile(ttft, 99)),
                    0.05,
                    time.perf_counter() - started,
                    outcomes,
                    times,
                    gpus,
                    rate,
                    ttft,
                )
            )
    return runs
