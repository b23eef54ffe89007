"""Read and write node and pod lists in the Alibaba openb trace format (``cluster-trace-gpu-v2023``).

The simulator's experiments and the CLI call ``load_nodes`` / ``load_pods`` to turn a CSV file into ``NodeSpec`` and
``TracePod`` values, then ``check_pods_fit`` to reject a trace that could never run on the given cluster;
``load_trace_files`` does all three for the ``--nodes`` / ``--pods`` options of the placement study and the
timeline replay. The synthetic generator (``tessera.sim.workloads.synthetic``) writes its output through
``write_nodes_csv`` / ``write_pods_csv`` so that the two sides always agree on the format. The CSV reading itself
(header, rows, integer cells, errors) is ``tessera.sim.traces.tables``.

Formats (header required, columns in any order, unknown columns ignored):

- nodes: ``sn,cpu_milli,memory_mib,gpu,model`` (empty ``model`` = CPU-only node);
- pods, long form: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
  deletion_time,scheduled_time``; short form: the first five of those.

Every problem in a file is an ``InputFileError`` naming the path, the 1-based line (the header is line 1) and the
column, so that the CLI can print one precise line.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.core.catalog import resolve_allowed, resolve_model
from tessera.core.cluster import NodeSpec
from tessera.core.errors import InputFileError, InvalidRequestError, UnknownGpuModelError
from tessera.core.workload import MILLI_PER_GPU, Request
from tessera.sim.traces.tables import Getter, Row, column_getter, parse_count, read_table

NODE_COLUMNS: tuple[str, ...] = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS_SHORT: tuple[str, ...] = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_COLUMNS_LONG: tuple[str, ...] = (
    *POD_COLUMNS_SHORT,
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)

# Field names of Request / NodeSpec errors mapped back to the file's column names.
_POD_FIELD_TO_COLUMN = {"num_gpus": "num_gpu", "mem_mib": "memory_mib", "gpu_types": "gpu_spec"}
_NODE_FIELD_TO_COLUMN = {"mem_mib": "memory_mib", "gpu_count": "gpu", "name": "sn"}


@dataclass(frozen=True, slots=True)
class TracePod:
    """One pod of a pod list: what it asks for and, when the file says, when it came, started and left."""

    name: str
    request: Request
    creation_time_s: int | None  # arrival, seconds relative to the trace start; None when absent
    deletion_time_s: int | None  # departure; None when absent
    scheduled_time_s: int | None  # when the traced cluster started it; None when it never did or absent
    qos: str  # LS / BE / Burstable / Guaranteed as written; "" when absent
    line: int = 0  # 1-based line in the source file; 0 for pods that were not read from a file


def trace_name(path: str | Path) -> str:
    """The trace's short name: the file stem, e.g. ``openb_pod_list_default``."""
    return Path(path).stem


# --------------------------------------------------------------------------------------------------- loading


def load_nodes(path: str | Path) -> list[NodeSpec]:
    """The nodes of a node list; raises ``InputFileError`` for any bad content (duplicate names included)."""
    name = str(path)
    columns, rows = read_table(path, NODE_COLUMNS, "nodes")
    get = {col: column_getter(columns, col) for col in NODE_COLUMNS}
    nodes: list[NodeSpec] = []
    first_line: dict[str, int] = {}
    for line, row in rows:
        node = _parse_node(name, line, row, get)
        if node.name in first_line:
            raise InputFileError(
                name, line, "sn", f"duplicate node name {node.name!r} (first on line {first_line[node.name]})"
            )
        first_line[node.name] = line
        nodes.append(node)
    return nodes


def load_pods(path: str | Path) -> list[TracePod]:
    """The pods of a pod list in the long (11-column) or short (5-column) form; raises ``InputFileError``."""
    name = str(path)
    columns, rows = read_table(path, POD_COLUMNS_SHORT, "pods")
    get = {col: column_getter(columns, col) for col in POD_COLUMNS_LONG}
    spec_cache: dict[str, frozenset[str]] = {}
    return [_parse_pod(name, line, row, get, spec_cache) for line, row in rows]


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


def check_pods_fit(pods: Sequence[TracePod], nodes: Sequence[NodeSpec], pods_path: str | Path) -> None:
    """Raise ``InputFileError`` for the first pod that no node of ``nodes`` could ever host by GPU count or type."""
    name = str(pods_path)
    largest = max((n.gpu_count for n in nodes), default=0)
    largest_by_model: dict[str, int] = {}
    for node in nodes:
        if node.gpu_model and node.gpu_count > 0:
            largest_by_model[node.gpu_model] = max(largest_by_model.get(node.gpu_model, 0), node.gpu_count)
    for pod in pods:
        problem = _fit_problem(pod.request, largest, largest_by_model)
        if problem is not None:
            raise InputFileError(name, pod.line or None, problem[0], f"pod {pod.name}: {problem[1]}")


def _fit_problem(request: Request, largest: int, largest_by_model: dict[str, int]) -> tuple[str, str] | None:
    """(column, message) saying why no node can host ``request``, or None when some node could."""
    wanted = request.num_gpus
    if wanted == 0:
        return None
    if wanted > largest:
        return "num_gpu", f"{_gpus(wanted)} requested but the largest node has {largest}"
    if not request.gpu_types:
        return None
    present = {m: n for m, n in largest_by_model.items() if m in request.gpu_types}
    allowed = "|".join(sorted(request.gpu_types))
    if not present:
        have = ", ".join(sorted(largest_by_model)) or "none"
        return "gpu_spec", f"allows {allowed} but the nodes have only these GPU types: {have}"
    if wanted > max(present.values()):
        biggest = max(present.values())
        return "num_gpu", f"{_gpus(wanted)} requested but the largest node of type {allowed} has {biggest}"
    return None


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


# ---------------------------------------------------------------------------------------------- field values


def _parse_optional_int(path: str, line: int, column: str, text: str) -> int | None:
    return None if not text.strip() else parse_count(path, line, column, text)


def _parse_name(path: str, line: int, column: str, text: str) -> str:
    name = text.strip()
    if not name:
        raise InputFileError(path, line, column, "missing value (a name is required)")
    return name


def _parse_gpu_spec(path: str, line: int, text: str, cache: dict[str, frozenset[str]]) -> frozenset[str]:
    allowed = cache.get(text)
    if allowed is None:
        try:
            allowed = resolve_allowed(text)
        except UnknownGpuModelError as exc:
            raise InputFileError(path, line, "gpu_spec", exc.message) from exc
        cache[text] = allowed
    return allowed


# ---------------------------------------------------------------------------------------------------- nodes


def _parse_node(path: str, line: int, row: Row, get: dict[str, Getter]) -> NodeSpec:
    sn = _parse_name(path, line, "sn", get["sn"](row))
    cpu_milli = parse_count(path, line, "cpu_milli", get["cpu_milli"](row))
    mem_mib = parse_count(path, line, "memory_mib", get["memory_mib"](row))
    gpu_count = parse_count(path, line, "gpu", get["gpu"](row))
    model = _parse_node_model(path, line, get["model"](row), gpu_count)
    try:
        return NodeSpec(name=sn, cpu_milli=cpu_milli, mem_mib=mem_mib, gpu_count=gpu_count, gpu_model=model)
    except InvalidRequestError as exc:
        raise InputFileError(path, line, _NODE_FIELD_TO_COLUMN.get(exc.field, exc.field), exc.message) from exc


def _parse_node_model(path: str, line: int, text: str, gpu_count: int) -> str | None:
    model = text.strip()
    if not model:
        if gpu_count > 0:
            raise InputFileError(path, line, "model", f"the node has {_gpus(gpu_count)} but no GPU model")
        return None
    try:
        return resolve_model(model).name
    except UnknownGpuModelError as exc:
        raise InputFileError(path, line, "model", exc.message) from exc


# ----------------------------------------------------------------------------------------------------- pods


def _parse_pod(path: str, line: int, row: Row, get: dict[str, Getter], cache: dict[str, frozenset[str]]) -> TracePod:
    name = _parse_name(path, line, "name", get["name"](row))
    request = _parse_request(path, line, row, get, cache)
    creation = _parse_optional_int(path, line, "creation_time", get["creation_time"](row))
    deletion = _parse_optional_int(path, line, "deletion_time", get["deletion_time"](row))
    scheduled = _parse_optional_int(path, line, "scheduled_time", get["scheduled_time"](row))
    _check_times(path, line, creation, deletion, scheduled)
    qos = get["qos"](row).strip()
    return TracePod(name, request, creation, deletion, scheduled, qos, line)


def _parse_request(path: str, line: int, row: Row, get: dict[str, Getter], cache: dict[str, frozenset[str]]) -> Request:
    cpu_milli = parse_count(path, line, "cpu_milli", get["cpu_milli"](row))
    mem_mib = parse_count(path, line, "memory_mib", get["memory_mib"](row))
    num_gpus = parse_count(path, line, "num_gpu", get["num_gpu"](row))
    gpu_milli = parse_count(path, line, "gpu_milli", get["gpu_milli"](row))
    _check_gpu_share(path, line, num_gpus, gpu_milli)
    gpu_types = _parse_gpu_spec(path, line, get["gpu_spec"](row), cache)
    try:
        return Request(
            num_gpus=num_gpus, gpu_milli=gpu_milli, gpu_types=gpu_types, cpu_milli=cpu_milli, mem_mib=mem_mib
        )
    except InvalidRequestError as exc:
        raise InputFileError(path, line, _POD_FIELD_TO_COLUMN.get(exc.field, exc.field), exc.message) from exc


def _check_gpu_share(path: str, line: int, num_gpus: int, gpu_milli: int) -> None:
    """The trace's own rules on (num_gpu, gpu_milli); ``Request`` checks the rest (fractions of several GPUs)."""
    if gpu_milli > MILLI_PER_GPU:
        raise InputFileError(path, line, "gpu_milli", f"{gpu_milli} is over {MILLI_PER_GPU} (one whole GPU)")
    if num_gpus == 0 and gpu_milli > 0:
        raise InputFileError(path, line, "gpu_milli", f"a GPU share of {gpu_milli} given for a pod with 0 GPUs")
    if num_gpus > 0 and gpu_milli == 0:
        message = f"{_gpus(num_gpus)} requested with a share of 0 (use {MILLI_PER_GPU} for whole GPUs)"
        raise InputFileError(path, line, "gpu_milli", message)


def _check_times(path: str, line: int, creation: int | None, deletion: int | None, scheduled: int | None) -> None:
    if creation is None:
        return
    if deletion is not None and deletion < creation:
        raise InputFileError(path, line, "deletion_time", f"{deletion} is before creation_time {creation}")
    if scheduled is not None and scheduled < creation:
        raise InputFileError(path, line, "scheduled_time", f"{scheduled} is before creation_time {creation}")


# ---------------------------------------------------------------------------------------------------- writing


def write_nodes_csv(nodes: Iterable[NodeSpec], path: str | Path) -> None:
    """Write ``nodes`` as a node list that ``load_nodes`` reads back unchanged."""
    rows = ([n.name, n.cpu_milli, n.mem_mib, n.gpu_count, n.gpu_model or ""] for n in nodes)
    _write_csv(path, NODE_COLUMNS, rows)


def write_pods_csv(pods: Iterable[TracePod], path: str | Path, columns: int = 11) -> None:
    """Write ``pods`` as a pod list in the long (11) or short (5) column form.

    The short form keeps only name, CPU, memory and GPU request: type constraints, QoS and times are dropped.
    ``pod_phase`` is written as ``Running`` for a pod with a scheduled time and ``Pending`` otherwise.
    """
    if columns not in (len(POD_COLUMNS_SHORT), len(POD_COLUMNS_LONG)):
        raise InvalidRequestError("columns", f"must be 5 or 11, got {columns}")
    header = POD_COLUMNS_LONG if columns == len(POD_COLUMNS_LONG) else POD_COLUMNS_SHORT
    _write_csv(path, header, (_pod_row(pod)[:columns] for pod in pods))


def _pod_row(pod: TracePod) -> list[object]:
    req = pod.request
    phase = "Running" if pod.scheduled_time_s is not None else "Pending"
    return [
        pod.name,
        req.cpu_milli,
        req.mem_mib,
        req.num_gpus,
        req.gpu_milli,
        "|".join(sorted(req.gpu_types)),
        pod.qos,
        phase,
        _blank_if_none(pod.creation_time_s),
        _blank_if_none(pod.deletion_time_s),
        _blank_if_none(pod.scheduled_time_s),
    ]


def _blank_if_none(value: int | None) -> object:
    return "" if value is None else value


def _write_csv(path: str | Path, header: Sequence[str], rows: Iterable[Sequence[object]]) -> None:
    with Path(path).open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)
