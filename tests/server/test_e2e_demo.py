"""``make run``'s demo (``tessera up --demo``): the printed OpenAI example works against the deployed sim model, the
mix runs with one workload waiting, and stopping the server leaves no process of the demo behind."""

from __future__ import annotations

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
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
    wait_for(lambda: not any(alive(p) for p in pids), timeout_s=20)
