"""The performance model: fitting machinery, the iteration rule, calibration from a Splitwise grid, user profiles,
scaling to other models and GPUs, the roofline default and the Splitwise-compatible mode.

Most tests write small CSVs to tmp_path; the ones marked ``shared`` read ../shared/traces/splitwise/perf_model.csv
and skip when it is absent."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.core.errors import InputFileError, UnknownGpuModelError
from tessera.serving.gpus import SERVING_GPUS, gpu_spec
from tessera.serving.models import model_spec
from tessera.serving.perf_calibrated import grid_points, split_failed_runs
from tessera.serving.perf_csv import read_splitwise_rows
from tessera.serving.perf_fit import (
    DecodeSample,
    DecodeStep,
    PiecewiseLinear,
    fit_decode_step,
    pool_adjacent_violators,
)
from tessera.serving.perf_model import (
    CalibratedPerf,
    Collectives,
    PerfModel,
    ProfilePerf,
    ReplicaShape,
    RooflinePerf,
    ScalingAssumptions,
    SplitwiseCompatPerf,
    calibrated_perf_for,
    choose_calibration_source,
    default_perf,
    shared_calibration_csv,
)
from tessera.serving.perf_scaling import estimate_collectives

REPO_ROOT = Path(__file__).resolve().parents[2]
SHARED_CSV = REPO_ROOT.parent / "shared" / "traces" / "splitwise" / "perf_model.csv"
shared = pytest.mark.skipif(not SHARED_CSV.is_file(), reason=f"{SHARED_CSV} is absent")

HEADER = (
    "model,hardware,prompt_size,batch_size,token_size,peak_power,average_power,prompt_time,token_time,e2e_time,"
    "tensor_parallel"
)
# The Splitwise grid's shape: a prompt sweep and a token sweep at batch 1, a batch sweep at 512-token prompts.
GRID = sorted(
    {(p, 1, 128) for p in (128, 256, 512, 1024, 2048, 4096, 8192)}
    | {(512, 1, t) for t in (128, 256, 512, 1024, 2048, 4096, 8192)}
    | {(512, b, 128) for b in (1, 2, 4, 8, 16, 32, 64)}
)
# A known truth for synthetic grids (seconds).
TRUE_DECODE = DecodeStep(intercept_s=0.03, per_seq_s=2e-4, per_seq_sq_s=1e-6, per_kv_token_s=1e-7, max_batch=64)


def true_prefill_ms(batch_tokens: int) -> float:
    return 40.0 + 0.09 * batch_tokens  # monotone, so interpolation must reproduce it exactly at the knots


def write_grid(path: Path, model: str = "toy-1b", tp: int = 1, repeats: int = 1, hardware: str = "h100-80gb") -> Path:
    lines = [HEADER]
    for (p, b, t), r in itertools.product(GRID, range(repeats)):
        noise = 1.0 + 0.01 * (r - (repeats - 1) / 2)  # symmetric around the truth: the median is the truth
        prefill = true_prefill_ms(p * b) * noise
        decode = TRUE_DECODE.seconds(b, b * (p + t / 2)) * 1000 * noise
        lines.append(f"{model},{hardware},{p},{b},{t},1,1,{prefill},{decode},0,{tp}")
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------------------------------------ machinery


def test_pool_adjacent_violators_keeps_ordered_values_and_pools_the_rest() -> None:
    assert pool_adjacent_violators([1.0, 2.0, 3.0], [1, 1, 1]) == [1.0, 2.0, 3.0]
    assert pool_adjacent_violators([3.0, 1.0, 2.0], [1, 1, 1]) == [2.0, 2.0, 2.0]
    assert pool_adjacent_violators([1.0, 4.0, 2.0], [1, 1, 3]) == [1.0, 2.5, 2.5]


@given(st.lists(st.tuples(st.floats(0, 1e3), st.floats(0.5, 10)), min_size=1, max_size=30))
def test_pooled_values_are_non_decreasing_and_keep_the_weighted_total(pairs: list[tuple[float, float]]) -> None:
    values, weights = [v for v, _ in pairs], [w for _, w in pairs]
    pooled = pool_adjacent_violators(values, weights)
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(pooled))
    total = sum(v * w for v, w in zip(values, weights, strict=True))
    assert sum(v * w for v, w in zip(pooled, weights, strict=True)) == pytest.approx(total, rel=1e-9, abs=1e-9)


def test_piecewise_linear_is_exact_on_knots_and_linear_between_and_outside() -> None:
    curve = PiecewiseLinear((100.0, 200.0, 400.0), (1.0, 2.0, 6.0))
    assert [curve(x) for x in (100, 200, 400)] == [1.0, 2.0, 6.0]
    assert curve(150) == pytest.approx(1.5)
    assert curve(800) == pytest.approx(14.0)  # the last segment's slope, 0.02 per token
    assert curve(50) == pytest.approx(0.5)  # the first segment's slope
    assert curve(0) == 0.0  # never below zero
    assert PiecewiseLinear((10.0, 20.0), (5.0, 6.0))(0) == pytest.approx(4.0)


def test_one_knot_means_time_proportional_to_tokens() -> None:
    assert PiecewiseLinear((512.0,), (0.1,))(1024) == pytest.approx(0.2)


def test_monotone_curve_pools_a_dip_and_rejects_bad_knots() -> None:
    curve = PiecewiseLinear.monotone([128, 256, 512], [0.06, 0.05, 0.07], [1, 1, 1])
    assert curve.ys == pytest.approx((0.055, 0.055, 0.07))
    with pytest.raises(ValueError):
        PiecewiseLinear((2.0, 1.0), (1.0, 2.0))
    with pytest.raises(ValueError):
        PiecewiseLinear((1.0, 2.0), (2.0, 1.0))


def test_decode_step_continues_on_its_tangent_beyond_the_largest_batch() -> None:
    step = DecodeStep(0.01, 1e-3, 1e-5, 0.0, max_batch=10)
    slope = 1e-3 + 2 * 1e-5 * 10
    assert step.intercept_at(10) == pytest.approx(0.01 + 0.01 + 0.001)
    assert step.intercept_at(30) == pytest.approx(step.intercept_at(10) + 20 * slope)
    assert step.intercept_at(30) < 0.01 + 30e-3 + 1e-5 * 900  # below the quadratic continued
    with pytest.raises(ValueError):
        DecodeStep(0.01, -1e-3, 0.0, 0.0, 1)


def test_fit_recovers_a_decode_step_from_exact_samples_and_keeps_the_kv_floor() -> None:
    samples = [
        DecodeSample(b, kv, TRUE_DECODE.seconds(b, kv)) for b, kv in itertools.product((1, 4, 16, 64), (0, 5e3, 4e4))
    ]
    fitted = fit_decode_step(samples)
    assert fitted.intercept_s == pytest.approx(TRUE_DECODE.intercept_s, rel=1e-6)
    assert fitted.per_seq_s == pytest.approx(TRUE_DECODE.per_seq_s, rel=1e-4)
    assert fitted.per_seq_sq_s == pytest.approx(TRUE_DECODE.per_seq_sq_s, rel=1e-4)
    assert fitted.per_kv_token_s == pytest.approx(TRUE_DECODE.per_kv_token_s, rel=1e-4)
    assert fitted.max_batch == 64
    assert fit_decode_step(samples, kv_floor_s=3e-7).per_kv_token_s >= 3e-7


# ------------------------------------------------------------------------------- calibration from a grid


def test_calibration_is_exact_on_the_grid_points_of_a_consistent_grid(tmp_path: Path) -> None:
    perf = CalibratedPerf.from_csv(write_grid(tmp_path / "g.csv", repeats=3), "toy-1b", "h100-80gb", 1)
    for p, b, t in GRID:
        assert perf.iteration_s(p * b, 0, 0) * 1000 == pytest.approx(true_prefill_ms(p * b), rel=1e-9)
        assert perf.iteration_s(0, b, round(b * (p + t / 2))) == pytest.approx(
            TRUE_DECODE.seconds(b, round(b * (p + t / 2))), rel=1e-5
        )
    assert perf.source is None  # the toy model's shape is unknown: not scalable
    with pytest.raises(ValueError, match="source"):
        perf.scaled_to(model_spec("llama2-7b"), "H100", 1)


def test_extrapolation_outside_the_grid_follows_the_end_segments(tmp_path: Path) -> None:
    perf = CalibratedPerf.from_csv(write_grid(tmp_path / "g.csv"), "toy-1b", "h100-80gb", 1)
    # Prefill beyond 32768 batch tokens continues the line; below 128 too, floored by a decode step of one.
    assert perf.prefill_s(65536) * 1000 == pytest.approx(true_prefill_ms(65536))
    assert perf.iteration_s(1, 0, 0) == pytest.approx(max(true_prefill_ms(1) / 1000, perf.decode_intercept_s(1)))
    # Decode beyond batch 64: the tangent, so it grows linearly and never shrinks.
    steps = [perf.decode_intercept_s(b) for b in (64, 128, 256, 512)]
    assert all(b > a for a, b in itertools.pairwise(steps))
    assert steps[3] - steps[2] == pytest.approx(2 * (steps[2] - steps[1]))


def test_a_failed_run_is_left_out_of_both_fits(tmp_path: Path) -> None:
    path = write_grid(tmp_path / "g.csv")
    text = path.read_text().replace(f",512,64,128,1,1,{true_prefill_ms(512 * 64)},", ",512,64,128,1,1,100.0,")
    path.write_text(text)
    kept, failed = split_failed_runs(grid_points(read_splitwise_rows(path)))
    assert [(g.prompt_size, g.batch_size) for g in failed] == [(512, 64)]
    perf = CalibratedPerf.from_csv(path, "toy-1b", "h100-80gb", 1)
    assert perf.decode.max_batch == 32
    assert perf.prefill.xs[-1] == 16384


def test_known_models_get_their_physics_and_the_kv_floor(tmp_path: Path) -> None:
    perf = CalibratedPerf.from_csv(write_grid(tmp_path / "g.csv", "llama2-70b", tp=8), "llama2-70b", "h100-80gb", 8)
    assert perf.source == ReplicaShape(model_spec("llama2-70b"), gpu_spec("H100-80GB"), 8)
    assert perf.decode.per_kv_token_s >= perf.source.kv_read_s_per_token()


@pytest.mark.parametrize(
    ("line", "field", "edit"),
    [
        (3, "batch_size", lambda cols: cols[:3] + ["two"] + cols[4:]),
        (3, "prompt_time", lambda cols: cols[:7] + ["-1"] + cols[8:]),
        (3, "token_time", lambda cols: cols[:8] + ["nan"] + cols[9:]),
        (3, None, lambda cols: cols[:-1]),
    ],
)
def test_a_malformed_grid_row_names_the_file_line_and_field(
    tmp_path: Path, line: int, field: str | None, edit: Callable[[list[str]], list[str]]
) -> None:
    path = write_grid(tmp_path / "g.csv")
    lines = path.read_text().splitlines()
    lines[line - 1] = ",".join(edit(lines[line - 1].split(",")))
    path.write_text("\n".join(lines))
    with pytest.raises(InputFileError) as caught:
        CalibratedPerf.from_csv(path, "toy-1b", "h100-80gb", 1)
    assert (caught.value.path, caught.value.line, caught.value.field) == (str(path), line, field)


def test_a_missing_column_or_configuration_is_named(tmp_path: Path) -> None:
    path = write_grid(tmp_path / "g.csv")
    path.write_text(path.read_text().replace("token_time", "tok_time", 1))
    with pytest.raises(InputFileError) as caught:
        CalibratedPerf.from_csv(path, "toy-1b", "h100-80gb", 1)
    assert (caught.value.line, caught.value.field) == (1, "token_time")
    path = write_grid(tmp_path / "g.csv")
    with pytest.raises(InputFileError, match="toy-1b h100-80gb tp1") as caught:
        CalibratedPerf.from_csv(path, "toy-1b", "h100-80gb", 4)
    assert caught.value.field == "tensor_parallel"
    with pytest.raises(InputFileError) as caught:
        CalibratedPerf.from_csv(tmp_path / "absent.csv")
    assert caught.value.path == str(tmp_path / "absent.csv")


# ------------------------------------------------------------------------------------- the iteration rule


def sample_models(tmp_path: Path) -> dict[str, PerfModel]:
    calibrated = CalibratedPerf.from_csv(
        write_grid(tmp_path / "g.csv", "llama2-70b", tp=4), "llama2-70b", "h100-80gb", 4
    )
    return {
        "calibrated": calibrated,
        "scaled": calibrated.scaled_to(model_spec("llama2-7b"), "H100", 1),
        "roofline": RooflinePerf(model_spec("llama3-8b"), gpu_spec("A100-80GB"), 1),
        "compat": SplitwiseCompatPerf.from_csv(tmp_path / "g.csv", "llama2-70b", "h100-80gb", 4),
    }


sizes = st.tuples(st.integers(0, 40_000), st.integers(0, 600), st.integers(0, 2_000_000))


@given(size=sizes)
def test_decode_affine_reproduces_every_decode_only_iteration(
    tmp_path_factory: pytest.TempPathFactory, size: tuple[int, int, int]
) -> None:
    models = sample_models(tmp_path_factory.mktemp("affine"))
    _, batch, kv = size
    for name, perf in models.items():
        intercept, slope = perf.decode_affine(batch)
        assert perf.iteration_s(0, batch, kv) == pytest.approx(intercept + slope * kv, rel=1e-12, abs=1e-15), name
    assert models["compat"].decode_affine(max(batch, 1))[1] == 0.0


@given(size=sizes, grow=st.sampled_from([0, 1, 2]), by=st.integers(1, 5000))
def test_iterations_never_get_cheaper_with_more_work(
    tmp_path_factory: pytest.TempPathFactory, size: tuple[int, int, int], grow: int, by: int
) -> None:
    models = sample_models(tmp_path_factory.mktemp("mono"))
    bigger = list(size)
    bigger[grow] += by
    for name in ("calibrated", "scaled", "roofline"):
        perf = models[name]
        before, after = perf.iteration_s(*size), perf.iteration_s(*bigger)
        assert after >= before - 1e-12, (name, size, bigger)
        assert before >= 0.0


def test_an_empty_iteration_costs_nothing_and_negative_sizes_are_refused(tmp_path: Path) -> None:
    for perf in sample_models(tmp_path).values():
        assert perf.iteration_s(0, 0, 0) == 0.0
        assert perf.decode_affine(0) == (0.0, 0.0)
        with pytest.raises(ValueError):
            perf.iteration_s(-1, 0, 0)
        with pytest.raises(ValueError):
            perf.decode_affine(-1)


def test_a_mixed_iteration_is_one_pass_never_cheaper_than_its_decode_step(tmp_path: Path) -> None:
    perf = sample_models(tmp_path)["calibrated"]
    assert isinstance(perf, CalibratedPerf)
    kv_s = perf.kv_token_s() * 20_000
    assert perf.iteration_s(2048, 16, 20_000) == pytest.approx(
        max(perf.prefill_s(2064) + kv_s, perf.decode.seconds(16, 20_000))
    )
    # A large prefill dominates; a tiny chunk rides on the decode step.
    assert perf.iteration_s(8192, 8, 8000) < perf.iteration_s(8192, 0, 0) + perf.iteration_s(0, 8, 8000)
    assert perf.iteration_s(1, 64, 64_000) >= perf.iteration_s(0, 64, 64_000)


# ------------------------------------------------------------------------------------ Splitwise compatible


def test_compat_mode_uses_the_simulator_s_rules(tmp_path: Path) -> None:
    path = write_grid(tmp_path / "g.csv", repeats=3)
    compat = SplitwiseCompatPerf.from_csv(path, "toy-1b", "h100-80gb", 1)
    # x = 512 holds seven grid points (the token sweep) of three repeats: the median of all 21 rows.
    at_512 = statistics.median(r.token_time_ms for r in read_splitwise_rows(path) if r.batch_tokens == 512) / 1000
    assert compat.iteration_s(3000, 0, 0) * 1000 == pytest.approx(true_prefill_ms(3000))
    assert compat.iteration_s(0, 512, 999_999) == pytest.approx(at_512)  # looked up at x = B, blind to kv
    assert compat.decode_affine(512) == pytest.approx((at_512, 0.0))
    assert compat.iteration_s(3000, 10, 5000) == pytest.approx(1.1 * true_prefill_ms(3010) / 1000)
    # Outside the table: linear on the end segments, with no monotone repair.
    first, second = compat.decode(128), compat.decode(256)
    assert compat.iteration_s(0, 1, 0) == pytest.approx(first + (second - first) * (1 - 128) / 128)


# ------------------------------------------------------------------------------------------ user profiles


PROFILE = """# my engine, vLLM 0.6 on one L4
kind,batch_size,tokens,kv_tokens,time_ms
prefill,1,256,0,30
prefill,1,512,0,50

prefill,2,1024,0,90
prefill,1,1024,0,94
decode,1,,500,20
decode,1,,4000,21
decode,8,8,8000,24
decode,32,32,32000,35
decode,64,,64000,50
"""


def test_a_profile_is_fitted_with_the_calibration_machinery(tmp_path: Path) -> None:
    path = tmp_path / "profile.csv"
    path.write_text(PROFILE)
    perf = ProfilePerf.from_csv(path)
    assert perf.prefill.xs == (256.0, 512.0, 1024.0)
    assert perf.prefill_s(1024) == pytest.approx(0.092)  # the median of the two 1024-token rows
    assert perf.iteration_s(512, 0, 0) == pytest.approx(0.05)
    for batch, kv, ms in ((1, 500, 20), (8, 8000, 24), (32, 32000, 35), (64, 64000, 50)):
        assert perf.iteration_s(0, batch, kv) * 1000 == pytest.approx(ms, rel=0.06)
    shape = ReplicaShape(model_spec("llama3-8b"), gpu_spec("L4"), 1)
    anchored = ProfilePerf.from_csv(path, source=shape)
    assert anchored.decode.per_kv_token_s >= shape.kv_read_s_per_token()
    assert anchored.scaled_to(model_spec("llama2-7b"), "L4", 1).source is not None


@pytest.mark.parametrize(
    ("text", "line", "field"),
    [
        (PROFILE.replace("decode,8,8,8000,24", "decod,8,8,8000,24"), 10, "kind"),
        (PROFILE.replace("decode,8,8,8000,24", "decode,8,8,8000,fast"), 10, "time_ms"),
        (PROFILE.replace("prefill,1,512,0,50", "prefill,1,0,0,50"), 4, "tokens"),
        (PROFILE.replace("decode,1,,500,20", "decode,0,,500,20"), 8, "batch_size"),
        (PROFILE.replace("kv_tokens", "context"), 2, "kv_tokens"),
        ("\n".join(line for line in PROFILE.splitlines() if not line.startswith("decode")), None, "kind"),
    ],
)
def test_a_bad_profile_names_the_file_line_and_field(tmp_path: Path, text: str, line: int | None, field: str) -> None:
    path = tmp_path / "profile.csv"
    path.write_text(text)
    with pytest.raises(InputFileError) as caught:
        ProfilePerf.from_csv(path)
    assert (caught.value.path, caught.value.line, caught.value.field) == (str(path), line, field)


# ------------------------------------------------------------------------------------ GPUs and scaling


def test_gpu_names_resolve_through_the_core_catalog() -> None:
    assert gpu_spec("h100") is SERVING_GPUS["H100-80GB"]
    assert gpu_spec("a100_40gb").memory_gib == 40
    assert set(SERVING_GPUS) == {"H100-80GB", "H200", "A100-80GB", "A100-40GB", "L4", "T4"}
    with pytest.raises(UnknownGpuModelError):
        gpu_spec("V100")  # the catalog knows it, serving has no figures for it
    with pytest.raises(UnknownGpuModelError):
        gpu_spec("B9000")


def calibrated_70b(tmp_path: Path, tp: int = 2) -> CalibratedPerf:
    return CalibratedPerf.from_csv(
        write_grid(tmp_path / f"g{tp}.csv", "llama2-70b", tp=tp), "llama2-70b", "h100-80gb", tp
    )


def test_scaling_onto_the_source_changes_nothing(tmp_path: Path) -> None:
    perf = calibrated_70b(tmp_path)
    same = perf.scaled_to(model_spec("llama2-70b"), "H100-80GB", 2)
    for size in ((0, 1, 0), (0, 64, 40_000), (4096, 0, 0), (1000, 8, 9000), (0, 300, 10**6)):
        assert same.iteration_s(*size) == pytest.approx(perf.iteration_s(*size), rel=1e-12)


def test_a_smaller_model_is_faster_but_keeps_the_engine_overhead(tmp_path: Path) -> None:
    perf = calibrated_70b(tmp_path)
    small = perf.scaled_to(model_spec("llama2-7b"), "H100-80GB", 2)
    for size in ((0, 1, 1000), (0, 64, 64_000), (1024, 0, 0), (8192, 0, 0)):
        assert small.iteration_s(*size) < perf.iteration_s(*size)
    # The weight read shrinks tenfold; the per-layer overhead only by the layer ratio (32 / 80).
    assert perf.source is not None
    weights_70b = perf.source.weights_read_s()
    overhead_70b = perf.decode.intercept_s - weights_70b
    assert small.decode.intercept_s == pytest.approx(overhead_70b * 32 / 80 + weights_70b * 6.74 / 69.0)
    assert small.source is not None
    assert small.decode.intercept_s > small.source.weights_read_s() + overhead_70b / 3  # not bandwidth-bound alone


def test_more_tensor_parallel_ranks_halve_the_work_but_not_the_overhead(tmp_path: Path) -> None:
    perf = calibrated_70b(tmp_path, tp=2)
    assert perf.source is not None
    wider = perf.scaled_to(model_spec("llama2-70b"), "H100-80GB", 4)
    weights = perf.source.weights_read_s()
    assert wider.decode.intercept_s == pytest.approx(perf.decode.intercept_s - weights / 2)
    work = perf.prefill_s(32768) - perf.decode.intercept_s
    assert wider.prefill_s(32768) - wider.decode.intercept_s == pytest.approx(work / 2)
    # With a measured collective cost per rank, the overhead grows with the ring instead.
    ring = ScalingAssumptions(collectives=Collectives(decode_s_per_layer_rank=1e-5))
    assert perf.scaled_to(model_spec("llama2-70b"), "H100", 4, ring).decode.intercept_s == pytest.approx(
        wider.decode.intercept_s + 80 * 1e-5 * 2
    )


def test_more_bandwidth_speeds_decode_and_more_flops_speed_prefill(tmp_path: Path) -> None:
    perf = calibrated_70b(tmp_path)
    h100 = perf.scaled_to(model_spec("llama2-13b"), "H100-80GB", 1)
    h200 = perf.scaled_to(model_spec("llama2-13b"), "H200", 1)  # same FLOPs, 1.43x the bandwidth
    a100 = perf.scaled_to(model_spec("llama2-13b"), "A100-80GB", 1)
    assert h200.iteration_s(0, 8, 8000) < h100.iteration_s(0, 8, 8000) < a100.iteration_s(0, 8, 8000)
    assert h200.prefill_s(8192) - h200.decode.intercept_s == pytest.approx(
        h100.prefill_s(8192) - h100.decode.intercept_s
    )
    assert a100.prefill_s(8192) > h100.prefill_s(8192)


def test_collectives_are_recovered_from_a_tensor_parallel_sweep() -> None:
    truth = Collectives(decode_s_per_layer_rank=3e-5, prefill_peer_efficiency=0.2)
    spec, gpu = model_spec("llama2-70b"), gpu_spec("H100")
    fits = []
    for tp in (2, 4, 8):
        shape = ReplicaShape(spec, gpu, tp)
        intercept = spec.layers * 1e-4 + truth.decode_overhead_s(shape) + shape.weights_read_s()
        per_token = shape.token_compute_s() / 0.5 + truth.prefill_token_s(shape)
        curve = PiecewiseLinear((1024.0, 32768.0), (intercept + 1024 * per_token, intercept + 32768 * per_token))
        fits.append((shape, DecodeStep(intercept, 0.0, 0.0, 0.0, 1), curve))
    found = estimate_collectives(fits)
    assert found.decode_s_per_layer_rank == pytest.approx(3e-5, rel=1e-6)
    assert found.prefill_peer_efficiency == pytest.approx(0.2, rel=1e-6)
    assert estimate_collectives(fits[:1]) == Collectives()


def test_the_source_is_the_same_hardware_and_model_at_the_nearest_tp() -> None:
    configs = {("llama2-70b", h, tp) for h in ("a100-80gb", "h100-80gb") for tp in (2, 4, 8)}
    configs |= {("bloom-176b", "h100-80gb", 8), ("mystery", "h100-80gb", 1)}
    choose = choose_calibration_source
    assert choose(configs, model_spec("llama2-7b"), gpu_spec("H100"), 1) == ("llama2-70b", "h100-80gb", 2)
    assert choose(configs, model_spec("llama2-7b"), gpu_spec("H200"), 8) == ("llama2-70b", "h100-80gb", 8)
    assert choose(configs, model_spec("llama2-13b"), gpu_spec("A100-40GB"), 3) == ("llama2-70b", "a100-80gb", 4)
    assert choose(configs, model_spec("llama2-70b"), gpu_spec("L4"), 16) == ("llama2-70b", "a100-80gb", 8)


# ---------------------------------------------------------------------------------- roofline and defaults


def test_the_roofline_matches_public_rough_figures() -> None:
    small = RooflinePerf(model_spec("llama2-7b"), gpu_spec("H100"), 1)
    assert 0.007 <= small.iteration_s(0, 1, 1000) <= 0.012  # 7B decodes at batch 1 in 7-12 ms per step
    assert 0.010 <= small.iteration_s(1024, 0, 0) <= 0.100  # a 1k-token prefill takes tens of ms
    big = RooflinePerf(model_spec("llama2-70b"), gpu_spec("H100"), 4)
    assert big.iteration_s(0, 1, 1000) > small.iteration_s(0, 1, 1000)
    # Decode turns compute-bound at large batches: the step grows with the batch beyond the weight read.
    assert small.decode_intercept_s(1024) > 2 * small.decode_intercept_s(1)
    with pytest.raises(ValueError):
        RooflinePerf(model_spec("llama2-7b"), gpu_spec("H100"), 0)


def test_default_perf_is_calibrated_when_the_file_is_there_else_the_roofline(tmp_path: Path) -> None:
    spec = model_spec("llama2-7b")
    assert isinstance(default_perf(spec, "H100", 1), RooflinePerf)
    assert isinstance(default_perf(spec, "H100", 1, tmp_path / "absent.csv"), RooflinePerf)
    path = write_grid(tmp_path / "g.csv", "llama2-70b", tp=2)
    calibrated = default_perf(spec, "H100", 1, path)
    assert isinstance(calibrated, CalibratedPerf)
    assert calibrated.source == ReplicaShape(spec, gpu_spec("H100"), 1)
    exact = calibrated_perf_for(path, model_spec("llama2-70b"), "H100-80GB", 2)
    assert exact == CalibratedPerf.from_csv(path, "llama2-70b", "h100-80gb", 2)


def test_the_shared_calibration_file_is_found_next_to_the_repository(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    assert shared_calibration_csv(root) is None
    target = tmp_path / "shared" / "traces" / "splitwise" / "perf_model.csv"
    target.parent.mkdir(parents=True)
    target.write_text(HEADER + "\n")
    assert shared_calibration_csv(root) == target


# ------------------------------------------------------------------------------- the measured grid itself


@shared
def test_the_measured_grid_fits_within_the_goal() -> None:
    rows = read_splitwise_rows(SHARED_CSV)
    configs = sorted({r.config for r in rows})
    errors: list[float] = []
    for config in configs:
        selected = [r for r in rows if r.config == config]
        perf = CalibratedPerf.from_rows(selected)
        kept, _ = split_failed_runs(grid_points(selected))
        errors += [abs(perf.iteration_s(0, g.batch_size, round(g.kv_tokens)) * 1000 / g.decode_ms - 1) for g in kept]
    assert len(configs) == 12
    assert statistics.fmean(errors) <= 0.05  # decode MAPE goal


@shared
def test_only_the_tp2_batch_64_runs_are_failed_runs() -> None:
    rows = read_splitwise_rows(SHARED_CSV)
    failed = {
        (config, g.prompt_size, g.batch_size)
        for config in {r.config for r in rows}
        for g in split_failed_runs(grid_points([r for r in rows if r.config == config]))[1]
    }
    assert {(c[2], p, b) for c, p, b in failed} == {(2, 512, 64)}


@shared
def test_a_7b_model_on_one_h100_meets_public_rough_figures() -> None:
    perf = calibrated_perf_for(SHARED_CSV, model_spec("llama2-7b"), "H100", 1)
    assert 0.007 <= perf.iteration_s(0, 1, 1000) <= 0.012
    assert 0.010 <= perf.iteration_s(1024, 0, 0) <= 0.100
    measured = calibrated_perf_for(SHARED_CSV, model_spec("llama2-70b"), "H100", 4)
    assert measured == CalibratedPerf.from_csv(SHARED_CSV, "llama2-70b", "h100-80gb", 4)
    assert perf.iteration_s(0, 32, 32_000) < measured.iteration_s(0, 32, 32_000)


@shared
def test_compat_mode_reads_the_measured_grid_as_the_simulator_does() -> None:
    compat = SplitwiseCompatPerf.from_csv(SHARED_CSV)  # llama2-70b, h100-80gb, TP8: the results' setup
    rows = [r for r in read_splitwise_rows(SHARED_CSV) if r.config == ("llama2-70b", "h100-80gb", 8)]
    at_2048 = statistics.median(r.prompt_time_ms for r in rows if r.batch_tokens == 2048) / 1000
    assert compat.iteration_s(2048, 0, 0) == pytest.approx(at_2048)
    assert 0.02 < compat.iteration_s(0, 100, 10**5) < 0.04  # about its batch-1 value, whatever the batch
