"""The engine seam: what the serving controller and the gateway need of an inference engine, whatever it is.

An ``EngineAdapter`` is one replica of one model on one engine kind (``sim``, ``vllm``, ``sglang``,
``transformers``). It says how to launch it (``command``: argv and environment, which the controller hands to the
backend as a ``service`` workload, or ``LocalProcess`` runs directly in tests and benchmarks), and speaks to the
running process over HTTP: ``health``, ``stats`` (its Prometheus ``/metrics`` read into ``EngineStats``), and
``sleep``/``wake`` where the engine has them (``sleep_capable``; others raise ``EngineUnsupported``). ``start`` and
``stop`` manage the process through its ``ProcessRunner`` seam.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol


class EngineError(RuntimeError):
    """An engine did not do what was asked (did not start, answered an error, ...)."""


class EngineUnsupported(EngineError):
    """The engine has no such operation (e.g. sleep on an engine without a sleep mode)."""


@dataclass(frozen=True, slots=True)
class EngineCommand:
    """How to run one replica: the process and where it will listen."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)  # added to the launcher's environment
    host: str = "127.0.0.1"
    port: int = 0
    cwd: str | None = None  # its working directory (``transformers serve`` finds its models' folders there)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class EngineStats:
    """One scrape of an engine's metrics, in vLLM's terms (``engines.metrics`` reads vLLM's and SGLang's names)."""

    running: int = 0  # vllm:num_requests_running
    waiting: int = 0  # vllm:num_requests_waiting
    kv_cache_usage: float = 0.0  # vllm:kv_cache_usage_perc, a fraction in [0, 1]
    preemptions_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    sleeping: bool = False
    kv_capacity_tokens: int = 0  # vllm:cache_config_info's num_gpu_blocks x block_size; 0: not exported


class ProcessRunner(Protocol):
    """Starts and stops engine processes (``LocalProcess`` here; the controller launches through the backend)."""

    async def launch(self, command: EngineCommand) -> None: ...

    async def terminate(self, grace_s: float) -> None: ...

    def exit_code(self) -> int | None:
        """The process's exit status once it has ended, None while it runs."""
        ...


class EngineAdapter(Protocol):
    """One replica of one model on one engine kind (see the module docstring)."""

    @property
    def kind(self) -> str: ...

    @property
    def model(self) -> str:
        """The model name it serves (what clients put in ``model``)."""
        ...

    @property
    def base_url(self) -> str:
        """Where its OpenAI-compatible API listens (``/v1/...`` under it)."""
        ...

    @property
    def sleep_capable(self) -> bool: ...

    def command(self) -> EngineCommand: ...

    async def start(self, timeout_s: float) -> None:
        """Launch it and return once it answers ``/health`` (``EngineError`` after ``timeout_s`` or if it dies)."""
        ...

    async def stop(self, grace_s: float = 5.0) -> None: ...

    async def health(self) -> bool: ...

    async def stats(self) -> EngineStats: ...

    async def sleep(self) -> None:
        """Release the GPU memory, keep the process (``EngineUnsupported`` where the engine cannot)."""
        ...

    async def wake(self) -> None: ...
