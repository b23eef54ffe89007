"""The SDK as docs/cli.md shows it: ``from tessera.client import TesseraClient`` works, and the documented calls
(submit, follow_logs, history, usage, put_queue, delete_queue) run against an in-process server. Importing
``tessera.client`` for ``ApiError`` alone does not load httpx (the CLI's start-up relies on it)."""

from __future__ import annotations

import subprocess
import sys

import httpx
from server_harness import ADMIN, MakeHarness

from tessera.client import ApiError, TesseraClient


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
