"""``make run``'s demo (``tessera up --demo``): the printed OpenAI example works against the deployed sim model, the
mix runs with one workload waiting, and stopping the server leaves no process of the demo behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from live_server import alive, free_port, wait_for

pytestmark = pytest.mark.e2e


def test_the_demo_serves_its_model_through_the_printed_example_and_cleans_up(tmp_path: Path) -> None:
    port, out = free_port(), tmp_path / "out.log"
    command = [sys.executable, "-m", "tessera.cli", "up", "--demo", "--port", str(port), "--data-dir", str(tmp_path)]
    with out.open("wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        printed = wait_for(lambda: "Stop with Ctrl-C" in out.read_text() and out.read_text(), timeout_s=60)
        token = re.search(r"TESSERA_TOKEN=(\S+)", printed)
        example = re.search(r"base_url='([^']+)'", printed)
        assert token and example and "demo-chat" in printed and "curl -s" in printed, printed
        ai = openai.OpenAI(base_url=example.group(1), api_key=token.group(1), max_retries=0, timeout=60)
        answer = ai.chat.completions.create(model="demo-chat", messages=[{"role": "user", "content": "Hello!"}])
        assert answer.choices[0].message.content
        pids = [
            int(p)
            for p in subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
        ]
        assert len(pids) >= 2  # at least the two replicas' engines
        # The submission the demo suggests fits beside the mix (before, the demo filled the GPU and it waited).
        suggested = re.search(r"tessera submit --gpu-fraction (\S+)", printed)
        assert suggested, printed
        env = {**os.environ, "TESSERA_URL": f"http://127.0.0.1:{port}", "TESSERA_TOKEN": token.group(1)}
        cli = [sys.executable, "-m", "tessera.cli"]
        submitted = subprocess.run(
            [*cli, "submit", "--json", "--gpu-fraction", suggested.group(1), "--", "python3", "-c", "print(42)"],
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        wid = json.loads(submitted.stdout)["id"]
        show = [*cli, "show", str(wid), "--json"]

        def ended() -> str | None:
            state = str(json.loads(subprocess.run(show, capture_output=True, text=True, env=env).stdout)["state"])
            return state if state in ("succeeded", "failed") else None

        assert wait_for(ended, timeout_s=30) == "succeeded"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    wait_for(lambda: not any(alive(p) for p in pids), timeout_s=20)
    assert "admin token (shown once" in out.read_text()
    # A later start on the same store cannot show the token again: it says how to get one.
    again = tmp_path / "again.log"
    command = [*command[:4], "--port", str(port), "--data-dir", str(tmp_path), "--run-as", "server"]
    with again.open("wb") as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        said = wait_for(lambda: "dashboard:" in again.read_text() and again.read_text(), timeout_s=60)
        assert "admin token: the one made at this store's first start is kept" in said, said
        assert "TESSERA_ADMIN_TOKEN=" in said and "shown once" not in said
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
