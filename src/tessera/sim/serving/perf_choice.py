"""Which performance model the twin uses (PROVISIONAL: replaced by the calibrated model when it lands)."""

from __future__ import annotations

from pathlib import Path

from tessera.serving.models import ModelSpec
from tessera.serving.policies.engine_parts import IterationTimes


class _Provisional:
    def __init__(self, spec: ModelSpec, gpu: str, tp: int) -> None:
        bw = 3.35e12 * 0.7 * tp
        flops = 989e12 * 0.5 * tp
        self.w = spec.weights_bytes / bw
        self.kv = spec.kv_bytes_per_token / bw
        self.f = spec.flops_per_token / flops

    def iteration_s(self, prefill_tokens: int, decode_batch: int, kv_tokens: int) -> float:
        return 0.004 + max(self.f * (prefill_tokens + decode_batch), self.w + self.kv * kv_tokens)

    def decode_affine(self, decode_batch: int) -> tuple[float, float]:
        return 0.004 + self.w, self.kv


def make_perf_factory(profile: Path | None):  # type: ignore[no-untyped-def]
    def factory(spec: ModelSpec, gpu: str, tp: int) -> IterationTimes:
        return _Provisional(spec, gpu, tp)

    return factory
