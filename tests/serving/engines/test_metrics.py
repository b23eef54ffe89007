"""Reading engines' Prometheus text: vLLM's names, SGLang's aliases, label sets summed, junk skipped."""

from __future__ import annotations

from pathlib import Path

from tessera.serving.engines.metrics import parse_metrics

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
vllm:num_preemptions_total{model_name="m"} 7 1700000000000
vllm:prompt_tokens_total{model_name="m a b"} 120
vllm:generation_tokens_total 99
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 5
"""


def test_vllm_gauges_are_summed_over_label_sets_and_usage_averaged() -> None:
    stats = parse_metrics(VLLM)
    assert (stats.running, stats.waiting) == (5, 4)
    assert stats.kv_cache_usage == 0.5
    assert stats.preemptions_total == 7  # a trailing timestamp is not the value
    assert stats.prompt_tokens_total == 120  # spaces inside a label value do not split the line
    assert stats.generation_tokens_total == 99
    assert not stats.sleeping


def test_sglang_names_and_the_old_vllm_cache_gauge_are_read_too() -> None:
    stats = parse_metrics("sglang:num_running_reqs 2\nsglang:num_queue_reqs 1\nsglang:token_usage 0.4\n")
    assert (stats.running, stats.waiting, stats.kv_cache_usage) == (2, 1, 0.4)
    assert parse_metrics("vllm:gpu_cache_usage_perc 0.3").kv_cache_usage == 0.3


def test_malformed_lines_and_nan_are_skipped() -> None:
    stats = parse_metrics(
        'vllm:num_requests_running\nvllm:num_requests_waiting{x="1"} abc\nvllm:num_requests_running NaN\n'
    )
    assert (stats.running, stats.waiting, stats.kv_cache_usage) == (0, 0, 0.0)


def test_an_empty_page_is_an_idle_engine() -> None:
    assert parse_metrics("").running == 0


def test_the_kv_cache_size_comes_from_vllms_cache_config_labels() -> None:
    """vLLM exports its KV cache's size only as labels of an info gauge: 182 blocks of 128 tokens here (a recorded
    vLLM 0.x CPU page; its kv_cache_size_tokens label says 23,296 too); the sim engine exports the same."""
    recorded = Path(__file__).parents[1] / "vllm_recorded" / "metrics.prom"
    assert parse_metrics(recorded.read_text()).kv_capacity_tokens == 182 * 128
    page = 'vllm:cache_config_info{block_size="16",note="a, b",num_gpu_blocks="10"} 1.0\n'
    assert parse_metrics(page).kv_capacity_tokens == 160
    assert parse_metrics('vllm:cache_config_info{block_size="16"} 1.0\n').kv_capacity_tokens == 0
    assert parse_metrics("").kv_capacity_tokens == 0
