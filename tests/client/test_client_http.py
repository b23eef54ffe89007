"""The SDK reads responses with the shared wire types (``tessera.api``); no server: canned responses through
httpx's MockTransport."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from tessera.api import API_VERSION, Health
from tessera.client.http import ApiError, TesseraClient

URL = "http://127.0.0.1:8470"


def _client(answer: Callable[[httpx.Request], httpx.Response]) -> TesseraClient:
    return TesseraClient(URL, "token", transport=httpx.MockTransport(answer))


def test_health_is_read_as_the_shared_model_with_the_api_version() -> None:
    body = {"status": "ok", "simulated_gpus": True, "gpus": 3, "api_version": "7"}
    with _client(lambda request: httpx.Response(200, json=body)) as client:
        health = client.health()
        assert health == Health(status="ok", simulated_gpus=True, gpus=3, api_version="7")
        assert client.api_version() == "7"


def test_a_server_from_before_api_version_speaks_version_1() -> None:
    body = {"status": "ok", "simulated_gpus": False, "gpus": 8}
    with _client(lambda request: httpx.Response(200, json=body)) as client:
        assert client.api_version() == "1" == API_VERSION


def test_a_health_body_that_does_not_fit_is_one_clear_api_error() -> None:
    body = {"status": "ok", "simulated_gpus": "maybe", "gpus": 1}
    with _client(lambda request: httpx.Response(200, json=body)) as client, pytest.raises(ApiError) as caught:
        client.health()
    assert str(caught.value).startswith(f"unexpected Health from {URL}: simulated_gpus: ")


def test_a_starting_server_is_an_api_error_with_its_status() -> None:
    with (
        _client(lambda request: httpx.Response(503, json={"detail": "starting"})) as client,
        pytest.raises(ApiError) as caught,
    ):
        client.health()
    assert (caught.value.status, caught.value.detail) == (503, "starting")


def test_follow_logs_reads_log_chunks_until_the_workload_has_ended() -> None:
    log = b"line one\nline two\n"

    def answer(request: httpx.Request) -> httpx.Response:
        offset = int(request.url.params["offset"])
        data = log[offset : offset + 9].decode()
        end = offset + len(data)
        return httpx.Response(
            200, json={"data": data, "offset": offset, "next_offset": end, "finished": end == len(log)}
        )

    with _client(answer) as client:
        assert "".join(client.follow_logs(4, poll_s=0.0)) == log.decode()
