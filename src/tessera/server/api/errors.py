"""The API's error responses: always JSON (an ``ErrorOut``), whatever the request held, naming the field as the user
wrote it.

Two traps are avoided here. A validation error carries the input it refused; Python's JSON reader accepts ``NaN``,
``Infinity`` and lone UTF-16 surrogates (``"\\ud800"``), which the JSON writer then cannot write, so rendering the
422 itself failed with a plain-text 500. And pydantic locates an error inside a union by the branch it tried
(``cpu.int``, ``cpu.constrained-str``); the user wrote ``cpu``. ``field_of`` walks the error's location through the
body actually sent and keeps only the keys and indices that are in it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

WHERE = ("body", "query", "path", "header", "cookie")
MAX_TEXT = 200  # characters of an input echoed back in ``errors``
MAX_ITEMS = 20  # items of a list or dict echoed back


def json_safe(value: object, *, cut: bool = False) -> object:
    """``value`` with what JSON cannot carry made printable: non-finite floats as text, unencodable characters
    escaped, other objects as their ``str``; the ``input`` echoed by a validation error is cut short (``cut``)."""
    if isinstance(value, dict):
        pairs = [(k, v) for k, v in value.items() if k != "ctx"]
        return {
            str(json_safe(k)): json_safe(v, cut=cut or k == "input") for k, v in pairs[: MAX_ITEMS if cut else None]
        }
    if isinstance(value, list | tuple):
        items = [json_safe(v, cut=cut) for v in (value[:MAX_ITEMS] if cut else value)]
        return items + ["..."] if cut and len(value) > MAX_ITEMS else items
    if isinstance(value, bool) or value is None or isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    text = value if isinstance(value, str) else str(value)
    if cut and len(text) > MAX_TEXT:
        text = text[:MAX_TEXT] + "..."
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def field_of(loc: Sequence[Any], body: object, *, missing: bool = False) -> str:
    """The dotted name of the field at ``loc`` as the user wrote it: the parts of ``loc`` that are keys or indices
    of ``body`` (and, for a ``missing`` error, the key it names last); union branches and validator tags are left
    out."""
    parts = list(loc)
    if parts and parts[0] in WHERE:
        if parts[0] != "body":
            return ".".join(str(p) for p in parts[1:]) or str(parts[0])
        parts = parts[1:]
    names: list[str] = []
    node = body
    for index, part in enumerate(parts):
        inside = isinstance(node, dict) and part in node
        if inside or (isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)):
            node = node[part]  # type: ignore[index]  # a dict or a list, checked above
        elif missing and isinstance(node, dict) and index == len(parts) - 1:
            pass  # the required key that is missing
        else:
            break
        names.append(str(part))
    return ".".join(names) or "body"


def _field(error: dict[str, Any], body: object) -> str:
    return field_of(error.get("loc", ()), body, missing=error.get("type") == "missing")


def _best(errors: Sequence[dict[str, Any]], field: str, body: object) -> dict[str, Any]:
    """Of the errors at ``field`` (one per union branch), the one that says most: a bound or a check over a type
    mismatch with one of the other branches."""
    same = [e for e in errors if _field(e, body) == field]
    telling = [e for e in same if not str(e.get("type", "")).endswith("_type")]
    return (telling or same or list(errors) or [{}])[0]


async def invalid_body(_: Request, exc: RequestValidationError) -> JSONResponse:
    errors = list(exc.errors())
    body = exc.body
    first = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        field = "body"  # its loc is a character offset
    else:
        field = _field(first, body)
        first = _best(errors, field, body)
    message = json_safe(first.get("msg", "invalid"))
    content = {"detail": f"{field}: {message}", "field": field, "errors": json_safe(errors)}
    return JSONResponse(status_code=422, content=content)


class CatchAll:
    """Any exception a route did not expect: logged with its traceback and answered as a JSON 500 (never plain
    text). It is not raised further: Starlette's own last-resort handler would re-raise it after answering, and
    uvicorn then closes the connection, so the client's next request on it fails."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception:
            if started:
                raise  # too late for another answer
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            response = JSONResponse(status_code=500, content={"detail": "internal error (logged by the server)"})
            await response(scope, receive, send)
