"""The engine shim turns the replica's GPU share into the engine's own memory cap, runs vLLM eagerly with a small
KV cache on the CPU, runs the real engines with the interpreter and flags the server was given, and starts vLLM and
the sim with priority scheduling (the gateway sends each request's SLO class as its priority)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tessera
from tessera.backends import base as backends_base
from tessera.serving.engine_exec import (
    ENGINE_KEY_ENV,
    KEY_ENV,
    LISTEN_HOST_ENV,
    LISTEN_PORT_ENV,
    engine_argv,
    engine_env,
    memory_fraction,
    name_link,
    node_port_engine,
)
from tessera.serving.replicas import DeployedModel, replica_command


def test_a_shared_gpu_caps_vllm_and_sglang_memory_at_the_share() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "GPU-1234", "TESSERA_GPU_MEM_FRACTION": "0.25"}  # as the backend sets them
    vllm = engine_argv("vllm", "chat", 8001, "/m", env)
    assert vllm[vllm.index("--gpu-memory-utilization") + 1] == "0.25"
    assert vllm[vllm.index("--served-model-name") + 1] == "chat" and vllm[vllm.index("--host") + 1] == "127.0.0.1"
    sglang = engine_argv("sglang", "chat", 8001, "/m", env)
    assert sglang[sglang.index("--mem-fraction-static") + 1] == "0.25"


def test_gpus_n_runs_vllm_and_sglang_tensor_parallel_over_the_n_gpus() -> None:
    two = {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}  # a replica of a model deployed with --gpus 2
    vllm = engine_argv("vllm", "chat", 8001, "/m", two)
    assert vllm[vllm.index("--tensor-parallel-size") + 1] == "2"
    sglang = engine_argv("sglang", "chat", 8001, "/m", two)
    assert sglang[sglang.index("--tp") + 1] == "2"
    one = {"CUDA_VISIBLE_DEVICES": "GPU-a"}
    assert "--tensor-parallel-size" not in engine_argv("vllm", "chat", 8001, "/m", one)
    assert "--tp" not in engine_argv("sglang", "chat", 8001, "/m", one)
    simulated = {**two, "TESSERA_GPU_SIMULATED": "1"}  # vLLM on the CPU: one process, no tensor parallel
    assert "--tensor-parallel-size" not in engine_argv("vllm", "chat", 8001, "/m", simulated)
    served = engine_argv("transformers", "chat", 8001, "/m", two)  # transformers serve has no such flag
    assert "--tensor-parallel-size" not in served and "--tp" not in served


def test_a_whole_gpu_or_the_cpu_leaves_the_engine_its_default() -> None:
    assert memory_fraction({}) is None
    assert memory_fraction({"TESSERA_GPU_MEM_FRACTION": "junk"}) is None
    assert "--gpu-memory-utilization" not in engine_argv("vllm", "chat", 8001, "/m", {})


def test_on_the_cpu_vllm_runs_eagerly_with_a_small_kv_cache_from_the_share() -> None:
    cpu = {"CUDA_VISIBLE_DEVICES": ""}
    vllm = engine_argv("vllm", "chat", 8001, "/m", cpu)
    assert "--enforce-eager" in vllm and "--gpu-memory-utilization" not in vllm
    assert engine_env("vllm", cpu)["VLLM_CPU_KVCACHE_SPACE"] == "1"  # no share: 1 GiB, not vLLM's 4
    simulated = {"CUDA_VISIBLE_DEVICES": "GPU-sim-0", "TESSERA_GPU_SIMULATED": "1", "TESSERA_GPU_MEM_MIB": "20480"}
    assert "--enforce-eager" in engine_argv("vllm", "chat", 8001, "/m", simulated)
    assert engine_env("vllm", simulated)["VLLM_CPU_KVCACHE_SPACE"] == "2"  # the share, capped at 2 GiB
    assert engine_env("vllm", {**cpu, "VLLM_CPU_KVCACHE_SPACE": "3"})["VLLM_CPU_KVCACHE_SPACE"] == "3"
    gpu = {"CUDA_VISIBLE_DEVICES": "GPU-1234", "TESSERA_GPU_MEM_FRACTION": "0.5"}
    assert "--enforce-eager" not in engine_argv("vllm", "chat", 8001, "/m", gpu)
    assert "VLLM_CPU_KVCACHE_SPACE" not in engine_env("vllm", gpu) and engine_env("vllm", gpu)["HF_HUB_OFFLINE"] == "1"


def test_the_engine_venv_and_extra_flags_come_from_the_environment() -> None:
    env = {"TESSERA_ENGINE_PYTHON": "/e/bin/python", "TESSERA_VLLM_ARGS": "--dtype float32", "CUDA_VISIBLE_DEVICES": ""}
    vllm = engine_argv("vllm", "chat", 8001, "/m", env)
    assert vllm[:3] == ["/e/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert vllm[-2:] == ["--dtype", "float32"]
    assert engine_argv("vllm", "chat", 8001, "/m", {})[0] == sys.executable
    served = engine_argv("transformers", "chat", 8001, "/m", env)
    assert served[:5] == ["/e/bin/python", "-m", "transformers.cli.transformers", "serve", "chat"]  # see name_link
    assert served[served.index("--device") + 1] == "cpu" and "--dtype" not in served  # TESSERA_VLLM_ARGS is vLLM's
    assert engine_argv("sim", "chat", 8001, None, env)[0] == sys.executable  # the sim is Tessera's own


def test_the_server_hands_the_engine_settings_to_each_replica() -> None:
    model = DeployedModel(
        id=1, name="chat", tenant="t", queue="t", engine="vllm", weights="/m", gpus=0, gpu_milli=0, gpu_mem_mib=0,
        min_replicas=1, max_replicas=1, idle_timeout_s=30.0, slo="standard",
    )  # fmt: skip
    server = {"TESSERA_ENGINE_PYTHON": "/e/bin/python", "TESSERA_VLLM_ARGS": "--dtype float32", "SECRET": "x"}
    _, env = replica_command(model, 8001, server)
    assert env["TESSERA_ENGINE_PYTHON"] == "/e/bin/python" and env["TESSERA_VLLM_ARGS"] == "--dtype float32"
    assert "SECRET" not in env
    assert env["PYTHONPATH"] == str(Path(tessera.__file__).parent.parent)  # the server's own shim
    assert "PYTHONPATH" not in engine_env("vllm", env) and engine_env("sim", env)["PYTHONPATH"] == env["PYTHONPATH"]


def test_transformers_serve_loads_the_folder_under_the_deployed_name(tmp_path: Path) -> None:
    weights = tmp_path / "weights"
    weights.mkdir()
    env = {"TMPDIR": str(tmp_path)}
    links = name_link("chat", str(weights), env)
    assert (links / "chat").resolve() == weights and links.stat().st_mode & 0o777 == 0o700
    other = tmp_path / "other"
    other.mkdir()
    assert name_link("chat", str(other), env) == links and (links / "chat").resolve() == other  # replaced
    assert sorted(p.name for p in links.iterdir()) == ["chat"]


def test_a_sim_replica_is_timed_and_sized_as_the_twin_sizes_its_replica() -> None:
    """Placed on an H100 share of 20 GiB, a sim replica of a catalog model times itself on an H100, keeps the KV
    cache the share leaves beside its weights, and loads its weights as a warm start before it listens; the twin's
    shared replica of the same request has the same KV cache."""
    from tessera.serving.engines.sim_server import build_engine, parse_options
    from tessera.serving.models import model_spec
    from tessera.serving.setups import serving_setup
    from tessera.serving.sizing import replica_shape

    spec = model_spec("llama3-8b")
    shape = replica_shape(spec, "H100-80GB", serving_setup("tessera").sizing)
    share = str(shape.request.gpu_mem_mib)
    env = {
        "CUDA_VISIBLE_DEVICES": "SIM-0", "TESSERA_GPU_SIMULATED": "1", "TESSERA_GPU_MODEL": "H100-80GB",
        "TESSERA_GPU_MEM_MIB": share, "TESSERA_GPU_MEM_FRACTION": "0.25",
    }  # fmt: skip
    argv = engine_argv("sim", "chat", 8001, "llama3-8b", env)
    assert argv[argv.index("--perf") + 1] == "llama3-8b@H100-80GB"
    assert argv[argv.index("--gpu-mem-mib") + 1] == share and argv[argv.index("--load-s") + 1] == "auto"
    options = parse_options(argv[3:])
    assert options.load_s > 0  # the warm start of 16 GB of weights takes a moment
    assert build_engine(options).engine.config.kv_blocks == pytest.approx(shape.kv_blocks, abs=1)
    whole = {k: v for k, v in env.items() if k != "TESSERA_GPU_MEM_FRACTION"}  # a whole GPU: no share to fit in
    assert "--gpu-mem-mib" not in engine_argv("sim", "chat", 8001, "llama3-8b", whole)
    assert "--perf" not in engine_argv("sim", "chat", 8001, None, env)  # no catalog model: the sim's own default


NODE = {LISTEN_HOST_ENV: "10.0.0.7", LISTEN_PORT_ENV: "41001", KEY_ENV: "k" * 43, "PYTHONPATH": "/src"}


def test_a_node_port_replica_listens_where_the_backend_said_with_its_key_only_in_the_engines_environment() -> None:
    for engine, variable in (("sim", "TESSERA_SIM_API_KEY"), ("vllm", "VLLM_API_KEY")):
        argv, env = node_port_engine(engine, "chat", "/m" if engine == "vllm" else None, NODE)
        assert argv[argv.index("--host") + 1] == "10.0.0.7" and argv[argv.index("--port") + 1] == "41001"
        assert env[variable] == "k" * 43 and KEY_ENV not in env
        assert not any("k" * 43 in arg for arg in argv)  # never on a command line (/proc/*/cmdline is public)
        assert variable == ENGINE_KEY_ENV[engine]
    assert LISTEN_HOST_ENV == backends_base.LISTEN_HOST_ENV and LISTEN_PORT_ENV == backends_base.LISTEN_PORT_ENV


def test_a_node_port_replica_without_its_address_or_key_or_on_an_engine_that_takes_no_key_variable_exits() -> None:
    for missing, says in ((KEY_ENV, KEY_ENV), (LISTEN_PORT_ENV, LISTEN_PORT_ENV), (LISTEN_HOST_ENV, LISTEN_HOST_ENV)):
        env = {k: v for k, v in NODE.items() if k != missing}
        with pytest.raises(SystemExit, match=says):
            node_port_engine("sim", "chat", None, env)
    for engine in ("sglang", "transformers"):  # their key options are command-line flags only
        with pytest.raises(SystemExit, match=f"{engine} cannot require the replica's key"):
            node_port_engine(engine, "chat", "/m", NODE)


def test_a_replica_with_a_key_is_started_on_its_node_port_and_its_key_stays_out_of_its_command_line() -> None:
    model = DeployedModel(1, "chat", "t", "default", "sim", "llama3-8b", 0, 250, 0, 0, 2, 30.0, "standard")
    argv, env = replica_command(model, None, server_env={}, api_key="secret-of-this-replica")
    assert "--node-port" in argv and "--socket" not in argv and "--port" not in argv
    assert env[KEY_ENV] == "secret-of-this-replica" and "secret-of-this-replica" not in " ".join(argv)
    socket_argv, socket_env = replica_command(model, None, server_env={})
    assert "--socket" in socket_argv and KEY_ENV not in socket_env  # the local backend's path is unchanged


def test_vllm_and_the_sim_start_with_priority_scheduling_the_others_do_not() -> None:
    for engine in ("vllm", "sim"):
        argv = engine_argv(engine, "chat", 8001, "llama3-8b", {"CUDA_VISIBLE_DEVICES": ""})
        assert argv[argv.index("--scheduling-policy") + 1] == "priority"
    for engine in ("sglang", "transformers"):
        assert "--scheduling-policy" not in engine_argv(engine, "chat", 8001, "/m", {"CUDA_VISIBLE_DEVICES": ""})
