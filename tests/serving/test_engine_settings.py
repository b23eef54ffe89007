"""A model's own engine settings: checked where it is deployed (the flags Tessera owns refused, however spelt),
carried on the replica's command line to the engine shim, and applied there: the engine's own arguments after
Tessera's and the server's, vLLM with priority scheduling and its KV options, and on the CPU path each replica's
engine threads bound to cores of its own instead of all to core 0."""

from __future__ import annotations

import json

import pytest

from tessera.errors import InvalidRequestError
from tessera.serving.engine_exec import (
    KEY_ENV,
    LISTEN_HOST_ENV,
    LISTEN_PORT_ENV,
    cpu_binding,
    engine_argv,
    engine_env,
    node_port_engine,
    parse_args,
)
from tessera.serving.engine_settings import EngineSettings, check, owned_flag, parse_core_list, replica_cores
from tessera.serving.replicas import DeployedModel, replica_command

CPU = {"CUDA_VISIBLE_DEVICES": ""}
GPU = {"CUDA_VISIBLE_DEVICES": "GPU-1"}


def _model(engine: str, settings: EngineSettings) -> DeployedModel:
    return DeployedModel(
        id=1, name="chat", tenant="t", queue="t", engine=engine, weights="/m", gpus=0, gpu_milli=0, gpu_mem_mib=0,
        min_replicas=1, max_replicas=1, idle_timeout_s=30.0, slo="standard", engine_settings=settings,
    )  # fmt: skip


def test_a_models_own_arguments_come_last_after_the_server_wide_ones() -> None:
    env = {**CPU, "TESSERA_VLLM_ARGS": "--dtype float32", "TESSERA_SGLANG_ARGS": "--x 1"}
    own = EngineSettings(engine_args=("--dtype", "bfloat16", "--max-model-len=512"))
    vllm = engine_argv("vllm", "chat", 8001, "/m", env, settings=own)
    assert vllm[-5:] == ["--dtype", "float32", "--dtype", "bfloat16", "--max-model-len=512"]  # the model's wins
    assert engine_argv("sglang", "chat", 8001, "/m", env, settings=own)[-3:] == list(own.engine_args)
    assert engine_argv("transformers", "chat", 8001, "/m", env, settings=own)[-3:] == list(own.engine_args)
    sim = engine_argv("sim", "chat", 0, "llama3-8b", env, "/run/e.sock", settings=EngineSettings(("--speedup", "5")))
    assert sim[-2:] == ["--speedup", "5"]


def test_the_settings_travel_on_the_replica_command_and_are_read_back_by_the_shim() -> None:
    settings = EngineSettings(("--port-ish", "a b", "--"), 2500, "0-3", 8.0, True)
    argv, _ = replica_command(_model("vllm", settings), None, {})
    shim = argv[argv.index("tessera.serving.engine_exec") + 1 :]
    ns, back = parse_args(shim)
    assert back == EngineSettings(settings.engine_args, 3000, "0-3", 8.0, True)  # whole cores: 2.5 -> 3
    assert (ns.engine, ns.name, ns.socket, ns.weights) == ("vllm", "chat", True, "/m")
    plain, _ = replica_command(_model("vllm", EngineSettings()), None, {})
    assert "--" not in plain and "--cpus" not in plain  # a model without settings: the command of before


@pytest.mark.parametrize(
    ("engine", "arg"),
    [
        ("vllm", "--port"), ("vllm", "--port=9000"), ("vllm", "--host"), ("vllm", "--uds=/tmp/x"),
        ("vllm", "--served-model-name"), ("vllm", "--served_model_name=x"), ("vllm", "--serv"), ("vllm", "-tp"),
        ("vllm", "--scheduling-policy=fcfs"), ("vllm", "--gpu-memory-utilization"), ("vllm", "--model"),
        ("vllm", "--api-key=k"), ("sglang", "--model-path"), ("sglang", "--tp"),
        ("sglang", "--mem-fraction-static=0.9"), ("transformers", "--device"), ("sim", "--perf"), ("sim", "--po"),
    ],
)  # fmt: skip
def test_the_flags_tessera_sets_are_refused_naming_engine_args(engine: str, arg: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check(engine, EngineSettings(engine_args=("--dtype", "float32", arg, "1")))
    assert caught.value.field == "engine_args" and arg.split("=")[0] in caught.value.message


def test_the_engines_other_flags_and_values_that_look_like_owned_flags_pass() -> None:
    args = ("--dtype", "float32", "--max-model-len", "512", "--enable-prefix-caching", "--kv-offloading-backend=native")
    check("vllm", EngineSettings(engine_args=args))
    check("sim", EngineSettings(engine_args=("--speedup", "10", "--kv-blocks", "64", "--max-model-len", "512")))
    assert owned_flag("vllm", ["--chat-template", "--port"]) == "--port"
    assert owned_flag("vllm", ["--p", "x"]) is None  # too short to be taken for --port alone


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        (EngineSettings(engine_args=("x",) * 65), "engine_args"),
        (EngineSettings(engine_args=("a\0b",)), "engine_args"),
        (EngineSettings(cpu_bind="0-x"), "cpu_bind"),
        (EngineSettings(cpu_bind="3-1"), "cpu_bind"),
        (EngineSettings(cpu_bind="all"), "cpu_bind"),
        (EngineSettings(kv_offload_gib=-1.0), "kv_offload_gib"),
        (EngineSettings(kv_offload_gib=float("nan")), "kv_offload_gib"),
    ],
)
def test_bad_settings_are_refused_naming_the_field(settings: EngineSettings, field: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        check("vllm", settings)
    assert caught.value.field == field


def test_kv_options_exist_only_for_vllm() -> None:
    for engine in ("sim", "sglang", "transformers"):
        for settings, field in (
            (EngineSettings(kv_offload_gib=4.0), "kv_offload_gib"),
            (EngineSettings(kv_events=True), "kv_events"),
        ):
            with pytest.raises(InvalidRequestError) as caught:
                check(engine, settings)
            assert caught.value.field == field
    check("vllm", EngineSettings(kv_offload_gib=4.0, kv_events=True))


def test_vllm_gets_its_kv_offloading_on_gpus_and_its_kv_events_in_the_replicas_runtime_dir() -> None:
    settings = EngineSettings(kv_offload_gib=8.0, kv_events=True)
    gpu = engine_argv("vllm", "chat", 8001, "/m", {**GPU, "TESSERA_RUNTIME_DIR": "/run/r7"}, settings=settings)
    assert gpu[gpu.index("--kv-offloading-size") + 1] == "8"
    events = json.loads(gpu[gpu.index("--kv-events-config") + 1])
    assert events == {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": "ipc:///run/r7/kv-events.sock"}
    cpu = engine_argv("vllm", "chat", 8001, "/m", CPU, settings=settings)
    assert "--kv-offloading-size" not in cpu and "--kv-events-config" in cpu  # on the CPU the cache is host memory
    assert "--kv-events-config" not in engine_argv("vllm", "chat", 8001, "/m", GPU)


def test_core_lists_parse_as_linux_writes_them() -> None:
    assert parse_core_list("0-3,8, 6") == (0, 1, 2, 3, 6, 8)
    assert parse_core_list("5") == (5,)


def test_consecutive_replicas_get_distinct_cores_while_the_host_has_them() -> None:
    cores = list(range(8))
    assert [replica_cores(cores, 2, slot) for slot in range(5)] == [(0, 1), (2, 3), (4, 5), (6, 7), (0, 1)]
    assert [replica_cores([0, 1], 1, slot) for slot in (17, 18)] == [(1,), (0,)]  # two replicas on 2 cores
    assert replica_cores([4, 5, 6], 2, 1) == (4, 6)  # wraps around
    assert replica_cores([0, 1], 4, 3) == (0, 1)  # asks for more than there are: all of them


def test_a_cpu_replicas_binding_follows_its_cpus_its_list_and_its_workload_id() -> None:
    allowed = list(range(8))
    assert cpu_binding(EngineSettings(), {"TESSERA_WORKLOAD_ID": "3"}, allowed) == (3,)  # one core by default
    assert cpu_binding(EngineSettings(cpu_milli=2000), {"TESSERA_WORKLOAD_ID": "1"}, allowed) == (2, 3)
    among = EngineSettings(cpu_milli=2000, cpu_bind="4-7,30")  # 30: not a core this replica may use
    assert cpu_binding(among, {"TESSERA_WORKLOAD_ID": "1"}, allowed) == (6, 7)
    assert cpu_binding(EngineSettings(cpu_bind="40-41"), {}, allowed) == (0,)  # none allowed: picked among all
    assert cpu_binding(EngineSettings(cpu_bind="none"), {}, allowed) is None


def test_vllm_on_the_cpu_binds_its_threads_to_the_replicas_cores_not_vllms_auto_choice() -> None:
    """vLLM's own ``auto`` binding puts every replica on the first NUMA node's cores less one, on a 2-core host
    core 0 alone; the shim names the replica's cores instead."""
    env = engine_env("vllm", CPU, EngineSettings(), (1,))
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["OMP_NUM_THREADS"] == "1"
    four = engine_env("vllm", CPU, EngineSettings(cpu_milli=4000), (0, 1, 2, 3))
    assert four["VLLM_CPU_OMP_THREADS_BIND"] == "0,1,2,3" and four["OMP_NUM_THREADS"] == "4"
    unbound = engine_env("vllm", CPU, EngineSettings(cpu_milli=3000, cpu_bind="none"), None)
    assert unbound["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and unbound["OMP_NUM_THREADS"] == "3"
    assert (
        engine_env("vllm", {**CPU, "VLLM_CPU_OMP_THREADS_BIND": "7"}, EngineSettings(), (1,))[
            "VLLM_CPU_OMP_THREADS_BIND"
        ]
        == "7"
    )  # set by hand: kept
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_env("vllm", GPU, EngineSettings(), None)
    assert engine_env("transformers", CPU, EngineSettings(), (2,))["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in engine_env("sim", CPU, EngineSettings(cpu_milli=2000), None)


def test_a_replica_on_a_nodes_port_gets_the_models_settings_too() -> None:
    """A replica the Ray backend starts on a port of its node (``--node-port``) runs with the model's own arguments
    and core binding as a local one does, its key still only in its environment."""
    node = {**CPU, LISTEN_HOST_ENV: "10.0.0.7", LISTEN_PORT_ENV: "41001", KEY_ENV: "k" * 43}
    argv, env = node_port_engine("vllm", "chat", "/m", node, EngineSettings(("--dtype", "float32")), (1,))
    assert argv[-2:] == ["--dtype", "float32"] and argv[argv.index("--port") + 1] == "41001"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1" and env["VLLM_API_KEY"] == "k" * 43
    _, shim_settings = parse_args(["vllm", "--name", "chat", "--node-port", "--cpus", "2", "--", "--dtype", "half"])
    assert shim_settings == EngineSettings(("--dtype", "half"), 2000)
