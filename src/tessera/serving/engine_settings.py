"""A deployed model's own engine settings (``tessera models deploy --engine-arg/--cpus/--cpu-bind/--kv-...``): what
they may be, how a replica's command carries them, and which cores a CPU replica's engine binds.

Checked where a model is deployed (``check``: an ``InvalidRequestError`` naming the API field), carried on the replica's
command line to ``engine_exec`` (``exec_flags``, read back by ``engine_exec``), applied there:

- ``engine_args``: the engine's own flags, after Tessera's (and after the server-wide ``TESSERA_<ENGINE>_ARGS``, so
  a model's own flag wins where the engine takes the last of a repeated one). The flags Tessera sets itself
  (``OWNED_FLAGS``: where it listens, its name, its share, the key a replica on a node's port requires, the
  scheduling policy the gateway's priorities need) are refused, also abbreviated (argparse expands ``--po`` to
  ``--port``) or spelt with ``_`` (vLLM reads ``--served_model_name``).
- ``cpu_milli``: the replica workload's CPU request (a quota of that many cores in its cgroup, counted against the
  node); on the CPU path its engine's threads are that many (at least one), bound to as many cores.
- ``cpu_bind``: which cores those are. ``""``: cores picked among those the replica may use (``replica_cores``:
  replica after replica, consecutive windows, so that replicas land on distinct cores as far as the host has them);
  a core list (``"0-3,8"``): picked among those; ``"none"``: no binding (the OS places the threads).
- ``kv_offload_gib``, ``kv_events``: vLLM's KV-cache offloading to host memory (``--kv-offloading-size``, GPUs
  only) and KV-cache events (``--kv-events-config``, published on ZMQ at ``ipc://<runtime dir>/kv-events.sock``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tessera.errors import InvalidRequestError

NO_BINDING = "none"
MAX_ENGINE_ARGS = 64
MAX_ARG_CHARS = 1000
MAX_KV_OFFLOAD_GIB = 4096.0
KV_ENGINES = ("vllm",)  # the engines with KV offloading and KV events (vLLM's flags)
_LISTEN = ("--host", "--port", "--uds")
# The flags Tessera sets on each engine's command line (``engine_exec.engine_argv``).
OWNED_FLAGS: dict[str, frozenset[str]] = {
    "vllm": frozenset(
        (
            *_LISTEN,
            "--model",
            "--served-model-name",
            "--scheduling-policy",
            "--tensor-parallel-size",
            "-tp",
            "--gpu-memory-utilization",
            "--kv-offloading-size",
            "--kv-events-config",
            "--api-key",
        )
    ),  # fmt: skip
    "sglang": frozenset(
        (*_LISTEN, "--model-path", "--model", "--served-model-name", "--tp-size", "--tp", "--mem-fraction-static")
    ),
    "transformers": frozenset((*_LISTEN, "--device")),
    "sim": frozenset((*_LISTEN, "--model", "--perf", "--gpu-mem-mib", "--scheduling-policy")),
}


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """A model's own engine settings (see the module docstring); the defaults are a model deployed without any."""

    engine_args: tuple[str, ...] = ()
    cpu_milli: int = 0  # the replica's CPU request (1000 = one core); 0: none
    cpu_bind: str = ""  # "": cores picked among those allowed; a core list: picked among those; "none": no binding
    kv_offload_gib: float = 0.0  # vLLM: host memory for KV-cache offloading; 0: none
    kv_events: bool = False  # vLLM: publish KV-cache events

    @property
    def cores(self) -> int:
        """How many cores a CPU replica's engine runs its threads on: its CPU request rounded up, at least one."""
        return max(1, math.ceil(self.cpu_milli / 1000))


def owned_flag(engine: str, args: Sequence[str]) -> str | None:
    """The first of ``args`` that sets a flag Tessera owns for ``engine`` (as given), or None."""
    owned = OWNED_FLAGS.get(engine, frozenset())
    for arg in args:
        if not arg.startswith("-") or arg == "--":
            continue
        name = arg.split("=", 1)[0].replace("_", "-")
        if name in owned or (name.startswith("--") and len(name) > 3 and any(o.startswith(name) for o in owned)):
            return arg
    return None


def parse_core_list(text: str) -> tuple[int, ...]:
    """``"0-3,8"`` -> (0, 1, 2, 3, 8): sorted, each once (``ValueError`` naming what is wrong)."""
    cores: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.strip().partition("-")
        if not first.isdigit() or (dash and not last.isdigit()):
            raise ValueError(f"{part.strip()!r} is not a core or a range of cores (examples: 3, 0-3)")
        low, high = int(first), int(last) if dash else int(first)
        if high < low or high > 65535:
            raise ValueError(f"{part.strip()!r}: a range runs from a lower to a higher core, at most 65535")
        cores.update(range(low, high + 1))
    return tuple(sorted(cores))


def check(engine: str, settings: EngineSettings) -> None:
    """``InvalidRequestError`` naming the field when no replica of ``engine`` could run with ``settings``."""
    if len(settings.engine_args) > MAX_ENGINE_ARGS:
        raise InvalidRequestError("engine_args", f"at most {MAX_ENGINE_ARGS} arguments")
    for arg in settings.engine_args:
        if len(arg) > MAX_ARG_CHARS or "\0" in arg:
            raise InvalidRequestError("engine_args", f"an argument has at most {MAX_ARG_CHARS} characters, no NUL")
    owned = owned_flag(engine, settings.engine_args)
    if owned is not None:
        raise InvalidRequestError(
            "engine_args", f"{owned.split('=', 1)[0]} is set by Tessera for the {engine} engine; leave it out"
        )
    if settings.cpu_bind not in ("", NO_BINDING):
        try:
            parse_core_list(settings.cpu_bind)
        except ValueError as exc:
            raise InvalidRequestError("cpu_bind", f"{exc}; or 'none'") from None
    if settings.kv_offload_gib and engine not in KV_ENGINES:
        raise InvalidRequestError("kv_offload_gib", f"the {engine} engine has no KV offloading in Tessera (vllm has)")
    if not 0 <= settings.kv_offload_gib <= MAX_KV_OFFLOAD_GIB or math.isnan(settings.kv_offload_gib):
        raise InvalidRequestError("kv_offload_gib", f"must be within 0..{MAX_KV_OFFLOAD_GIB:g} GiB")
    if settings.kv_events and engine not in KV_ENGINES:
        raise InvalidRequestError("kv_events", f"the {engine} engine has no KV-cache events in Tessera (vllm has)")


def exec_flags(settings: EngineSettings) -> list[str]:
    """``engine_exec``'s flags for ``settings``; the engine's own arguments last, after ``--``."""
    flags: list[str] = []
    if settings.cpu_milli:
        flags += ["--cpus", str(settings.cores)]
    if settings.cpu_bind:
        flags += ["--cpu-bind", settings.cpu_bind]
    if settings.kv_offload_gib:
        flags += ["--kv-offload-gib", f"{settings.kv_offload_gib:g}"]
    if settings.kv_events:
        flags += ["--kv-events"]
    if settings.engine_args:
        flags += ["--", *settings.engine_args]
    return flags


def replica_cores(allowed: Sequence[int], count: int, slot: int) -> tuple[int, ...]:
    """The ``count`` cores of ``allowed`` a replica binds: the window that starts at ``slot * count`` (wrapping
    around), so that consecutive slots (replicas launched one after another) get distinct cores while the host has
    enough; all of ``allowed`` when it has no more than ``count``."""
    pool = sorted(set(allowed))
    if count >= len(pool):
        return tuple(pool)
    start = (slot * count) % len(pool)
    return tuple(sorted(pool[(start + i) % len(pool)] for i in range(count)))
