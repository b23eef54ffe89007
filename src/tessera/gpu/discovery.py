"""Which GPUs a node schedules on: ``detect_gpus`` turns the node's ``gpus`` setting into a ``GpuProbe``.

Called once by whoever starts a node (the local backend, the agent). ``"auto"`` asks NVML; any other value is a
simulated pool spec (``4xA100-80GB,2xT4``, see ``parse_gpu_spec``).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from tessera.gpu.gpus import GpuProbe, SimulatedProbe, parse_gpu_spec
from tessera.gpu.nvml import NvmlProbe

logger = logging.getLogger(__name__)

AUTO_SPEC = "auto"
# The pool a node gets under "auto" when NVML finds no GPU (no driver, no device): one simulated A100-80GB,
# so that a laptop or CI machine can still run the whole control plane end to end.
DEFAULT_SIMULATED_SPEC = "1xA100-80GB"


def load_nvml() -> Any:
    """The ``pynvml`` module, initialised; raises whatever the import or ``nvmlInit()`` raises."""
    nvml = importlib.import_module("pynvml")
    nvml.nvmlInit()
    return nvml


def detect_gpus(spec: str, nvml_loader: Callable[[], Any] = load_nvml, node: str = "local") -> GpuProbe:
    """The GPUs of ``node``: real ones from NVML when ``spec`` is ``"auto"``, else the simulated pool ``spec``.

    Under ``"auto"``, any failure to load NVML, to initialise it or to read its devices, and a driver that
    reports no GPU, all fall back to ``DEFAULT_SIMULATED_SPEC`` with a warning saying the pool is simulated.
    A malformed pool spec raises ``InvalidRequestError("gpus", ...)``.
    """
    if spec.strip().lower() != AUTO_SPEC:
        return SimulatedProbe(parse_gpu_spec(spec, node=node))
    try:
        nvml = nvml_loader()
        probe = NvmlProbe(nvml, node=node)
    except Exception as exc:  # no pynvml, no driver, no device, a driver error: all mean "no real GPUs here"
        return _fallback(node, f"NVML is not usable ({type(exc).__name__}: {exc})")
    if not probe.devices():
        _shutdown_quietly(nvml)
        return _fallback(node, "NVML reports no schedulable GPU")
    logger.info("node %s: %d GPU(s) from NVML", node, len(probe.devices()))
    return probe


def _fallback(node: str, why: str) -> SimulatedProbe:
    logger.warning("node %s: %s; using a SIMULATED pool %s (no real GPU behind it)", node, why, DEFAULT_SIMULATED_SPEC)
    return SimulatedProbe(parse_gpu_spec(DEFAULT_SIMULATED_SPEC, node=node))


def _shutdown_quietly(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:  # best effort: the pool is simulated either way
        logger.debug("nvmlShutdown failed", exc_info=True)
