"""OpenAI's wire format, the part the sim engine and the gateway both read: request bodies, and errors.

The request models accept what the OpenAI API accepts and keep the fields they do not name (``extra="allow"``): the
gateway forwards the client's own bytes upstream and only reads the model, ``stream`` and the sizes it routes by.
Errors use OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``; a malformed body names the field
(its dotted path) in ``param`` and in the message.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

CHARS_PER_TOKEN = 4  # the prompt-size estimate when no tokenizer is at hand (English text averages ~4 characters)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(_Open):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage in every chunk too (with include_usage)


class ChatMessage(_Open):
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(_Open):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1)  # choices to generate

    def prompt_text(self) -> str:
        parts: list[str] = []
        for message in self.messages:
            if isinstance(message.content, str):
                parts.append(message.content)
            elif message.content:
                parts.extend(str(p.get("text", "")) for p in message.content)
        return "\n".join(parts)

    def output_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


_Prompt = str | list[str] | list[int] | list[list[int]]


class CompletionRequest(_Open):
    model: str
    prompt: _Prompt
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    n: int = Field(default=1, ge=1)  # choices to generate

    def prompt_text(self) -> str:
        return _text_of(self.prompt)

    def output_limit(self) -> int | None:
        return self.max_tokens


class EmbeddingRequest(_Open):
    model: str
    input: _Prompt

    def prompt_text(self) -> str:
        return _text_of(self.input)

    def output_limit(self) -> int | None:
        return 1

    @property
    def stream(self) -> bool:
        return False

    @property
    def n(self) -> int:
        return 1


OpenAIRequest = ChatRequest | CompletionRequest | EmbeddingRequest


def _text_of(prompt: _Prompt) -> str:
    if isinstance(prompt, str):
        return prompt
    return " ".join(x if isinstance(x, str) else str(x) for x in prompt)


def estimate_tokens(text: str) -> int:
    return max(1, -(-len(text) // CHARS_PER_TOKEN))


def error_body(message: str, kind: str, code: int | str | None, param: str | None = None) -> bytes:
    """OpenAI's error JSON (``kind``: ``invalid_request_error``, ...; ``code``: ``model_not_found``, ... or the
    HTTP status, as vLLM puts it)."""
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": code}}).encode()


def validation_error(exc: ValidationError) -> tuple[str, str]:
    """(message, param) of a pydantic error: the first problem, its field as a dotted path."""
    first = exc.errors()[0]
    param = ".".join(str(part) for part in first["loc"]) or "body"
    return f"{param}: {first['msg']}", param


def parse_request(kind: type[OpenAIRequest], body: bytes) -> OpenAIRequest | tuple[str, str]:
    """The request, or (message, param) naming what is wrong with the body."""
    try:
        return kind.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors()
        if errors and errors[0]["type"] == "json_invalid":
            return f"the body is not valid JSON: {errors[0]['msg']}", "body"
        if errors and errors[0]["type"] == "model_type":
            return "the body must be a JSON object", "body"
        return validation_error(exc)
