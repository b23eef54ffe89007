"""The OpenAI request bodies: what is accepted, and errors that name the field."""

from __future__ import annotations

import json

from tessera.serving.engines.openai_wire import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    error_body,
    estimate_tokens,
    parse_request,
)


def test_a_chat_body_keeps_unknown_fields_and_reads_the_output_limit() -> None:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hello"}], "temperature": 0, "max_tokens": 7}'
    parsed = parse_request(ChatRequest, body)
    assert isinstance(parsed, ChatRequest)
    assert parsed.output_limit() == 7 and not parsed.stream and parsed.prompt_text() == "hello"
    assert parsed.model_extra == {"temperature": 0}
    newer = parse_request(
        ChatRequest, b'{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":3}'
    )
    assert isinstance(newer, ChatRequest) and newer.output_limit() == 3


def test_content_parts_and_prompt_lists_are_read_as_text() -> None:
    body = (
        b'{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}'
    )
    parsed = parse_request(ChatRequest, body)
    assert isinstance(parsed, ChatRequest) and parsed.prompt_text() == "a\nb"
    completion = parse_request(CompletionRequest, b'{"model":"m","prompt":["x","y"]}')
    assert isinstance(completion, CompletionRequest) and completion.prompt_text() == "x y"
    embedding = parse_request(EmbeddingRequest, b'{"model":"m","input":[1,2,3]}')
    assert isinstance(embedding, EmbeddingRequest) and embedding.output_limit() == 1 and not embedding.stream


def test_errors_name_the_field() -> None:
    assert parse_request(ChatRequest, b'{"messages": []}') == ("model: Field required", "model")
    message, param = parse_request(ChatRequest, b'{"model": "m", "messages": []}')
    assert param == "messages" and "at least 1" in message
    message, param = parse_request(ChatRequest, b'{"model":"m","messages":[{"content":"x"}]}')
    assert param == "messages.0.role"
    _, param = parse_request(ChatRequest, b'{"model":"m","messages":[{"role":"u"}],"max_tokens":0}')
    assert param == "max_tokens"
    assert parse_request(ChatRequest, b"{nope")[1] == "body"  # type: ignore[index]
    assert parse_request(ChatRequest, b"[1]") == ("the body must be a JSON object", "body")


def test_the_error_body_has_openais_shape() -> None:
    error = json.loads(error_body("gone", "invalid_request_error", "model_not_found", "model"))["error"]
    assert error == {"message": "gone", "type": "invalid_request_error", "param": "model", "code": "model_not_found"}


def test_the_token_estimate_is_four_characters_a_token_and_at_least_one() -> None:
    assert (estimate_tokens(""), estimate_tokens("abcd"), estimate_tokens("abcde")) == (1, 1, 2)
