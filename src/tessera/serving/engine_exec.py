"""``python -m tessera.serving.engine_exec ENGINE --name NAME (--socket | --port PORT) [--weights W] [--cpus N]
[--cpu-bind CORES|none] [--kv-offload-gib G] [--kv-events] [-- ENGINE ARGS...]``: start one replica's engine in this
process's place, with the memory cap its GPU share allows and the model's own engine settings
(``engine_settings``).

``--socket``: the engine listens on the Unix socket ``engine.sock`` in the replica's private runtime directory
(``$TESSERA_RUNTIME_DIR``, which the backend makes: only the replica's user and the server can enter it), so no other
tenant can reach it, use it or take its address; ``tessera up`` starts every local replica so. The sim engine and
vLLM listen there themselves (``--uds``); an engine that only speaks TCP (transformers serve, SGLang) listens on a
loopback port, in the replica's private network namespace when the server is root, and ``engine_bridge`` relays the
socket to it. ``--port``: the engine listens on 127.0.0.1:PORT (a backend without runtime directories).
``--node-port``: the engine listens on the port the backend picked on this node (``$TESSERA_LISTEN_HOST``,
``$TESSERA_LISTEN_PORT``: the Ray backend, whose replicas may run on other hosts than the gateway's) and requires the
replica's own key (``$TESSERA_REPLICA_KEY``, which the server made) as ``Authorization: Bearer`` from every caller;
the key goes to the engine in its environment, never on its command line (which every user can read in /proc):
vLLM's ``VLLM_API_KEY``, the sim engine's ``TESSERA_SIM_API_KEY``. SGLang and ``transformers serve`` have no such
variable, so they are refused there, saying why.

A replica is launched as a Tessera workload, so its share is only known at launch, from the variables the backend
sets (``gpu.isolation``). This shim turns ``TESSERA_GPU_MEM_FRACTION`` into the engine's own flag (vLLM's and
SGLang's memory fraction), the GPUs in ``CUDA_VISIBLE_DEVICES`` (``--gpus N``) into their tensor-parallel size, and
``exec``s the engine, so that the workload's process is the engine itself: stopping
the workload stops the engine.

The real engines usually live in a virtualenv of their own (``scripts/engines.sh`` makes ``.venv-vllm``: vLLM pins
torch and transformers), named by ``TESSERA_ENGINE_PYTHON``; without it they run with this interpreter. Extra
engine flags come from ``TESSERA_<ENGINE>_ARGS`` (e.g. ``TESSERA_VLLM_ARGS="--dtype float32"``), the server-wide
defaults, then from the model's own ``engine_args`` (after ``--``). The server passes these variables
(``SERVER_ENV``) from its own environment to every replica (``replicas.replica_command``).

vLLM and the sim engine start with ``--scheduling-policy priority`` (``PRIORITY_ENGINES``): the gateway sends each
request's SLO class as its ``priority`` (``gateway.priority``). SGLang is not (its priority scheduling, where a
version has it, is off by default and orders the other way round unless told).

On the CPU (no GPU in ``CUDA_VISIBLE_DEVICES``, or a simulated one), vLLM runs eagerly (``--enforce-eager``: a
start in about 30 s instead of minutes of compilation) with a KV cache of ``VLLM_CPU_KVCACHE_SPACE`` GiB in host
memory: the share's memory capped at 2 GiB, 1 GiB without a share (vLLM's default of 4 would let only a few engines
fit in the machine's memory), unless the variable is set already. Its OpenMP threads are bound to the replica's
cores (``cpu_binding``: ``--cpus`` of them, at least one, picked by ``engine_settings.replica_cores`` with the
workload's id as the slot): ``VLLM_CPU_OMP_THREADS_BIND``. Left to itself (``auto``) vLLM binds every replica to the
first NUMA node's cores less one it keeps for its scheduler, on a 2-core host core 0 alone: all replicas shared it.
``transformers serve`` on the CPU runs bound (its process's affinity) to its cores likewise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from tessera.serving import engine_bridge
from tessera.serving.engine_settings import NO_BINDING, EngineSettings, parse_core_list, replica_cores

SIM_GPU = "A100-80GB"
GPU_MODEL_ENV = "TESSERA_GPU_MODEL"  # the placed GPUs' catalog model, set by the backend (``gpu.isolation``)
ENGINE_PYTHON = "TESSERA_ENGINE_PYTHON"
CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
CPU_KV_DEFAULT_GIB = 1
CPU_KV_MAX_GIB = 2
REAL_ENGINES = ("vllm", "sglang", "transformers")
RUNTIME_DIR_ENV = "TESSERA_RUNTIME_DIR"  # set by the local backend (backends.runtime_dirs)
SOCKET_NAME = "engine.sock"
LISTENS_ON_UNIX = ("sim", "vllm")  # the engines with a Unix-socket option of their own (``--uds``)
LISTEN_HOST_ENV = "TESSERA_LISTEN_HOST"  # set by a backend that picks the port on the node (backends.base)
LISTEN_PORT_ENV = "TESSERA_LISTEN_PORT"
KEY_ENV = "TESSERA_REPLICA_KEY"  # the replica's own secret (server.serving_plane makes it)
# How each engine that can require a key is given it (an environment variable: argv is readable by all).
ENGINE_KEY_ENV = {"sim": "TESSERA_SIM_API_KEY", "vllm": "VLLM_API_KEY"}
PRIORITY_ENGINES = ("vllm", "sim")  # started with --scheduling-policy priority: the gateway sends SLO priorities
OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
KV_EVENTS_NAME = "kv-events.sock"
# What the server hands on to every replica from its own environment (the workload's environment is clean).
SERVER_ENV = (ENGINE_PYTHON, CPU_KV_ENV, *(f"TESSERA_{e.upper()}_ARGS" for e in REAL_ENGINES))


def memory_fraction(env: Mapping[str, str]) -> float | None:
    """The share of the GPU's memory the engine may use, from ``TESSERA_GPU_MEM_FRACTION`` (which the backend sets
    when the GPU is shared); None for a whole GPU or the CPU (the engine's own default then)."""
    text = env.get("TESSERA_GPU_MEM_FRACTION", "")
    try:
        fraction = float(text)
    except ValueError:
        return None
    return fraction if 0 < fraction <= 1 else None


def on_cpu(env: Mapping[str, str]) -> bool:
    """Whether the engine will run on the CPU: the workload was given no GPU, or a simulated one (or, run by hand
    outside Tessera, the machine has no NVIDIA driver)."""
    if env.get("TESSERA_GPU_SIMULATED") == "1":
        return True
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return visible.strip() == ""
    return not Path("/dev/nvidiactl").exists()


def gpu_count(env: Mapping[str, str]) -> int:
    """How many GPUs the workload was given (``CUDA_VISIBLE_DEVICES``, as the backend sets it); 0 on the CPU."""
    if on_cpu(env):
        return 0
    return len([d for d in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()])


def cpu_kv_cache_gib(env: Mapping[str, str]) -> str:
    """``VLLM_CPU_KVCACHE_SPACE`` for a CPU replica: as set, else the share's memory capped (see the docstring)."""
    if env.get(CPU_KV_ENV):
        return env[CPU_KV_ENV]
    try:
        share_gib = int(env.get("TESSERA_GPU_MEM_MIB", "")) // 1024
    except ValueError:
        return str(CPU_KV_DEFAULT_GIB)
    return str(max(CPU_KV_DEFAULT_GIB, min(CPU_KV_MAX_GIB, share_gib)))


def engine_python(env: Mapping[str, str]) -> str:
    return env.get(ENGINE_PYTHON) or sys.executable


def extra_args(engine: str, env: Mapping[str, str]) -> list[str]:
    return shlex.split(env.get(f"TESSERA_{engine.upper()}_ARGS", ""))


def socket_path(env: Mapping[str, str]) -> str:
    """Where a ``--socket`` replica listens: ``engine.sock`` in its runtime directory."""
    runtime = env.get(RUNTIME_DIR_ENV)
    if not runtime:
        raise SystemExit(f"engine_exec: --socket needs {RUNTIME_DIR_ENV}, which this backend did not set")
    return os.path.join(runtime, SOCKET_NAME)


def node_listen(env: Mapping[str, str]) -> tuple[str, int, str]:
    """Where a ``--node-port`` replica listens and the key it requires: (host, port, key) from the environment the
    backend and the server gave it; exits saying what is missing."""
    host, port, key = env.get(LISTEN_HOST_ENV, ""), env.get(LISTEN_PORT_ENV, ""), env.get(KEY_ENV, "")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise SystemExit(f"engine_exec: --node-port needs {LISTEN_HOST_ENV} and {LISTEN_PORT_ENV} from the backend")
    if not key:
        raise SystemExit(f"engine_exec: --node-port needs the replica's key in {KEY_ENV}")
    return host, int(port), key


def keyed_env(engine: str, env: Mapping[str, str], key: str) -> dict[str, str]:
    """``env`` with the replica's key where ``engine`` reads the key it requires (``ENGINE_KEY_ENV``); exits for an
    engine that can be given one only on its command line."""
    variable = ENGINE_KEY_ENV.get(engine)
    if variable is None:
        raise SystemExit(
            f"engine_exec: {engine} cannot require the replica's key without a command-line flag, which every user "
            "can read: on a backend whose replicas listen on TCP ports of their nodes (Ray), use sim or vllm"
        )
    out = {k: v for k, v in env.items() if k != KEY_ENV}
    out[variable] = key
    return out


def node_port_engine(
    engine: str,
    name: str,
    weights: str | None,
    env: Mapping[str, str],
    settings: EngineSettings | None = None,
    cores: tuple[int, ...] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of a ``--node-port`` replica's engine: on the host and port the backend
    gave, the key in the environment where the engine reads it (exits when anything is missing); the model's own
    ``settings`` and CPU ``cores`` as for any replica."""
    host, port, key = node_listen(env)
    argv = engine_argv(engine, name, port, weights, env, host=host, settings=settings)
    return argv, keyed_env(engine, engine_env(engine, env, settings, cores), key)


def engine_argv(
    engine: str,
    name: str,
    port: int,
    weights: str | None,
    env: Mapping[str, str],
    uds: str | None = None,
    host: str = "127.0.0.1",
    settings: EngineSettings | None = None,
) -> list[str]:
    """The engine's command line (the program first): listening on ``uds`` (sim and vLLM only), else on
    ``host``:``port``; the server-wide extra flags, then the model's own (``settings.engine_args``), last."""
    settings = settings or EngineSettings()
    listen = ["--uds", uds] if uds is not None else ["--host", host, "--port", str(port)]
    if uds is not None and engine not in LISTENS_ON_UNIX:
        raise ValueError(f"{engine} cannot listen on a Unix socket itself")
    policy = ["--scheduling-policy", "priority"] if engine in PRIORITY_ENGINES else []
    own = list(settings.engine_args)
    fraction = memory_fraction(env)
    if engine == "sim":
        argv = [sys.executable, "-m", "tessera.serving.engines.sim_server", "--model", name, *sim_args(weights, env)]
        return argv + listen + policy + own
    python = engine_python(env)
    if engine == "vllm":
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", weights or name]
        argv += ["--served-model-name", name, *listen, *policy]
        if on_cpu(env):
            argv += ["--enforce-eager"]
        elif fraction is not None:
            argv += ["--gpu-memory-utilization", str(fraction)]
        if gpu_count(env) > 1:  # `--gpus N`: one engine over the N GPUs, tensor parallel
            argv += ["--tensor-parallel-size", str(gpu_count(env))]
        return argv + vllm_kv_flags(settings, env) + extra_args(engine, env) + own
    if engine == "sglang":
        argv = [python, "-m", "sglang.launch_server", "--model-path", weights or name]
        argv += ["--served-model-name", name, *listen, "--enable-metrics"]
        if fraction is not None:
            argv += ["--mem-fraction-static", str(fraction)]
        if gpu_count(env) > 1:
            argv += ["--tp", str(gpu_count(env))]
        return argv + extra_args(engine, env) + own
    if engine == "transformers":  # `transformers serve NAME`: loads it at start (``name_link``), serves only it
        return transformers_argv(name, port, env) + own
    raise SystemExit(f"engine_exec: unknown engine {engine!r}")


def sim_args(weights: str | None, env: Mapping[str, str]) -> list[str]:
    """The sim engine's timing and memory: a catalog model (``weights``) on the GPU type it was placed on
    (``TESSERA_GPU_MODEL``; the sim's default without one), its KV cache what the share leaves (a shared GPU), and
    its weights' load time from host memory before it listens, as the twin times a warm start."""
    if not weights:
        return []
    args = ["--perf", f"{weights}@{env.get(GPU_MODEL_ENV) or SIM_GPU}", "--load-s", "auto"]
    share = env.get("TESSERA_GPU_MEM_MIB", "")
    if memory_fraction(env) is not None and share.isdigit():
        args += ["--gpu-mem-mib", share]
    return args


def vllm_kv_flags(settings: EngineSettings, env: Mapping[str, str]) -> list[str]:
    """vLLM's flags for the model's KV options: offloading to host memory (on GPUs: on the CPU the cache is in host
    memory already, and the option is left out), and KV-cache events on ZMQ at ``kv-events.sock`` in the replica's
    runtime directory (only the replica's user and the server can reach it)."""
    flags: list[str] = []
    if settings.kv_offload_gib and not on_cpu(env):
        flags += ["--kv-offloading-size", f"{settings.kv_offload_gib:g}"]
    elif settings.kv_offload_gib:
        sys.stderr.write("engine_exec: KV offloading left out: on the CPU the KV cache is in host memory already\n")
    if settings.kv_events:
        where = os.path.join(env.get(RUNTIME_DIR_ENV) or env.get("TMPDIR") or "/tmp", KV_EVENTS_NAME)
        config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"ipc://{where}"}
        flags += ["--kv-events-config", json.dumps(config, separators=(",", ":"))]
    return flags


def cpu_binding(settings: EngineSettings, env: Mapping[str, str], allowed: Sequence[int]) -> tuple[int, ...] | None:
    """The cores a CPU replica's engine binds its threads to, or None for no binding (``cpu_bind`` "none"):
    ``settings.cores`` of them among ``allowed`` (the cores this process may use), or among the model's
    ``cpu_bind`` list where it has one (cores it lists that this process may not use are left out), the window
    ``engine_settings.replica_cores`` gives the replica's workload id."""
    if settings.cpu_bind == NO_BINDING:
        return None
    pool = sorted(allowed)
    if settings.cpu_bind:
        listed = [c for c in parse_core_list(settings.cpu_bind) if c in set(pool)]
        if listed:
            pool = listed
        else:
            sys.stderr.write(f"engine_exec: none of the cores {settings.cpu_bind} is allowed here; using {pool}\n")
    try:
        slot = int(env.get("TESSERA_WORKLOAD_ID", "0"))
    except ValueError:
        slot = 0
    return replica_cores(pool, settings.cores, slot)


def transformers_argv(
    pinned: str | None, port: int, env: Mapping[str, str], model_timeout_s: int | None = None
) -> list[str]:
    """``transformers serve``'s command line: pinned to the model ``pinned`` (loaded at start, never unloaded), or,
    with ``pinned`` None, serving any model a request names (a folder relative to its working directory), each
    loaded on its first request and unloaded after ``model_timeout_s`` idle seconds (its own default: 300)."""
    argv = [engine_python(env), "-m", "transformers.cli.transformers", "serve"]
    argv += [pinned] if pinned is not None else []
    argv += ["--host", "127.0.0.1", "--port", str(port)]
    if pinned is None and model_timeout_s is not None:
        argv += ["--model-timeout", str(model_timeout_s)]
    if on_cpu(env):
        argv += ["--device", "cpu"]
    return argv + extra_args("transformers", env)


def name_link(name: str, weights: str, env: Mapping[str, str]) -> Path:
    """A directory holding ``NAME -> weights``, for ``transformers serve``: pinned to one model, it answers only
    requests whose ``model`` is exactly the one it loaded (400 otherwise), and clients send the deployed name, so it
    loads the folder under that name, as a path relative to this directory (its working directory). One directory
    per user, the link replaced atomically: a restart or a second replica of the model finds the same link."""
    base = Path(env.get("TMPDIR") or "/tmp") / f"tessera-engine-links-{os.getuid()}"
    base.mkdir(mode=0o700, exist_ok=True)
    if base.is_symlink() or base.stat().st_uid != os.getuid():
        raise SystemExit(f"engine_exec: {base} is not this user's own directory")
    staged = base / f".{name}.{os.getpid()}"
    staged.unlink(missing_ok=True)
    staged.symlink_to(Path(weights).resolve())
    staged.replace(base / name)
    return base


def engine_env(
    engine: str, env: Mapping[str, str], settings: EngineSettings | None = None, cores: tuple[int, ...] | None = None
) -> dict[str, str]:
    """The engine's environment: this one, offline for the hub, with the CPU KV cache sized for vLLM; a real
    engine's virtualenv is self-contained, so Tessera's ``PYTHONPATH`` (for this shim) does not reach it. On the CPU,
    vLLM's OpenMP threads are bound to ``cores`` (``VLLM_CPU_OMP_THREADS_BIND``; "nobind" for None, with as many
    threads as the model's cores when it asked for any), unless the variable is set already."""
    settings = settings or EngineSettings()
    out = {**env, "HF_HUB_OFFLINE": "1"}
    if engine != "sim":
        out.pop("PYTHONPATH", None)
    if engine in ("vllm", "transformers") and on_cpu(env):
        if cores is not None:
            out.setdefault("OMP_NUM_THREADS", str(len(cores)))
        elif settings.cpu_milli:
            out.setdefault("OMP_NUM_THREADS", str(settings.cores))
    if engine == "vllm" and on_cpu(env):
        out[CPU_KV_ENV] = cpu_kv_cache_gib(env)
        out.setdefault(OMP_BIND_ENV, ",".join(map(str, cores)) if cores is not None else "nobind")
    return out


def parse_args(args: Sequence[str]) -> tuple[argparse.Namespace, EngineSettings]:
    """The shim's options, and the model's engine settings (its own engine arguments are those after ``--``)."""
    args = list(args)
    own, engine_args = (args[: args.index("--")], args[args.index("--") + 1 :]) if "--" in args else (args, [])
    parser = argparse.ArgumentParser(prog="python -m tessera.serving.engine_exec")
    parser.add_argument("engine", choices=REAL_ENGINES + ("sim",))
    parser.add_argument("--name", required=True)
    listen = parser.add_mutually_exclusive_group(required=True)
    listen.add_argument("--port", type=int)
    listen.add_argument("--socket", action="store_true", help=f"listen on $TESSERA_RUNTIME_DIR/{SOCKET_NAME}")
    listen.add_argument("--node-port", action="store_true", help=f"listen on ${LISTEN_HOST_ENV}:${LISTEN_PORT_ENV}")
    parser.add_argument("--weights")
    parser.add_argument("--cpus", type=int, default=0, help="cores the engine's threads run on (the CPU request)")
    parser.add_argument("--cpu-bind", default="", help="the cores to pick them among (0-3,8), or none")
    parser.add_argument("--kv-offload-gib", type=float, default=0.0)
    parser.add_argument("--kv-events", action="store_true")
    ns = parser.parse_args(own)
    settings = EngineSettings(tuple(engine_args), ns.cpus * 1000, ns.cpu_bind, ns.kv_offload_gib, ns.kv_events)
    return ns, settings


def main(args: Sequence[str] | None = None) -> None:
    ns, settings = parse_args(sys.argv[1:] if args is None else args)
    uds = socket_path(os.environ) if ns.socket else None
    if ns.engine == "transformers" and ns.weights:
        os.chdir(name_link(ns.name, ns.weights, os.environ))
    cores = None
    if ns.engine in ("vllm", "transformers") and on_cpu(os.environ):
        cores = cpu_binding(settings, os.environ, sorted(os.sched_getaffinity(0)))
        if ns.engine == "transformers" and cores is not None:
            os.sched_setaffinity(0, cores)  # the engine, and all it starts, runs on the replica's cores
    if ns.node_port:  # on a port of this node, the replica's key required
        argv, env = node_port_engine(ns.engine, ns.name, ns.weights, os.environ, settings, cores)
        os.execvpe(argv[0], argv, env)
    env = engine_env(ns.engine, os.environ, settings, cores)
    if uds is not None and ns.engine not in LISTENS_ON_UNIX:  # a TCP-only engine behind the socket
        port = engine_bridge.free_loopback_port()
        argv = engine_argv(ns.engine, ns.name, port, ns.weights, os.environ, settings=settings)
        sys.exit(engine_bridge.run_bridged(argv, env, uds, port))
    if uds is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(uds)  # left by an earlier run of this replica
    argv = engine_argv(ns.engine, ns.name, ns.port or 0, ns.weights, os.environ, uds, settings=settings)
    os.execvpe(argv[0], argv, env)


if __name__ == "__main__":
    main()
