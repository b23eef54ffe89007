"""The serving setups, as data shared by both runtimes: how replicas are sized and placed, routed, scaled and cached.

``tessera simulate serving --setup NAME`` replays them in the twin; ``tessera up --serving-setup NAME`` runs one
live (the gateway's default router, late binding, admission and engine priority; the controller's autoscaler and
its tick). ``KEY=VALUE`` knobs (``with_setup_knobs``: ``--serving-set`` live, ``--set`` in the twin) change a
setup the same way on both. What live does not do yet (say so where a figure depends on it): adaptive sizing (a
live replica's share is the one its model was deployed with), the per-node model cache (a live replica starts as its
engine does) and the placement and sharing model (the core scheduler places live replicas; GPUs are not slowed by
their neighbours' work beyond what the hardware does).

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

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.core.errors import InvalidRequestError

SETUP_NAMES: tuple[str, ...] = ("static", "static-autoscale", "tessera")
DEFAULT_SETUP = "tessera"


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
    # A tensor-parallel replica may be a gang of one-GPU shares (else whole GPUs; live has only whole GPUs for them)
    shared_gangs: bool = True
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


def serving_setup(name: str, option: str = "--setup") -> PolicySetup:
    """The setup called ``name``; ``InvalidRequestError`` naming ``option`` for an unknown one."""
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
    raise InvalidRequestError(option, f"unknown serving setup {name!r} (known: {', '.join(SETUP_NAMES)})")


def model_autoscaler(setup: PolicySetup, chosen: str | None) -> str | None:
    """A model's autoscaler: its own (``models deploy --autoscaler``; "none": a fixed number of replicas), else the
    setup's; None for a fixed number."""
    name = chosen if chosen is not None else setup.autoscaler
    return None if name in (None, "none") else name


# ------------------------------------------------------------------------------------------------------------ knobs
def _flag(text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "on", "yes", "1"):
        return True
    if value in ("false", "off", "no", "0"):
        return False
    raise ValueError(f"{text!r} is not true or false")


def _router(text: str) -> str:
    from tessera.serving.policies.router import ROUTER_NAMES

    name = text.strip().lower()
    if name not in ROUTER_NAMES:
        raise ValueError(f"{text!r} is not a router (known: {', '.join(ROUTER_NAMES)})")
    return name


def _autoscaler(text: str) -> str | None:
    name = text.strip().lower()
    if name in ("none", "fixed"):
        return None
    if name not in AUTOSCALER_NAMES:
        raise ValueError(f"{text!r} is not an autoscaler (known: {', '.join(AUTOSCALER_NAMES)}, none)")
    return name


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds") from None
    if not (value > 0 and value < 86_400):
        raise ValueError(f"{text!r}: give seconds > 0 and < 86400")
    return value


AUTOSCALER_NAMES: tuple[str, ...] = ("knative", "tessera")
ROOM_KV_FREE = 0.05  # late binding: a busy replica takes another request only with this share of its KV cache free
SHARING_NAMES: tuple[str, ...] = ("time-slice", "mps", "isolated")  # the twin's interference modes


def _sharing(text: str) -> str:
    name = text.strip().lower()
    if name not in SHARING_NAMES:
        raise ValueError(f"{text!r} is not a sharing mode (known: {', '.join(SHARING_NAMES)})")
    return name


# knob -> (what it does, its parser); the knob is the setup's field of the same name
SETUP_KNOBS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "router": ("the router of a model deployed without --router", _router),
    "autoscaler": ("knative, tessera (SLO feedback, sized targets) or none (fixed replicas)", _autoscaler),
    "admission": ("shed batch requests under overload", _flag),
    "engine_priority": ("SLO classes order the engine's queue (engines with request priority)", _flag),
    "late_binding": ("the gateway holds requests until a replica has room (else: straight to a replica)", _flag),
    "tick_s": ("the control loop's period in seconds (autoscaler)", _seconds),
    "max_hold_s": ("a request held for a replica is refused after this long", _seconds),
    "sharing": ("twin only: how replicas on one GPU slow each other (time-slice, mps, isolated)", _sharing),
    "adaptive": ("twin only: busy models get whole-GPU replicas (live: the share deployed)", _flag),
    "shared_gangs": ("twin only: a tensor-parallel replica may be a gang of GPU shares (live: whole GPUs)", _flag),
}
SIZING_KNOBS = frozenset({"adaptive", "shared_gangs"})  # fields of the setup's ReplicaSizing


def with_setup_knobs(setup: PolicySetup, settings: Sequence[str], option: str = "--set") -> PolicySetup:
    """``setup`` with every ``KEY=VALUE`` of ``settings`` applied (a later one wins); ``InvalidRequestError``
    naming ``option`` and the key for an unknown key or a bad value."""
    changes: dict[str, Any] = {}
    for text in settings:
        key, sep, value = text.partition("=")
        key = key.strip().lower().replace("-", "_")
        if not sep or not key:
            raise InvalidRequestError(option, f"{text!r} is not KEY=VALUE")
        knob = SETUP_KNOBS.get(key)
        if knob is None:
            raise InvalidRequestError(option, f"unknown serving knob {key!r} (known: {', '.join(SETUP_KNOBS)})")
        try:
            changes[key] = knob[1](value)
        except ValueError as exc:
            raise InvalidRequestError(option, f"{key}: {exc}") from None
    sizing = {key: changes.pop(key) for key in SIZING_KNOBS & changes.keys()}
    if sizing:
        changes["sizing"] = dataclasses.replace(setup.sizing, **sizing)
    return dataclasses.replace(setup, **changes) if changes else setup
