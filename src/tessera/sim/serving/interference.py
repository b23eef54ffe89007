"""How much replicas that share a GPU slow each other down.

Three modes, one per way of sharing a GPU between processes (``isolated``: none slows another, as MIG slices, or
sim engines on simulated GPUs, which is what a live run with sim engines measures):

- ``time-slice`` (CUDA's default without MPS): the GPU runs one process's kernels at a time, switching contexts, so
  k busy replicas each get 1/k of it: every iteration is stretched k-fold. The most pessimistic reading.
- ``mps`` (an MPS daemon serves the GPU, which ``tessera up`` uses when it finds one): kernels of different
  processes run concurrently. A replica busy decoding streams its weights and KV cache from HBM for a share
  ``u`` of each iteration (its *intensity*); the rest of the iteration is time the GPU's memory system is free
  for others (kernel-launch gaps, scheduling, sampling, small kernels). Its *saturating time* is ``u`` times its
  step. On a shared GPU an iteration of a busy replica takes at least the busy replicas' saturating times added
  up: each is slowed by ``max(1, sum of their saturating times / its own step)``. Replicas whose demands fit
  together run at full speed; two equal busy replicas are each slowed by the sum of their intensities; a light
  replica beside a busy one waits for the busy one's saturating time, so it slows more and the busy one less.
  Measured so on an H100 with two engine-like decode loops (``scripts/gpu_check/interference.py``: within 3% in
  six pairs of two model widths, docs/serving.md section 9), where dividing by the summed intensity alone had the
  right total but not the split.

``u`` comes from the performance model, read conservatively: of a decode step at the replica's target batch, only
the part that a one-sequence step spends *beyond* streaming the weights (launch gaps, scheduling, sampling: time the
GPU's memory system is idle) is counted as free for neighbours; everything else, including all the time the step
grows with the batch and the KV cache, is counted as saturating the GPU. Prefill iterations (about 1-3% of a
conversation request's GPU time) are counted at the same intensity.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.serving.gpus import gpu_spec
from tessera.serving.models import ModelSpec
from tessera.serving.policies.engine_parts import IterationTimes
from tessera.serving.setups import SHARING_NAMES

SHARING_MODES = SHARING_NAMES  # the setups' knob takes these
HBM_EFFICIENCY = 0.85  # of the datasheet bandwidth a streaming kernel reaches


@dataclass(frozen=True, slots=True)
class StepDemand:
    """What a busy replica asks of its GPU: its decode step at its target batch, alone, and the share of that step
    it keeps the GPU saturated (its intensity)."""

    step_s: float
    intensity: float

    @property
    def saturating_s(self) -> float:
        return self.intensity * self.step_s


def step_demand(
    spec: ModelSpec, gpu: str, tensor_parallel: int, perf: IterationTimes, batch: int, kv_tokens: int
) -> StepDemand:
    """A replica's decode step at ``batch`` sequences holding ``kv_tokens``, and its intensity (the module
    docstring)."""
    step_s = perf.iteration_s(0, batch, kv_tokens)
    one_seq_s = perf.iteration_s(0, 1, kv_tokens // max(batch, 1))
    weights_s = weights_stream_s(spec.weights_bytes / tensor_parallel, gpu_spec(gpu).hbm_gb_s)
    return StepDemand(step_s, intensity_of_steps(step_s, one_seq_s, weights_s))


def intensity(
    spec: ModelSpec, gpu: str, tensor_parallel: int, perf: IterationTimes, batch: int, kv_tokens: int
) -> float:
    """The share of a decode step at ``batch`` sequences holding ``kv_tokens`` during which the replica keeps the
    GPU busy (see the module docstring)."""
    return step_demand(spec, gpu, tensor_parallel, perf, batch, kv_tokens).intensity


def weights_stream_s(weight_bytes: float, hbm_gb_s: float) -> float:
    """How long streaming ``weight_bytes`` from device memory takes at ``HBM_EFFICIENCY`` of the datasheet rate."""
    return weight_bytes / (hbm_gb_s * 1e9 * HBM_EFFICIENCY)


def intensity_of_steps(step_s: float, one_seq_s: float, weights_s: float) -> float:
    """The intensity of a decode step of ``step_s``, given a one-sequence step of ``one_seq_s`` and the time its
    weights take to stream (``weights_stream_s``): what the one-sequence step spends beyond streaming them is free
    for neighbours. From the performance model in the twin, from measured steps in the GPU check."""
    free_s = max(0.0, one_seq_s - weights_s)
    return min(1.0, max(0.0, step_s - free_s) / step_s) if step_s > 0 else 1.0


def slowdown(mode: str, busy_count: int, busy_saturating_s: float, own_step_s: float) -> float:
    """The stretch of a busy replica's iterations (each ``own_step_s`` alone) on a GPU with ``busy_count`` busy
    replicas (itself included) whose saturating times sum to ``busy_saturating_s``."""
    if mode == "time-slice":
        return float(max(1, busy_count))
    if mode == "isolated":
        return 1.0
    return max(1.0, busy_saturating_s / own_step_s) if own_step_s > 0 else 1.0
