"""The sim engine's OpenAI-compatible API over ``http_lite``: what ``sim_server`` serves.

Routes: ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``; ``GET /v1/models``, ``/health``,
``/metrics`` (vLLM's metric names, so that the gateway scrapes the sim and vLLM alike); ``POST /sleep``,
``POST /wake_up`` and ``GET /is_sleeping`` (vLLM's sleep-mode endpoints). Tokens are counted as a byte-pair
tokenizer would (``sim_tokens``: the prompt's ``usage.prompt_tokens`` and the engine model's prefill alike); text is
deterministic: output token i of a choice is a word picked from the prompt's CRC-32, the choice and i, one token per
streamed chunk. ``n`` choices are ``n`` sequences in the engine model (the prompt prefilled for each); with
``stream_options.include_usage`` the stream ends with a usage chunk, and with ``continuous_usage_stats`` too every
chunk carries the usage so far (of its choice), as vLLM does. Tokens leave as the engine model produces them
(``sim_live``); a client that disconnects cancels its request in the model. With an API key (``SimSettings.api_key``:
a replica on a TCP port of its node) every route, ``/health`` included, answers 401 unless the request carries
``Authorization: Bearer <key>`` (compared in constant time). Started with ``--scheduling-policy priority``, the
engine model orders its queue by each request's ``priority`` read as an SLO class (``SloClass.of_engine_priority``:
what the gateway puts there), as the twin's engine does with ``engine_priority``; without, it ignores the field.
"""

from __future__ import annotations

import hmac
import json
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from tessera.serving.engines.http_lite import HttpConnection, HttpRequest
from tessera.serving.engines.openai_wire import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    OpenAIRequest,
    error_body,
    parse_request,
)
from tessera.serving.engines.sim_live import LiveEngine
from tessera.serving.engines.sim_tokens import count_tokens, output_token
from tessera.serving.policies.requests import SloClass

_ROUTES: dict[str, type[OpenAIRequest]] = {
    "/v1/chat/completions": ChatRequest,
    "/v1/completions": CompletionRequest,
    "/v1/embeddings": EmbeddingRequest,
}


MAX_CHOICES = 128  # ``n`` above this is refused (400), as OpenAI's API does


@dataclass(frozen=True, slots=True)
class SimSettings:
    model: str  # the name it serves (``/v1/models``); other names get 404 as vLLM answers
    max_model_len: int = 8192  # prompt + output tokens allowed per request
    default_output_tokens: int = 16  # when the request sets no max_tokens
    embedding_dim: int = 16
    api_key: str = field(default="", repr=False)  # required of every request when set ("": none)


class _Choice:
    """One choice of a request: its sequence in the engine model hands its tokens here (a ``TokenSink``)."""

    __slots__ = ("sink", "index")

    def __init__(self, sink: _Sink, index: int) -> None:
        self.sink, self.index = sink, index

    def tokens(self, first: int, count: int) -> None:
        self.sink.tokens(self.index, first, count)

    def finished(self, refused: str) -> None:
        self.sink.finished(self.index, refused)


class _Sink:
    """One request's response, each of its ``n`` choices a sequence of its own in the engine model: streamed as SSE
    chunks (one per token of a choice, usage in each with ``continuous_usage_stats``), or whole once every choice is
    done."""

    __slots__ = (
        "conn", "stream", "chat", "seed", "head", "texts", "usage", "continuous", "prompt_tokens", "output_tokens",
        "generated", "left", "done",
    )  # fmt: skip

    def __init__(
        self, conn: HttpConnection, request: ChatRequest | CompletionRequest, head: str, prompt_tokens: int,
        outputs: int,
    ) -> None:  # fmt: skip
        self.conn = conn
        self.stream = request.stream
        self.chat = isinstance(request, ChatRequest)
        self.seed = zlib.crc32(request.prompt_text().encode())
        self.head = head  # the chunk JSON up to "choices"
        self.texts: list[list[str]] = [[] for _ in range(request.n)]
        options = request.stream_options
        self.usage = bool(options is not None and options.include_usage)
        self.continuous = bool(self.usage and options is not None and options.continuous_usage_stats)
        self.prompt_tokens = prompt_tokens
        self.output_tokens = outputs
        self.generated = [0] * request.n  # tokens handed out so far, per choice
        self.left = request.n  # choices not finished yet
        self.done = False  # answered (whole, or an error)
        if self.stream:
            conn.start_stream()

    def choices(self) -> list[_Choice]:
        return [_Choice(self, index) for index in range(len(self.texts))]

    def _usage(self, completion_tokens: int) -> str:
        prompt = self.prompt_tokens
        total = prompt + completion_tokens
        return f'"usage":{{"prompt_tokens":{prompt},"completion_tokens":{completion_tokens},"total_tokens":{total}}}'

    def tokens(self, index: int, first: int, count: int) -> None:
        if self.done:
            return
        seed = self.seed + 1009 * index
        self.generated[index] = first + count
        if not self.stream:
            self.texts[index].extend(output_token(seed, i) for i in range(first, first + count))
            return
        events: list[str] = []  # one SSE event per token (the model may hand out several after a late tick)
        for i in range(first, first + count):
            text = json.dumps(output_token(seed, i))
            if self.chat:
                role = '"role":"assistant",' if i == 0 else ""
                choice = f'{{"index":{index},"delta":{{{role}"content":{text}}},"logprobs":null,"finish_reason":null}}'
            else:
                choice = f'{{"index":{index},"text":{text},"logprobs":null,"finish_reason":null}}'
            usage = "," + self._usage(i + 1) if self.continuous else ""
            events.append(f"data: {self.head}[{choice}]{usage}}}\n\n")
        self.conn.send_chunk("".join(events).encode())

    def finished(self, index: int, refused: str) -> None:
        if self.done:
            return
        if refused:
            self.done = True
            body = error_body(refused, "BadRequestError", 400)
            if self.stream:
                self.conn.send_chunk(b"data: " + body + b"\n\ndata: [DONE]\n\n")
                self.conn.end_stream()
            else:
                self.conn.respond(400, body)
            return
        self.generated[index] = self.output_tokens
        self.left -= 1
        if self.stream:
            delta = '"delta":{},' if self.chat else '"text":"",'
            usage = "," + self._usage(self.output_tokens) if self.continuous else ""
            choice = f'{{"index":{index},{delta}"logprobs":null,"finish_reason":"length"}}'
            tail = f"data: {self.head}[{choice}]{usage}}}\n\n"
            if not self.left:
                if self.usage:
                    tail += f"data: {self.head}[],{self._usage(sum(self.generated))}}}\n\n"
                tail += "data: [DONE]\n\n"
            self.conn.send_chunk(tail.encode())
            if not self.left:
                self.done = True
                self.conn.end_stream()
            return
        if not self.left:
            self.done = True
            self._respond_whole()

    def _respond_whole(self) -> None:
        choices: list[dict[str, object]] = []
        for i, pieces in enumerate(self.texts):
            item: dict[str, object] = {"index": i, "logprobs": None, "finish_reason": "length"}
            if self.chat:
                item["message"] = {"role": "assistant", "content": "".join(pieces)}
            else:
                item["text"] = "".join(pieces)
            choices.append(item)
        whole = json.loads(self.head + "[]}")
        whole["object"] = "chat.completion" if self.chat else "text_completion"
        whole["choices"] = choices
        whole["usage"] = json.loads("{" + self._usage(sum(self.generated)) + "}")["usage"]
        self.conn.respond(200, json.dumps(whole).encode())


class _EmbeddingSink:
    __slots__ = ("conn", "model", "seed", "dim", "prompt_tokens")

    def __init__(self, conn: HttpConnection, model: str, seed: int, dim: int, prompt_tokens: int) -> None:
        self.conn, self.model, self.seed, self.dim, self.prompt_tokens = conn, model, seed, dim, prompt_tokens

    def tokens(self, first: int, count: int) -> None:
        pass

    def finished(self, refused: str) -> None:
        if refused:
            self.conn.respond(400, error_body(refused, "BadRequestError", 400))
            return
        vector = [((self.seed >> (i % 24)) % 1000) / 1000.0 for i in range(self.dim)]
        body = {
            "object": "list",
            "data": [{"object": "embedding", "index": 0, "embedding": vector}],
            "model": self.model,
            "usage": {"prompt_tokens": self.prompt_tokens, "total_tokens": self.prompt_tokens},
        }
        self.conn.respond(200, json.dumps(body).encode())


def bearer_matches(headers: Mapping[str, str], key: str) -> bool:
    """Whether the request's ``Authorization`` is ``Bearer <key>`` (a constant-time comparison of the key)."""
    scheme, _, given = headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode())


class SimApi:
    """The request handler ``http_lite.serve`` calls."""

    def __init__(self, settings: SimSettings, live: LiveEngine) -> None:
        self.settings = settings
        self.live = live
        self.sleeping = False
        self._model_json = json.dumps(settings.model)
        self._count = 0

    def __call__(self, request: HttpRequest, conn: HttpConnection) -> None:
        if self.settings.api_key and not bearer_matches(request.headers, self.settings.api_key):
            conn.respond(401, error_body("invalid or missing API key", "AuthenticationError", 401))
            return
        kind = _ROUTES.get(request.path)
        if kind is not None:
            if request.method != "POST":
                conn.respond(405, error_body("use POST", "BadRequestError", 405))
            else:
                self._infer(kind, request, conn)
            return
        path = request.path
        if path == "/health":
            conn.respond(200, b"", "text/plain")
        elif path == "/metrics":
            conn.respond(200, self.metrics().encode(), "text/plain; version=0.0.4")
        elif path == "/v1/models":
            created = int(time.time())
            item = {"id": self.settings.model, "object": "model", "created": created, "owned_by": "tessera-sim"}
            conn.respond(200, json.dumps({"object": "list", "data": [item]}).encode())
        elif path == "/is_sleeping":
            conn.respond(200, json.dumps({"is_sleeping": self.sleeping}).encode())
        elif path in ("/sleep", "/wake_up") and request.method == "POST":
            self._sleep_or_wake(path == "/sleep", conn)
        else:
            conn.respond(404, error_body(f"no route {path}", "NotFoundError", 404))

    def _sleep_or_wake(self, sleep: bool, conn: HttpConnection) -> None:
        running, waiting, _ = self.live.stats()
        if sleep and running + waiting:
            conn.respond(409, error_body("requests in flight: drain before sleep", "ConflictError", 409))
            return
        self.sleeping = sleep
        conn.respond(200, b"", "text/plain")

    def _infer(self, kind: type[OpenAIRequest], http: HttpRequest, conn: HttpConnection) -> None:
        parsed = parse_request(kind, http.body)
        if isinstance(parsed, tuple):
            message, param = parsed
            conn.respond(400, error_body(message, "BadRequestError", 400, param))
            return
        settings = self.settings
        if parsed.model != settings.model:
            message = f"The model `{parsed.model}` does not exist."
            conn.respond(404, error_body(message, "NotFoundError", 404, "model"))
            return
        if self.sleeping:
            conn.respond(503, error_body("the engine is asleep: POST /wake_up first", "ServiceUnavailable", 503))
            return
        prompt_tokens = count_tokens(parsed.prompt_text())
        outputs = parsed.output_limit() or settings.default_output_tokens
        if not isinstance(parsed, EmbeddingRequest) and parsed.n > MAX_CHOICES:
            message = f"n: at most {MAX_CHOICES} choices, got {parsed.n}"
            conn.respond(400, error_body(message, "BadRequestError", 400, "n"))
            return
        if prompt_tokens + outputs > min(settings.max_model_len, self.live.max_tokens):
            limit = min(settings.max_model_len, self.live.max_tokens)
            message = (
                f"This model's maximum context length is {limit} tokens. However, you requested"
                f" {prompt_tokens + outputs} tokens ({prompt_tokens} in the messages, {outputs} in the completion)."
            )
            conn.respond(400, error_body(message, "BadRequestError", 400, "max_tokens"))
            return
        slo = self._slo(parsed)
        if slo is None:
            conn.respond(400, error_body("priority: must be an integer", "BadRequestError", 400, "priority"))
            return
        self._count += 1
        if isinstance(parsed, EmbeddingRequest):
            seed = zlib.crc32(parsed.prompt_text().encode())
            sink = _EmbeddingSink(conn, settings.model, seed, settings.embedding_dim, prompt_tokens)
            rid = self.live.submit(prompt_tokens, 1, sink, slo)
            if self.live.is_live(rid):  # not refused at once: a disconnect from now on cancels it
                conn.on_close = lambda: self.live.cancel(rid)
            return
        prefix = "chatcmpl" if isinstance(parsed, ChatRequest) else "cmpl"
        obj = "chat.completion.chunk" if isinstance(parsed, ChatRequest) else "text_completion"
        head = (
            f'{{"id":"{prefix}-{self._count:x}","object":"{obj}","created":{int(time.time())},'
            f'"model":{self._model_json},"choices":'
        )
        answer = _Sink(conn, parsed, head, prompt_tokens, outputs)
        rids = [self.live.submit(prompt_tokens, outputs, choice, slo) for choice in answer.choices()]
        live = [rid for rid in rids if self.live.is_live(rid)]
        if live:  # not all refused at once: a disconnect from now on cancels them

            def cancel() -> None:
                for rid in live:
                    self.live.cancel(rid)

            conn.on_close = cancel

    def _slo(self, parsed: OpenAIRequest) -> SloClass | None:
        """The class the engine model orders the request by: with priority scheduling, its ``priority`` (0 when it
        has none, as in vLLM) read as a class; else standard for all (arrival order). None: no integer."""
        if not self.live.engine.config.priority:
            return SloClass.STANDARD
        priority = (parsed.model_extra or {}).get("priority", 0)
        if priority is None:
            priority = 0
        if not isinstance(priority, int) or isinstance(priority, bool):
            return None
        return SloClass.of_engine_priority(priority)

    def metrics(self) -> str:
        running, waiting, usage = self.live.stats()
        counters = self.live.counters
        label = f"{{model_name={self._model_json}}}"
        config = self.live.engine.config
        cache = f'{{block_size="{config.block_tokens}",num_gpu_blocks="{config.kv_blocks}"}}'
        lines = [
            "# TYPE vllm:cache_config_info gauge",
            f"vllm:cache_config_info{cache} 1",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{label} {running}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{label} {waiting}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{label} {usage:.6f}",
            "# TYPE vllm:num_preemptions_total counter",
            f"vllm:num_preemptions_total{label} {self.live.engine.preemptions}",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{label} {counters.prompt_tokens}",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{label} {counters.generation_tokens}",
            "# TYPE vllm:request_success_total counter",
            f"vllm:request_success_total{label} {counters.requests_finished}",
            "# TYPE tessera_sim:requests_cancelled_total counter",
            f"tessera_sim:requests_cancelled_total{label} {counters.requests_cancelled}",
            "# TYPE tessera_sim:is_sleeping gauge",
            f"tessera_sim:is_sleeping{label} {int(self.sleeping)}",
        ]
        return "\n".join(lines) + "\n"
