"""Bodies that once made the API answer a plain-text 500 (and reset the connection), and the limits on what a body may
hold: every one is now a 4xx JSON error naming the field as the user wrote it (issue 17, defects 4 and 9).

The bodies are sent as raw JSON text: Python's JSON reader (the server's) accepts ``NaN``, ``Infinity`` and a lone
surrogate escape, which a JSON writer on the client side would refuse to produce.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_harness import ADMIN, Harness, MakeHarness

from tessera.server.api.limits import MAX_BODY_BYTES
from tessera.server.submit import MAX_ARG_BYTES, MAX_COMMAND_BYTES, MAX_ENV_BYTES


def _post(h: Harness, text: str) -> Any:
    http = TestClient(h.server.app, raise_server_exceptions=False)  # a 500 must come back, not raise here
    headers = {**h.as_(ADMIN), "content-type": "application/json"}
    return http.post("/v1/workloads", content=text.encode("utf-8", "surrogatepass"), headers=headers)


def _refused(response: Any, field: str, status: int = 422) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["field"] == field, body
    assert body["detail"].startswith(f"{field}: "), body


# The bodies of the issue (JSON text), and the field each must be refused for.
ONCE_A_500 = [
    ('{"command": ["true"], "gpus": 1, "gpu_fraction": NaN}', "gpu_fraction"),
    ('{"command": ["true"], "gpus": 1, "gpu_fraction": Infinity}', "gpu_fraction"),
    ('{"command": ["true"], "gpus": 1, "gpu_fraction": -Infinity}', "gpu_fraction"),
    ('{"command": ["true"], "name": "\\ud800"}', "name"),
    ('{"command": ["\\ud800"]}', "command.0"),
    ('{"command": ["true", "a\\udfff"]}', "command.1"),
    ('{"command": ["true"], "env": {"A": "\\ud800"}}', "env.A"),
    ('{"command": ["true"], "cpu": 1e308}', "cpu"),
    ('{"command": ["true"], "cpu": NaN}', "cpu"),
    ('{"command": ["true"], "cpu": 1' + "0" * 400 + "}", "cpu"),
    ('{"command": ["true"], "mem": 1e308}', "mem"),
    ('{"command": ["true"], "gpus": 1, "gpu_mem": 1' + "0" * 30 + "}", "gpu_mem"),
    ('{"command": ["true"], "gpus": 1, "gpu_mem": "99999999999999999999GiB"}', "gpu_mem"),
    ('{"command": ["true"], "priority": "--5"}', "priority"),
    ('{"command": ["true"], "priority": "\\u00b2"}', "priority"),
    ('{"command": ["true"], "priority": "\\u0663"}', "priority"),  # an Arabic-Indic digit: isdigit(), not int()
]


@pytest.mark.parametrize(("text", "field"), ONCE_A_500)
def test_a_body_that_once_was_a_500_is_a_422_naming_the_field(make_harness: MakeHarness, text: str, field: str) -> None:
    _refused(_post(make_harness(), text), field)


@pytest.mark.parametrize("offset", [2**50, 2**62])
def test_a_log_offset_beyond_the_file_systems_limit_is_an_empty_chunk(make_harness: MakeHarness, offset: int) -> None:
    h = make_harness()
    created = h.submit()
    path = h.server.ctx.loop.log_path(created["id"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("hello\n")
    response = h.http.get(f"/v1/workloads/{created['id']}/logs", params={"offset": offset}, headers=h.as_(ADMIN))
    assert response.status_code == 200, response.text
    assert (response.json()["data"], response.json()["next_offset"]) == ("", offset)


@pytest.mark.parametrize("offset", [2**63, 10**30])
def test_a_log_offset_out_of_range_is_refused(make_harness: MakeHarness, offset: int) -> None:
    h = make_harness()
    created = h.submit()
    response = h.http.get(f"/v1/workloads/{created['id']}/logs", params={"offset": offset}, headers=h.as_(ADMIN))
    _refused(response, "offset")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"command": [""]}, "command.0"),
        ({"command": ["true"], "gpus": True}, "gpus"),
        ({"command": ["true"], "gpus": 1, "gpu_milli": True}, "gpu_milli"),
        ({"command": ["true"], "gpus": 1, "gpu_fraction": True}, "gpu_fraction"),
        ({"command": ["true"], "cpu": []}, "cpu"),  # pydantic says cpu.int, cpu.float, cpu.constrained-str
        ({"command": ["true"], "cpu": "x" * 51}, "cpu"),
        ({"command": ["true"], "mem": {"a": 1}}, "mem"),
        ({"command": ["true"], "priority": 1.5}, "priority"),
        ({"command": ["true"], "env": {"1BAD": "x"}}, "env.1BAD"),
        ({}, "command"),
    ],
)
def test_the_field_is_named_as_the_user_wrote_it(make_harness: MakeHarness, body: dict[str, Any], field: str) -> None:
    _refused(_post(make_harness(), json.dumps(body)), field)


def test_an_argument_the_os_could_not_exec_is_refused_at_submission(make_harness: MakeHarness) -> None:
    h = make_harness()
    _refused(_post(h, json.dumps({"command": ["echo", "x" * MAX_ARG_BYTES]})), "command.1")
    _refused(_post(h, json.dumps({"command": ["true"], "env": {"BIG": "x" * MAX_ARG_BYTES}})), "env.BIG")
    near = "x" * (MAX_ARG_BYTES - 1)  # with its NUL: exactly what execve takes
    assert _post(h, json.dumps({"command": ["echo", near]})).status_code == 201


def test_too_much_command_or_environment_in_all_is_refused(make_harness: MakeHarness) -> None:
    h = make_harness()
    piece = "x" * (64 * 1024)
    many = MAX_COMMAND_BYTES // len(piece) + 1
    _refused(_post(h, json.dumps({"command": ["echo", *[piece] * many]})), "command")
    env = {f"V{i}": piece for i in range(MAX_ENV_BYTES // len(piece) + 1)}
    _refused(_post(h, json.dumps({"command": ["true"], "env": env})), "env")


def test_a_body_over_the_limit_is_a_413_json_error(make_harness: MakeHarness) -> None:
    h = make_harness()
    big = json.dumps({"command": ["echo", "x" * MAX_BODY_BYTES]})
    _refused(_post(h, big), "body", status=413)

    def chunks() -> Any:  # no Content-Length: the limit holds while reading
        for start in range(0, len(big), 65536):
            yield big[start : start + 65536].encode()

    headers = {**h.as_(ADMIN), "content-type": "application/json"}
    _refused(h.http.post("/v1/workloads", content=chunks(), headers=headers), "body", status=413)
    assert h.submit()["state"] == "pending"  # the server is fine afterwards


def test_an_unexpected_exception_is_a_json_500(make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    h = make_harness()

    def broken(*_: object, **__: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(h.server.ctx.store, "queues", broken)
    # The exception does not reach the server either (raise_server_exceptions): uvicorn would close the connection.
    response = TestClient(h.server.app, raise_server_exceptions=True).get("/v1/queues", headers=h.as_(ADMIN))
    assert response.status_code == 500
    assert response.headers["content-type"] == "application/json"
    assert "boom" not in response.text  # nothing of the internals leaks


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_FIELDS = ("name", "kind", "gpus", "gpu_milli", "gpu_fraction", "gpu_compute", "gpu_mem", "cpu", "mem", "priority")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(field=st.sampled_from(_FIELDS), value=_JSON_VALUES)
def test_any_json_value_in_any_field_is_never_a_server_error(
    make_harness: MakeHarness, field: str, value: object
) -> None:
    """Non-finite floats, surrogates, huge integers and wrong types in every field of a submission."""
    harness = _shared(make_harness)
    text = json.dumps({"command": ["true"], "gpus": 1, field: value}, allow_nan=True)
    response = _post(harness, text)
    assert response.status_code < 500, (text, response.text)
    if response.status_code >= 400:
        assert response.json()["field"].split(".")[0] in (field, "gpus", "gpu_fraction", "gpu_milli"), response.text


_HARNESS: dict[int, Harness] = {}


def _shared(make_harness: MakeHarness) -> Harness:
    """One harness per test run of the property (its examples share it: building one per example is slow)."""
    key = id(make_harness)
    if key not in _HARNESS:
        _HARNESS.clear()
        _HARNESS[key] = make_harness("1xA100-80GB")
    return _HARNESS[key]
