"""Start-up time of the ``tessera`` command (docs/cli.md, "Start-up time"): wall and CPU time (user + sys) of
``tessera jobs --help``, ``tessera --help`` and ``tessera jobs`` against no server, with the floor beside them
(``python -c pass``, ``import click``, ``import typer``).

With ``--before SRC`` (another checkout's ``src``, e.g. ``git archive main src | tar -x -C /tmp/old``) each command
also runs from that code, through the same virtualenv (``PYTHONPATH=SRC``). Each round runs every variant once, in
turn, so that a change in the machine's load falls on all of them alike. Bytecode is written and used
(``PYTHONDONTWRITEBYTECODE`` is dropped), after two warm-up runs of each. The load average is printed with the
table: on a shared machine wall times grow with it; CPU time much less.
Usage: ``python bench/cli_startup.py [--rounds 20] [--before SRC]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
COMMANDS = {"tessera jobs --help": ["jobs", "--help"], "tessera --help": ["--help"], "tessera jobs": ["jobs"]}
FLOOR = {
    "python -c pass": "pass",
    "python -c 'import click'": "import click",
    "python -c 'import typer'": "import typer",
}


def once(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds (user + sys) and exit code of one run."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime, os.waitstatus_to_exitcode(status)


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description="Start-up time of the tessera command, before and after.")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--before", type=Path, help="src folder of the code to compare with")
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(TESSERA_CONFIG="/nonexistent/config.yaml", TESSERA_URL="http://127.0.0.1:9", COLUMNS="100")
    variants: dict[str, tuple[list[str], dict[str, str]]] = {}
    for name, words in COMMANDS.items():
        if args.before is not None:
            variants[f"before: {name}"] = ([str(BIN / "tessera"), *words], {**env, "PYTHONPATH": str(args.before)})
        variants[f"{'after: ' if args.before else ''}{name}"] = ([str(BIN / "tessera"), *words], env)
    for name, code in FLOOR.items():
        variants[f"floor: {name}"] = ([sys.executable, "-c", code], env)
    for argv, variant_env in variants.values():
        once(argv, variant_env)
        once(argv, variant_env)
    runs: dict[str, list[tuple[float, float, int]]] = {name: [] for name in variants}
    loads = [load()]
    for round_ in range(args.rounds):
        for name, (argv, variant_env) in variants.items():
            runs[name].append(once(argv, variant_env))
        if round_ % 5 == 4:
            loads.append(load())
    print(f"load average (1, 5, 15 min) during the runs: {' | '.join(loads)}")
    print(f"{'':40s} {'wall mean':>9s} {'wall min':>8s} {'CPU mean':>8s} {'CPU min':>7s}  exit")
    for name, results in runs.items():
        wall = [r[0] for r in results]
        cpu = [r[1] for r in results]
        codes = ",".join(str(c) for c in sorted({r[2] for r in results}))
        print(
            f"{name:40s} {statistics.mean(wall):9.3f} {min(wall):8.3f} {statistics.mean(cpu):8.3f} {min(cpu):7.3f}"
            f"  {codes}"
        )


if __name__ == "__main__":
    main()
