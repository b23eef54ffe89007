"""The engine shim turns the replica's GPU share into the engine's own memory cap."""

from __future__ import annotations

from tessera.serving.engine_exec import engine_argv, memory_fraction


def test_a_shared_gpu_caps_vllm_and_sglang_memory_at_the_share() -> None:
    env = {"TESSERA_GPU_MEM_FRACTION": "0.25"}
    vllm = engine_argv("vllm", "chat", 8001, "/m", env)
    assert vllm[vllm.index("--gpu-memory-utilization") + 1] == "0.25"
    assert vllm[vllm.index("--served-model-name") + 1] == "chat" and vllm[vllm.index("--host") + 1] == "127.0.0.1"
    sglang = engine_argv("sglang", "chat", 8001, "/m", env)
    assert sglang[sglang.index("--mem-fraction-static") + 1] == "0.25"


def test_a_whole_gpu_or_the_cpu_leaves_the_engine_its_default() -> None:
    assert memory_fraction({}) is None
    assert memory_fraction({"TESSERA_GPU_MEM_FRACTION": "junk"}) is None
    assert "--gpu-memory-utilization" not in engine_argv("vllm", "chat", 8001, "/m", {})
