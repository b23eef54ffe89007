"""``HttpxUpstream``: the gateway's upstream seam (``upstream.Upstream``) over an ``httpx.AsyncClient``, so that
tests drive the gateway through httpx's mock transport."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from tessera.serving.gateway.upstream import UpstreamError, UpstreamResponse


class _HttpxResponse:
    closes_at_once = False
    complete = False  # its last piece is not known as such: the end goes in a write of its own

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.status = response.status_code
        self.content_type = response.headers.get("content-type", "application/json")
        length = response.headers.get("content-length")
        self.content_length = int(length) if length is not None else None

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_raw():
                if chunk:
                    yield chunk
        except httpx.HTTPError as exc:
            raise UpstreamError(str(exc)) from exc

    async def close(self) -> None:
        await self._response.aclose()


def _auth(api_key: str | None) -> dict[str, str]:
    return {} if api_key is None else {"authorization": f"Bearer {api_key}"}


class HttpxUpstream:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def call(
        self,
        method: str,
        base_url: str,
        path: str,
        body: bytes = b"",
        peer_pid: int | None = None,
        api_key: str | None = None,
    ) -> tuple[int, bytes]:
        try:
            response = await self.client.request(method, base_url + path, content=body or None, headers=_auth(api_key))
        except httpx.HTTPError as exc:
            raise UpstreamError(f"{type(exc).__name__}: {exc}") from exc
        return response.status_code, response.content

    def forget(self, base_url: str) -> None:
        pass  # httpx's pool closes what it no longer uses

    async def post(
        self, base_url: str, path: str, body: bytes, peer_pid: int | None = None, api_key: str | None = None
    ) -> UpstreamResponse:
        headers = {"content-type": "application/json", **_auth(api_key)}
        request = self.client.build_request("POST", base_url + path, content=body, headers=headers)
        try:
            return _HttpxResponse(await self.client.send(request, stream=True))
        except httpx.HTTPError as exc:
            raise UpstreamError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        await self.client.aclose()
