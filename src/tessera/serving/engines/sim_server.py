"""``python -m tessera.serving.engines.sim_server --model NAME --port P``: the sim engine as a real HTTP process.

An OpenAI-compatible server (``sim_api``) whose tokens come at the pace of the part-1 engine model (``sim_live``)
timed by the performance model of a catalog model on a GPU type (``--perf llama3-8b@A100-80GB``), optionally sped
up (``--speedup 10``: ten times faster, for tests). It binds 127.0.0.1 unless told otherwise, and prints one line,
``tessera-sim listening on http://HOST:PORT``, once it accepts connections (port 0 picks a free one); with
``--uds PATH`` it listens on that Unix socket instead (how a replica of ``tessera up`` serves: only the gateway can
reach it) and prints ``tessera-sim listening on unix:PATH``. SIGTERM and SIGINT stop it. Bad options: one line
naming the option, exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.serving.engines.http_lite import serve, serve_unix
from tessera.serving.engines.sim_api import SimApi, SimSettings
from tessera.serving.engines.sim_live import LiveEngine
from tessera.serving.gpus import gpu_spec
from tessera.serving.models import model_spec
from tessera.serving.perf_model import default_perf, shared_calibration_csv
from tessera.serving.policies.engine_parts import EngineConfig

DEFAULT_PERF = "llama3-8b@A100-80GB"
GPU_MEMORY_UTILIZATION = 0.9  # of the GPU's memory, weights plus KV cache (vLLM's default)
BLOCK_TOKENS = 16
READY_LINE = "tessera-sim listening on"


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
    if kv_blocks <= 0:
        free = gpu.memory_bytes * GPU_MEMORY_UTILIZATION - spec.weights_bytes / spec.tensor_parallel
        kv_blocks = int(free * spec.tensor_parallel // spec.kv_bytes_per_token) // BLOCK_TOKENS
        if kv_blocks < 1:
            raise OptionError("--perf", f"{spec.name} leaves no KV cache on {gpu.name}")
    times = default_perf(spec, gpu, spec.tensor_parallel, shared_calibration_csv())
    return LiveEngine(EngineConfig(kv_blocks=kv_blocks, block_tokens=BLOCK_TOKENS), times, options.speedup)


def parse_options(argv: Sequence[str]) -> SimOptions:
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
    ns = parser.parse_args(list(argv))
    if ns.port is not None and not 0 <= ns.port <= 65535:
        parser.exit(2, f"--port: must be in 0..65535, got {ns.port}\n")
    return SimOptions(
        ns.model, ns.port or 0, ns.host, ns.perf, ns.speedup, ns.kv_blocks, ns.max_model_len,
        ns.default_output_tokens, ns.uds,
    )  # fmt: skip


async def run(options: SimOptions) -> None:
    live = build_engine(options)
    settings = SimSettings(options.model, options.max_model_len, options.default_output_tokens)
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


def _event_loop_policy() -> None:
    """uvloop when it is installed (about twice the requests per core); asyncio's own loop otherwise."""
    try:
        uvloop = importlib.import_module("uvloop")
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(sys.argv[1:] if argv is None else argv)
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
