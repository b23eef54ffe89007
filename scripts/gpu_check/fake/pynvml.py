"""A fake ``pynvml`` for rehearsing the GPU check without a GPU (see ../README.md): one GPU, by default an H100
(FAKE_GPU_NAME and FAKE_GPU_MIB pick another), whose compute processes are the files /tmp/fakedev/procs/PID
(their MiB), written by wl.py when it has no torch. Built on Tessera's own test double, ``tessera.gpu.fakes``."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from tessera.gpu.fakes import FakeGpu, FakeNvml, FakeNvmlError

NVMLError = FakeNvmlError
PROCS = "/tmp/fakedev/procs"
_gpu = FakeGpu(
    os.environ.get("FAKE_GPU_NAME", "NVIDIA H100 80GB HBM3"),
    int(os.environ.get("FAKE_GPU_MIB", "81559")),
    "GPU-fake-1111-2222",
    util_pct=3,
    power_mw=71000,
    mig=[],
)
_nvml = FakeNvml([_gpu])


def _refresh() -> None:
    """The processes still alive among the files in PROCS, and the memory they hold (plus 600 MiB reserved)."""
    procs = []
    for name in os.listdir(PROCS) if os.path.isdir(PROCS) else []:
        if os.path.exists(f"/proc/{name}"):
            with open(f"{PROCS}/{name}") as f:
                procs.append((int(name), int(f.read() or 0)))
    _gpu.processes = procs
    _gpu.mem_used_mib = 600 + sum(m for _, m in procs)


def __getattr__(name: str) -> Any:
    attr = getattr(_nvml, name)
    if not callable(attr):
        return attr

    def call(*args: Any, **kwargs: Any) -> Any:
        _refresh()
        return attr(*args, **kwargs)

    wrapped: Callable[..., Any] = call
    return wrapped
