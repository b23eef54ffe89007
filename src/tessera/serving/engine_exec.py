"""``python -m tessera.serving.engine_exec ENGINE --name NAME --port PORT [--weights W]``: start one replica's
engine in this process's place, with the memory cap its GPU share allows.

A replica is launched as a Tessera workload, so its share is only known at launch, from the variables the backend
sets (``gpu.isolation``). This shim turns ``TESSERA_GPU_MEM_FRACTION`` into the engine's own flag (vLLM's and
SGLang's memory fraction) and ``exec``s the engine, so that the workload's process is the engine itself: stopping
the workload stops the engine.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence

SIM_GPU = "A100-80GB"


def memory_fraction(env: Mapping[str, str]) -> float | None:
    """The share of the GPU's memory the engine may use, from ``TESSERA_GPU_MEM_FRACTION`` (which the backend sets
    when the GPU is shared); None for a whole GPU or the CPU (the engine's own default then)."""
    text = env.get("TESSERA_GPU_MEM_FRACTION", "")
    try:
        fraction = float(text)
    except ValueError:
        return None
    return fraction if 0 < fraction <= 1 else None


def engine_argv(engine: str, name: str, port: int, weights: str | None, env: Mapping[str, str]) -> list[str]:
    """The engine's command line (the program first)."""
    python = sys.executable
    host = ["--host", "127.0.0.1", "--port", str(port)]
    fraction = memory_fraction(env)
    if engine == "sim":  # the timing of a catalog model (on the sim engine's default GPU type)
        perf = ["--perf", f"{weights}@{SIM_GPU}"] if weights else []
        return [python, "-m", "tessera.serving.engines.sim_server", "--model", name, *perf, *host]
    if engine == "vllm":
        argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", weights or name]
        argv += ["--served-model-name", name, *host]
        if fraction is not None:
            argv += ["--gpu-memory-utilization", str(fraction)]
        return argv
    if engine == "sglang":
        argv = [python, "-m", "sglang.launch_server", "--model-path", weights or name]
        argv += ["--served-model-name", name, *host]
        if fraction is not None:
            argv += ["--mem-fraction-static", str(fraction)]
        return argv
    if engine == "transformers":
        return ["transformers", "serve", *host]
    raise SystemExit(f"engine_exec: unknown engine {engine!r}")


def main(args: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tessera.serving.engine_exec")
    parser.add_argument("engine", choices=("vllm", "sglang", "transformers", "sim"))
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--weights")
    ns = parser.parse_args(args)
    argv = engine_argv(ns.engine, ns.name, ns.port, ns.weights, os.environ)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
