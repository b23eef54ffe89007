"""How big a replica of a model is on a GPU model: the core request the placement engine places, and the KV
cache its engine gets.

- A **shared** replica (a model that fits on one GPU, under a sharing policy) asks for weights + a KV reserve of
  ``kv_reserve_tokens`` (at most ``kv_reserve_max_gib``) + ``overhead_gib`` of the GPU's memory, which the core
  turns into a GPU share; several such replicas pack onto one GPU.
- A **shared tensor-parallel** replica is a gang of ``tensor_parallel`` one-GPU shares on distinct GPUs of one
  node (``fleet.Fleet.place``), each asking for its weight shard, a KV reserve as large as a one-GPU replica's
  (``kv_reserve_tokens``, at most ``kv_reserve_max_gib``, per GPU) and the overhead; the rest of those GPUs hosts
  other replicas.
- A **whole-GPU** replica (every replica of a policy that does not share) takes
  ``tensor_parallel`` whole GPUs; its engine may use ``gpu_memory_utilization`` of their memory, and what the
  weight shards leave is KV cache (as an engine sized by ``--gpu-memory-utilization`` does).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from tessera.core.catalog import resolve_model
from tessera.core.errors import InvalidRequestError
from tessera.core.workload import MILLI_PER_GPU, Request
from tessera.serving.models import GIB, MIB, ModelSpec
from tessera.serving.setups import ReplicaSizing

BLOCK_TOKENS = 16


@dataclass(frozen=True, slots=True)
class ReplicaShape:
    request: Request  # what the core placement engine places (once per GPU for a shared tensor-parallel replica)
    kv_blocks: int  # the engine's KV cache, in blocks of BLOCK_TOKENS tokens
    gpus: int  # GPUs it spans
    shared: bool  # memory shares (a gang of ``gpus`` one-GPU shares on one node when gpus > 1)


class ModelDoesNotFitError(InvalidRequestError):
    """A model whose weights leave no KV cache on the cluster's GPUs (reported against ``--gpus``)."""

    def __init__(self, message: str) -> None:
        super().__init__("--gpus", message)


def replica_shape(spec: ModelSpec, gpu_model: str, sizing: ReplicaSizing) -> ReplicaShape:
    gpu = resolve_model(gpu_model)
    gpu_bytes = gpu.mem_mib * MIB
    usable = gpu_bytes * sizing.gpu_memory_utilization
    tp = spec.tensor_parallel
    kind = frozenset({gpu.name})
    if sizing.shared and (tp == 1 or sizing.shared_gangs):
        # One GPU's share, or for a tensor-parallel model a gang of ``tp`` shares on distinct GPUs of one node
        # (``fleet``): each asks for its weight shard, one GPU's KV reserve and the overhead; the rest of each GPU is
        # free for other (smaller) replicas.
        reserve_tokens = min(  # the reserve is per GPU: a replica of tp GPUs reserves tp times as much
            tp * sizing.kv_reserve_tokens, int(tp * sizing.kv_reserve_max_gib * GIB // spec.kv_bytes_per_token)
        )
        shard = (spec.weights_bytes + reserve_tokens * spec.kv_bytes_per_token) / tp + sizing.overhead_gib * GIB
        if shard <= usable:
            request = Request(num_gpus=1, gpu_mem_mib=math.ceil(shard / MIB), gpu_types=kind)
            return ReplicaShape(request, reserve_tokens // BLOCK_TOKENS, tp, shared=True)
    per_gpu_kv = usable - spec.weights_bytes / tp - sizing.overhead_gib * GIB
    if per_gpu_kv <= 0:
        raise ModelDoesNotFitError(
            f"{spec.name} does not fit on {tp} x {gpu.name}: its weight shards leave no room for a KV cache"
        )
    kv_tokens = int(per_gpu_kv * tp // spec.kv_bytes_per_token)
    request = Request(num_gpus=tp, gpu_milli=MILLI_PER_GPU, gpu_types=kind)
    return ReplicaShape(request, kv_tokens // BLOCK_TOKENS, tp, shared=False)


def concurrency_target(shape: ReplicaShape, sizing: ReplicaSizing, tokens_per_sequence: float | None = None) -> float:
    """Sequences one replica can hold in its KV cache at the mean footprint (``tokens_per_sequence``, by default the
    sizing's): the autoscaler's per-replica target."""
    return sequences_held(shape.kv_blocks * BLOCK_TOKENS, sizing, tokens_per_sequence)


def sequences_held(kv_tokens: int, sizing: ReplicaSizing, tokens_per_sequence: float | None = None) -> float:
    """Sequences a KV cache of ``kv_tokens`` holds at the mean footprint (at least two); the live controller's
    per-replica target, from the KV cache size its replicas' engines export."""
    per_sequence = tokens_per_sequence if tokens_per_sequence is not None else sizing.tokens_per_sequence
    return max(2.0, kv_tokens / max(per_sequence, 1.0))


def replica_shapes(spec: ModelSpec, gpu_model: str, sizing: ReplicaSizing) -> tuple[ReplicaShape, ...]:
    """The replica sizes a model may use, smallest first: one, or under ``adaptive`` sizing a shared replica and a
    whole-GPU one (for a busy model, one copy of the weights beside a large KV cache beats several small copies)."""
    first = replica_shape(spec, gpu_model, sizing)
    if not (sizing.shared and sizing.adaptive):
        return (first,)
    whole = replica_shape(spec, gpu_model, dataclasses.replace(sizing, shared=False))
    return (first, whole) if whole.kv_blocks > first.kv_blocks else (first,)
