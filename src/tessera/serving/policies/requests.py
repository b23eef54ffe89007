"""Inference requests and their SLO classes.

Three classes, most urgent first: ``interactive`` (chat: a person waits for the first token), ``standard`` (API
calls) and ``batch`` (offline work, the only class shed under overload). Each has a time-to-first-token (TTFT) and a
time-per-output-token (TPOT) target; a request's deadline is its arrival plus its class's TTFT target, and requests
of one class are served earliest deadline first.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class SloClass(enum.IntEnum):
    """Lower value = more urgent; the engine and the admission order by it before the deadline."""

    INTERACTIVE = 0
    STANDARD = 1
    BATCH = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @property
    def engine_priority(self) -> int:
        """The request priority an engine with priority scheduling gets for this class (vLLM's ``priority``: lower
        is served earlier): interactive 0, standard 1, batch 2."""
        return int(self)

    @classmethod
    def of_engine_priority(cls, priority: int) -> SloClass:
        """The class an engine's request ``priority`` stands for (the sim engine's three levels): 0 or less is
        interactive, 1 standard, 2 or more batch."""
        return cls(min(max(priority, cls.INTERACTIVE), cls.BATCH))

    @classmethod
    def parse(cls, text: str) -> SloClass:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            known = ", ".join(c.label for c in cls)
            raise ValueError(f"unknown SLO class {text!r} (known: {known})") from None


@dataclass(frozen=True, slots=True)
class SloTarget:
    ttft_s: float  # time to first token, seconds
    tpot_s: float  # mean time per output token after the first, seconds


DEFAULT_SLO_TARGETS: dict[SloClass, SloTarget] = {
    SloClass.INTERACTIVE: SloTarget(ttft_s=2.0, tpot_s=0.2),
    SloClass.STANDARD: SloTarget(ttft_s=10.0, tpot_s=0.5),
    SloClass.BATCH: SloTarget(ttft_s=600.0, tpot_s=2.0),
}


@dataclass(slots=True)
class InferenceRequest:
    """One request as the serving policies see it (token counts known up front in the twin; the live gateway
    knows the prompt and predicts the output)."""

    id: int
    model: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    slo: SloClass = SloClass.INTERACTIVE
    deadline_s: float = 0.0  # arrival + the class's TTFT target (set by the caller; 0 = none)
    session: int = -1  # conversation id for session affinity (-1 = none)
    prefix: tuple[int, ...] = ()  # hashes of the prompt's leading 16-token blocks, for prefix-affinity routing

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"request {self.id}: prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"request {self.id}: output_tokens must be >= 1, got {self.output_tokens}")

    def priority_key(self) -> tuple[int, float, float, int]:
        """The order of service: class, then earliest deadline, then arrival, then id (a total order)."""
        return (int(self.slo), self.deadline_s, self.arrival_s, self.id)
