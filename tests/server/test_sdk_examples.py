"""The SDK as docs/cli.md shows it: the example runs as it is written there (its code block, with the server's
address and a token put in) against a real ``tessera up`` whose workloads get the clean PATH, and the documented
calls (submit, follow_logs, history, usage, put_queue, delete_queue) run against an in-process server. Importing
``tessera.client`` for ``ApiError`` alone does not load httpx (the CLI's start-up relies on it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from live_server import ADMIN as LIVE_ADMIN
from live_server import LiveServer
from server_harness import ADMIN, MakeHarness

from tessera.client import ApiError, TesseraClient

DOCS = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def documented_example() -> str:
    """The Python block of docs/cli.md's "Python SDK" section."""
    section = DOCS.read_text().split("## Python SDK", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match is not None, "docs/cli.md has no Python example under its Python SDK section"
    return match.group(1)


@pytest.mark.e2e
def test_the_documented_example_runs_as_written(tmp_path: Path) -> None:
    """Issue 25: the example submitted ``python train.py``, which a workload's clean PATH (/usr/local/bin:/usr/bin:
    /bin) does not have, from no directory: it failed. Here it runs unchanged but for the address and token, from
    a directory holding a train.py, with no virtualenv on the workload's PATH."""
    server = LiveServer(tmp_path / "data")
    server.start()
    try:
        code = documented_example()
        assert '"http://127.0.0.1:8470"' in code and '"tsr_..."' in code
        code = code.replace('"http://127.0.0.1:8470"', repr(server.url)).replace('"tsr_..."', repr(LIVE_ADMIN))
        project = tmp_path / "project"
        project.mkdir()
        (project / "train.py").write_text("import sys\nprint('epoch 1 loss 0.25', sys.executable)\n")
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
        paths = [os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if paths:  # the code under test, not another checkout installed in the environment
            env["PYTHONPATH"] = os.pathsep.join(paths)
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=project, capture_output=True, text=True, env=env, timeout=120
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0].startswith("epoch 1 loss 0.25 /"), done.stdout  # train.py ran, by the system's python3
        assert lines[1] == "succeeded 0", done.stdout
    finally:
        server.cancel_all()
        server.stop()


def test_the_documented_calls(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")

    def forward(request: httpx.Request) -> httpx.Response:  # the SDK over the in-process app, no socket
        answer = h.http.request(
            request.method,
            request.url.path,
            params=request.url.params,
            headers=dict(request.headers),
            content=request.content,
        )
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    with TesseraClient("http://tessera", ADMIN, transport=httpx.MockTransport(forward)) as tessera:
        job = tessera.submit({"command": ["python", "train.py"], "gpus": 1, "gpu_fraction": 0.5})
        h.step()
        h.clock.advance(7200)
        h.backend.finish(str(job["id"]), 0)
        h.step()
        assert list(tessera.follow_logs(job["id"], poll_s=0)) == []  # the fake backend writes no log
        (record,) = tessera.history(states=["succeeded"])
        assert record["id"] == job["id"] and record["gpu_hours"] == 1.0
        assert tessera.usage()[0]["gpu_hours"] == 1.0
        tessera.put_queue({"name": "lab", "tenant": "lab", "nominal": {"*": {"gpus": 1}}})
        assert tessera.delete_queue("lab")["name"] == "lab"
        try:
            tessera.delete_queue("lab")
        except ApiError as error:
            assert error.status == 404
        else:
            raise AssertionError("a deleted queue was deleted again")


def test_api_error_alone_does_not_load_httpx() -> None:
    probe = "import sys; from tessera.client import ApiError; print('httpx' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "False"
