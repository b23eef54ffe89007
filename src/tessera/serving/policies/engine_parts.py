"""The engine model's parts: its configuration, the timing seam it needs, its sequences and what it reports.

The engine model itself is ``engine.Engine``; these types are shared with the twin and the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from tessera.serving.policies.requests import InferenceRequest


class IterationTimes(Protocol):
    """Engine timing: what ``tessera.serving.perf_model`` provides (a calibrated or a user-profiled model)."""

    def iteration_s(self, prefill_tokens: int, decode_batch: int, kv_tokens: int) -> float:
        """Seconds of one iteration: ``prefill_tokens`` new prompt tokens and one new token for each of
        ``decode_batch`` decoding sequences whose contexts hold ``kv_tokens`` tokens in all."""
        ...

    def decode_affine(self, decode_batch: int) -> tuple[float, float]:
        """``(intercept_s, slope_s_per_kv_token)``: ``iteration_s(0, B, kv) == intercept + slope * kv``."""
        ...


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """One replica's engine. ``kv_blocks`` comes from the replica's GPU memory (what the weights leave)."""

    kv_blocks: int  # paged KV cache size, in blocks of ``block_tokens`` tokens
    block_tokens: int = 16
    max_batch_tokens: int = 2048  # tokens one iteration processes (decodes first, then prefill chunks)
    max_running: int = 256  # sequences in the running batch
    chunked_prefill: bool = True  # False: a prompt is prefilled whole, in one iteration
    priority: bool = True  # waiting order: SLO class, then deadline (False: arrival order)
    watermark_blocks: int = -1  # kept free when admitting a new sequence (-1: 1% of kv_blocks)
    predicted_output_tokens: int = 256  # the load estimate routers see (the engine does not know true lengths)
    fast_forward: bool = True  # plan runs of decode-only iterations as one segment (False: one at a time)
    # True: the token budget goes to prompts first and decoding sequences fill what is left (the rest skip the
    # iteration), as vLLM v0 and the Splitwise simulator schedule; False: decodes first, then prompt chunks.
    prefill_first: bool = False

    def __post_init__(self) -> None:
        for name in ("kv_blocks", "block_tokens", "max_batch_tokens", "max_running", "predicted_output_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"engine config: {name} must be >= 1, got {getattr(self, name)}")

    @property
    def watermark(self) -> int:
        return self.watermark_blocks if self.watermark_blocks >= 0 else self.kv_blocks // 100

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    @property
    def max_tokens(self) -> int:
        """The longest sequence (prompt + output) the cache can ever hold."""
        return self.kv_blocks * self.block_tokens


class Seq:
    """One request inside the engine. ``kv`` tokens of context are in the cache; a (re)admitted sequence first
    prefills ``target`` tokens (its prompt, plus what it had generated when a preemption dropped its cache), and
    the iteration that finishes that prefill emits its next token."""

    __slots__ = ("req", "key", "kv", "target", "generated", "blocks", "first_token_s", "preemptions", "admitted_s")

    def __init__(self, req: InferenceRequest, key: tuple[float, ...]) -> None:
        self.req = req
        self.key = key  # the waiting order: smaller first; also the preemption order (largest first)
        self.kv = 0
        self.target = req.prompt_tokens
        self.generated = 0
        self.blocks = 0
        self.first_token_s = math.nan
        self.preemptions = 0
        self.admitted_s: tuple[float, ...] = ()  # every time it entered the running batch

    @property
    def prefilling(self) -> bool:
        return self.kv < self.target

    def __lt__(self, other: Seq) -> bool:  # heap order
        return self.key < other.key


@dataclass(frozen=True, slots=True)
class Completion:
    """A request that left the engine: served (``finish_s`` set) or refused (``refused`` says why)."""

    request: InferenceRequest
    first_token_s: float
    finish_s: float
    preemptions: int = 0
    refused: str = ""
    admitted_s: tuple[float, ...] = ()  # when it entered the running batch (again after each preemption)

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.request.arrival_s

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (0 for a one-token answer)."""
        if self.request.output_tokens <= 1:
            return 0.0
        return (self.finish_s - self.first_token_s) / (self.request.output_tokens - 1)


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What a router and an autoscaler see of one engine."""

    queued: int
    running: int
    predicted_tokens: int
    kv_free_frac: float
    prefill_tokens: int = 0  # prompt tokens still to prefill (waiting and mid-prefill sequences)
