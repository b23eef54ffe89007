"""The sim engine's clockwork: the part-1 engine model (``policies.engine.Engine``) driven by the event loop's clock.

``LiveEngine`` is what ``sim_server`` serves. Virtual time is the loop's monotonic clock since start-up times
``speedup``; one timer per engine (not per request) fires when the model's next iteration ends, advances the model,
and hands every running sequence's new tokens to its ``TokenSink``. The model runs with ``fast_forward`` off, so
each iteration is an event and tokens trickle out at the modelled pace (one per running sequence per iteration).
The work per iteration is O(running sequences): no task, queue or future per request.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from dataclasses import dataclass
from typing import Protocol

from tessera.serving.policies.engine import Engine
from tessera.serving.policies.engine_parts import Completion, EngineConfig, IterationTimes
from tessera.serving.policies.requests import DEFAULT_SLO_TARGETS, InferenceRequest, SloClass


class TokenSink(Protocol):
    """Where one request's tokens go (an HTTP response, usually)."""

    def tokens(self, first: int, count: int) -> None:
        """Output tokens ``first`` .. ``first + count - 1`` (0-based) are ready."""
        ...

    def finished(self, refused: str) -> None:
        """The request is done: served (``refused`` empty; every token was given to ``tokens``) or refused."""
        ...


@dataclass(slots=True)
class _Live:
    sink: TokenSink
    output_tokens: int
    sent: int = 0


@dataclass(slots=True)
class LiveCounters:
    """Monotonic counters for ``/metrics`` (vLLM's ``*_total`` names)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0


class LiveEngine:
    """One replica's engine model on a real clock (see the module docstring)."""

    def __init__(self, config: EngineConfig, times: IterationTimes, speedup: float = 1.0) -> None:
        if speedup <= 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        self.engine = Engine(dataclasses.replace(config, fast_forward=False), times)
        self.speedup = speedup
        self.counters = LiveCounters()
        self._live: dict[int, _Live] = {}
        self._next_id = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._t0 = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at_s = math.inf  # the virtual time the timer is set for

    @property
    def max_tokens(self) -> int:
        """The longest request (prompt + output) the KV cache can ever hold."""
        return self.engine.config.max_tokens

    def now_s(self) -> float:
        loop = self._clock()
        return (loop.time() - self._t0) * self.speedup

    def submit(self, prompt_tokens: int, output_tokens: int, sink: TokenSink, slo: SloClass = SloClass.STANDARD) -> int:
        """Queue a request; returns its id (for ``cancel``). Tokens and the end arrive at ``sink`` later (a refusal
        may arrive at once, before this returns)."""
        now = self.now_s()
        rid = self._next_id
        self._next_id += 1
        deadline = now + DEFAULT_SLO_TARGETS[slo].ttft_s
        request = InferenceRequest(rid, "", now, prompt_tokens, output_tokens, slo=slo, deadline_s=deadline)
        self._live[rid] = _Live(sink, output_tokens)
        self.counters.prompt_tokens += prompt_tokens
        self._settle(self.engine.submit(request, now))
        self._arm()
        return rid

    def cancel(self, rid: int) -> None:
        """Drop request ``rid`` (its client went away); its sink hears nothing more."""
        if self._live.pop(rid, None) is None:
            return
        self.counters.requests_cancelled += 1
        self._settle(self.engine.cancel(rid, self.now_s()))
        self._arm()

    def is_live(self, rid: int) -> bool:
        """Whether request ``rid`` is still in the engine (neither done, refused nor cancelled)."""
        return rid in self._live

    def stats(self) -> tuple[int, int, float]:
        """(running, waiting, KV-cache usage in [0, 1]) as vLLM's gauges report them."""
        engine = self.engine
        usage = 1.0 - engine.free_blocks / engine.config.kv_blocks
        return len(engine.running), len(engine.waiting), usage

    # ------------------------------------------------------------------------------------------------ internals
    def _clock(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._t0 = self._loop.time()
        return self._loop

    def _arm(self) -> None:
        """Set the one timer for the model's next event (earlier than the one set, or none set)."""
        at = self.engine.next_event_s
        if at == self._timer_at_s:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at_s = at
        if math.isinf(at):
            return
        loop = self._clock()
        self._timer = loop.call_at(self._t0 + at / self.speedup, self._tick)

    def _tick(self) -> None:
        self._timer = None
        now = max(self.now_s(), self._timer_at_s)  # the loop may wake a hair early: the event is due
        self._timer_at_s = math.inf
        self._settle(self.engine.advance(now))
        self._arm()

    def _settle(self, done: list[Completion]) -> None:
        """Hand out the tokens the model produced since the last call, then end what completed."""
        live = self._live
        for seq in self.engine.running:
            entry = live.get(seq.req.id)
            if entry is not None and seq.generated > entry.sent:
                count = seq.generated - entry.sent
                entry.sink.tokens(entry.sent, count)
                entry.sent = seq.generated
                self.counters.generation_tokens += count
        for completion in done:
            entry = live.pop(completion.request.id, None)
            if entry is None:
                continue
            if not completion.refused and entry.output_tokens > entry.sent:
                count = entry.output_tokens - entry.sent
                entry.sink.tokens(entry.sent, count)
                self.counters.generation_tokens += count
            self.counters.requests_finished += 1
            entry.sink.finished(completion.refused)
