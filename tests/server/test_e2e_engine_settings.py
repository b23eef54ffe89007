"""A model's own engine arguments and its requests' SLO classes on a real ``tessera up`` with sim engines: the
arguments reach the engine's command line after Tessera's own (priority scheduling among them), ``models show``
prints them, and the engine serves a request's class in order (an interactive one sent after a batch one, while the
engine's KV cache holds one request at a time, finishes first)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import openai
import pytest
from live_server import ADMIN, LiveServer, wait_for

pytestmark = pytest.mark.e2e


def _engine_argv(model_name: str) -> list[str]:
    """The command line of the sim engine serving ``model_name``."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = [a.decode() for a in cmdline.read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if "tessera.serving.engines.sim_server" in argv and model_name in argv:
            return argv
    return []


def _cli(server: LiveServer, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"TESSERA_URL": server.url, "TESSERA_TOKEN": ADMIN, "PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    paths = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(paths)
    return subprocess.run(
        [sys.executable, "-m", "tessera.cli", *args], capture_output=True, text=True, env=env, timeout=60
    )


def test_engine_args_reach_the_sim_and_it_serves_the_more_urgent_class_first(tmp_path: Path) -> None:
    live = LiveServer(tmp_path / "server", gpus="1xA100-80GB")
    live.start()
    try:
        # 3 KV blocks of 16 tokens: one request of ~35 tokens at a time; at a fifth of the modelled speed.
        deployed = _cli(
            live, "models", "deploy", "prio", "--engine", "sim", "--gpu-fraction", "0.25",
            "--engine-arg", "--kv-blocks 3", "--engine-arg=--speedup=0.2",
        )  # fmt: skip
        assert deployed.returncode == 0, deployed.stderr
        with live.client() as client:
            wait_for(lambda: client.model("prio")["replicas"] == 1, timeout_s=60)
        argv = _engine_argv("prio")
        assert argv[-5:] == ["--scheduling-policy", "priority", "--kv-blocks", "3", "--speedup=0.2"], argv
        shown = _cli(live, "models", "show", "prio")
        assert shown.returncode == 0 and "--kv-blocks 3 --speedup=0.2" in shown.stdout, shown.stdout + shown.stderr

        ai = openai.OpenAI(base_url=f"{live.url}/openai/v1", api_key=ADMIN, max_retries=0, timeout=120)
        finished: list[str] = []

        def ask(name: str, slo: str) -> None:
            ai.completions.create(
                model="prio", prompt=f"{name} go", max_tokens=30, extra_headers={"x-tessera-slo": slo}
            )
            finished.append(name)

        threads = []
        for name, slo in (("blocker", "standard"), ("batch", "batch"), ("interactive", "interactive")):
            threads.append(threading.Thread(target=ask, args=(name, slo)))
            threads[-1].start()
            time.sleep(0.3)  # each reaches the engine before the next is sent; the blocker is running by then
        for thread in threads:
            thread.join(120)
        assert sorted(finished) == ["batch", "blocker", "interactive"], finished
        assert finished.index("interactive") < finished.index("batch"), finished
    finally:
        try:
            with live.client() as client:
                for m in client.models():
                    client.delete_model(m["name"])
                wait_for(lambda: not client.models(), timeout_s=30)
            live.cancel_all()
        finally:
            live.stop()
