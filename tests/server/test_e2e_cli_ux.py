"""The CLI's logs, history and queues against a real ``tessera up`` with real workload processes: 100,000
multi-byte characters come back byte-identical through ``tessera logs`` (and ``logs -f``, which then exits with the
job's exit code), ``--tail``, a log rotated at ``--log-max-size`` while it is followed, ``tessera history`` after
the end, and ``tessera queues apply`` (twice: nothing changes) and ``delete``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from live_server import ADMIN, LiveServer, wait_for

pytestmark = pytest.mark.e2e

LOG_CAP = 1024 * 1024
# 100,000 characters of 2, 3 and 4 bytes, written in pieces of odd sizes so that writes (and the server's chunks)
# end inside characters.
MULTIBYTE = """
import os, sys
text = ("é€😀" * 33_334)[:100_000] + "\\nsecond line\\nlast line\\n"
data = text.encode()
for start in range(0, len(data), 4099):
    os.write(1, data[start:start + 4099])
sys.exit(3)
"""
EXPECTED = (("é€😀" * 33_334)[:100_000] + "\nsecond line\nlast line\n").encode()
# About 5 MiB of numbered lines over about 5 s: the log passes the 1 MiB cap several times while it runs. It first
# says it is ready and waits for the go file (argv[1]), so that the follower is attached before the first rotation.
CHATTY = """
import os, sys, time
print("ready", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
for i in range(50):
    sys.stdout.write("".join(f"line {i:02d}-{j:04d} " + "x" * 90 + "\\n" for j in range(1000)))
    sys.stdout.flush()
    time.sleep(0.1)
print("the end")
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path_factory.mktemp("cli-ux") / "data", gpus="2xA100-80GB", args=("--log-max-size", "1MiB"))
    live.start()
    yield live
    live.cancel_all()
    live.stop()


def cli_env(server: LiveServer, token: str = ADMIN) -> dict[str, str]:
    env = {"TESSERA_URL": server.url, "TESSERA_TOKEN": token, "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    env["LANG"] = "C"  # the bytes must come back whatever the locale
    paths = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def tessera(server: LiveServer, *args: str, token: str = ADMIN) -> subprocess.CompletedProcess[bytes]:
    env = cli_env(server, token)
    return subprocess.run([sys.executable, "-m", "tessera.cli", *args], capture_output=True, env=env, timeout=120)


def tessera_popen(server: LiveServer, *args: str) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tessera.cli", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(server))


def submit(server: LiveServer, *args: str) -> int:
    done = tessera(server, "submit", "--json", *args)
    assert done.returncode == 0, done.stderr
    return int(json.loads(done.stdout)["id"])


def test_multibyte_output_comes_back_byte_identical_and_logs_f_exits_with_the_job(server: LiveServer) -> None:
    wid = submit(server, "--gpus", "1", "--", sys.executable, "-c", MULTIBYTE)
    followed = tessera(server, "logs", str(wid), "-f")  # started at once: it follows while the job writes
    assert followed.stdout == EXPECTED
    assert followed.returncode == 3, followed.stderr
    again = tessera(server, "logs", str(wid))
    assert again.returncode == 0 and again.stdout == EXPECTED
    assert tessera(server, "logs", str(wid), "--tail", "2").stdout == b"second line\nlast line\n"
    assert tessera(server, "logs", str(wid), "--tail", "1", "-f").returncode == 3

    records = json.loads(tessera(server, "history", "--json", "--state", "failed").stdout)
    mine = next(r for r in records if r["id"] == wid)
    assert mine["state"] == "failed" and mine["exit_code"] == 3
    assert mine["started_at"] <= mine["ended_at"] and mine["gpu_hours"] > 0
    assert mine["where"] == [f"local GPU {mine['where'][0].split()[-1]}"]
    table = tessera(server, "history", "--since", "1h").stdout.decode()
    assert str(wid) in table and "failed" in table
    totals = json.loads(tessera(server, "history", "--totals", "--json").stdout)
    assert totals[0]["tenant"] == "default" and totals[0]["gpu_hours"] > 0


def test_a_log_over_the_cap_is_rotated_while_it_is_followed(server: LiveServer, tmp_path: Path) -> None:
    go = tmp_path / "go"
    wid = submit(server, "--", sys.executable, "-c", CHATTY, str(go))
    # Started before the job writes (on a loaded machine a follower started after the submission could come in
    # after two rotations, and the lines before them are gone by design).
    with tessera_popen(server, "logs", str(wid), "-f") as follower:
        assert follower.stdout is not None
        assert follower.stdout.readline() == b"ready\n"  # the follower is attached
        go.touch()
        rest, err = follower.communicate(timeout=120)
    assert follower.returncode == 0, err
    followed = b"ready\n" + rest
    lines = followed.decode().splitlines()
    # The follower saw every line in order (rotation may lose the bytes of one instant: allow a line or two).
    assert lines[-1] == "the end" and len(lines) >= 50_000 - 2
    logs = server.data_dir / "logs"
    assert (logs / f"{wid}.log.1").exists(), sorted(p.name for p in logs.iterdir())
    on_disk = (logs / f"{wid}.log").stat().st_size + (logs / f"{wid}.log.1").stat().st_size
    assert on_disk < 5 * LOG_CAP  # of about 5 MiB written
    kept = tessera(server, "logs", str(wid)).stdout
    assert followed.endswith(kept) and 0 < len(kept) < len(followed)
    assert tessera(server, "logs", str(wid), "--tail", "1").stdout == b"the end\n"


QUEUES = """\
queues:
  - name: research-a
    tenant: research-a
    cohort: research
    flavors:
      - name: "*"
        nominalQuota: {gpus: 1}
        borrowingLimit: {gpus: 1}
  - name: research-b
    cohort: research
    queueingStrategy: StrictFIFO
    flavors:
      - name: "*"
        nominalQuota: {gpus: 1, cpu: 8, memory: 16Gi}
        lendingLimit: {gpus: 0.5}
"""


def test_queues_apply_is_idempotent_and_delete_refuses_a_busy_queue(server: LiveServer, tmp_path: Path) -> None:
    path = tmp_path / "queues.yaml"
    path.write_text(QUEUES)
    first = tessera(server, "queues", "apply", "-f", str(path))
    assert first.returncode == 0, first.stderr
    assert first.stdout.decode().splitlines() == ["queue research-a: created", "queue research-b: created"]
    second = tessera(server, "queues", "apply", "-f", str(path))
    assert second.stdout.decode().splitlines() == ["queue research-a: unchanged", "queue research-b: unchanged"]
    listed = {q["name"]: q for q in json.loads(tessera(server, "queues", "--json").stdout)}
    assert listed["research-b"]["lending_limit"] == {"*": {"gpu_milli": 500}}
    assert listed["research-a"]["borrowing_limit"] == {"*": {"gpu_milli": 1000}}

    path.write_text(QUEUES.replace("cohort: research\n    flavors", "flavors", 1))  # a limit without a cohort
    refused = tessera(server, "queues", "apply", "-f", str(path))
    assert refused.returncode == 2
    assert refused.stderr.decode().startswith(f"error: {path}:"), refused.stderr

    busy = submit(server, "--queue", "research-b", "--", "sleep", "300")
    wait_for(lambda: json.loads(tessera(server, "show", str(busy), "--json").stdout)["state"] == "running")
    denied = tessera(server, "queues", "delete", "research-b")
    assert denied.returncode == 2 and b"1 running" in denied.stderr, denied.stderr
    assert tessera(server, "cancel", str(busy)).returncode == 0
    wait_for(lambda: json.loads(tessera(server, "show", str(busy), "--json").stdout)["state"] == "cancelled")
    deleted = tessera(server, "queues", "delete", "research-b")
    assert deleted.returncode == 0 and deleted.stdout == b"queue research-b deleted\n"
    assert "research-b" not in {q["name"] for q in json.loads(tessera(server, "queues", "--json").stdout)}
