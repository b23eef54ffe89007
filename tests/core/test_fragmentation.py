"""Node fragmentation against typical pods, checked against a direct (slow) transcription of the definition."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.core.fragmentation import FragmentationModel, TypicalPod, typical_pods
from tessera.core.workload import Request

MODELS = ("P100", "T4")
TYPICAL = (
    TypicalPod(4_000, 1, 500, frozenset(), 0.4),
    TypicalPod(8_000, 1, 1000, frozenset(), 0.3),
    TypicalPod(16_000, 2, 1000, frozenset({"T4"}), 0.2),
    TypicalPod(2_000, 0, 0, frozenset(), 0.1),
)


def frag_by_definition(cpu_free: int, gpu_free: list[int], model: str) -> float:
    idle = sum(gpu_free)
    total = 0.0
    for pod in TYPICAL:
        allowed = not pod.gpu_types or model in pod.gpu_types
        fits = sum(1 for g in gpu_free if g >= pod.gpu_milli) >= pod.num_gpus and cpu_free >= pod.cpu_milli
        if pod.num_gpus == 0 or not allowed or not fits:
            total += pod.popularity * idle
        else:
            total += pod.popularity * sum(g for g in gpu_free if g < pod.gpu_milli)
    return total


@settings(max_examples=200, deadline=None)
@given(
    cpu=st.integers(0, 32_000),
    gpus=st.lists(st.integers(0, 1000), min_size=1, max_size=8),
    model=st.sampled_from(MODELS),
)
def test_vectorised_fragmentation_matches_the_definition(cpu: int, gpus: list[int], model: str) -> None:
    fm = FragmentationModel(TYPICAL, MODELS)
    padded = np.array([gpus + [0] * (8 - len(gpus))], dtype=np.int64)
    got = fm.node_frag(np.array([cpu]), padded, np.array([MODELS.index(model)]))[0]
    assert abs(got - frag_by_definition(cpu, gpus, model)) < 1e-6


def test_typical_pods_keep_the_most_popular_shapes_up_to_the_coverage_and_renormalise() -> None:
    requests = [Request(num_gpus=1, gpu_milli=500, cpu_milli=1000)] * 6
    requests += [Request(num_gpus=1, gpu_milli=1000, cpu_milli=2000)] * 3
    requests += [Request(cpu_milli=0)]
    kept = typical_pods(requests, coverage=0.85)
    assert [(p.gpu_milli, round(p.popularity, 3)) for p in kept] == [(500, 0.667), (1000, 0.333)]
    # CPU-free requests are counted as 100 milli-CPU, as Kubernetes scoring does.
    assert typical_pods([Request()])[0].cpu_milli == 100
