"""``GET /v1/events/stream`` (the dashboard's live updates), ``/docs`` and ``/redoc`` served from local assets with a
bearer security scheme in the OpenAPI document, and the dashboard's files at ``/ui``, on the in-process server.
(The browser tests are in ``test_e2e_dashboard.py``.)"""

from __future__ import annotations

import asyncio
import gc
import re
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from live_server import free_port, wait_for
from server_harness import ADMIN, Harness, MakeHarness

from tessera.server.api import stream_routes, web
from tessera.server.submit import Principal


def changed_ids(body: str) -> list[int]:
    """The ``last_event_id`` of each ``changed`` event of a Server-Sent Events body."""
    return [int(m) for m in re.findall(r'event: changed\ndata: \{"last_event_id": (\d+)\}', body)]


def stream(h: Harness, token: str, **params: Any) -> Any:  # TestClient's response (httpx2's type in Starlette 1)
    return h.http.get("/v1/events/stream", params=params, headers=h.as_(token))


def tenant_token(h: Harness, tenant: str) -> str:
    created = h.http.post("/v1/tokens", json={"tenant": tenant}, headers=h.as_(ADMIN))
    assert created.status_code == 201, created.text
    token: str = created.json()["token"]
    return token


def test_the_stream_names_the_newest_event_the_caller_may_see(make_harness: MakeHarness) -> None:
    h = make_harness()
    a, b = tenant_token(h, "team-a"), tenant_token(h, "team-b")
    h.submit(a)
    h.step()
    first = stream(h, a, max_events=1)
    assert first.status_code == 200 and first.headers["content-type"].startswith("text/event-stream")
    (seen_by_a,) = changed_ids(first.text)
    assert seen_by_a == max(e.id for e in h.server.ctx.store.events())
    h.submit(b)  # another tenant's activity: a's stream does not move, the admin's does
    (still,) = changed_ids(stream(h, a, max_events=1).text)
    (admin,) = changed_ids(stream(h, ADMIN, max_events=1).text)
    assert still == seen_by_a < admin == max(e.id for e in h.server.ctx.store.events())
    (b_sees,) = changed_ids(stream(h, b, max_events=1).text)
    assert b_sees == admin
    assert changed_ids(stream(h, tenant_token(h, "team-c"), max_events=1).text) == [0]  # nothing of its own yet


def test_the_stream_needs_a_token_and_is_bounded(make_harness: MakeHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    h = make_harness()
    assert h.http.get("/v1/events/stream").status_code == 401
    assert stream(h, "not-a-token").status_code == 401
    assert stream(h, ADMIN, max_seconds=0).json()["field"] == "max_seconds"
    monkeypatch.setattr(stream_routes, "POLL_S", 0.02)
    monkeypatch.setattr(stream_routes, "HEARTBEAT_S", 0.1)
    started = time.monotonic()
    quiet = stream(h, ADMIN, max_seconds=1)  # nothing changes: one event, then comments, then the end
    assert 1.0 <= time.monotonic() - started < 5.0
    assert len(changed_ids(quiet.text)) == 1 and quiet.text.count(": keep-alive\n\n") >= 3, quiet.text
    assert h.server.app.state.event_streams == 0
    h.server.ctx.closing = lambda: True  # the server is shutting down: the stream ends at once
    started = time.monotonic()
    assert changed_ids(stream(h, ADMIN).text) == [] and time.monotonic() - started < 1.0
    h.server.ctx.closing = lambda: False
    monkeypatch.setattr(stream_routes, "MAX_STREAMS", 0)
    refused = stream(h, ADMIN, max_events=1)
    assert refused.status_code == 429 and "open event streams" in refused.json()["detail"]


@pytest.fixture
def served(make_harness: MakeHarness) -> Iterator[tuple[Harness, str]]:
    """The harness's app under a real uvicorn on 127.0.0.1 (TestClient reads a response to its end)."""
    h = make_harness()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(h.server.app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout_s=10)
    yield h, f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_a_stream_tells_of_a_change_at_once_and_closes_when_the_client_goes(served: tuple[Harness, str]) -> None:
    h, url = served
    app = h.server.app
    with (
        httpx.Client(base_url=url, headers=h.as_(ADMIN), timeout=10) as client,
        client.stream("GET", "/v1/events/stream") as response,
    ):
        lines = response.iter_lines()
        assert next(line for line in lines if line.startswith("data:")) == 'data: {"last_event_id": 0}'
        assert app.state.event_streams == 1
        submitted = time.monotonic()
        h.submit()
        assert next(line for line in lines if line.startswith("data:")) != 'data: {"last_event_id": 0}'
        assert time.monotonic() - submitted < 2 * stream_routes.POLL_S + 1.0
    wait_for(lambda: app.state.event_streams == 0, timeout_s=5)  # the server noticed and ended the stream


def test_one_tenant_holding_its_streams_does_not_lock_out_the_others(
    served: tuple[Harness, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25: one tenant could hold all the server's streams (64) and every other caller got 429. Now a tenant
    (and the admin) holds at most ``MAX_STREAMS_PER_TENANT``; here 2 of a server's 5."""
    monkeypatch.setattr(stream_routes, "MAX_STREAMS", 5)
    monkeypatch.setattr(stream_routes, "MAX_STREAMS_PER_TENANT", 2)
    h, url = served
    a, b = tenant_token(h, "team-a"), tenant_token(h, "team-b")
    app = h.server.app
    with httpx.Client(base_url=url, timeout=10) as client:
        lines: list[Iterator[str]] = []  # kept: an iterator dropped half-read closes its connection

        def open_stream(token: str) -> Any:
            request = client.build_request("GET", "/v1/events/stream", headers=h.as_(token))
            response = client.send(request, stream=True)
            if response.status_code == 200:
                lines.append(response.iter_lines())
                assert next(line for line in lines[-1] if line.startswith("data:"))
            return response

        held = [open_stream(a), open_stream(a)]
        assert [r.status_code for r in held] == [200, 200]
        refused = open_stream(a)
        assert refused.status_code == 429  # the server's 64 were all a tenant's before
        refused.read()
        assert "tenant team-a's 2 open event streams" in refused.json()["detail"]
        others = [open_stream(b), open_stream(ADMIN)]  # the others still get theirs
        assert [r.status_code for r in others] == [200, 200]
        assert app.state.event_streams == 4 and app.state.event_streams_of == {"team-a": 2, "team-b": 1, "(admin)": 1}
        held.pop().close()
        wait_for(lambda: app.state.event_streams_of.get("team-a") == 1, timeout_s=5)
        again = open_stream(a)  # a slot given back is a slot to take
        assert again.status_code == 200
        for response in [*held, *others, again]:
            response.close()
    wait_for(lambda: app.state.event_streams == 0 and app.state.event_streams_of == {}, timeout_s=5)


def test_a_stream_slot_is_given_back_once_also_when_its_body_never_ran() -> None:
    app = types.SimpleNamespace(state=types.SimpleNamespace())
    release = stream_routes.take_stream_slot(app, "team-a")
    assert app.state.event_streams == 1 and app.state.event_streams_of == {"team-a": 1}
    release()
    release()  # the body's ``finally`` and the finalizer of a body dropped unstarted: counted once
    assert app.state.event_streams == 0 and app.state.event_streams_of == {}

    # The route's own response, dropped before its body started (a client gone before the first byte).
    routes = stream_routes.router(None).routes  # type: ignore[arg-type]  # the context is read by the body only
    route = next(r for r in routes if getattr(r, "path", "") == "/events/stream")
    request = types.SimpleNamespace(app=app)
    caller = Principal("team-a", is_admin=False)
    response = asyncio.run(route.endpoint(request=request, caller=caller))  # type: ignore[attr-defined]
    assert app.state.event_streams_of == {"team-a": 1}
    del response
    gc.collect()
    assert app.state.event_streams == 0 and app.state.event_streams_of == {}


def test_docs_and_redoc_load_only_local_assets(make_harness: MakeHarness) -> None:
    h = make_harness()
    for page in ("/docs", "/redoc"):
        html = h.http.get(page).text
        urls = re.findall(r'(?:src|href)="([^"]+)"|url: *\'([^\']+)\'', html)
        found = [u for pair in urls for u in pair if u]
        assert found and all(u.startswith("/") for u in found), (page, found)
        assert "//" not in html.replace("://127.0.0.1", ""), page  # nothing from another host, fonts included
        for asset in (u for u in found if u.startswith(web.DOCS_ASSETS)):
            assert h.http.get(asset).status_code == 200, asset


def test_the_openapi_document_declares_the_bearer_scheme_without_changing_auth(make_harness: MakeHarness) -> None:
    h = make_harness()
    doc = h.server.app.openapi()
    assert doc["components"]["securitySchemes"]["bearer"] == {
        "type": "http",
        "scheme": "bearer",
        "description": "a token from `tessera up` (admin) or `tessera token create` (tenant)",
    }
    for path, operations in doc["paths"].items():
        for operation in operations.values():
            if path.startswith("/v1/"):
                assert operation["security"] == [{"bearer": []}], path
                assert "authorization" not in {p["name"].lower() for p in operation.get("parameters", [])}, path
    assert doc["paths"]["/metrics"]["get"]["security"] == [{}, {"bearer": []}]
    assert "/docs" not in doc["paths"] and "/ui" not in doc["paths"]
    assert h.http.get("/v1/queues").status_code == 401
    assert h.http.get("/v1/queues", headers=h.as_(ADMIN)).status_code == 200


def test_the_dashboard_files_are_served_and_fetch_nothing_from_elsewhere(make_harness: MakeHarness) -> None:
    h = make_harness()
    assert h.http.get("/ui", follow_redirects=False).status_code in (307, 308)
    index = h.http.get("/ui/")
    assert index.status_code == 200 and "<title>Tessera</title>" in index.text
    for name in ("index.html", "app.js", "style.css"):
        text = h.http.get(f"/ui/{name}").text
        assert text
        external = set(re.findall(r"(?:https?:)?//[A-Za-z0-9.-]+\.[A-Za-z]{2,}", text)) - {"http://www.w3.org"}
        assert not external, (name, external)  # the SVG namespace is a name, not a request
    code = (web.DASHBOARD / "app.js").read_text()
    assert not re.search(r"\.(innerHTML|outerHTML)\s*=|insertAdjacentHTML|document\.write", code)  # text nodes only
