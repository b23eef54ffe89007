"""``TesseraClient``: the API over httpx, one method per route. Errors become ``ApiError`` with the server's one-line
detail (and the field it names), or a clear line when the server cannot be reached.

Responses are read with the wire types of ``tessera.api`` where the SDK interprets them (``health``,
``api_version``, ``follow_logs``); the other methods hand back the JSON as the server sent it. pydantic and the wire
types load with the first of those calls, so that a command that only lists (``tessera jobs``) starts without them."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import httpx

from tessera.client.errors import ApiError

if TYPE_CHECKING:
    from pydantic import BaseModel

    from tessera.api import Health

__all__ = ["ApiError", "TesseraClient", "wait_healthy"]

Body = TypeVar("Body", bound="BaseModel")
HISTORY_PAGE = 1000  # records per page of GET /v1/history (its largest limit)


class TesseraClient:
    def __init__(
        self, url: str, token: str | None, *, timeout_s: float = 30.0, transport: httpx.BaseTransport | None = None
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> TesseraClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        if "json" in kwargs and (where := non_finite_at(kwargs["json"])) is not None:
            field, value = where  # JSON has no NaN or infinity: say which field, as the server would
            raise ApiError(0, f"{field}: must be a finite number, not {value}", field)
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise ApiError(
                0, f"cannot reach the Tessera server at {self.url} ({exc}); is `tessera up` running?"
            ) from None
        if response.is_success:
            return response.json()
        try:
            body = response.json()
        except ValueError:
            body = {}
        detail = body.get("detail") if isinstance(body, dict) else None
        if not isinstance(detail, str):
            detail = f"HTTP {response.status_code}: {response.text[:200]}"
        raise ApiError(response.status_code, detail, body.get("field") if isinstance(body, dict) else None)

    def _parse(self, model: type[Body], data: object) -> Body:
        """``data`` read as ``model``; a body that does not fit is an ``ApiError`` (a server of another version)."""
        from pydantic import ValidationError

        try:
            return model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise ApiError(0, f"unexpected {model.__name__} from {self.url}: {where}: {first['msg']}") from None

    def health(self) -> Health:
        """``GET /healthz``: ready, the GPUs and the server's API version (an ``ApiError`` with 503 while starting)."""
        from tessera.api import Health

        return self._parse(Health, self._call("GET", "/healthz"))

    def api_version(self) -> str:
        """The server's ``API_VERSION`` (compare with ``tessera.api.API_VERSION``, the SDK's own)."""
        return self.health().api_version

    def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/v1/workloads", json=spec)
        return result

    def workloads(
        self,
        states: list[str] | None = None,
        queue: str | None = None,
        name: str | None = None,
        array: int | None = None,
    ) -> list[dict[str, Any]]:
        """All visible workloads (paged through), optionally of some states, one queue, one name or one array."""
        out: list[dict[str, Any]] = []
        after = 0
        while True:
            params: dict[str, Any] = {"limit": 10_000, "after": after}
            if states:
                params["state"] = states
            if queue:
                params["queue"] = queue
            if name is not None:
                params["name"] = name
            if array is not None:
                params["array"] = array
            page: list[dict[str, Any]] = self._call("GET", "/v1/workloads", params=params)
            out.extend(page)
            if len(page) < 10_000:
                return out
            after = page[-1]["id"]

    def workload(self, workload_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/workloads/{workload_id}")
        return result

    def events(self, workload_id: int) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", f"/v1/workloads/{workload_id}/events")
        return result

    def cancel(self, workload_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/v1/workloads/{workload_id}/cancel")
        return result

    def hold(self, workload_id: int) -> dict[str, Any]:
        """Keep a pending workload from being scheduled (``ApiError`` 409 when it is not pending)."""
        result: dict[str, Any] = self._call("POST", f"/v1/workloads/{workload_id}/hold")
        return result

    def release(self, workload_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/v1/workloads/{workload_id}/release")
        return result

    def logs(self, workload_id: int, offset: int = 0, *, tail: int | None = None, rank: int = 0) -> dict[str, Any]:
        """One chunk of the log (``LogChunk``'s fields) from ``offset``, or from the start of its last ``tail``
        lines; of a multi-worker job's rank ``rank`` (0: the workload's log). A chunk holds whole UTF-8 characters:
        its bytes go from ``offset`` to ``next_offset``."""
        params: dict[str, Any] = {"offset": offset}
        if tail is not None:
            params["tail"] = tail
        if rank != 0:  # only then: a server from before ranks answers rank 0's log as ever
            params["rank"] = rank
        result: dict[str, Any] = self._call("GET", f"/v1/workloads/{workload_id}/logs", params=params)
        return result

    def read_logs(self, workload_id: int, *, tail: int | None = None, rank: int = 0) -> Iterator[str]:
        """The log (of rank ``rank``) as it is now (from its last ``tail`` lines when given), chunk by chunk,
        without waiting."""
        from tessera.api import LogChunk

        chunk = self._parse(LogChunk, self.logs(workload_id, tail=tail, rank=rank))
        while chunk.data:
            yield chunk.data
            chunk = self._parse(LogChunk, self.logs(workload_id, chunk.next_offset, rank=rank))

    def follow_logs(
        self, workload_id: int, poll_s: float = 0.5, *, tail: int | None = None, rank: int = 0
    ) -> Iterator[str]:
        """Log text (of rank ``rank``) as it is written, until the workload has ended and everything was read (from
        its last ``tail`` lines when given)."""
        from tessera.api import LogChunk

        chunk = self._parse(LogChunk, self.logs(workload_id, tail=tail, rank=rank))
        while True:
            if chunk.data:
                yield chunk.data
            elif chunk.finished:
                return
            else:
                time.sleep(poll_s)
            chunk = self._parse(LogChunk, self.logs(workload_id, chunk.next_offset, rank=rank))

    def nodes(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/v1/nodes")
        return result

    def queues(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/v1/queues")
        return result

    def put_queue(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create or replace a queue (admin only; ``QueueIn``'s fields)."""
        result: dict[str, Any] = self._call("POST", "/v1/queues", json=body)
        return result

    def delete_queue(self, name: str) -> dict[str, Any]:
        """Delete a queue (admin only); refused (409) while workloads wait or run in it. Returns what it was."""
        result: dict[str, Any] = self._call("DELETE", f"/v1/queues/{name}")
        return result

    def queue_usage(
        self, *, queue: str | None = None, window_s: float | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        """Each queue's GPU usage over time (``QueueUsageHistory``: ``{"now", "period_s", "window_s", "max_points",
        "queues": [{"queue", "tenant", "points": [{"at", "gpu_milli", "borrowed_milli", "nominal_milli"}]}]}``),
        sampled by the server; ``window_s``: only the last seconds; ``limit``: the newest N points per queue."""
        params = {k: v for k, v in (("queue", queue), ("window_s", window_s), ("limit", limit)) if v is not None}
        result: dict[str, Any] = self._call("GET", "/v1/queues/usage", params=params)
        return result

    def history(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        states: list[str] | None = None,
        queue: str | None = None,
        tenant: str | None = None,
    ) -> list[dict[str, Any]]:
        """Accounting records (``HistoryOut``), oldest first, paged through: the workloads whose life (submitted to
        ended, or now) overlaps ``since``..``until`` (seconds since the epoch), of ``states``, ``queue``, ``tenant``
        (an admin's filter; a tenant sees only its own)."""
        params: dict[str, Any] = {k: v for k, v in (("since", since), ("until", until)) if v is not None}
        if states:
            params["state"] = states
        if queue:
            params["queue"] = queue
        if tenant:
            params["tenant"] = tenant
        out: list[dict[str, Any]] = []
        after = 0
        while True:
            page: list[dict[str, Any]] = self._call("GET", "/v1/history", params={**params, "after": after})
            out.extend(page)
            if len(page) < HISTORY_PAGE:
                return out
            after = page[-1]["id"]

    def usage(
        self,
        *,
        since: float | None = None,
        until: float | None = None,
        queue: str | None = None,
        tenant: str | None = None,
    ) -> list[dict[str, Any]]:
        """Per-tenant totals (``UsageOut``: workloads, GPU-hours, ...) of what ``history`` lists for the same
        filters."""
        given = (("since", since), ("until", until), ("queue", queue), ("tenant", tenant))
        params = {k: v for k, v in given if v is not None}
        result: list[dict[str, Any]] = self._call("GET", "/v1/history/totals", params=params)
        return result

    def config(self) -> dict[str, Any]:
        """The scheduler the server runs: its preset, placement and every knob (``GET /v1/config``)."""
        result: dict[str, Any] = self._call("GET", "/v1/config")
        return result

    def create_token(self, tenant: str, label: str = "") -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/v1/tokens", json={"tenant": tenant, "label": label})
        return result

    def tokens(self) -> list[dict[str, Any]]:
        """Every stored token, without secrets (admin only)."""
        result: list[dict[str, Any]] = self._call("GET", "/v1/tokens")
        return result

    def revoke_token(self, token_id: int) -> dict[str, Any]:
        """Revoke token ``token_id`` (admin only); returns what it was."""
        result: dict[str, Any] = self._call("DELETE", f"/v1/tokens/{token_id}")
        return result

    # ------------------------------------------------------------------------------------------------- models
    def deploy_model(self, body: dict[str, Any]) -> dict[str, Any]:
        """Deploy a model (``POST /v1/models``); returns it as ``models()`` lists it."""
        result: dict[str, Any] = self._call("POST", "/v1/models", json=body)
        return result

    def models(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/v1/models")
        return result

    def model(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/v1/models/{name}")
        return result

    def model_stats(self, name: str) -> dict[str, Any]:
        """A model's recent requests against its SLO, its replicas over time and its setup (``GET
        /v1/models/NAME/stats``; ``tessera.api.serving_stats.ModelStatsOut``)."""
        result: dict[str, Any] = self._call("GET", f"/v1/models/{name}/stats")
        return result

    def delete_model(self, name: str) -> dict[str, Any]:
        """Delete a model: its replicas stop, then it is gone."""
        result: dict[str, Any] = self._call("DELETE", f"/v1/models/{name}")
        return result


def non_finite_at(body: object, where: str = "") -> tuple[str, float] | None:
    """The first NaN or infinity in a JSON body, as (dotted field, value); None when there is none."""
    if isinstance(body, float) and not math.isfinite(body):
        return where or "body", body
    items = body.items() if isinstance(body, dict) else enumerate(body) if isinstance(body, list | tuple) else ()
    for key, value in items:
        found = non_finite_at(value, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def wait_healthy(url: str, timeout_s: float = 30.0, exit_code: Callable[[], int | None] = lambda: None) -> None:
    """Wait until ``GET {url}/healthz`` answers 200 (a server just started). ``exit_code`` reports the server
    process's exit code, or None while it runs; raises ``RuntimeError`` if it exits first and ``TimeoutError`` when
    ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        code = exit_code()
        if code is not None:
            raise RuntimeError(f"the server exited with {code}")
        try:
            if httpx.get(url + "/healthz", timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} not ready after {timeout_s:.0f} s")
