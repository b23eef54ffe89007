"""The cluster and workload an experiment runs on: a node list and a pod list from files, or the embedded default.

Called by the CLI and the benchmarks so that both load, check and order a trace the same way. The embedded default
is the synthetic, openb-shaped cluster and workload of ``tessera.sim.synthetic``: it needs no file, no GPU and no
network.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tessera.core.cluster import NodeSpec
from tessera.core.errors import InvalidRequestError
from tessera.core.workload import Request
from tessera.sim.synthetic import synthetic_nodes, synthetic_pods
from tessera.sim.traces import TracePod, check_pods_fit, load_nodes, load_pods, trace_name

DEFAULT_TRACE = "synthetic-default"


@dataclass(frozen=True, slots=True)
class ExperimentInputs:
    trace: str  # short name shown in reports: the pod list's file stem, or DEFAULT_TRACE
    nodes: list[NodeSpec]
    requests: list[Request]  # one per pod, ordered by pod name

    @property
    def gpus(self) -> int:
        return sum(node.gpu_count for node in self.nodes)


def load_trace_files(
    nodes_path: Path | None, pods_path: Path | None
) -> tuple[str, list[NodeSpec], list[TracePod]] | None:
    """(trace name, nodes, pods) from the two files, checked to fit; ``None`` when neither is given.

    Giving only one of them is an ``InvalidRequestError`` naming the missing option; bad content an ``InputFileError``.
    """
    if nodes_path is None and pods_path is None:
        return None
    if nodes_path is None or pods_path is None:
        given, missing = ("--nodes", "--pods") if pods_path is None else ("--pods", "--nodes")
        path = nodes_path if pods_path is None else pods_path
        raise InvalidRequestError(missing, f"{given} {path} was given without {missing}: give both or neither")
    nodes = load_nodes(nodes_path)
    pods = load_pods(pods_path)
    check_pods_fit(pods, nodes, pods_path)
    return trace_name(pods_path), nodes, pods


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
