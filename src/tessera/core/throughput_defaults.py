"""The embedded default throughput and co-location tables: what the twin's training workload and the control
plane read job types against when no Gavel tables are given (``tessera simulate timeline --traces DIR`` and
``tessera up --gavel DIR`` read measured ones, ``tessera.sim.workloads.gavel``). Plain data, no I/O."""

from __future__ import annotations

from tessera.core.throughput import ColocationModel, ThroughputModel

# The embedded default: ILLUSTRATIVE rough numbers written for Tessera (not Gavel's measurements), steps per second
# of one job alone on one GPU. They keep the shape that matters to a scheduler: compute-bound vision models gain
# most from a newer GPU, small RL and recommendation models little.
DEFAULT_ISOLATED_STEPS_PER_S: dict[str, dict[str, float]] = {
    # job type:        K80,  P100,  T4,   V100M16
    "ResNet-50": {"K80": 0.7, "P100": 2.5, "T4": 1.8, "V100M16": 5.0},
    "ResNet-18": {"K80": 2.5, "P100": 7.0, "T4": 5.0, "V100M16": 12.0},
    "Transformer": {"K80": 1.2, "P100": 4.0, "T4": 3.0, "V100M16": 8.0},
    "LM": {"K80": 10.0, "P100": 20.0, "T4": 15.0, "V100M16": 30.0},
    "Recommendation": {"K80": 15.0, "P100": 30.0, "T4": 25.0, "V100M16": 40.0},
    "CycleGAN": {"K80": 0.5, "P100": 1.6, "T4": 1.0, "V100M16": 3.0},
    "A3C": {"K80": 3.0, "P100": 4.5, "T4": 3.5, "V100M16": 5.0},
}

# ILLUSTRATIVE co-location factors on a V100 (co-located ÷ isolated throughput), written for Tessera: two large
# vision models slow each other to about half (no gain); a small model beside a large one loses little.
DEFAULT_COLOCATION_FACTORS: dict[tuple[str, str], tuple[float, float]] = {
    ("ResNet-50", "ResNet-50"): (0.48, 0.48),
    ("ResNet-50", "A3C"): (0.85, 0.80),
    ("ResNet-50", "Recommendation"): (0.75, 0.70),
    ("ResNet-18", "LM"): (0.70, 0.65),
    ("Transformer", "Transformer"): (0.50, 0.50),
    ("Transformer", "LM"): (0.60, 0.70),
    ("CycleGAN", "CycleGAN"): (0.45, 0.45),
    ("LM", "A3C"): (0.90, 0.85),
}


def default_models() -> tuple[ThroughputModel, ColocationModel]:
    """Models from the embedded illustrative tables above (reference GPU ``V100M16``)."""
    isolated = {
        (job_type, gpu_model): steps_per_s
        for job_type, by_model in DEFAULT_ISOLATED_STEPS_PER_S.items()
        for gpu_model, steps_per_s in by_model.items()
    }
    colocated = {(a, b, "V100M16"): factors for (a, b), factors in DEFAULT_COLOCATION_FACTORS.items()}
    return ThroughputModel(isolated), ColocationModel(colocated)
