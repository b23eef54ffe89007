"""Random cluster states and requests that the scoring tests (test_tessera_scores, test_tessera_jit) share."""

import numpy as np

from tessera.core.cluster import ClusterState
from tessera.core.workload import MILLI_PER_GPU, Request


def random_state(state: ClusterState, rng: np.random.Generator) -> None:
    """Random free GPU shares (multiples of 50, some whole, some empty), CPU and memory; every node bumped."""
    free = rng.choice([0, 50, 100, 250, 300, 500, 700, 1000, 1000, 1000], size=state.gpu_free_milli.shape)
    state.gpu_free_milli[:] = np.where(state.gpu_exists, free, 0)
    state.cpu_free_milli[:] = (state.cpu_cap_milli * rng.random(state.num_nodes)).astype(np.int64)
    state.mem_free_mib[:] = (state.mem_cap_mib * rng.random(state.num_nodes)).astype(np.int64)
    state.version += 1


def random_requests(
    rng: np.random.Generator, models: tuple[str, ...], count: int, cpu_only_floor: int = 0
) -> list[Request]:
    """``count`` requests of five kinds: CPU only (at least ``cpu_only_floor`` milli-CPUs; 0 keeps requests with no
    CPU at all, scored as the Kubernetes non-zero default), a GPU share, whole GPUs, GPU memory, a typed share."""
    out = []
    for _ in range(count):
        kind = rng.integers(5)
        cpu, mem = int(rng.integers(0, 16)) * 1000, int(rng.integers(0, 64)) * 1024
        if kind == 0:
            out.append(Request(cpu_milli=cpu or cpu_only_floor, mem_mib=mem))
        elif kind == 1:
            out.append(Request(num_gpus=1, gpu_milli=int(rng.choice([100, 250, 300, 500, 810])), cpu_milli=cpu))
        elif kind == 2:
            out.append(Request(num_gpus=int(rng.choice([1, 2, 4, 8])), gpu_milli=MILLI_PER_GPU, cpu_milli=cpu))
        elif kind == 3:  # a share on a large model, a whole GPU on a small one
            out.append(Request(num_gpus=1, gpu_mem_mib=int(rng.choice([6_000, 12_000, 20_000])), cpu_milli=cpu))
        else:
            out.append(Request(num_gpus=1, gpu_milli=500, cpu_milli=cpu, gpu_types=frozenset(models[:2])))
    return out
