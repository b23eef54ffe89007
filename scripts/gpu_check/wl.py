"""The GPU check's workload: report the isolation environment, allocate device memory with torch, hold it, exit 0.

python wl.py FRACTION EXTRA_MIB HOLD_S: allocates FRACTION x TESSERA_GPU_MEM_MIB + EXTRA_MIB MiB (in 512 MiB
chunks, each touched), prints ALLOCATED, sleeps HOLD_S seconds. Without torch or CUDA (a simulated pool) it only
reports and sleeps.
"""

import importlib
import json
import os
import sys
import time
from typing import Any

fraction, extra_mib, hold_s = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
keys = sorted(k for k in os.environ if k.startswith(("TESSERA_", "CUDA_", "XLA_")))
print("WLENV " + json.dumps({k: os.environ[k] for k in keys}), flush=True)
print(f"WLPID pid={os.getpid()} pgid={os.getpgid(0)} uid={os.getuid()} python={sys.executable}", flush=True)
allowance = int(os.environ.get("TESSERA_GPU_MEM_MIB") or 0)
target = int(fraction * allowance + extra_mib)
try:
    torch: Any = importlib.import_module("torch")
except ImportError as exc:
    print(f"NO_TORCH {exc}; holding {hold_s}s without a GPU", flush=True)
    if os.path.isdir(
        "/tmp/fakedev/procs"
    ):  # the rehearsal's fake NVML (fake/pynvml.py) lists this pid with this memory
        with open(f"/tmp/fakedev/procs/{os.getpid()}", "w") as f:
            f.write(str(target))
        print(f"ALLOCATED mib={target} (fake NVML) allowance={allowance}", flush=True)
    time.sleep(hold_s)
    sys.exit(0)
if not torch.cuda.is_available():
    print(f"NO_CUDA torch {torch.__version__}; holding {hold_s}s", flush=True)
    time.sleep(hold_s)
    sys.exit(0)
print(
    f"CUDA devices={torch.cuda.device_count()} name={torch.cuda.get_device_name(0)} "
    f"total_mib={torch.cuda.get_device_properties(0).total_memory >> 20}",
    flush=True,
)
chunks = []
done = 0
step = 512
t0 = time.time()
while done < target:
    n = min(step, target - done)
    x = torch.empty(n << 20, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    chunks.append(x)
    done += n
    if extra_mib > 0:  # the hog: grow slowly enough for the watchdog's samples to see it rise
        time.sleep(0.05)
torch.cuda.synchronize()
free, total = torch.cuda.mem_get_info()
print(
    f"ALLOCATED mib={done} target={target} allowance={allowance} in {time.time() - t0:.1f}s "
    f"reserved_mib={torch.cuda.memory_reserved() >> 20} device_free_mib={free >> 20} total_mib={total >> 20}",
    flush=True,
)
time.sleep(hold_s)
print("DONE", flush=True)
