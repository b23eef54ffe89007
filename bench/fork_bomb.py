"""A tenant's fork bomb under a real ``tessera up`` (root, one OS user per tenant): how well the server keeps
answering (``/healthz`` latency before and during), how many processes the bomb got, how many forks were refused,
and the host's load average. Issue 25's acceptance: ``/healthz`` p99 <= 100 ms during the bomb.

The bomb is bounded by this script: each shell starts two more, ``--depth`` levels down (2^(depth+1) - 1 shells at
most), and each then sleeps ``--live-s`` seconds (a ``sleep`` process each: twice as many processes), or with
``--spin N`` counts to N (busy on a CPU, no more processes). It
asks for no CPU and no memory (as the attacker did), so only the server's defaults hold it. The tenant's processes
seen in ``/proc`` are sampled (a scan while processes come and go may count a few more than were ever there at
once); the bomb's cgroup's ``pids.peak`` and ``pids.events`` (read while it runs; its ``max`` count is the refused
forks reported) are exact.

Each ``--pids-max`` value is one run (``default``: the option left out, so the server's default; ``0``: no pids
limit), one after another on this host; ``--src`` runs another checkout's Tessera (e.g. an export of the code
before the limits, which knows no ``--workload-pids-max``: give ``--pids-max default``).

Usage (as root): ``python bench/fork_bomb.py [--pids-max default --pids-max 0] [--depth 12] [--live-s 4]
[--spin N] [--measure-s 20] [--src DIR]``. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

from tessera.backends import cgroup_limits
from tessera.backends.accounts import user_name
from tessera.client.http import TesseraClient, wait_healthy

ADMIN = "bench-fork-bomb-admin-token-0123456789"
BOMB = """
b() {{ [ $1 -gt 0 ] && {{ b $(($1 - 1)) & b $(($1 - 1)) & }}; {work}; }}
sleep 600 & keep=$!
echo "pid $$"
(b {depth})
wait $keep
"""
SPIN = "i=0; while [ $i -lt {spin} ]; do i=$((i + 1)); done"  # busy, without forking


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] if ordered else float("nan")


class Probe:
    """Samples ``/healthz`` latency (ms), the load average and the tenant's process count on threads."""

    def __init__(self, url: str, uid: int | None) -> None:
        self.url, self.uid = url, uid
        self.latencies_ms: list[float] = []
        self.failures = 0
        self.load_max = 0.0
        self.processes_max = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._healthz), threading.Thread(target=self._host)]

    def __enter__(self) -> Probe:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _healthz(self) -> None:
        with httpx.Client(base_url=self.url, timeout=10) as http:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    ok = http.get("/healthz").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies_ms.append((time.perf_counter() - started) * 1000)
                self.failures += not ok
                self._stop.wait(0.01)

    def _host(self) -> None:
        while not self._stop.is_set():
            self.load_max = max(self.load_max, float(Path("/proc/loadavg").read_text().split()[0]))
            if self.uid is not None:
                self.processes_max = max(self.processes_max, count_processes(self.uid))
            self._stop.wait(0.25)

    def summary(self) -> str:
        p50, p99 = percentile(self.latencies_ms, 0.5), percentile(self.latencies_ms, 0.99)
        worst = max(self.latencies_ms, default=float("nan"))
        return f"/healthz n={len(self.latencies_ms)} p50={p50:.1f} ms p99={p99:.1f} ms max={worst:.1f} ms" + (
            f" failed={self.failures}" if self.failures else ""
        )


def count_processes(uid: int) -> int:
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                count += entry.stat().st_uid == uid
    return count


def tenant_uid(tenant: str) -> int | None:
    try:
        return pwd.getpwnam(user_name(tenant)).pw_uid
    except KeyError:
        return None


def run(pids_max: str, args: argparse.Namespace) -> None:
    data_dir = Path(tempfile.mkdtemp(prefix="tessera-bomb-", dir="/tmp"))
    port = free_port()
    command = [sys.executable, "-m", "tessera.cli", "up", "--port", str(port), "--gpus", "1xA100-80GB"]
    command += ["--data-dir", str(data_dir), "--run-as", "tenant-users"]
    command += [] if pids_max == "default" else ["--workload-pids-max", pids_max]
    env = {**os.environ, "TESSERA_ADMIN_TOKEN": ADMIN, "PYTHONPATH": str(Path(args.src).absolute())}
    log = (data_dir / "server.log").open("ab")
    server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    tenant = f"bomb{uuid.uuid4().hex[:6]}"
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, 60, server.poll)
        with TesseraClient(url, ADMIN) as admin:
            token = str(admin.create_token(tenant)["token"])
        with Probe(url, None) as before:
            time.sleep(args.baseline_s)
        with TesseraClient(url, token) as client:
            work = SPIN.format(spin=args.spin) if args.spin else f"sleep {args.live_s}"
            bomb = BOMB.format(depth=args.depth, work=work)
            workload_id = int(client.submit({"command": ["sh", "-c", bomb]})["id"])
            with Probe(url, tenant_uid(tenant)) as during:
                while during.uid is None:
                    during.uid = tenant_uid(tenant)
                    time.sleep(0.05)
                time.sleep(args.measure_s)
            text = str(client.logs(workload_id)["data"])  # its first line names the bomb's shell
            cgroup = cgroup_counts(text)
            events = [e["message"] for e in client.events(workload_id) if e["kind"] == "started"]
            client.cancel(workload_id)
            deadline = time.monotonic() + 60
            while client.workload(workload_id)["state"] == "running" and time.monotonic() < deadline:
                time.sleep(0.2)
        refused = cgroup.get("pids.events", "").removeprefix("max ") or "unknown"
        print(f"pids-max {pids_max}: {events[0] if events else 'not started'}")
        print(f"  before: {before.summary()}")
        print(f"  during: {during.summary()}; load average max {during.load_max:.1f}")
        print(
            f"  the tenant's processes: at most {during.processes_max} seen in /proc; forks refused by pids.max: "
            f"{refused}; its cgroup: {', '.join(f'{k} {v}' for k, v in cgroup.items())}"
        )
    finally:
        server.terminate()
        server.wait(30)
        subprocess.run(["userdel", user_name(tenant)], capture_output=True, check=False)
        shutil.rmtree(data_dir, ignore_errors=True)


def cgroup_counts(log_text: str) -> dict[str, str]:
    """The bomb's cgroup's pids.max, pids.peak (where the kernel has it) and pids.events (``max N``: the forks its
    limit refused, all of them, where the log keeps only some of the shells' "Cannot fork" lines), read through the
    bomb's shell (its pid is the log's first line) while it runs; "why" when they cannot be read."""
    words = log_text.split()
    if len(words) < 2 or words[0] != "pid":
        return {"why": "unknown (no pid in the log)"}
    directory = cgroup_limits.directories_of(int(words[1])).get("pids")
    if directory is None:
        return {"why": "no pids controller"}
    names = [n for n in ("pids.max", "pids.peak", "pids.events") if (directory / n).exists()]
    return {n: (directory / n).read_text().strip() for n in names} or {"why": f"no pids limit ({directory})"}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pids-max", action="append", help="a run's --workload-pids-max (default: the default)")
    parser.add_argument("--depth", type=int, default=12, help="levels of the bomb (2^(depth+1) - 1 shells)")
    parser.add_argument("--live-s", type=float, default=4.0, help="how long each bomb process lives (sleeping)")
    parser.add_argument("--spin", type=int, default=0, help="each bomb process counts to this instead (busy)")
    parser.add_argument("--measure-s", type=float, default=20.0, help="how long /healthz is measured in the bomb")
    parser.add_argument("--baseline-s", type=float, default=3.0, help="how long it is measured before")
    parser.add_argument("--src", default=str(Path(__file__).resolve().parent.parent / "src"), help="Tessera to run")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: tenants' OS users and cgroup limits need a root server")
    each = f"counting to {args.spin} (busy)" if args.spin else f"sleeping {args.live_s:g} s"
    print(
        f"{os.cpu_count()} CPUs; bomb depth {args.depth} (at most {2 ** (args.depth + 1) - 1} shells), "
        f"each {each}; Tessera from {args.src}"
    )
    for pids_max in args.pids_max or ["default"]:
        run(pids_max, args)


if __name__ == "__main__":
    main()
