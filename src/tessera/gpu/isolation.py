"""The isolation a launched workload gets on its node: its environment (``isolation_env``) and an honest
account of what each mechanism enforces on this host (``describe_isolation``).

Called by backends when they launch a workload. Mechanisms, strongest first:

- ``CUDA_VISIBLE_DEVICES`` by UUID (or MIG UUID): enforced by the CUDA driver; a CPU-only workload gets an
  empty value and sees no GPU. Simulated UUIDs (``SIM-...``) are not valid CUDA ids, so CUDA shows no GPU either.
- MPS, when an MPS control daemon serves the GPU: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps the SMs a client
  may use; ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` caps its device memory. The latter is a comma-separated list of
  ``<ordinal>=<size>`` with a unit suffix (``0=3072M,1=3072M``), ordinals counted after ``CUDA_VISIBLE_DEVICES``
  is applied (so 0..n-1 here), per NVIDIA's MPS documentation (appendix "Environment Variables"). Sizes are
  written in MiB with the ``M`` suffix.
- Framework caps, read by the workload itself (advisory): ``TESSERA_GPU_MEM_FRACTION`` for PyTorch's
  ``torch.cuda.set_per_process_memory_fraction`` or vLLM's ``--gpu-memory-utilization``, and
  ``XLA_PYTHON_CLIENT_MEM_FRACTION``, which JAX reads on its own.
- The NVML memory watchdog (``tessera.gpu.watchdog``), which stops a workload after it exceeds its allowance.
"""

from __future__ import annotations

import errno
import math
import os
import socket
import stat
from collections.abc import Sequence
from pathlib import Path

from tessera.core.errors import InvalidRequestError
from tessera.core.workload import MILLI_PER_GPU
from tessera.gpu.gpus import GpuDevice

DEFAULT_MPS_PIPE_DIR = "/tmp/nvidia-mps"  # where nvidia-cuda-mps-control -d opens its pipes by default
MPS_PROBE_TIMEOUT_S = 1.0  # how long mps_available waits for the daemon to accept
FRACTION_DIGITS = 4


def mps_available(pipe_dir: str | Path = DEFAULT_MPS_PIPE_DIR, timeout_s: float = MPS_PROBE_TIMEOUT_S) -> bool:
    """Whether a live MPS control daemon serves ``pipe_dir``, found by asking it, not by a file being there.

    The daemon (``nvidia-cuda-mps-control -d``) listens on a UNIX socket called ``control`` (a sequenced-packet
    socket in current drivers) and leaves that file behind when it quits, so its presence proves nothing: a live
    daemon accepts a connection, a dead one's socket refuses it. Drivers that used a named pipe instead are asked
    the same way: opening the pipe for writing without blocking succeeds only while the daemon holds it open."""
    control = Path(pipe_dir) / "control"
    try:
        mode = control.stat().st_mode
    except OSError:
        return False
    if stat.S_ISSOCK(mode):
        return _socket_accepts(control, timeout_s)
    if stat.S_ISFIFO(mode):
        return _fifo_has_reader(control)
    return False


def _socket_accepts(path: Path, timeout_s: float) -> bool:
    for kind in (socket.SOCK_SEQPACKET, socket.SOCK_STREAM):  # the daemon's kind first; EPROTOTYPE: try the other
        with socket.socket(socket.AF_UNIX, kind) as probe:
            probe.settimeout(timeout_s)
            try:
                probe.connect(str(path))
            except OSError as error:
                if error.errno == errno.EPROTOTYPE:
                    continue
                return False  # refused (a stale socket), timed out, not allowed
            return True
    return False


def _fifo_has_reader(path: Path) -> bool:
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: nobody reads the pipe
        return False
    os.close(descriptor)
    return True


def memory_allowance_mib(devices: Sequence[GpuDevice], gpu_milli: int, gpu_mem_mib: int) -> int:
    """Device memory a workload may hold on each of its GPUs: ``gpu_mem_mib`` when stated, else its granted
    share of the smallest device's memory. Also the per-workload allowance the watchdog enforces."""
    if not devices:
        return 0
    if gpu_mem_mib > 0:
        return gpu_mem_mib
    return min(d.mem_mib for d in devices) * gpu_milli // MILLI_PER_GPU


def isolation_env(
    workload_id: str,
    devices: Sequence[GpuDevice],
    gpu_milli: int,
    gpu_mem_mib: int,
    mps: bool = False,
    mps_pipe_dir: str | None = None,
) -> dict[str, str]:
    """The environment variables that confine a workload to ``devices`` and its share of each.

    ``gpu_milli`` is the granted share of each GPU (1000 = whole; 0 with ``gpu_mem_mib`` set means "derive it
    from memory"), ``gpu_mem_mib`` the stated device memory per GPU (0 = not stated). Memory-fraction caps are set
    only when the GPU is shared (share < 1000). ``mps`` adds the MPS client limits; ``mps_pipe_dir`` tells the
    client where a non-default MPS daemon listens.
    """
    _validate(devices, gpu_milli, gpu_mem_mib)
    share_milli = _share_milli(devices, gpu_milli, gpu_mem_mib)
    allowance_mib = memory_allowance_mib(devices, gpu_milli, gpu_mem_mib)
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(d.uuid for d in devices),
        "TESSERA_WORKLOAD_ID": workload_id,
        "TESSERA_GPU_MILLI": str(share_milli),
        "TESSERA_GPU_MEM_MIB": str(allowance_mib),
    }
    if devices:
        env["TESSERA_GPU_MODEL"] = devices[0].model
    if any(d.simulated for d in devices):
        env["TESSERA_GPU_SIMULATED"] = "1"
    if devices and share_milli < MILLI_PER_GPU:
        fraction = _format_fraction(_memory_fraction(devices, share_milli, gpu_mem_mib))
        env["TESSERA_GPU_MEM_FRACTION"] = fraction
        env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = fraction
    if devices and mps:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, math.ceil(share_milli * 100 / MILLI_PER_GPU)))
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={allowance_mib}M" for i in range(len(devices)))
        if mps_pipe_dir is not None:
            env["CUDA_MPS_PIPE_DIRECTORY"] = mps_pipe_dir
    return env


def describe_isolation(
    devices: Sequence[GpuDevice], gpu_milli: int, gpu_mem_mib: int, mps: bool = False, watchdog: bool = False
) -> list[str]:
    """One line per mechanism: what confines this workload on this host, and whether it is enforced or advisory.

    ``mps`` says whether an MPS daemon serves the GPUs (see ``mps_available``), ``watchdog`` whether the NVML
    memory watchdog runs on this node.
    """
    _validate(devices, gpu_milli, gpu_mem_mib)
    if not devices:
        return ["CUDA_VISIBLE_DEVICES: enforced by the CUDA driver (empty: the workload sees no GPU)"]
    if any(d.simulated for d in devices):
        return ["simulated GPU: nothing enforced (SIM- UUIDs are not CUDA devices; the workload sees no GPU)"]
    lines = [f"CUDA_VISIBLE_DEVICES: enforced by the CUDA driver ({len(devices)} device(s) by UUID)"]
    if all(d.is_mig for d in devices):
        lines.append("memory and compute: enforced by MIG hardware partitioning")
        return lines
    if _share_milli(devices, gpu_milli, gpu_mem_mib) >= MILLI_PER_GPU:
        lines.append("memory and compute: whole GPU(s), nothing shared, no cap needed")
        return lines
    lines.append(_memory_line(mps, watchdog))
    if mps:
        lines.append("compute share: enforced by MPS (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE caps the SMs used)")
    else:
        lines.append("compute share: not enforced without MPS (time-sliced with the GPU's other workloads)")
    return lines


def _memory_line(mps: bool, watchdog: bool) -> str:
    if mps:
        return "memory cap: enforced by MPS (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)"
    advisory = "memory cap: advisory (frameworks read TESSERA_GPU_MEM_FRACTION / XLA_PYTHON_CLIENT_MEM_FRACTION)"
    if watchdog:
        return f"{advisory}; enforced after the fact by the NVML watchdog, which stops the workload"
    return f"{advisory}; not enforced (no watchdog on this node)"


def _validate(devices: Sequence[GpuDevice], gpu_milli: int, gpu_mem_mib: int) -> None:
    if not 0 <= gpu_milli <= MILLI_PER_GPU:
        raise InvalidRequestError("gpu_milli", f"must be within 0..{MILLI_PER_GPU}, got {gpu_milli}")
    if gpu_mem_mib < 0:
        raise InvalidRequestError("gpu_mem_mib", f"must be >= 0, got {gpu_mem_mib}")
    if not devices and (gpu_milli or gpu_mem_mib):
        raise InvalidRequestError("gpu_milli", "a GPU share was given but no GPU was assigned")
    if devices and not (gpu_milli or gpu_mem_mib):
        raise InvalidRequestError("gpu_milli", "GPUs were assigned but neither gpu_milli nor gpu_mem_mib was given")


def _share_milli(devices: Sequence[GpuDevice], gpu_milli: int, gpu_mem_mib: int) -> int:
    """The share of each GPU: ``gpu_milli``, or the memory request's share of the smallest device."""
    if not devices or gpu_milli > 0:
        return gpu_milli
    smallest_mib = min(d.mem_mib for d in devices)
    return min(MILLI_PER_GPU, math.ceil(gpu_mem_mib * MILLI_PER_GPU / smallest_mib))


def _memory_fraction(devices: Sequence[GpuDevice], share_milli: int, gpu_mem_mib: int) -> float:
    """Fraction of each device's memory the workload may take (the tightest over its devices)."""
    if gpu_mem_mib > 0:
        return min(1.0, gpu_mem_mib / min(d.mem_mib for d in devices))
    return share_milli / MILLI_PER_GPU


def _format_fraction(fraction: float) -> str:
    """Rounded down to ``FRACTION_DIGITS`` digits (a cap must not grow by rounding), without trailing zeros."""
    scale = 10**FRACTION_DIGITS
    digits = math.floor(fraction * scale + 1e-9)  # 1e-9: 0.29 * 10000 is 2899.9999...
    return f"{digits / scale:.{FRACTION_DIGITS}f}".rstrip("0").rstrip(".")
