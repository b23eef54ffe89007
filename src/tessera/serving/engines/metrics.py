"""Reading an engine's Prometheus ``/metrics`` text into ``EngineStats``.

The names are vLLM's (the sim exports the same), with SGLang's equivalents and vLLM's older cache gauge as
aliases; the KV cache's size in tokens comes from the labels of vLLM's ``cache_config_info``. Series of one name
with several label sets (one per model name, say) are summed; the cache usage, a fraction, is averaged. Unknown
names and malformed lines are skipped: an engine upgrade that adds metrics must not blind the router.
"""

from __future__ import annotations

import math
import re

from tessera.serving.engines.base import EngineStats

# metric name -> EngineStats field
_NAMES: dict[str, str] = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",  # vLLM before v0.10
    "vllm:num_preemptions_total": "preemptions_total",
    "vllm:prompt_tokens_total": "prompt_tokens_total",
    "vllm:generation_tokens_total": "generation_tokens_total",
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "waiting",
    "sglang:token_usage": "kv_cache_usage",
    "sglang:prompt_tokens_total": "prompt_tokens_total",
    "sglang:generation_tokens_total": "generation_tokens_total",
    "tessera_sim:is_sleeping": "sleeping",
}


def parse_metrics(text: str) -> EngineStats:
    """The stats in a Prometheus text exposition (see the module docstring)."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    capacity = 0
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        if line.startswith(CACHE_INFO):
            capacity += _kv_capacity_tokens(line)
            continue
        brace = line.find("{")
        space = line.find(" ")
        if brace >= 0 and (space < 0 or brace < space):
            name = line[:brace]
            close = line.rfind("}")
            rest = line[close + 1 :].split() if close > brace else []
        else:
            name, _, tail = line.partition(" ")
            rest = tail.split()
        target = _NAMES.get(name)
        if target is None or not rest:
            continue
        try:
            value = float(rest[0])
        except ValueError:
            continue
        if math.isnan(value):
            continue
        sums[target] = sums.get(target, 0.0) + value
        counts[target] = counts.get(target, 0) + 1
    usage = sums.get("kv_cache_usage", 0.0) / counts.get("kv_cache_usage", 1)
    return EngineStats(
        running=int(sums.get("running", 0)),
        waiting=int(sums.get("waiting", 0)),
        kv_cache_usage=min(max(usage, 0.0), 1.0),
        preemptions_total=int(sums.get("preemptions_total", 0)),
        prompt_tokens_total=int(sums.get("prompt_tokens_total", 0)),
        generation_tokens_total=int(sums.get("generation_tokens_total", 0)),
        sleeping=sums.get("sleeping", 0.0) > 0,
        kv_capacity_tokens=capacity,
    )


CACHE_INFO = "vllm:cache_config_info{"
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def _kv_capacity_tokens(line: str) -> int:
    """``num_gpu_blocks`` x ``block_size`` from vLLM's ``cache_config_info`` labels; 0 when either is missing."""
    labels = dict(_LABEL.findall(line))
    try:
        return max(0, int(labels["num_gpu_blocks"]) * int(labels["block_size"]))
    except (KeyError, ValueError):
        return 0


def vllm_asleep(text: str) -> bool:
    """Whether vLLM says it sleeps: ``vllm:engine_sleep_state{sleep_state="awake"}`` is 0 for one of its engines
    (the gauge has one series per engine and state; 1 for ``awake`` means it serves)."""
    for line in text.splitlines():
        if line.startswith("vllm:engine_sleep_state{") and 'sleep_state="awake"' in line:
            value = line.rpartition("}")[2].split()
            if value and value[0] in ("0", "0.0"):
                return True
    return False
