"""Tests of the openb node and pod list loaders and writers (tessera.sim.traces.openb)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera.core.cluster import NodeSpec
from tessera.core.errors import InputFileError, InvalidRequestError
from tessera.core.workload import Request
from tessera.sim.traces.openb import (
    POD_COLUMNS_LONG,
    POD_COLUMNS_SHORT,
    TracePod,
    check_pods_fit,
    load_nodes,
    load_pods,
    trace_name,
    write_nodes_csv,
    write_pods_csv,
)
from tessera.sim.workloads.synthetic import synthetic_nodes, synthetic_pods

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
OPENB = TRACES / "openb"

LONG_HEADER = ",".join(POD_COLUMNS_LONG)
SHORT_HEADER = ",".join(POD_COLUMNS_SHORT)
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
GOOD_POD = "pod-a,4000,8192,1,500,,LS,Running,10,100,12"
GOOD_NODE = "node-a,96000,393216,8,G2"


def write(tmp_path: Path, text: str, name: str = "pods.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8", newline="")
    return path


def pod_file(tmp_path: Path, *rows: str, header: str = LONG_HEADER) -> Path:
    return write(tmp_path, "\n".join((header, *rows)) + "\n")


def node_file(tmp_path: Path, *rows: str, header: str = NODE_HEADER) -> Path:
    return write(tmp_path, "\n".join((header, *rows)) + "\n", name="nodes.csv")


def without_line(pods: list[TracePod]) -> list[TracePod]:
    return [dataclasses.replace(p, line=0) for p in pods]


# ------------------------------------------------------------------------------------------------ round trips


def test_long_form_round_trip_of_synthetic_pods(tmp_path: Path) -> None:
    pods = synthetic_pods(300, seed=1, constrained_share=0.3)
    path = tmp_path / "pods.csv"
    write_pods_csv(pods, path)
    loaded = load_pods(path)
    assert without_line(loaded) == pods
    assert [p.line for p in loaded] == list(range(2, len(pods) + 2))
    assert any(p.request.gpu_types for p in loaded)


def test_short_form_round_trip_keeps_requests_only(tmp_path: Path) -> None:
    pods = synthetic_pods(200, seed=2)
    path = tmp_path / "pods.csv"
    write_pods_csv(pods, path, columns=5)
    assert path.read_text(encoding="utf-8").splitlines()[0] == SHORT_HEADER
    loaded = load_pods(path)
    assert [(p.name, p.request) for p in loaded] == [(p.name, p.request) for p in pods]
    assert all(p.qos == "" and p.creation_time_s is None and p.deletion_time_s is None for p in loaded)
    assert all(p.scheduled_time_s is None for p in loaded)


def test_node_round_trip(tmp_path: Path) -> None:
    nodes = [*synthetic_nodes(40, seed=3), NodeSpec("cpu-only", 32000, 131072, 0, None)]
    path = tmp_path / "nodes.csv"
    write_nodes_csv(nodes, path)
    assert load_nodes(path) == nodes


def test_write_pods_rejects_other_column_counts(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError) as info:
        write_pods_csv(synthetic_pods(3), tmp_path / "p.csv", columns=7)
    assert info.value.field == "columns"


_names = st.text(
    alphabet=st.characters(blacklist_categories=("Cc", "Cs", "Zs", "Zl", "Zp"), blacklist_characters="\ufeff"),
    min_size=1,
    max_size=12,
)


@st.composite
def trace_pods(draw: st.DrawFn) -> TracePod:
    num_gpus = draw(st.integers(0, 64))
    if num_gpus == 0:
        gpu_milli = 0
    elif num_gpus == 1:
        gpu_milli = draw(st.integers(1, 1000))
    else:
        gpu_milli = 1000
    types = draw(st.frozensets(st.sampled_from(["G2", "G3", "A10", "P100", "T4", "V100M16", "V100M32"]), max_size=3))
    request = Request(
        num_gpus=num_gpus,
        gpu_milli=gpu_milli,
        gpu_types=types if num_gpus else frozenset(),
        cpu_milli=draw(st.integers(0, 10**7)),
        mem_mib=draw(st.integers(0, 10**8)),
    )
    creation = draw(st.none() | st.integers(0, 10**9))
    later = st.none() if creation is None else st.none() | st.integers(creation, creation + 10**9)
    deletion = draw(st.none() | st.integers(0, 10**9)) if creation is None else draw(later)
    scheduled = draw(st.none() | st.integers(0, 10**9)) if creation is None else draw(later)
    qos = draw(st.sampled_from(["LS", "BE", "Burstable", "Guaranteed", ""]))
    return TracePod(draw(_names), request, creation, deletion, scheduled, qos)


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pods=st.lists(trace_pods(), min_size=1, max_size=20))
def test_arbitrary_valid_rows_round_trip(tmp_path: Path, pods: list[TracePod]) -> None:
    path = tmp_path / "hyp.csv"
    write_pods_csv(pods, path)
    assert without_line(load_pods(path)) == pods


# ----------------------------------------------------------------------------------------------- header forms


def test_columns_reordered_are_read_by_name(tmp_path: Path) -> None:
    header = "memory_mib,gpu_milli,name,extra,num_gpu,cpu_milli,gpu_spec"
    (pod,) = load_pods(pod_file(tmp_path, "2048,250,pod-a,zzz,1,1500,T4|P100", header=header))
    assert pod.name == "pod-a"
    expected = Request(num_gpus=1, gpu_milli=250, cpu_milli=1500, mem_mib=2048, gpu_types=frozenset({"T4", "P100"}))
    assert pod.request == expected
    assert pod.qos == "" and pod.creation_time_s is None


def test_bom_whitespace_and_blank_lines_are_accepted(tmp_path: Path) -> None:
    text = "\ufeff" + LONG_HEADER + "\r\n pod-a , 4000 ,8192, 1 ,+500,,LS,Running, 10,100,\r\n\r\n"
    (pod,) = load_pods(write(tmp_path, text))
    assert pod.name == "pod-a"
    assert pod.request == Request(num_gpus=1, gpu_milli=500, cpu_milli=4000, mem_mib=8192)
    assert (pod.creation_time_s, pod.deletion_time_s, pod.scheduled_time_s) == (10, 100, None)
    assert pod.line == 2


def test_long_form_fields(tmp_path: Path) -> None:
    (pod,) = load_pods(pod_file(tmp_path, GOOD_POD))
    assert pod == TracePod(
        "pod-a", Request(num_gpus=1, gpu_milli=500, cpu_milli=4000, mem_mib=8192), 10, 100, 12, "LS", line=2
    )


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("", frozenset()),
        ("T4", frozenset({"T4"})),
        ("V100M16|T4", frozenset({"V100M16", "T4"})),
        ("v100m32| p100 ", frozenset({"V100M32", "P100"})),
        ("A100", frozenset({"A100-40GB", "A100-80GB"})),
    ],
)
def test_gpu_spec_parsing(tmp_path: Path, spec: str, expected: frozenset[str]) -> None:
    (pod,) = load_pods(pod_file(tmp_path, f'pod-a,1000,1024,1,1000,"{spec}",LS,Running,0,1,0'))
    assert pod.request.gpu_types == expected


def test_trace_name() -> None:
    assert trace_name("/x/y/openb_pod_list_default.csv") == "openb_pod_list_default"
    assert trace_name(Path("nodes.csv")) == "nodes"


# ------------------------------------------------------------------------------------------------- bad input


def assert_error(exc: InputFileError, path: Path, line: int | None, field: str | None) -> None:
    assert exc.path == str(path)
    assert exc.line == line
    assert exc.field == field
    assert str(path) in str(exc)


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ("pod-b,abc,8192,1,500,,LS,Running,10,100,12", "cpu_milli"),
        ("pod-b,4000,1.5,1,500,,LS,Running,10,100,12", "memory_mib"),
        ("pod-b,4000,8192,-1,500,,LS,Running,10,100,12", "num_gpu"),
        ("pod-b,,8192,1,500,,LS,Running,10,100,12", "cpu_milli"),
        ("pod-b,4000,8192,1,1200,,LS,Running,10,100,12", "gpu_milli"),
        ("pod-b,4000,8192,2,500,,LS,Running,10,100,12", "gpu_milli"),
        ("pod-b,4000,8192,1,0,,LS,Running,10,100,12", "gpu_milli"),
        ("pod-b,4000,8192,0,300,,LS,Running,10,100,12", "gpu_milli"),
        ("pod-b,4000,8192,65,1000,,LS,Running,10,100,12", "num_gpu"),
        ("pod-b,4000,8192,1,500,H9000,LS,Running,10,100,12", "gpu_spec"),
        ("pod-b,4000,8192,1,500,T4|nope,LS,Running,10,100,12", "gpu_spec"),
        ("pod-b,4000,8192,1,500,,LS,Running,x,100,12", "creation_time"),
        ("pod-b,4000,8192,1,500,,LS,Running,10,5,12", "deletion_time"),
        ("pod-b,4000,8192,1,500,,LS,Running,10,100,5", "scheduled_time"),
        (" ,4000,8192,1,500,,LS,Running,10,100,12", "name"),
        ("pod-b,4000,8192,1,500,,LS,Running,10,100", None),
        ("pod-b,4000,8192,1,500,,LS,Running,10,100,12,extra", None),
    ],
)
def test_bad_pod_rows_name_line_and_field(tmp_path: Path, row: str, field: str | None) -> None:
    path = pod_file(tmp_path, GOOD_POD, row)
    with pytest.raises(InputFileError) as info:
        load_pods(path)
    assert_error(info.value, path, 3, field)


def test_short_form_bad_row(tmp_path: Path) -> None:
    path = pod_file(tmp_path, "a,1,1,0,0", "b,1,1,1,0", header=SHORT_HEADER)
    with pytest.raises(InputFileError) as info:
        load_pods(path)
    assert_error(info.value, path, 3, "gpu_milli")


def test_missing_pod_column_lists_columns_found(tmp_path: Path) -> None:
    path = pod_file(tmp_path, "a,1,1,0", header="name,cpu_milli,memory_mib,num_gpu")
    with pytest.raises(InputFileError) as info:
        load_pods(path)
    assert_error(info.value, path, 1, "gpu_milli")
    assert "name, cpu_milli, memory_mib, num_gpu" in info.value.message


def test_duplicate_header_column(tmp_path: Path) -> None:
    path = pod_file(tmp_path, "a,1,1,0,0,2", header=SHORT_HEADER + ",cpu_milli")
    with pytest.raises(InputFileError) as info:
        load_pods(path)
    assert_error(info.value, path, 1, "cpu_milli")


@pytest.mark.parametrize("text", ["", "\ufeff"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputFileError) as info:
        load_pods(path)
    assert_error(info.value, path, None, None)
    assert "empty" in info.value.message


def test_header_without_pods(tmp_path: Path) -> None:
    path = pod_file(tmp_path, "")
    with pytest.raises(InputFileError) as info:
        load_pods(path)
    assert_error(info.value, path, 1, None)
    assert "no pods" in info.value.message


def test_missing_file_and_bad_encoding(tmp_path: Path) -> None:
    missing = tmp_path / "missing.csv"
    with pytest.raises(InputFileError) as info:
        load_pods(missing)
    assert_error(info.value, missing, None, None)
    bad = tmp_path / "latin1.csv"
    bad.write_bytes((SHORT_HEADER + "\na,1,1,0,0\nb\xe9,1,1,0,0\n").encode("latin-1"))
    with pytest.raises(InputFileError) as info:
        load_pods(bad)
    assert_error(info.value, bad, 3, None)


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ("node-b,abc,1024,2,T4", "cpu_milli"),
        ("node-b,1000,-5,2,T4", "memory_mib"),
        ("node-b,1000,1024,2.0,T4", "gpu"),
        ("node-b,1000,1024,2,K80X", "model"),
        ("node-b,1000,1024,2,", "model"),
        ("node-a,1000,1024,2,T4", "sn"),
        (",1000,1024,2,T4", "sn"),
        ("node-b,1000,1024,2", None),
    ],
)
def test_bad_node_rows_name_line_and_field(tmp_path: Path, row: str, field: str | None) -> None:
    path = node_file(tmp_path, GOOD_NODE, row)
    with pytest.raises(InputFileError) as info:
        load_nodes(path)
    assert_error(info.value, path, 3, field)


def test_duplicate_node_message_names_first_line(tmp_path: Path) -> None:
    path = node_file(tmp_path, GOOD_NODE, "node-b,1,1,0,", GOOD_NODE)
    with pytest.raises(InputFileError) as info:
        load_nodes(path)
    assert_error(info.value, path, 4, "sn")
    assert "line 2" in info.value.message


def test_node_list_fields_and_cpu_only_nodes(tmp_path: Path) -> None:
    nodes = load_nodes(node_file(tmp_path, GOOD_NODE, "cpu-1,32000,262144,0,", "node-c,8000,32768,1,v100"))
    assert nodes == [
        NodeSpec("node-a", 96000, 393216, 8, "G2"),
        NodeSpec("cpu-1", 32000, 262144, 0, None),
        NodeSpec("node-c", 8000, 32768, 1, "V100M16"),
    ]


def test_node_list_problems_of_the_whole_file(tmp_path: Path) -> None:
    path = node_file(tmp_path)
    with pytest.raises(InputFileError) as info:
        load_nodes(path)
    assert_error(info.value, path, 1, None)
    assert "no nodes" in info.value.message
    path = node_file(tmp_path, "node-a,1,1,0", header="sn,cpu_milli,memory_mib,gpu")
    with pytest.raises(InputFileError) as info:
        load_nodes(path)
    assert_error(info.value, path, 1, "model")


# ------------------------------------------------------------------------------------------------ pods vs nodes


NODES = [NodeSpec("t4", 64000, 262144, 2, "T4"), NodeSpec("v100", 64000, 262144, 4, "V100M16")]


def test_pods_that_fit_pass(tmp_path: Path) -> None:
    path = pod_file(tmp_path, "a,1,1,0,0,,,,,,", "b,1,1,4,1000,V100M16|T4,,,,,", "c,1,1,2,1000,T4,,,,,")
    check_pods_fit(load_pods(path), NODES, path)


@pytest.mark.parametrize(
    ("row", "field", "words"),
    [
        ("x,1,1,8,1000,,,,,,", "num_gpu", "8 GPUs requested but the largest node has 4"),
        ("x,1,1,1,500,P100,,,,,", "gpu_spec", "P100"),
        ("x,1,1,4,1000,T4,,,,,", "num_gpu", "largest node of type T4 has 2"),
    ],
)
def test_first_pod_that_cannot_fit_is_reported(tmp_path: Path, row: str, field: str, words: str) -> None:
    path = pod_file(tmp_path, "a,1,1,1,1000,,,,,,", row, "y,1,1,64,1000,,,,,,")
    with pytest.raises(InputFileError) as info:
        check_pods_fit(load_pods(path), NODES, path)
    assert_error(info.value, path, 3, field)
    assert words in info.value.message


# ------------------------------------------------------------------------------------------------ the real trace


requires_openb = pytest.mark.skipif(not (OPENB / "openb_pod_list_default.csv").exists(), reason="no openb trace")


@requires_openb
def test_openb_node_lists() -> None:
    gpu_nodes = load_nodes(OPENB / "openb_node_list_gpu_node.csv")
    assert len(gpu_nodes) == 1213
    assert sum(n.gpu_count for n in gpu_nodes) == 6212
    all_nodes = load_nodes(OPENB / "openb_node_list_all_node.csv")
    assert len(all_nodes) == 1523
    assert sum(1 for n in all_nodes if n.gpu_count == 0) == 310


@requires_openb
def test_openb_pod_lists_all_load_and_fit() -> None:
    gpu_nodes = load_nodes(OPENB / "openb_node_list_gpu_node.csv")
    paths = sorted(OPENB.glob("openb_pod_list_*.csv"))
    assert paths
    for path in paths:
        pods = load_pods(path)
        check_pods_fit(pods, gpu_nodes, path)
        if trace_name(path) == "openb_pod_list_default":
            assert len(pods) == 8152
