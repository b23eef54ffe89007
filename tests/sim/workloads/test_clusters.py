"""Cluster shapes: the PAI machine list (file and embedded mix) and down-scaling that keeps the GPU-model mix."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tessera.core.cluster import NodeSpec
from tessera.core.errors import InputFileError, InvalidRequestError
from tessera.sim.workloads.clusters import PAI_MIX, load_pai_nodes, pai_cluster, scale_nodes, subsample_nodes
from tessera.sim.workloads.synthetic import synthetic_nodes

PAI = Path(__file__).resolve().parents[3].parent / "shared" / "traces" / "pai" / "pai_machine_spec.csv"


def shapes(nodes: list[NodeSpec]) -> Counter[tuple[str | None, int, int, int]]:
    return Counter((n.gpu_model, n.cpu_milli, n.mem_mib, n.gpu_count) for n in nodes)


def test_pai_rows_become_nodes_in_tesseras_units(tmp_path: Path) -> None:
    path = tmp_path / "pai.csv"
    path.write_text("m1,T4,96,512,2\nm2,V100,96,384,8\nm3,MISC,96,512,8\nm4,CPU,96,512,0\nm5,V100M32,96,384,8\n")
    nodes = load_pai_nodes(path)
    assert nodes == [
        NodeSpec("m1", 96_000, 512 * 1024, 2, "T4"),
        NodeSpec("m2", 96_000, 384 * 1024, 8, "V100M16"),
        NodeSpec("m3", 96_000, 512 * 1024, 8, "G2"),
        NodeSpec("m5", 96_000, 384 * 1024, 8, "V100M32"),
    ]
    with_cpu = load_pai_nodes(path, misc_gpu_model="P100", include_cpu_nodes=True)
    assert [n.gpu_model for n in with_cpu] == ["T4", "V100M16", "P100", None, "V100M32"]
    assert pai_cluster(path, misc_gpu_model="A10")[2].gpu_model == "A10"


@pytest.mark.parametrize(
    ("text", "line", "column", "fragment"),
    [
        ("m1,T4,96,512,2\nm2,T4,96,512\n", 2, None, "4 fields"),
        ("m1,TPU,96,512,2\n", 1, "gpu_type", "unknown GPU type"),
        ("m1,CPU,96,512,2\n", 1, "cap_gpu", "CPU machine with 2 GPUs"),
        ("m1,T4,96,512,2\nm1,T4,96,512,2\n", 2, "machine", "duplicate machine"),
        ("m1,T4,lots,512,2\n", 1, "cap_cpu", "not an integer"),
        ("m1,T4,96,-1,2\n", 1, "cap_mem", ">= 0"),
        (",T4,96,512,2\n", 1, "machine", "missing"),
    ],
)
def test_bad_machine_rows_name_the_line_and_column(
    tmp_path: Path, text: str, line: int, column: str | None, fragment: str
) -> None:
    path = tmp_path / "pai.csv"
    path.write_text(text)
    with pytest.raises(InputFileError, match=fragment) as info:
        load_pai_nodes(path)
    assert (info.value.line, info.value.field) == (line, column)


def test_empty_or_gpu_less_lists_are_rejected(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(InputFileError, match="no machines"):
        load_pai_nodes(empty)
    cpu_only = tmp_path / "cpu.csv"
    cpu_only.write_text("m1,CPU,96,512,0\n")
    with pytest.raises(InvalidRequestError, match="no node with GPUs"):
        pai_cluster(cpu_only)


def test_the_embedded_mix_has_the_machine_lists_shape() -> None:
    nodes = pai_cluster(None)
    assert len(nodes) == sum(count for count, *_, gpus in PAI_MIX if gpus) == 1814
    assert sum(n.gpu_count for n in nodes) == 6742
    assert len(pai_cluster(None, include_cpu_nodes=True)) == 1897


def test_max_nodes_keeps_the_model_mix_and_is_deterministic() -> None:
    full = pai_cluster(None)
    small = pai_cluster(None, 100)
    assert small == pai_cluster(None, 100) and len(small) == 100
    full_models, small_models = Counter(n.gpu_model for n in full), Counter(n.gpu_model for n in small)
    for model, count in full_models.items():
        assert small_models[model] == pytest.approx(100 * count / len(full), abs=1)
    assert subsample_nodes(full[:10], 50) == full[:10]
    with pytest.raises(InvalidRequestError, match="max_nodes"):
        subsample_nodes(full, 0)


def test_scale_nodes_keeps_shapes_the_largest_node_and_input_order() -> None:
    nodes = synthetic_nodes(400, seed=3)
    scaled = scale_nodes(nodes, 0.3)
    assert scaled == scale_nodes(nodes, 0.3)
    positions = [nodes.index(n) for n in scaled]
    assert positions == sorted(positions)
    full_shapes, small_shapes = shapes(nodes), shapes(scaled)
    for shape, count in full_shapes.items():
        if count >= 30:
            assert small_shapes[shape] == pytest.approx(0.3 * count, abs=1.5), shape
    for model in {n.gpu_model for n in nodes}:
        largest = max(n.gpu_count for n in nodes if n.gpu_model == model)
        assert any(n.gpu_model == model and n.gpu_count == largest for n in scaled)
    assert scale_nodes(nodes, 1.0) == nodes
    for bad in (0.0, 1.5, -0.1):
        with pytest.raises(InvalidRequestError, match="gpu_scale"):
            scale_nodes(nodes, bad)


@pytest.mark.skipif(not PAI.exists(), reason="../shared/traces/pai is not here")
def test_the_pai_file_matches_the_embedded_mix() -> None:
    from_file = pai_cluster(PAI, include_cpu_nodes=True)
    assert shapes(from_file) == shapes(pai_cluster(None, include_cpu_nodes=True))
    assert len(pai_cluster(PAI, 64)) == 64
