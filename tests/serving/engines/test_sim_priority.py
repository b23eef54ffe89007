"""The sim engine honours a request's ``priority`` as vLLM does under ``--scheduling-policy priority``: its queue is
ordered by SLO class (the twin's engine with ``engine_priority``), and without that policy the field is ignored."""

from __future__ import annotations

import asyncio

import pytest
from sim_harness import connect, exchange, make_api, parse_responses, post

from tessera.serving.engines.sim_api import SimApi
from tessera.serving.engines.sim_server import build_engine, parse_options

# 220 prompt tokens + 10 output: 15 of the 20 blocks of 16 tokens, so one such request runs at a time.
LONG = {"model": "m", "prompt": "x" * 880, "max_tokens": 10}


async def _finish_order(api: SimApi, priorities: dict[str, int | None]) -> list[str]:
    """Send a blocker, then one request per name (with its ``priority``, none for None) while it runs; the names
    in the order their answers completed."""
    blocker, _ = connect(api)
    blocker.data_received(post("/v1/completions", LONG))
    await asyncio.sleep(0.02)
    transports = {}
    for name, priority in priorities.items():
        conn, transport = connect(api)
        body = LONG if priority is None else {**LONG, "priority": priority}
        conn.data_received(post("/v1/completions", body))
        transports[name] = transport
    done: list[str] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while len(done) < len(transports):
        assert loop.time() < deadline, "the requests did not finish"
        for name, transport in transports.items():
            if name not in done and parse_responses(bytes(transport.data))[0]:
                done.append(name)
        await asyncio.sleep(0.002)
    return done


def test_with_priority_scheduling_the_more_urgent_class_is_served_first() -> None:
    async def go() -> None:
        api = make_api(iteration_s=0.005, kv_blocks=20, priority=True)
        order = await _finish_order(api, {"batch": 2, "standard": 1, "interactive": 0})
        assert order == ["interactive", "standard", "batch"]

    asyncio.run(go())


def test_without_it_the_field_is_ignored_and_requests_are_served_in_arrival_order() -> None:
    async def go() -> None:
        api = make_api(iteration_s=0.005, kv_blocks=20, priority=False)
        order = await _finish_order(api, {"batch": 2, "standard": 1, "interactive": 0})
        assert order == ["batch", "standard", "interactive"]

    asyncio.run(go())


def test_no_priority_counts_as_0_and_out_of_range_values_as_the_nearest_class() -> None:
    async def go() -> None:
        api = make_api(iteration_s=0.005, kv_blocks=20, priority=True)
        order = await _finish_order(api, {"far-batch": 99, "none": None, "urgent": -4})
        assert order[-1] == "far-batch" and set(order[:2]) == {"none", "urgent"}

    asyncio.run(go())


def test_a_priority_that_is_no_integer_is_refused_naming_it() -> None:
    async def go() -> None:
        api = make_api(priority=True)
        [refused] = await exchange(api, post("/v1/completions", {**LONG, "priority": "high"}))
        assert refused.status == 400 and refused.json()["error"]["param"] == "priority"

    asyncio.run(go())


@pytest.mark.parametrize(("flag", "priority"), [([], False), (["--scheduling-policy", "priority"], True)])
def test_the_server_takes_vllms_scheduling_policy_flag(flag: list[str], priority: bool) -> None:
    options = parse_options(["--model", "m", "--port", "0", *flag])
    assert build_engine(options).engine.config.priority is priority
