"""A burst held while a model starts from zero, spread (or not) over its replicas as they become ready.

Three sim engine processes (``llama3-8b@A100-80GB`` timing, real time) on 127.0.0.1 and the gateway in this process
(uvicorn). For each arm: the model is deployed with no replica ready, ``--requests`` concurrent streaming chat
requests of ~``--prompt-tokens`` tokens come at once and are held; the replicas are then registered one by one,
``--first-s`` after the burst and ``--stagger-s`` apart, as a controller whose replicas start at different speeds
would. An arm is the per-replica in-flight cap (``GatewayConfig.replica_concurrency``): 0 is no cap, every held
request bound at once to the replicas ready at that moment (the old release); N binds at most N per replica and
keeps the rest held until a replica has room. Prints, per arm, the requests each replica served (in the order they
became ready) and the time to first token (from sending, the wait for the first replica included), then one JSON
line.

    PYTHONPATH=src .venv/bin/python bench/gateway_burst.py [--caps 0,32] [--requests 100] [--stagger-s 1.0]

``--caps 0`` also runs against a tree older than the cap (it passes the cap to the gateway only when non-zero).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections import Counter
from dataclasses import fields

import httpx

from tessera.serving.engines.process import free_port
from tessera.serving.engines.sim import SimEngine
from tessera.serving.gateway.app import Gateway, GatewayConfig
from tessera.serving.gateway.registry import InMemoryRegistry, ModelRoute
from tessera.serving.gateway.serve import uvicorn_server

MODEL = "burst"


THREE_LETTERS = ("the", "and", "for", "was", "are", "his", "but", "you", "her", "she", "one", "all", "has", "can")


def _prompt(i: int, tokens: int) -> str:
    """Words of three letters and a space: one token each by a tokenizer's count and by four characters a token
    alike (the sim engine's count before), so that trees of either kind see the same prefill."""
    return f"request {i}: " + " ".join(THREE_LETTERS[(i * 7 + k) % len(THREE_LETTERS)] for k in range(tokens))


async def _one(client: httpx.AsyncClient, i: int, prompt_tokens: int, max_tokens: int) -> tuple[str, float]:
    body = {
        "model": MODEL, "messages": [{"role": "user", "content": _prompt(i, prompt_tokens)}],
        "max_tokens": max_tokens, "stream": True,
    }  # fmt: skip
    start = time.monotonic()
    first: float | None = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        replica = response.headers["x-tessera-replica"]
        async for line in response.aiter_lines():
            if first is None and line.startswith("data: {") and '"content"' in line:
                first = time.monotonic() - start
    assert first is not None, "no token came"
    return replica, first


async def _arm(cap: int, engines: list[SimEngine], ns: argparse.Namespace) -> dict[str, object]:
    registry = InMemoryRegistry()
    options: dict[str, object] = {"scrape_interval_s": 0.5}
    if cap:
        options["replica_concurrency"] = cap
    gateway = Gateway(registry, config=GatewayConfig(**options))  # type: ignore[arg-type]
    port = free_port()
    server = uvicorn_server(gateway, port=port)
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    registry.deploy(ModelRoute(MODEL, "bench"))
    limits = httpx.Limits(max_connections=ns.requests + 10)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=300, limits=limits) as client:
        burst = [asyncio.ensure_future(_one(client, i, ns.prompt_tokens, ns.max_tokens)) for i in range(ns.requests)]
        await asyncio.sleep(ns.first_s)
        order: list[str] = []
        for index, engine in enumerate(engines):
            if index:
                await asyncio.sleep(ns.stagger_s)
            order.append(str(registry.add_replica(MODEL, engine.base_url)))
        results = await asyncio.gather(*burst)
    server.should_exit = True
    await serving
    per_replica = Counter(replica for replica, _ in results)
    ttft = sorted(t for _, t in results)
    return {
        "cap": cap,
        "per_replica": [per_replica.get(r, 0) for r in order],
        "ttft_p50_s": round(statistics.median(ttft), 3),
        "ttft_p99_s": round(ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))], 3),
        "ttft_max_s": round(ttft[-1], 3),
        "ttft_min_s": round(ttft[0], 3),
        "ttft_deciles_s": [round(ttft[min(len(ttft) - 1, len(ttft) * k // 10)], 2) for k in range(11)],
    }


async def _main(ns: argparse.Namespace) -> list[dict[str, object]]:
    engines = [SimEngine(MODEL, free_port(), speedup=ns.speedup) for _ in range(3)]
    for engine in engines:
        await engine.start(60.0)
    try:
        caps = [int(c) for c in ns.caps.split(",")]
        if any(caps) and "replica_concurrency" not in {f.name for f in fields(GatewayConfig)}:
            sys.exit("this tree's gateway has no replica_concurrency: run it with --caps 0")
        runs = []
        for _ in range(ns.runs):
            for cap in caps:
                runs.append(await _arm(cap, engines, ns))
                await asyncio.sleep(1.0)  # the engines drain what was cancelled or left
        return runs
    finally:
        for engine in engines:
            await engine.stop(5.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--caps", default="0,32", help="per-replica in-flight caps to compare (0: none)")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--first-s", type=float, default=0.5, help="the first replica is ready this long after")
    parser.add_argument("--stagger-s", type=float, default=1.0, help="then one more replica every this long")
    parser.add_argument("--speedup", type=float, default=1.0, help="the sim engines' speed-up of modelled time")
    parser.add_argument("--runs", type=int, default=1)
    ns = parser.parse_args()
    runs = asyncio.run(_main(ns))
    print(f"{'cap':>4}  {'per replica (in order ready)':<30} {'TTFT p50':>9} {'p99':>7} {'max':>7}")
    for run in runs:
        shares = " / ".join(str(n) for n in run["per_replica"])  # type: ignore[attr-defined]
        print(
            f"{run['cap']:>4}  {shares:<30} {run['ttft_p50_s']:>8.2f}s {run['ttft_p99_s']:>6.2f}s"
            f" {run['ttft_max_s']:>6.2f}s"
        )
    print(json.dumps({"requests": ns.requests, "stagger_s": ns.stagger_s, "runs": runs}))


if __name__ == "__main__":
    main()
