"""Issue 25's attack on the serving plane, through a real ``tessera up`` as root with one OS user per tenant (its
default there) and the sim engine's real HTTP server: tenant A's workloads try to take tenant B's replica's address
before it starts (the hijack: B's prompts to A, A's forged answers to B), to reach B's replica directly (free use of
its share, ``POST /sleep``), and fail at each; B's requests through the gateway are all answered by B's replica.

Before, a replica listened on a TCP port named on its command line: A's workload bound it first and the gateway
registered A's process as B's replica on any 200 from ``/health``, and any workload could call it or put it to
sleep. Now it listens on a Unix socket in a directory only B's OS user can enter, in a network namespace of its own,
and the gateway registers it only once the process listening there is proven to be the replica's."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_server import LiveServer, wait_for

from tessera.backends.accounts import user_name
from tessera.backends.runtime_dirs import base_path
from tessera.serving.gateway.upstream import peer_pid_of

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(os.geteuid() != 0, reason="per-tenant OS users need a root server"),
]

# A's first workload, before B deploys: watches for B's replica and tries to take its address first (a port on
# its command line, a socket in the server's runtime directory), answering what it gets with a forged reply.
SQUAT = r"""
import glob, os, socket, sys, threading, time
base = sys.argv[1]
BODY = b'{"object": "chat.completion", "choices": [{"message": {"content": "FORGED"}}]}'
FORGED = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s' % (len(BODY), BODY)
def answer(server):
    while True:
        conn, _ = server.accept()
        conn.recv(65536); conn.sendall(FORGED); conn.close()
def take(family, address, what):
    try:
        s = socket.socket(family, socket.SOCK_STREAM)
        s.bind(address); s.listen(64)
    except OSError as e:
        print("SQUAT-DENIED", what, e.strerror, flush=True); return
    print("SQUAT-TOOK", what, flush=True)
    threading.Thread(target=answer, args=(s,), daemon=True).start()
for i in range(1, 40):  # the replica's directory and socket, before the server makes them
    path = os.path.join(base, str(i))
    if path == os.environ.get("TESSERA_RUNTIME_DIR"):
        continue  # its own: no attack
    try:
        os.mkdir(path)
        print("SQUAT-TOOK dir", path, flush=True)
    except OSError as e:
        print("SQUAT-DENIED dir", i, e.strerror, flush=True)
    take(socket.AF_UNIX, os.path.join(path, "engine.sock"), f"socket {i}")
seen = set()
deadline = time.time() + float(sys.argv[2])
while time.time() < deadline:
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            argv = open(cmdline, "rb").read().split(b"\0")
        except OSError:
            continue
        if b"tessera.serving.engine_exec" in argv and cmdline not in seen:
            seen.add(cmdline)
            print("SAW", b" ".join(argv).decode(), flush=True)
            if b"--port" in argv:
                take(socket.AF_INET, ("127.0.0.1", int(argv[argv.index(b"--port") + 1])), "port")
    time.sleep(0.005)
print("SQUAT-END", flush=True)
"""

# A's second workload, once B's replica runs: everything it may know (the socket's path, the replica's pid).
PROBE = r"""
import glob, os, socket, sys
sock_path, victim_pid = sys.argv[1], sys.argv[2]
def tried(what, action):
    try:
        out = action()
        print("REACHED", what, out, flush=True)
    except OSError as e:
        print("DENIED", what, e.strerror, flush=True)
def unix(path):
    s = socket.socket(socket.AF_UNIX); s.connect(path)
    s.sendall(b"POST /sleep HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n"); return s.recv(100)
tried("socket", lambda: unix(sock_path))
tried("runtime-dir", lambda: os.listdir(os.path.dirname(sock_path)))
tried("runtime-base", lambda: os.listdir(os.path.dirname(os.path.dirname(sock_path))))
tried("environ", lambda: open(f"/proc/{victim_pid}/environ", "rb").read()[:20])
tried("netns", lambda: os.readlink(f"/proc/{victim_pid}/ns/net"))
chat = b'{"model": "chat", "messages": [{"role": "user", "content": "free"}], "max_tokens": 2}'
for name in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(name).read().splitlines()[1:]:
        fields = line.split()
        if fields[3] != "0A":  # listening sockets only
            continue
        port = int(fields[1].rsplit(":", 1)[1], 16)
        for path, body in (("/v1/chat/completions", chat), ("/sleep", b"")):
            try:
                s = socket.create_connection(("127.0.0.1", port), timeout=2)
                head = f"POST {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                s.sendall(head.encode() + b"content-length: %d\r\n\r\n" % len(body) + body)
                answer = s.recv(4096); s.close()
            except OSError:
                continue
            if answer.startswith(b"HTTP/1.1 200") and (b"chat.completion" in answer or path == "/sleep"):
                print("REACHED port", port, path, flush=True)
print("PROBE-END", flush=True)
"""


@pytest.fixture
def data_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tessera-rep-", dir="/tmp"))  # not tmp_path: its parents are 0700
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _log(server: LiveServer, token: str, workload_id: int) -> str:
    with server.client(token) as client:
        return str(client.logs(workload_id)["data"])


def _chat(server: LiveServer, token: str, content: str) -> httpx.Response:
    body = {"model": "chat", "messages": [{"role": "user", "content": content}], "max_tokens": 4}
    headers = {"authorization": f"Bearer {token}"}
    return httpx.post(f"{server.url}/openai/v1/chat/completions", json=body, headers=headers, timeout=60)


def test_another_tenant_cannot_take_reach_use_or_sleep_a_replica(data_dir: Path) -> None:
    server = LiveServer(data_dir, run_as="tenant-users")
    tenants = [f"rep{uuid.uuid4().hex[:8]}" for _ in range(2)]
    server.start()
    try:
        with server.client() as admin:
            attacker, victim = (str(admin.create_token(t)["token"]) for t in tenants)
        base = base_path(data_dir / "runs")
        with server.client(attacker) as a:
            squat_id = int(a.submit({"command": ["python3", "-c", SQUAT, str(base), "40"]})["id"])
            wait_for(lambda: "SQUAT-" in _log(server, attacker, squat_id), timeout_s=30)
        with server.client(victim) as b:
            b.deploy_model({"name": "chat", "engine": "sim", "gpu_fraction": 0.25, "min_replicas": 1})
            wait_for(lambda: b.model("chat")["state"] == "ready", timeout_s=60)
            replica_id = int(b.model("chat")["replica_workloads"][0])
        answers = [_chat(server, victim, f"question {i}") for i in range(20)]
        socket_path = base / str(replica_id) / "engine.sock"
        victim_pid = _listener(socket_path)
        with server.client(attacker) as a:
            probe_id = int(a.submit({"command": ["python3", "-c", PROBE, str(socket_path), str(victim_pid)]})["id"])
            wait_for(lambda: a.workload(probe_id)["state"] in ("succeeded", "failed"), timeout_s=60)
        after = _chat(server, victim, "still mine?")
        sleeping = _is_sleeping(socket_path)
        squat, probe = _log(server, attacker, squat_id), _log(server, attacker, probe_id)
        uid = {t: _uid(user_name(t)) for t in tenants}
    finally:
        server.cancel_all()
        server.stop()
        for tenant in tenants:
            subprocess.run(["userdel", user_name(tenant)], capture_output=True, check=False)
    assert "SQUAT-TOOK" not in squat, squat  # neither its directory, nor its socket, nor a port
    assert "SAW" in squat and "--port" not in squat  # it saw the replica start: no address on its command line
    assert all(r.status_code == 200 and "FORGED" not in r.text for r in answers), [r.text for r in answers]
    assert all(r.headers.get("x-tessera-replica") is not None for r in answers)
    assert "PROBE-END" in probe and "REACHED" not in probe, probe
    for what in ("socket", "runtime-dir", "runtime-base", "environ", "netns"):
        assert f"DENIED {what}" in probe, probe
    assert after.status_code == 200 and "FORGED" not in after.text and not sleeping
    assert uid[tenants[0]] != uid[tenants[1]] and _owner(socket_path) in (None, uid[tenants[1]])


def _listener(socket_path: Path) -> int:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(socket_path))  # root may
        pid = peer_pid_of(s)
    assert pid is not None
    return pid


def _is_sleeping(socket_path: Path) -> bool:
    transport = httpx.HTTPTransport(uds=str(socket_path))
    with httpx.Client(transport=transport, base_url="http://replica", timeout=10) as client:
        answer: dict[str, Any] = json.loads(client.get("/is_sleeping").text)
    return bool(answer["is_sleeping"])


def _uid(user: str) -> int:
    return pwd.getpwnam(user).pw_uid


def _owner(path: Path) -> int | None:
    try:
        return path.parent.stat().st_uid
    except FileNotFoundError:  # removed with the replica at the end
        return None
