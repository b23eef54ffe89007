"""Shared by the serving twin's tests: a cheap, deterministic engine timing in place of the calibrated model.

The twin's tests check its mechanisms and books, not the performance model's figures, so engines run on an affine
iteration time (the same shape as ``tests/serving/policies/test_engine.py``'s), scaled by the model's parameters
per GPU so that a 70B replica on 4 GPUs is about twice as slow per iteration as an 8B one on one.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from tessera.serving.models import ModelSpec
from tessera.serving.policies.engine_parts import IterationTimes
from tessera.sim.serving.twin import PerfFactory

REFERENCE_PARAMS_B = 8.0  # a model of this many parameters per GPU gets AffineTimes' base figures


@dataclass(frozen=True)
class AffineTimes:
    """iteration = scale x (base + per_prefill x prefill tokens + per_seq x batch + per_kv x KV tokens)."""

    scale: float = 1.0
    base: float = 0.010
    per_prefill: float = 0.0001
    per_seq: float = 0.0002
    per_kv: float = 0.000001

    def iteration_s(self, prefill_tokens: int, decode_batch: int, kv_tokens: int) -> float:
        seconds = self.base + self.per_prefill * prefill_tokens + self.per_seq * decode_batch + self.per_kv * kv_tokens
        return self.scale * seconds

    def decode_affine(self, decode_batch: int) -> tuple[float, float]:
        return self.scale * (self.base + self.per_seq * decode_batch), self.scale * self.per_kv


def affine_perf(spec: ModelSpec, gpu_model: str, tensor_parallel: int) -> IterationTimes:
    del gpu_model  # one GPU model in these tests
    return AffineTimes(scale=spec.params_b / tensor_parallel / REFERENCE_PARAMS_B)


@pytest.fixture(scope="session")
def perf() -> PerfFactory:
    """The twin's ``TwinInputs.perf``: cheap affine engine timings (see the module docstring)."""
    return affine_perf
