"""The serving policies the twin compares, as data: how replicas are sized and placed, routed, scaled and cached.

- ``static``: every model on dedicated whole GPUs, a fixed number of replicas sized for its own peak (never below
  one), loaded before the first request; least-load routing; first come, first served inside the engine.
- ``static-autoscale``: whole GPUs per replica, scaled per model by a Knative-style autoscaler with its public
  default targets and scale-to-zero after 30 s idle; every start loads the weights from disk (no model cache);
  power-of-two-choices routing (what Ray Serve's router does); no SLO awareness.
- ``tessera``: replicas sized by memory share several models per GPU, placed by the core placement engine; a
  per-node model cache keeps scaled-down models warm in host memory; SLO-aware routing (least-load with prefix
  affinity), admission (only ``batch`` is shed under overload), SLO classes inside the engine; an autoscaler with
  short windows and SLO feedback that scales a model to zero only when it can come back within its TTFT target.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.core.errors import InvalidRequestError

POLICY_NAMES: tuple[str, ...] = ("static", "static-autoscale", "tessera")


@dataclass(frozen=True, slots=True)
class ReplicaSizing:
    """How much of a GPU one replica asks for."""

    shared: bool  # True: a memory share of one GPU (models that fit on one); False: whole GPUs
    kv_reserve_tokens: int = 24_576  # KV-cache tokens a shared replica reserves next to its weights, per GPU...
    kv_reserve_max_gib: float = 12.0  # ...at most this much memory per GPU (full multi-head KV gets fewer tokens)
    tokens_per_sequence: int = 1_260  # a sequence's mean KV footprint (prompt + half its output, conv trace)
    adaptive: bool = False  # busy models get whole-GPU replicas (one copy of the weights serves a large KV cache)
    grow_at: float = 1.5  # ...once their load is over this many small replicas' worth
    shrink_at: float = 0.75  # and small replicas again under this many
    gpu_memory_utilization: float = 0.9  # of a GPU's memory an engine may use (weights + KV), as vLLM's default
    overhead_gib: float = 1.0  # activations, CUDA context and graphs of a shared replica


@dataclass(frozen=True, slots=True)
class PolicySetup:
    name: str
    sizing: ReplicaSizing
    router: str
    autoscaler: str | None  # "knative" | "tessera" | None (a fixed number of replicas)
    model_cache: bool  # scaled-down models stay warm in host memory
    admission: bool  # shed batch requests under overload
    engine_priority: bool  # SLO classes (then deadlines) order the engine's queue
    late_binding: bool = False  # the gateway queues requests (most urgent first) until a replica has room
    sharing: str = "time-slice"  # how replicas on one GPU interfere (``interference``): "time-slice" or "mps"
    placement: str = "bestfit"
    tick_s: float = 1.0  # the control loop's period (autoscaler, held requests, samples)
    max_hold_s: float = 60.0  # a request held for a replica to start is refused after this long
    host_cache_gib: float = 1024.0  # host memory per node for warm models


def policy_setup(name: str) -> PolicySetup:
    key = name.strip().lower()
    if key == "static":
        return PolicySetup(
            "static",
            ReplicaSizing(shared=False),
            router="least-load",
            autoscaler=None,
            model_cache=False,
            admission=False,
            engine_priority=False,
        )
    if key == "static-autoscale":
        return PolicySetup(
            "static-autoscale",
            ReplicaSizing(shared=False),
            router="power-of-two",
            autoscaler="knative",
            model_cache=False,
            admission=False,
            engine_priority=False,
            tick_s=2.0,  # Knative's autoscaler ticks every 2 s
        )
    if key == "tessera":
        return PolicySetup(
            "tessera",
            ReplicaSizing(shared=True, adaptive=True),
            router="prefix-affinity",
            autoscaler="tessera",
            model_cache=True,
            admission=True,
            engine_priority=True,
            late_binding=True,
            sharing="mps",
        )
    raise InvalidRequestError("--policies", f"unknown policy {name!r} (known: {', '.join(POLICY_NAMES)})")
