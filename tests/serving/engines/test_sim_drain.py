"""A sim engine told to stop (SIGTERM: a scale-down) finishes the requests it took, as the twin's draining replica
does, instead of cutting their answers; it waits no longer than its drain limit."""

from __future__ import annotations

import asyncio

from sim_harness import ConstantTimes

from tessera.serving.engines.sim_live import LiveEngine
from tessera.serving.engines.sim_server import drain
from tessera.serving.policies.engine_parts import EngineConfig


class Sink:
    def __init__(self) -> None:
        self.count = 0
        self.done: str | None = None

    def tokens(self, first: int, count: int) -> None:
        self.count = first + count

    def finished(self, refused: str) -> None:
        self.done = refused


def test_drain_waits_for_the_answers_taken_and_no_longer_than_its_limit() -> None:
    async def go() -> tuple[str | None, float, bool]:
        live = LiveEngine(EngineConfig(kv_blocks=1000), ConstantTimes(0.005))
        sink = Sink()
        live.submit(16, 40, sink)  # about 0.2 s of decoding
        loop = asyncio.get_running_loop()
        began = loop.time()
        await drain(live, 30.0)
        drained_s = loop.time() - began
        long = Sink()
        live.submit(16, 2_000, long)  # some 10 s of decoding: far longer than the limit
        await drain(live, 0.2)
        return sink.done, drained_s, long.done is None

    done, drained_s, cut = asyncio.run(go())
    assert done == "" and drained_s < 30.0  # finished, served in full; drain returned once it had
    assert cut  # the long one was still running when the limit came: drain gave up rather than wait
