"""Synthetic, openb-shaped clusters and pod lists: the simulator's embedded default when no trace is given.

The project does not ship the Alibaba trace; instead the CLI, the examples and the tests call ``synthetic_nodes`` and
``synthetic_pods`` to get a cluster and a workload with the same shape, drawn from the documented distributions
below (aggregate shares measured on ``openb_node_list_gpu_node.csv`` and ``openb_pod_list_default.csv``, Weng et
al., ATC '23). ``write_nodes_csv`` / ``write_pods_csv`` export them in the trace format that
``tessera.sim.traces.openb`` reads back.

Node mix (share of the 1,213 GPU nodes of openb; counts are apportioned by largest remainder, then the node order is
shuffled with the seed):

=======  =========  ===============  ====  =======
share    cpu cores  host memory GiB  gpus  model
=======  =========  ===============  ====  =======
45.3%    96         384              8     G2
31.9%    104        512              2     T4
8.8%     16         120              2     P100
3.2%     128        768              8     G3
2.3%     32         128              4     V100M16
1.8%     64         256              2     P100
1.7%     96         768              8     V100M32
1.6%     8          32               1     V100M16
1.4%     96         384              4     T4
0.7%     48         368              4     V100M32
0.6%     64         256              8     V100M16
0.2%     8          60               1     P100
0.2%     8          60               2     P100
0.2%     128        1024             1     A10
0.1%     82         336              8     V100M16
=======  =========  ===============  ====  =======

Pod shapes (share of pods; each kind then draws (cpu_milli, memory_mib) from its own small set below, and a
sharing pod draws its ``gpu_milli`` independently):

- 13.3% CPU-only; 37.8% sharing 1-GPU (``gpu_milli`` < 1000); 48.0% whole 1-GPU; 0.2% 2-GPU, 0.2% 4-GPU, 0.5% 8-GPU.
- sharing ``gpu_milli`` weights (per mille of sharing pods): 810: 350, 470: 244, 320: 107, 650: 82, 230: 45, 460: 42,
  590: 24, 160: 24, 550: 23, 220: 20, 370: 15, 110: 8, 480: 6, 50: 2.
- QoS: LS 57%, BE 41.7%, Burstable 1.2%, Guaranteed 0.1%.

With the defaults (2,000 pods, 300 nodes) the total GPU request is about 0.95-1.0 x the cluster's GPU capacity,
as on the real trace (0.98), so the 1.3x arrival-inflation experiment behaves alike.

Times (for timeline simulations; the inflation experiment ignores them): creation times have exponential
inter-arrivals (``PodTimes.mean_interarrival_s``, 30 s, first pod at 0); durations are lognormal with median
``PodTimes.median_duration_s`` (1 h) and log-space sigma ``PodTimes.duration_sigma`` (1.5); every pod is scheduled at
its creation time. (On the real default list gaps average 1,583 s and the median lifetime is about 9 minutes; the
defaults here pack arrivals closer so that a timeline run on 2,000 pods keeps the cluster busy.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from tessera.core.cluster import NodeSpec
from tessera.core.errors import InvalidRequestError
from tessera.core.workload import MILLI_PER_GPU, Request
from tessera.sim.traces.openb import TracePod, write_nodes_csv, write_pods_csv

__all__ = ["NODE_MIX", "PodTimes", "synthetic_nodes", "synthetic_pods", "write_nodes_csv", "write_pods_csv"]

MIB_PER_GIB = 1024

# (count among openb's 1,213 GPU nodes, cpu cores, host memory GiB, gpus, model)
NODE_MIX: tuple[tuple[int, int, int, int, str], ...] = (
    (549, 96, 384, 8, "G2"),
    (387, 104, 512, 2, "T4"),
    (107, 16, 120, 2, "P100"),
    (39, 128, 768, 8, "G3"),
    (28, 32, 128, 4, "V100M16"),
    (22, 64, 256, 2, "P100"),
    (21, 96, 768, 8, "V100M32"),
    (19, 8, 32, 1, "V100M16"),
    (17, 96, 384, 4, "T4"),
    (9, 48, 368, 4, "V100M32"),
    (7, 64, 256, 8, "V100M16"),
    (3, 8, 60, 1, "P100"),
    (2, 8, 60, 2, "P100"),
    (2, 128, 1024, 1, "A10"),
    (1, 82, 336, 8, "V100M16"),
)

# Pod kinds: (name, weight, num_gpus); weights are per mille of pods.
_POD_KINDS: tuple[tuple[str, int, int], ...] = (
    ("cpu", 133, 0),
    ("share", 378, 1),
    ("whole", 480, 1),
    ("gpu2", 2, 2),
    ("gpu4", 2, 4),
    ("gpu8", 5, 8),
)

# (cpu_milli, memory_mib) -> weight, per kind: the most common shapes of each kind in openb.
_SHAPES: dict[str, tuple[tuple[int, int, int], ...]] = {
    "cpu": ((12500, 57344, 364), (32000, 49152, 284), (8000, 30517, 163), (15400, 51200, 120), (16500, 51200, 95)),
    "share": (
        (3152, 5600, 1122),
        (11908, 47104, 625),
        (8000, 30517, 486),
        (4000, 22888, 189),
        (4000, 15258, 182),
        (4152, 10600, 152),
        (4000, 30517, 136),
        (6000, 6144, 51),
    ),
    "whole": (
        (11300, 49152, 857),
        (11400, 48128, 534),
        (3152, 5600, 470),
        (18708, 64512, 255),
        (9810, 41560, 195),
        (12000, 24576, 158),
        (15700, 58368, 158),
        (11908, 47104, 153),
    ),
    "gpu2": ((16200, 66560, 7), (6000, 65536, 3), (30200, 160768, 3), (17400, 43008, 2)),
    "gpu4": ((32200, 132096, 9), (32000, 131072, 3), (60200, 320512, 3)),
    "gpu8": ((88000, 327680, 18), (64200, 263168, 18), (120000, 737280, 3), (64000, 262144, 3)),
}

# gpu_milli -> weight (per mille of sharing pods).
_SHARE_MILLI: tuple[tuple[int, int], ...] = (
    (810, 350),
    (470, 244),
    (320, 107),
    (650, 82),
    (230, 45),
    (460, 42),
    (590, 24),
    (160, 24),
    (550, 23),
    (220, 20),
    (370, 15),
    (110, 8),
    (480, 6),
    (50, 2),
)

_QOS: tuple[tuple[str, int], ...] = (("LS", 570), ("BE", 417), ("Burstable", 12), ("Guaranteed", 1))

_SECOND_TYPE_SHARE = 0.3  # of constrained pods, those that allow two GPU types instead of one

# (gpu_model, gpus, cpu_milli, mem_mib) of a GPU node, for drawing type constraints that the cluster can honour.
_HostShape = tuple[str, int, int, int]


# ---------------------------------------------------------------------------------------------------- nodes


def synthetic_nodes(num_nodes: int = 300, seed: int = 0) -> list[NodeSpec]:
    """``num_nodes`` GPU nodes in openb's proportions (``NODE_MIX``), named ``syn-node-0000``…, order shuffled."""
    if num_nodes < 1:
        raise InvalidRequestError("num_nodes", f"must be >= 1, got {num_nodes}")
    counts = apportion([row[0] for row in NODE_MIX], num_nodes)
    shapes = [shape for shape, count in zip(NODE_MIX, counts, strict=True) for _ in range(count)]
    order = np.random.default_rng(seed).permutation(len(shapes))
    return [_node(f"syn-node-{i:04d}", shapes[int(j)]) for i, j in enumerate(order)]


def _node(name: str, shape: tuple[int, int, int, int, str]) -> NodeSpec:
    _, cores, mem_gib, gpus, model = shape
    return NodeSpec(name=name, cpu_milli=cores * 1000, mem_mib=mem_gib * MIB_PER_GIB, gpu_count=gpus, gpu_model=model)


def apportion(weights: Sequence[int], total: int) -> list[int]:
    """Integer counts summing to ``total`` in proportion to ``weights`` (largest remainder; ties by position)."""
    whole = sum(weights)
    quotas = [w * total for w in weights]
    counts = [q // whole for q in quotas]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(quotas[i] % whole), i))
    for i in by_remainder[: total - sum(counts)]:
        counts[i] += 1
    return counts


# ----------------------------------------------------------------------------------------------------- pods


@dataclass(frozen=True, slots=True)
class PodTimes:
    """How synthetic pods arrive and how long they stay (seconds)."""

    mean_interarrival_s: float = 30.0  # mean of the exponential gaps between creations; > 0
    median_duration_s: float = 3600.0  # median of the lognormal duration; > 0
    duration_sigma: float = 1.5  # sigma of the duration's logarithm; >= 0

    def __post_init__(self) -> None:
        if not self.mean_interarrival_s > 0:
            raise InvalidRequestError("mean_interarrival_s", f"must be > 0, got {self.mean_interarrival_s}")
        if not self.median_duration_s > 0:
            raise InvalidRequestError("median_duration_s", f"must be > 0, got {self.median_duration_s}")
        if not self.duration_sigma >= 0:
            raise InvalidRequestError("duration_sigma", f"must be >= 0, got {self.duration_sigma}")


def synthetic_pods(
    num_pods: int = 2000,
    seed: int = 0,
    constrained_share: float = 0.0,
    *,
    nodes: Sequence[NodeSpec] | None = None,
    times: PodTimes = PodTimes(),
) -> list[TracePod]:
    """``num_pods`` pods drawn from openb's request shapes (see the module docstring); deterministic per seed.

    ``constrained_share`` of the GPU pods get a ``gpu_types`` constraint of one (sometimes two) GPU models drawn,
    weighted by GPU count, from the models of ``nodes`` (default: ``synthetic_nodes()``) whose nodes could host the
    pod's GPUs, CPU and memory, so that a constrained trace still fits the cluster.
    """
    if num_pods < 1:
        raise InvalidRequestError("num_pods", f"must be >= 1, got {num_pods}")
    if not 0.0 <= constrained_share <= 1.0:
        raise InvalidRequestError("constrained_share", f"must be in [0, 1], got {constrained_share}")
    rng = np.random.default_rng(seed)
    hosts = _host_shapes(nodes if nodes is not None else synthetic_nodes())
    requests = _draw_requests(rng, num_pods, constrained_share, hosts)
    qos = _draw(rng, [w for _, w in _QOS], num_pods)
    creation, deletion = _draw_times(rng, num_pods, times)
    return [
        TracePod(f"syn-pod-{i:04d}", req, int(creation[i]), int(deletion[i]), int(creation[i]), _QOS[int(qos[i])][0])
        for i, req in enumerate(requests)
    ]


def _draw_requests(
    rng: np.random.Generator, num_pods: int, constrained_share: float, hosts: Sequence[_HostShape]
) -> list[Request]:
    kinds = _draw(rng, [k[1] for k in _POD_KINDS], num_pods)
    shape_pick = rng.random(num_pods)
    share_milli = np.array([m for m, _ in _SHARE_MILLI])[_draw(rng, [w for _, w in _SHARE_MILLI], num_pods)]
    constrain = rng.random(num_pods) < constrained_share
    requests: list[Request] = []
    for i in range(num_pods):
        kind, _, num_gpus = _POD_KINDS[int(kinds[i])]
        cpu_milli, mem_mib = _pick_shape(_SHAPES[kind], float(shape_pick[i]))
        gpu_milli = int(share_milli[i]) if kind == "share" else (MILLI_PER_GPU if num_gpus else 0)
        request = Request(num_gpus=num_gpus, gpu_milli=gpu_milli, cpu_milli=cpu_milli, mem_mib=mem_mib)
        if num_gpus and constrain[i]:
            request = _constrain(request, hosts, rng)
        requests.append(request)
    return requests


def _draw_times(
    rng: np.random.Generator, num_pods: int, times: PodTimes
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Creation (first at 0) and deletion times in whole seconds; every pod lives at least one second."""
    creation = np.floor(np.cumsum(rng.exponential(times.mean_interarrival_s, num_pods))).astype(np.int64)
    creation -= creation[0]
    duration = rng.lognormal(np.log(times.median_duration_s), times.duration_sigma, num_pods)
    deletion = creation + np.maximum(1, np.rint(duration)).astype(np.int64)
    return creation, deletion


def _draw(rng: np.random.Generator, weights: Sequence[int], size: int) -> npt.NDArray[np.int64]:
    """``size`` indices into ``weights`` drawn in proportion to them."""
    p = np.asarray(weights, dtype=np.float64)
    return rng.choice(len(weights), size=size, p=p / p.sum())


def _pick_shape(shapes: Sequence[tuple[int, int, int]], u: float) -> tuple[int, int]:
    """The (cpu_milli, memory_mib) at quantile ``u`` in [0, 1) of the weighted ``shapes``."""
    total = sum(s[2] for s in shapes)
    target = u * total
    for cpu_milli, mem_mib, weight in shapes:
        if target < weight:
            return cpu_milli, mem_mib
        target -= weight
    return shapes[-1][0], shapes[-1][1]


def _host_shapes(nodes: Sequence[NodeSpec]) -> list[_HostShape]:
    return [(n.gpu_model, n.gpu_count, n.cpu_milli, n.mem_mib) for n in nodes if n.gpu_model and n.gpu_count > 0]


def _constrain(request: Request, hosts: Sequence[_HostShape], rng: np.random.Generator) -> Request:
    """``request`` allowed only on one or two models of ``hosts`` that can hold it (unchanged if none can)."""
    weight: dict[str, int] = {}
    for model, gpus, cpu_milli, mem_mib in hosts:
        if gpus >= request.num_gpus and cpu_milli >= request.cpu_milli and mem_mib >= request.mem_mib:
            weight[model] = weight.get(model, 0) + gpus
    if not weight:
        return request
    models = sorted(weight)
    p = np.array([weight[m] for m in models], dtype=np.float64)
    count = 2 if len(models) > 1 and rng.random() < _SECOND_TYPE_SHARE else 1
    chosen = rng.choice(len(models), size=count, replace=False, p=p / p.sum())
    return replace(request, gpu_types=frozenset(models[int(i)] for i in chosen))
