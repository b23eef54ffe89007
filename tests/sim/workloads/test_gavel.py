"""Loading Gavel's throughput tables into the core models, the embedded default, and clear errors on bad files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.core.errors import InputFileError
from tessera.core.throughput import ColocationModel, ThroughputModel
from tessera.sim.workloads.gavel import (
    COLOCATED_FILE,
    DEFAULT_COLOCATION_FACTORS,
    DEFAULT_ISOLATED_STEPS_PER_S,
    ISOLATED_FILE,
    default_models,
    load_colocation_model,
    load_gavel_models,
    load_throughput_model,
)

TRACES = Path(__file__).resolve().parents[3].parent / "shared" / "traces"
GAVEL = TRACES / "gavel"

ISOLATED_HEADER = "gpu_type,consolidated,job_type,model,batch_size,scale_factor,throughput_steps_per_s"
ISOLATED_ROWS = [
    "k80,1,ResNet,ResNet,32,1,1.0",
    "p100,1,ResNet,ResNet,32,1,4.0",
    "v100,1,ResNet,ResNet,32,1,10.0",
    "v100,1,ResNet,ResNet,32,2,18.0",
    "v100,0,ResNet,ResNet,32,1,9.0",
    "k80,1,A3C,A3C,,1,3.0",
    "v100,1,A3C,A3C,,1,5.0",
    "k80,1,Big,Big,128,2,0.0",
]
COLOCATED_HEADER = (
    "gpu_type,consolidated,job_type_a,scale_factor_a,job_type_b,scale_factor_b,"
    "throughput_a_steps_per_s,throughput_b_steps_per_s,isolated_throughput_a_steps_per_s"
)
COLOCATED_ROWS = [
    "v100,1,ResNet,1,ResNet,1,4.0,4.0,10.0",
    "v100,1,ResNet,1,A3C,1,8.0,4.0,10.0",
    "v100,1,A3C,1,ResNet,1,4.0,8.0,5.0",
    "v100,1,A3C,1,A3C,1,0.0,0.0,5.0",
    "v100,1,ResNet,2,ResNet,2,7.0,7.0,18.0",
]


def write(path: Path, header: str, rows: list[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


@pytest.fixture
def isolated(tmp_path: Path) -> Path:
    return write(tmp_path / ISOLATED_FILE, ISOLATED_HEADER, ISOLATED_ROWS)


@pytest.fixture
def colocated(tmp_path: Path) -> Path:
    return write(tmp_path / COLOCATED_FILE, COLOCATED_HEADER, COLOCATED_ROWS)


def test_the_isolated_table_keeps_one_scale_factor_and_placement(isolated: Path) -> None:
    model = load_throughput_model(isolated)
    assert model.table == {
        ("ResNet", "K80"): 1.0,
        ("ResNet", "P100"): 4.0,
        ("ResNet", "V100M16"): 10.0,
        ("A3C", "K80"): 3.0,
        ("A3C", "V100M16"): 5.0,
    }
    assert model.speedup("ResNet", "k80", "v100") == pytest.approx(10.0)
    assert load_throughput_model(isolated, consolidated=False).table == {("ResNet", "V100M16"): 9.0}
    # The only scale-2 "Big" row measured 0 (it does not fit): left out, the fallback covers it.
    assert load_throughput_model(isolated, scale_factor=2).table == {("ResNet", "V100M16"): 18.0}


def test_co_location_factors_divide_by_each_jobs_isolated_throughput(colocated: Path) -> None:
    model = load_colocation_model(colocated)
    assert model.factors("ResNet", "A3C", "V100") == pytest.approx((0.8, 0.8))
    assert model.factors("ResNet", "ResNet", "V100") == pytest.approx((0.4, 0.4))
    assert model.factors("A3C", "A3C", "V100") == (0.0, 0.0)  # does not fit together: no throughput at all
    assert model.net_gain("A3C", "ResNet", "v100") == pytest.approx(0.6)
    assert load_colocation_model(colocated, scale_factor=2).factors("ResNet", "ResNet", "v100") == pytest.approx(
        (7 / 18, 7 / 18)
    )


def test_load_gavel_models_reads_a_folder_or_falls_back_to_the_default(isolated: Path, colocated: Path) -> None:
    throughput, colocation = load_gavel_models(isolated.parent)
    assert throughput.table[("ResNet", "V100M16")] == 10.0
    assert colocation.is_measured("A3C", "ResNet", "V100M16")
    default_throughput, default_colocation = load_gavel_models(None)
    assert default_throughput.table == default_models()[0].table
    assert default_colocation.table == default_models()[1].table


def test_the_embedded_default_covers_its_tables() -> None:
    throughput, colocation = default_models()
    assert isinstance(throughput, ThroughputModel) and isinstance(colocation, ColocationModel)
    assert set(throughput.job_types) == set(DEFAULT_ISOLATED_STEPS_PER_S)
    for job_type in throughput.job_types:
        assert throughput.speedup(job_type, "K80", "V100") > 1.0
        assert throughput.throughput(job_type, "H100") > throughput.throughput(job_type, "V100")
    for (a, b), factors in DEFAULT_COLOCATION_FACTORS.items():
        assert colocation.factors(a, b, "V100M16") == factors
    assert not colocation.worth_sharing("ResNet-50", "ResNet-50", "V100M16")
    assert colocation.worth_sharing("LM", "A3C", "V100M16")


@pytest.mark.parametrize(
    ("row", "column", "fragment"),
    [
        ("v100,1,ResNet,ResNet,32,1,fast", "throughput_steps_per_s", "not a number"),
        ("v100,1,ResNet,ResNet,32,1,-2", "throughput_steps_per_s", ">= 0"),
        ("v100,1,ResNet,ResNet,32,1,inf", "throughput_steps_per_s", "finite"),
        ("v100,2,ResNet,ResNet,32,1,1.0", "consolidated", "0 or 1"),
        ("v100,1,ResNet,ResNet,32,one,1.0", "scale_factor", "not an integer"),
        ("tpu,1,ResNet,ResNet,32,1,1.0", "gpu_type", "unknown GPU type"),
        ("v100,1, ,ResNet,32,1,1.0", "job_type", "missing"),
        ("v100,1,ResNet,ResNet,32,1,1.0\nV100M16,1,ResNet,ResNet,32,1,2.0", "job_type", "given twice"),
    ],
)
def test_bad_isolated_rows_name_the_line_and_column(tmp_path: Path, row: str, column: str, fragment: str) -> None:
    path = write(tmp_path / "iso.csv", ISOLATED_HEADER, ["p100,1,ResNet,ResNet,32,1,4.0", row])
    with pytest.raises(InputFileError, match=fragment) as info:
        load_throughput_model(path)
    assert info.value.field == column
    assert info.value.line in (3, 4)
    assert str(path) in str(info.value)


def test_structural_problems_are_input_file_errors(tmp_path: Path) -> None:
    missing_column = write(tmp_path / "a.csv", "gpu_type,job_type,throughput_steps_per_s", ["v100,ResNet,1.0"])
    with pytest.raises(InputFileError, match="required column missing"):
        load_throughput_model(missing_column)
    with pytest.raises(InputFileError, match="no rows with scale_factor 4"):
        load_throughput_model(write(tmp_path / "b.csv", ISOLATED_HEADER, ISOLATED_ROWS), scale_factor=4)
    with pytest.raises(InputFileError, match="cannot read"):
        load_throughput_model(tmp_path / "absent.csv")
    with pytest.raises(InputFileError, match="cannot read"):
        load_gavel_models(tmp_path / "no-such-folder")


def test_a_partner_without_an_isolated_throughput_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path / "co.csv", COLOCATED_HEADER, ["v100,1,ResNet,1,Ghost,1,4.0,1.0,10.0"])
    with pytest.raises(InputFileError, match="no isolated throughput for Ghost") as info:
        load_colocation_model(path)
    assert (info.value.line, info.value.field) == (2, "job_type_b")


def test_bad_co_located_rows_name_the_line_and_column(tmp_path: Path) -> None:
    rows = [*COLOCATED_ROWS, "p100,1,ResNet,1,A3C,1,8.0,x,10.0"]
    with pytest.raises(InputFileError, match="not a number") as info:
        load_colocation_model(write(tmp_path / "co.csv", COLOCATED_HEADER, rows))
    assert (info.value.line, info.value.field) == (len(rows) + 1, "throughput_b_steps_per_s")
    duplicate = [*COLOCATED_ROWS, COLOCATED_ROWS[0]]
    with pytest.raises(InputFileError, match="given twice"):
        load_colocation_model(write(tmp_path / "dup.csv", COLOCATED_HEADER, duplicate))


@pytest.mark.skipif(not (GAVEL / ISOLATED_FILE).exists(), reason="../shared/traces/gavel is not here")
def test_the_published_tables_load() -> None:
    throughput, colocation = load_gavel_models(GAVEL)
    assert len(throughput.job_types) == 26
    assert len(throughput.table) == 26 * 3  # every job type on k80, p100 and v100
    resnet = "ResNet-50 (batch size 64)"
    assert throughput.speedup(resnet, "K80", "V100") > 5.0
    assert throughput.speedup("A3C", "K80", "V100") < throughput.speedup(resnet, "K80", "V100")
    assert not throughput.is_measured(resnet, "T4")
    assert throughput.throughput(resnet, "T4") > 0
    assert len(colocation.table) == 26 * 26 * 3
    gains = [colocation.net_gain(a, b, gpu) for a, b, gpu in colocation.table]
    assert any(g > 0 for g in gains) and any(g < 0 for g in gains)
    factors = [f for pair in colocation.table.values() for f in pair]
    assert 0.5 < sum(factors) / len(factors) < 0.6
    for scale_factor in (2, 4, 8):
        assert load_gavel_models(GAVEL, scale_factor=scale_factor)[0].table
