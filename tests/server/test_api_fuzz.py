"""Schemathesis against the in-process API (OpenAPI document at /openapi.json): bounded, valid and invalid inputs,
as an admin and as a tenant. No request may end in a 5xx; every response must match its documented schema, status
code and content type; a request that breaks the schema must get a 4xx.

Not checked: ``positive_data_acceptance`` (the server rightly refuses schema-valid bodies that are semantically wrong,
such as a borrowing limit without a cohort, with a 422 naming the field), and ``allow_header_conformance`` /
``unsupported_method`` (Starlette answers an unrouted method with 405 and an ``Allow`` header of one route only).

The run is bounded (``MAX_EXAMPLES`` per operation and role) and derandomised so that CI is reproducible; set
``TESSERA_FUZZ_EXAMPLES`` for a longer, randomised run. Each test reports the requests it sent by status
(``user_properties``); ``tests/conftest.py`` sums them over the run, xdist workers included, and prints the total
with the count of responses >= 500 at the end of the session (issue 17: the acceptance wants that figure).

What schemathesis cannot send: its bodies are valid JSON of valid UTF-8 text, so ``NaN``, ``Infinity`` and lone
surrogates (which Python's JSON reader accepts) come from ``test_api_limits.py`` instead.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from server_harness import ADMIN, Harness, MakeHarness, harness_factory

from tessera.server.auth import create_tenant_token

DEEPER = os.environ.get("TESSERA_FUZZ_EXAMPLES")
MAX_EXAMPLES = int(DEEPER) if DEEPER else 100
FUZZ_PROPERTY = "fuzz-statuses"  # the user property tests/conftest.py sums
TENANT = "team-a"
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
]


def _openapi_document() -> dict[str, Any]:
    """The API's OpenAPI document, from a throw-away server (schemathesis needs it when the tests are collected)."""
    with tempfile.TemporaryDirectory() as tmp:
        make, clients = harness_factory(Path(tmp))
        harness = make()
        document = copy.deepcopy(harness.server.app.openapi())
        for client in clients:
            client.close()
        harness.server.ctx.store.engine.dispose()
    # The tests send the token themselves (``Target.call``). With the operations' ``security`` (the bearer scheme)
    # left in, schemathesis makes "negative" cases out of the credentials, which that header then overrides: valid
    # requests it expects to be refused.
    for operations in document["paths"].values():
        for operation in operations.values():
            operation.pop("security", None)
    return document


# The event stream is left out: it answers for up to an hour by design (its own tests are in
# test_event_stream_and_docs.py).
schema = schemathesis.openapi.from_dict(_openapi_document()).exclude(path="/v1/events/stream")
schema.config.generation.update(max_examples=MAX_EXAMPLES, deterministic=DEEPER is None)
# A generated body over the 1 MiB limit is refused before it is read, with 413: as much a rejection of bad data as a
# 422, which the check does not count by default.
_REJECTION = schema.config.checks.negative_data_rejection
schema.config.checks.negative_data_rejection = type(_REJECTION)(
    expected_statuses=[*_REJECTION.expected_statuses, "413"]
)


@dataclass
class Target:
    """One server shared by every generated request of the module (its state grows as the fuzzer submits)."""

    harness: Harness
    tenant_token: str
    statuses: Counter[int] = field(default_factory=Counter)

    def call(self, case: Any, token: str) -> None:
        response = case.call_and_validate(
            app=self.harness.server.app, headers={"Authorization": f"Bearer {token}"}, checks=CHECKS
        )
        self.statuses[response.status_code] += 1
        if case.method.upper() != "GET" and response.status_code < 300:
            self.harness.step()  # the loop must cope with whatever the fuzzer managed to submit

    def tenant(self) -> str:
        """The tenant's token; a new one when the fuzzer (as admin, DELETE /v1/tokens/{id}) revoked it."""
        store = self.harness.server.ctx.store
        if store.token(self.tenant_token) is None:
            self.tenant_token, _ = create_tenant_token(store, TENANT, "fuzz", self.harness.clock())
        return self.tenant_token


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    make, clients = harness_factory(tmp_path_factory.mktemp("fuzz"))
    harness = make("2xA100-80GB,1xT4")
    created = harness.http.post("/v1/tokens", json={"tenant": TENANT}, headers=harness.as_(ADMIN))
    assert created.status_code == 201, created.text
    harness.submit(gpus=1, gpu_fraction=0.5)  # something to look at: workload 1, running after the first step
    yield Target(harness, created.json()["token"])
    for client in clients:
        client.close()


@pytest.fixture
def counted(target: Target, request: pytest.FixtureRequest) -> Iterator[Target]:
    """``target``, with the requests this test sent recorded on its report (role and status -> count)."""
    before = Counter(target.statuses)
    yield target
    role = "admin" if "as_admin" in request.node.name else "tenant"
    sent = {f"{role} {status}": n for status, n in (target.statuses - before).items()}
    request.node.user_properties.append((FUZZ_PROPERTY, sent))


# ``counted`` is meant to be function-scoped: it runs once per operation (a test item), around all its examples.
PER_ITEM = settings(suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.slow
@schema.parametrize()
@PER_ITEM
def test_api_as_admin_has_no_server_errors(case: Any, counted: Target) -> None:
    counted.call(case, ADMIN)


@pytest.mark.slow
@schema.parametrize()
@PER_ITEM
def test_api_as_tenant_has_no_server_errors(case: Any, counted: Target) -> None:
    counted.call(case, counted.tenant())


# ------------------------------------------------------------------------ regressions the fuzzer found (fast)

LONG_NUMBER = "0" * 51  # a string longer than the schema allows, which pydantic's lax mode would read as the number 0


@pytest.mark.parametrize("field", ["priority", "mem", "cpu"])
def test_an_overlong_numeric_string_is_refused_not_read_as_a_number(make_harness: MakeHarness, field: str) -> None:
    h = make_harness()
    response = h.http.post("/v1/workloads", json={"command": ["true"], field: LONG_NUMBER}, headers=h.as_(ADMIN))
    assert response.status_code == 422, response.text
    assert response.json()["field"].startswith(field)


def test_a_gpu_memory_string_of_digits_within_bounds_still_works(make_harness: MakeHarness) -> None:
    h = make_harness()
    created = h.submit(gpus=1, gpu_mem="10240", priority="7", cpu="2", mem="4096")
    assert (created["gpu_mem_mib"], created["priority"], created["cpu_milli"], created["mem_mib"]) == (
        10240,
        7,
        2000,
        4096,
    )


def test_a_body_that_is_not_json_names_the_body(make_harness: MakeHarness) -> None:
    h = make_harness()
    headers = {**h.as_(ADMIN), "content-type": "application/json"}
    broken = h.http.post("/v1/workloads", content=b'{"command": ', headers=headers)
    assert broken.status_code == 422 and broken.json()["field"] == "body", broken.text
    undecodable = h.http.post("/v1/workloads", content=b"\xff", headers=headers)
    assert undecodable.status_code == 400 and undecodable.json()["field"] == "body", undecodable.text


def test_error_responses_are_documented(make_harness: MakeHarness) -> None:
    document = make_harness().server.app.openapi()
    error = {"$ref": "#/components/schemas/ErrorOut"}
    workload = document["paths"]["/v1/workloads/{workload_id}"]["get"]["responses"]
    for status in ("401", "404", "422"):
        assert workload[status]["content"]["application/json"]["schema"] == error, status
    assert "403" in document["paths"]["/v1/tokens"]["post"]["responses"]
