"""``python -m tessera.serving.engines.sim_server --model NAME --port P``: the sim engine as a real HTTP process.

An OpenAI-compatible server (``sim_api``) whose tokens come at the pace of the part-1 engine model (``sim_live``)
timed by the performance model of a catalog model on a GPU type (``--perf llama3-8b@A100-80GB``), optionally sped
up (``--speedup 10``: ten times faster, for tests). It binds 127.0.0.1 unless told otherwise, and prints one line,
``tessera-sim listening on http://HOST:PORT``, once it accepts connections (port 0 picks a free one); with
``--uds PATH`` it listens on that Unix socket instead (how a replica of ``tessera up`` serves: only the gateway can
reach it) and prints ``tessera-sim listening on unix:PATH``. With ``TESSERA_SIM_API_KEY`` set in its environment
(never an option: a command line is readable by every user) it answers 401 to any request without
``Authorization: Bearer <that key>``, as a replica on a TCP port of its node runs. ``--scheduling-policy priority``
(as vLLM's) orders its queue by each request's ``priority`` (lower first), read as an SLO class: 0 or less
interactive, 1 standard, 2 or more batch (``SloClass.of_engine_priority``), then by deadline, as the twin's engine
with ``engine_priority``. SIGTERM and SIGINT stop it. Bad options: one line naming the option, exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tessera.serving.engines.http_lite import serve, serve_unix
from tessera.serving.engines.sim_api import SimApi, SimSettings
from tessera.serving.engines.sim_live import LiveEngine
from tessera.serving.gpus import gpu_spec
from tessera.serving.models import GIB, MIB, model_spec
from tessera.serving.perf_model import default_perf, shared_calibration_csv
from tessera.serving.policies.engine_parts import EngineConfig
from tessera.serving.policies.model_cache import Tier, ready_time_s
from tessera.serving.setups import ReplicaSizing

DEFAULT_PERF = "llama3-8b@A100-80GB"
# As the twin sizes a replica: the share of the GPU's memory an engine uses (weights plus KV cache, vLLM's default),
# and what activations, the CUDA context and graphs take of it.
GPU_MEMORY_UTILIZATION = ReplicaSizing(shared=True).gpu_memory_utilization
OVERHEAD_GIB = ReplicaSizing(shared=True).overhead_gib
BLOCK_TOKENS = 16
READY_LINE = "tessera-sim listening on"
DRAIN_S = 8.0  # under the backend's stop grace (10 s) before SIGKILL
API_KEY_ENV = "TESSERA_SIM_API_KEY"
SCHEDULING_POLICIES = ("fcfs", "priority")  # as vLLM's --scheduling-policy


@dataclass(frozen=True, slots=True)
class SimOptions:
    model: str
    port: int
    host: str = "127.0.0.1"
    perf: str = DEFAULT_PERF  # "<catalog model>@<GPU type>"
    speedup: float = 1.0
    kv_blocks: int = 0  # 0: what the GPU's memory leaves beside the weights
    max_model_len: int = 8192
    default_output_tokens: int = 16
    uds: str | None = None  # listen on this Unix socket instead of host:port
    gpu_mem_mib: int = 0  # the memory its share of the GPU holds (0: the whole GPU)
    load_s: float = 0.0  # seconds it takes to load the weights before it listens
    api_key: str = field(default="", repr=False)  # required of every request when set (from ``API_KEY_ENV``)
    scheduling_policy: str = "fcfs"  # "priority": a request's ``priority`` orders the queue (vLLM's option)
    drain_s: float = DRAIN_S  # on SIGTERM, how long it finishes the requests it took before it exits


class OptionError(ValueError):
    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")


def build_engine(options: SimOptions) -> LiveEngine:
    """The engine model for ``options``: timing from the performance model, KV cache from the GPU's memory."""
    name, _, gpu_name = options.perf.partition("@")
    try:
        spec = model_spec(name)
        gpu = gpu_spec(gpu_name or "A100-80GB")
    except (ValueError, KeyError) as exc:
        raise OptionError("--perf", str(exc)) from None
    if options.speedup <= 0:
        raise OptionError("--speedup", f"must be > 0, got {options.speedup}")
    kv_blocks = options.kv_blocks
    if kv_blocks <= 0:  # what the weights, activations and CUDA context leave, as the twin sizes a replica
        usable = gpu.memory_bytes * GPU_MEMORY_UTILIZATION
        if options.gpu_mem_mib > 0:
            usable = min(usable, options.gpu_mem_mib * MIB)
        free = usable - spec.weights_bytes / spec.tensor_parallel - OVERHEAD_GIB * GIB
        kv_blocks = int(free * spec.tensor_parallel // spec.kv_bytes_per_token) // BLOCK_TOKENS
        if kv_blocks < 1:
            raise OptionError("--perf", f"{spec.name} leaves no KV cache on {gpu.name}")
    times = default_perf(spec, gpu, spec.tensor_parallel, shared_calibration_csv())
    priority = options.scheduling_policy == "priority"
    config = EngineConfig(kv_blocks=kv_blocks, block_tokens=BLOCK_TOKENS, priority=priority)
    return LiveEngine(config, times, options.speedup)


def parse_options(argv: Sequence[str], env: Mapping[str, str] | None = None) -> SimOptions:
    """The options of ``argv``, and the API key it requires from ``env``'s ``API_KEY_ENV`` (none without ``env``)."""
    parser = argparse.ArgumentParser(prog="python -m tessera.serving.engines.sim_server", description=__doc__)
    parser.add_argument("--model", required=True, help="the model name it serves")
    listen = parser.add_mutually_exclusive_group(required=True)
    listen.add_argument("--port", type=int, help="TCP port (0: any free one)")
    listen.add_argument("--uds", help="a Unix socket's path to listen on instead of a TCP port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--perf", default=DEFAULT_PERF, help="timing: <catalog model>@<GPU type>")
    parser.add_argument("--speedup", type=float, default=1.0, help="run the modelled time this many times faster")
    parser.add_argument("--kv-blocks", type=int, default=0, help="KV cache blocks of 16 tokens (0: from the GPU)")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--default-output-tokens", type=int, default=16)
    parser.add_argument("--gpu-mem-mib", type=int, default=0, help="memory of its GPU share (0: the whole GPU)")
    parser.add_argument(
        "--load-s", default="0", help="seconds to load the weights before listening; auto: from the model's size"
    )
    parser.add_argument(
        "--scheduling-policy", choices=SCHEDULING_POLICIES, default="fcfs",
        help="fcfs: arrival order; priority: a request's priority (lower first: 0 interactive, 1 standard, 2 batch)",
    )  # fmt: skip
    ns = parser.parse_args(list(argv))
    if ns.port is not None and not 0 <= ns.port <= 65535:
        parser.exit(2, f"--port: must be in 0..65535, got {ns.port}\n")
    if ns.gpu_mem_mib < 0:
        parser.exit(2, f"--gpu-mem-mib: must be >= 0, got {ns.gpu_mem_mib}\n")
    return SimOptions(
        ns.model, ns.port or 0, ns.host, ns.perf, ns.speedup, ns.kv_blocks, ns.max_model_len,
        ns.default_output_tokens, ns.uds, ns.gpu_mem_mib, _load_s(parser, ns.load_s, ns.perf, ns.speedup),
        (env or {}).get(API_KEY_ENV, ""),
        ns.scheduling_policy,
    )  # fmt: skip


def _load_s(parser: argparse.ArgumentParser, text: str, perf: str, speedup: float) -> float:
    """``--load-s``: seconds, or ``auto``: the time the twin gives a start from host memory (``model_cache``),
    sped up as the rest."""
    if text.strip().lower() == "auto":
        try:
            spec = model_spec(perf.partition("@")[0])
        except (ValueError, KeyError) as exc:
            parser.exit(2, f"--perf: {exc}\n")
        return ready_time_s(spec.weights_bytes, Tier.WARM, gpus=spec.tensor_parallel) / max(speedup, 1e-9)
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (0 <= value < 3600):
        parser.exit(2, f"--load-s: give seconds in [0, 3600) or auto, got {text!r}\n")
    return value


async def run(options: SimOptions) -> None:
    live = build_engine(options)
    if options.load_s > 0:  # the weights load before the engine listens, as a real engine's do
        await asyncio.sleep(options.load_s)
    settings = SimSettings(options.model, options.max_model_len, options.default_output_tokens, api_key=options.api_key)
    api = SimApi(settings, live)
    if options.uds is not None:
        server = await serve_unix(api, options.uds)
        where = f"unix:{options.uds}"
    else:
        server = await serve(api, options.host, options.port)
        where = f"http://{options.host}:{server.sockets[0].getsockname()[1]}"
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    sys.stdout.write(f"{READY_LINE} {where}\n")
    sys.stdout.flush()
    async with server:
        await stop.wait()
        server.close()  # no new connection: a request bound here now finds it gone and goes elsewhere
        await drain(live, options.drain_s)


async def drain(live: LiveEngine, limit_s: float) -> None:
    """On SIGTERM (a scale-down, a model deleted), finish the requests taken, for at most ``limit_s`` (under the
    backend's stop grace), as the twin's draining replica does, rather than cut their answers."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while loop.time() < deadline:
        running, waiting, _ = live.stats()
        if running + waiting == 0:
            return
        await asyncio.sleep(0.05)


def _event_loop_policy() -> None:
    """uvloop when it is installed (about twice the requests per core); asyncio's own loop otherwise."""
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(sys.argv[1:] if argv is None else argv, os.environ)
    try:
        build_engine(options)  # options checked before the loop starts
    except OptionError as exc:
        sys.stderr.write(f"{exc}\n")
        return 2
    _event_loop_policy()
    asyncio.run(run(options))
    return 0


if __name__ == "__main__":
    sys.exit(main())
