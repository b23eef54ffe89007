"""Two models share one simulated GPU by memory on a real ``tessera up``: a burst on the high-priority model (at zero
replicas) evicts the idle low-priority model's replica, which is requeued, not failed; every request of the burst
succeeds, the winner is never evicted back (preemption never loops), and once the burst's model is back at zero
the low-priority model gets its share again. The switch times are measured and printed (docs/serving.md)."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from live_server import ADMIN, LiveServer, wait_for

pytestmark = pytest.mark.e2e

BURST = 20  # concurrent streaming requests on the high-priority model


def model(server: LiveServer, name: str) -> dict[str, Any]:
    with server.client() as client:
        return client.model(name)


def event_at(server: LiveServer, workload_id: int, kind: str) -> float | None:
    """When the workload's first event of ``kind`` happened (the server's clock), or None."""
    with server.client() as client:
        return next((float(e["at"]) for e in client.events(workload_id) if e["kind"] == kind), None)


async def burst(server: LiveServer) -> list[float | BaseException]:
    """``BURST`` concurrent streaming chat requests; each one's time of first token (``time.time()``)."""
    ai = openai.AsyncOpenAI(base_url=f"{server.url}/openai/v1", api_key=ADMIN, max_retries=0, timeout=120)

    async def one(i: int) -> float:
        stream = await ai.chat.completions.create(
            model="high", messages=[{"role": "user", "content": f"now {i}"}], max_tokens=8, stream=True
        )
        first: float | None = None
        async for _ in stream:
            first = time.time() if first is None else first
        assert first is not None
        return first

    return await asyncio.gather(*(one(i) for i in range(BURST)), return_exceptions=True)


def test_a_burst_on_a_high_priority_model_evicts_an_idle_low_priority_one_sharing_its_gpu(tmp_path: Path) -> None:
    live = LiveServer(tmp_path / "one-gpu", gpus="1xA100-80GB")
    live.start()
    try:
        with live.client() as client:
            client.deploy_model({"name": "low", "engine": "sim", "gpu_fraction": 0.6, "slo": "batch"})
            # standard: a class whose TTFT target a start (eviction included) fits in twice over, so the setup's
            # autoscaler lets it go back to zero (an interactive one it would keep at one replica)
            body = {"name": "high", "engine": "sim", "gpu_fraction": 0.6, "slo": "standard"}
            client.deploy_model(body | {"min_replicas": 0, "max_replicas": 1, "idle_timeout": "3s"})
        wait_for(lambda: model(live, "low")["state"] == "ready", timeout_s=30)
        low_replica = model(live, "low")["replica_workloads"][0]
        assert model(live, "high")["state"] == "scaled-to-zero"

        start = time.time()
        results = asyncio.run(burst(live))
        errors = [r for r in results if isinstance(r, BaseException)]
        assert errors == [], errors[:3]
        firsts = sorted(r for r in results if isinstance(r, float))

        with live.client() as client:
            assert client.workload(low_replica)["state"] in ("pending", "running")  # requeued, not failed
        evicted = event_at(live, low_replica, "preempted")
        assert evicted is not None and evicted >= start - 1.0
        high_replica = model(live, "high")["replica_workloads"][0]
        launched = event_at(live, high_replica, "started")
        assert launched is not None and launched >= evicted
        assert event_at(live, high_replica, "preempted") is None  # the winner is not evicted back
        scrape = httpx.get(f"{live.url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
        assert 'tessera_model_evictions_total{served_model="low"} 1.0' in scrape
        assert 'tessera_model_evictions_total{served_model="high"} 0.0' in scrape
        assert 'tessera_model_starts_total{served_model="high",tier="cold"} 1.0' in scrape  # a cold start
        assert 'tessera_model_state{served_model="high",state="ready"} 1.0' in scrape
        ttft = [f - start for f in firsts]
        print(
            f"\nswitch ({BURST} concurrent requests, 0 errors): burst start -> low-priority replica evicted "
            f"{evicted - start:.2f} s; eviction -> high-priority replica launched {launched - evicted:.2f} s; "
            f"eviction -> first token {firsts[0] - evicted:.2f} s; burst start -> first token {ttft[0]:.2f} s "
            f"(median {statistics.median(ttft):.2f} s, last {ttft[-1]:.2f} s)"
        )
        # Once the burst is over, the high-priority model goes back to zero and the low one gets its share back.
        back_start = time.time()
        wait_for(lambda: model(live, "high")["state"] == "scaled-to-zero", timeout_s=40)
        wait_for(lambda: model(live, "low")["replicas"] == 1, timeout_s=30)
        print(f"back: high at zero and low running again {time.time() - back_start:.2f} s after the burst")
        assert event_at(live, high_replica, "preempted") is None
    finally:
        with live.client() as client:
            for m in client.models():
                client.delete_model(m["name"])
            wait_for(lambda: not client.models(), timeout_s=30)
        live.cancel_all()
        live.stop()
