"""The cluster and workload the placement study runs on: a node list and a pod list from files, or the default.

Called by the CLI (``tessera simulate fgd``, ``tessera bench placement``) and the benchmarks so that all load, check
and order a trace the same way: the files through ``tessera.sim.traces.openb.load_trace_files``, the requests in the
order of the pods' names. The embedded default is the synthetic, openb-shaped cluster and workload of
``tessera.sim.workloads.synthetic``: it needs no file, no GPU and no network.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tessera.core.cluster import NodeSpec
from tessera.core.workload import Request
from tessera.sim.traces.openb import TracePod, load_trace_files
from tessera.sim.workloads.synthetic import synthetic_nodes, synthetic_pods

DEFAULT_TRACE = "synthetic-default"


@dataclass(frozen=True, slots=True)
class ExperimentInputs:
    trace: str  # short name shown in reports: the pod list's file stem, or DEFAULT_TRACE
    nodes: list[NodeSpec]
    requests: list[Request]  # one per pod, ordered by pod name

    @property
    def gpus(self) -> int:
        return sum(node.gpu_count for node in self.nodes)


def load_inputs(nodes_path: Path | None, pods_path: Path | None) -> ExperimentInputs:
    """The given node and pod lists (both or neither); raises ``InputFileError`` / ``InvalidRequestError``."""
    loaded = load_trace_files(nodes_path, pods_path)
    if loaded is None:
        return default_inputs()
    name, nodes, pods = loaded
    return ExperimentInputs(name, nodes, _requests_by_name(pods))


def default_inputs() -> ExperimentInputs:
    """The embedded synthetic default (300 openb-shaped nodes, 2,000 pods)."""
    nodes = synthetic_nodes()
    return ExperimentInputs(DEFAULT_TRACE, nodes, _requests_by_name(synthetic_pods(nodes=nodes)))


def _requests_by_name(pods: list[TracePod]) -> list[Request]:
    """Requests in the order of the pods' names (stable: file order among equal names)."""
    return [pod.request for pod in sorted(pods, key=lambda pod: pod.name)]
