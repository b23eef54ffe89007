"""The log of one rank of a multi-worker job, read through the route (``rank``), the SDK and ``tessera logs --rank``:
rank ``r`` reads ``rank_log_path(log, r)``; a rank without a log is refused once the workload started (422 naming
``rank``; one line, exit 2, in the CLI); rank 0 and a request without ``rank`` read the workload's log as before."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from server_harness import ADMIN, Harness, MakeHarness
from typer.testing import CliRunner

import tessera.cli.logs
from tessera.backends.base import rank_log_path
from tessera.cli.main import app
from tessera.client.http import TesseraClient


def started_gang(h: Harness) -> int:
    """A running workload whose ranks 0 and 1 have logs (as the backend writes them)."""
    wid = int(h.submit(gpus=0)["id"])
    h.step()
    assert h.get(wid)["state"] == "running"
    path = h.server.ctx.loop.log_path(wid)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("rank 0 says hello\nrank 0 again\n")
    rank_log_path(path, 1).write_text("rank 1 says hello\nrank 1 again\n")
    return wid


def logs(h: Harness, wid: int, **params: Any) -> Any:
    return h.http.get(f"/v1/workloads/{wid}/logs", params=params, headers=h.as_(ADMIN))


def sdk(h: Harness) -> TesseraClient:
    def forward(request: httpx.Request) -> httpx.Response:  # the SDK over the in-process app, no socket
        answer = h.http.request(request.method, request.url.path, params=request.url.params, headers=request.headers)
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    return TesseraClient("http://tessera", ADMIN, transport=httpx.MockTransport(forward))


def test_the_route_reads_each_ranks_log_and_refuses_a_rank_without_one(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    wid = started_gang(h)
    assert logs(h, wid).json()["data"] == "rank 0 says hello\nrank 0 again\n"  # no rank: as before
    assert logs(h, wid, rank=0).json()["data"] == "rank 0 says hello\nrank 0 again\n"
    assert logs(h, wid, rank=1).json()["data"] == "rank 1 says hello\nrank 1 again\n"
    assert logs(h, wid, rank=1, tail=1).json()["data"] == "rank 1 again\n"
    for rank in (2, -1):
        refused = logs(h, wid, rank=rank)
        assert refused.status_code == 422 and refused.json()["field"] == "rank", refused.text
    assert "no rank 2" in logs(h, wid, rank=2).json()["detail"]


def test_a_pending_workloads_rank_reads_empty_until_it_starts(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    wid = int(h.submit(gpus=1)["id"])  # not scheduled yet: no step
    assert h.get(wid)["state"] == "pending"
    answer = logs(h, wid, rank=3)
    assert answer.status_code == 200 and answer.json()["data"] == ""


def test_the_sdk_reads_and_follows_a_rank(make_harness: MakeHarness) -> None:
    h = make_harness("1xA100-80GB")
    wid = started_gang(h)
    with sdk(h) as client:
        assert "".join(client.read_logs(wid, rank=1)) == "rank 1 says hello\nrank 1 again\n"
        assert "".join(client.read_logs(wid)) == "rank 0 says hello\nrank 0 again\n"
        h.backend.finish(str(wid), 0)
        h.step()
        assert "".join(client.follow_logs(wid, poll_s=0.01, tail=1, rank=1)) == "rank 1 again\n"


@pytest.fixture
def cli_over(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Points ``tessera logs`` at a harness's server (the SDK over the in-process app)."""

    def point(h: Harness) -> None:
        @contextmanager
        def client_for(url: Any, token: Any) -> Iterator[TesseraClient]:
            with sdk(h) as client:
                yield client

        monkeypatch.setattr(tessera.cli.logs, "client_for", client_for)

    return point


def test_tessera_logs_rank_prints_that_ranks_log_and_names_rank_in_its_error(
    make_harness: MakeHarness, cli_over: Any
) -> None:
    h = make_harness("1xA100-80GB")
    wid = started_gang(h)
    cli_over(h)
    done = CliRunner().invoke(app, ["logs", str(wid), "--rank", "1"])
    assert done.exit_code == 0 and done.stdout == "rank 1 says hello\nrank 1 again\n", done.output
    assert CliRunner().invoke(app, ["logs", str(wid)]).stdout == "rank 0 says hello\nrank 0 again\n"
    refused = CliRunner().invoke(app, ["logs", str(wid), "--rank", "5"])
    assert refused.exit_code == 2 and refused.stdout == "", refused.output
    assert refused.stderr == f"error: rank: workload {wid} has no rank 5 (it has no log)\n"


def test_another_tenant_cannot_learn_whether_a_rank_exists(make_harness: MakeHarness) -> None:
    """The workload is checked first: another tenant gets 404 for every rank, existing or not, never the 422 that
    would tell it which ranks have logs."""
    h = make_harness("1xA100-80GB")
    wid = started_gang(h)
    other = h.http.post("/v1/tokens", json={"tenant": "intruder"}, headers=h.as_(ADMIN)).json()["token"]
    for rank in (0, 1, 2):
        answer = h.http.get(f"/v1/workloads/{wid}/logs", params={"rank": rank}, headers=h.as_(other))
        assert answer.status_code == 404 and "rank 1 says" not in answer.text, answer.text
