"""The SLO class as the engine's request priority: the ``priority`` field the gateway puts into a forwarded body.

An engine that Tessera starts with priority scheduling (vLLM and the sim engine, ``--scheduling-policy priority``:
``engine_exec.PRIORITY_ENGINES``) serves a lower ``priority`` earlier. The gateway sends each request's class as
``SloClass.engine_priority`` (interactive 0, standard 1, batch 2). A client's own ``priority`` may lower its urgency
(a larger number stands), never raise it above its class: a smaller one is replaced by the class's, and one that is
no integer is refused (400 naming ``priority``); a ``null`` one is the class's. Under a serving setup that does not
order engines' queues by class (``PolicySetup.engine_priority`` off, as ``static``) no field is added, and a
client's own priority is held to 0, the engines' default, the same way.

The body stays the client's bytes: without a ``priority`` of the client's, ``"priority":N`` is spliced in before
the object's closing brace (one copy of the body, no re-encoding: the parse already proved the body one JSON
object, so its last ``}`` closes it, since only whitespace may follow and no UTF-8 multi-byte sequence contains that
byte). Only a client's too-urgent ``priority`` makes the body be encoded again (one key of that name then, its
value the class's).
"""

from __future__ import annotations

import json

from tessera.serving.engines.openai_wire import OpenAIRequest
from tessera.serving.policies.requests import SloClass

FIELD = "priority"
_WHITESPACE = b" \t\r\n"


class PriorityError(ValueError):
    """The client's ``priority`` is no integer."""


def forwarded_body(body: bytes, parsed: OpenAIRequest, slo: SloClass | None) -> bytes:
    """``body`` (which ``parsed`` was parsed from) with the request priority of class ``slo`` (see the module
    docstring); ``PriorityError`` when the client's own ``priority`` is no integer. ``slo`` None: the serving setup
    does not order engines' queues by class: no field is added (the engine serves every request at its default, 0),
    and a client's own priority may still not be below 0."""
    extra = parsed.model_extra or {}
    wanted = slo.engine_priority if slo is not None else 0
    if FIELD not in extra:
        return splice_priority(body, wanted) if slo is not None else body
    own = extra[FIELD]
    if own is not None and (not isinstance(own, int) or isinstance(own, bool)):
        raise PriorityError(f"priority: must be an integer, got {json.dumps(own)[:50]}")
    if own is not None and own >= wanted:  # as urgent as its class or less: the client's own value stands
        return body
    obj = json.loads(body)
    obj[FIELD] = wanted
    return json.dumps(obj, separators=(",", ":")).encode()  # ASCII: a lone surrogate escaped in it stays escaped


def splice_priority(body: bytes, priority: int) -> bytes:
    """``body``, a JSON object with no ``priority`` member, with ``"priority":priority`` added as its last member."""
    end = body.rfind(b"}")
    if end < 0:
        raise ValueError("the body is not a JSON object")
    before = end - 1
    while before >= 0 and body[before] in _WHITESPACE:
        before -= 1
    comma = b"" if before >= 0 and body[before] == 0x7B else b","  # 0x7B: "{", the object is empty
    return b'%b%b"priority":%d%b' % (body[:end], comma, priority, body[end:])
