"""The sim engine's OpenAI API, driven in-process through its HTTP parser (no socket, no subprocess)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

from sim_harness import connect, exchange, get, make_api, parse_responses, post

from tessera.serving.engine_exec import ENGINE_KEY_ENV
from tessera.serving.engines.metrics import parse_metrics
from tessera.serving.engines.sim_server import API_KEY_ENV, parse_options
from tessera.serving.engines.sim_tokens import count_tokens, output_token

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5}


def test_a_streamed_chat_sends_one_chunk_per_token_then_the_finish_and_done() -> None:
    async def go() -> None:
        api = make_api()
        [streamed] = await exchange(api, post("/v1/chat/completions", {**CHAT, "stream": True}))
        [whole] = await exchange(api, post("/v1/chat/completions", CHAT))
        assert streamed.status == 200 and streamed.headers["content-type"] == "text/event-stream"
        events = streamed.events()
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        deltas = [c["choices"][0]["delta"] for c in chunks]
        assert deltas[0]["role"] == "assistant" and deltas[-1] == {}
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m" for c in chunks)
        text = "".join(d.get("content", "") for d in deltas)
        assert len(deltas) == 6  # five tokens, each in its own chunk (one per engine iteration), and the finish
        assert text == whole.json()["choices"][0]["message"]["content"]  # deterministic text
        assert whole.json()["usage"]["completion_tokens"] == 5

    asyncio.run(go())


def test_completions_embeddings_and_usage_chunks() -> None:
    async def go() -> None:
        api = make_api()
        body = {
            "model": "m",
            "prompt": "abc",
            "max_tokens": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        completion, embedding = await exchange(
            api, post("/v1/completions", body), post("/v1/embeddings", {"model": "m", "input": "abc"})
        )
        events = [json.loads(e) for e in completion.events()[:-1]]
        assert events[0]["object"] == "text_completion"
        assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 3
        assert "".join(e["choices"][0]["text"] for e in events[:-1]) == "".join(
            output_token(_seed("abc"), i) for i in range(3)
        )
        vector = embedding.json()["data"][0]["embedding"]
        assert len(vector) == 16 and embedding.json()["model"] == "m"

    asyncio.run(go())


def test_usage_counts_tokens_as_a_tokenizer_one_per_chunk_and_continuous_usage_is_in_every_chunk() -> None:
    """The prompt was counted at four characters a token and each chunk was a word with a trailing space, so a
    client re-tokenizing the answer (guidellm, inference-perf) found other counts than ``usage`` said."""

    async def go() -> None:
        api = make_api()
        prompt = "Tokenizers split 1234567 into three pieces."
        options = {"include_usage": True, "continuous_usage_stats": True}
        body = {"model": "m", "prompt": prompt, "max_tokens": 4, "stream": True, "stream_options": options}
        [completion] = await exchange(api, post("/v1/completions", body))
        events = [json.loads(e) for e in completion.events()[:-1]]
        tokens = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"] is None]
        assert len(tokens) == 4 and all(count_tokens(e["choices"][0]["text"]) == 1 for e in tokens)
        text = "".join(e["choices"][0]["text"] for e in tokens)
        assert count_tokens(text) == 4 and text == text.strip()  # the answer re-tokenizes to its token count
        prompt_tokens = count_tokens(prompt)
        # Token/izers, split, a space, 123/456/7, into, three, pieces, the full stop: not four characters a token.
        assert prompt_tokens == 11 != len(prompt) // 4
        # Every chunk carries the usage so far (vLLM's continuous_usage_stats), the last one the total.
        assert [e["usage"]["completion_tokens"] for e in events] == [1, 2, 3, 4, 4, 4]
        assert all(e["usage"]["prompt_tokens"] == prompt_tokens for e in events)
        assert events[-1]["choices"] == [] and events[-1]["usage"]["total_tokens"] == prompt_tokens + 4

    asyncio.run(go())


def test_n_choices_are_generated_streamed_by_index_and_counted_in_usage() -> None:
    async def go() -> None:
        api = make_api()
        body = {**CHAT, "n": 3, "max_tokens": 4}
        streamed, whole = await exchange(
            api,
            post("/v1/chat/completions", {**body, "stream": True, "stream_options": {"include_usage": True}}),
            post("/v1/chat/completions", body),
        )
        choices = whole.json()["choices"]
        assert [c["index"] for c in choices] == [0, 1, 2] and whole.json()["usage"]["completion_tokens"] == 12
        assert len({c["message"]["content"] for c in choices}) == 3  # each choice its own text
        events = [json.loads(e) for e in streamed.events()[:-1]]
        per_choice: dict[int, str] = {}
        for e in events[:-1]:
            choice = e["choices"][0]
            per_choice[choice["index"]] = per_choice.get(choice["index"], "") + choice["delta"].get("content", "")
        assert [per_choice[i] for i in range(3)] == [c["message"]["content"] for c in choices]
        assert events[-1]["usage"]["completion_tokens"] == 12
        [too_many] = await exchange(api, post("/v1/chat/completions", {**CHAT, "n": 129}))
        assert too_many.status == 400 and too_many.json()["error"]["param"] == "n"

    asyncio.run(go())


def _seed(text: str) -> int:
    import zlib

    return zlib.crc32(text.encode())


def test_errors_are_openai_shaped_with_the_right_status() -> None:
    async def go() -> None:
        api = make_api()
        wrong_model, bad_body, too_long, bad_method, no_route = await exchange(
            api,
            post("/v1/chat/completions", {**CHAT, "model": "other"}),
            post("/v1/chat/completions", {"model": "m"}),
            post("/v1/chat/completions", {**CHAT, "max_tokens": 5000}),
            get("/v1/chat/completions"),
            get("/nope"),
        )
        assert (wrong_model.status, wrong_model.json()["error"]["param"]) == (404, "model")
        assert (bad_body.status, bad_body.json()["error"]["param"]) == (400, "messages")
        assert too_long.status == 400 and "maximum context length is 4096" in too_long.json()["error"]["message"]
        assert (bad_method.status, no_route.status) == (405, 404)
        assert set(no_route.json()["error"]) == {"message", "type", "param", "code"}

    asyncio.run(go())


def test_a_chunked_upload_is_refused_and_the_connection_closed() -> None:
    async def go() -> None:
        conn, transport = connect(make_api())
        conn.data_received(b"POST /v1/completions HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n")
        [response], _ = parse_responses(bytes(transport.data))
        assert response.status == 411 and transport.closed

    asyncio.run(go())


def test_a_disconnect_cancels_the_request_in_the_engine_model() -> None:
    async def go() -> None:
        api = make_api(iteration_s=0.01)
        conn, transport = connect(api)
        conn.data_received(post("/v1/chat/completions", {**CHAT, "max_tokens": 2000, "stream": True}))
        await asyncio.sleep(0.05)
        assert api.live.stats()[0] == 1
        assert b"data: " in transport.data  # it was streaming
        conn.connection_lost(None)
        running, waiting, usage = api.live.stats()
        assert (running, waiting, usage) == (0, 0, 0.0)
        assert api.live.counters.requests_cancelled == 1
        [metrics] = await exchange(api, get("/metrics"))
        assert "tessera_sim:requests_cancelled_total" in metrics.body.decode()

    asyncio.run(go())


def test_metrics_show_running_and_waiting_under_vllms_names() -> None:
    async def go() -> None:
        api = make_api(iteration_s=0.01, kv_blocks=20)  # 320 tokens of cache: one 220-token prompt at a time
        conns = [connect(api) for _ in range(3)]
        long = {"model": "m", "prompt": "x" * 880, "max_tokens": 50, "stream": True}  # 220 + 50 tokens
        for conn, _ in conns:
            conn.data_received(post("/v1/completions", long))
        await asyncio.sleep(0.03)
        [page] = await exchange(api, get("/metrics"))
        stats = parse_metrics(page.body.decode())
        assert (stats.running, stats.waiting) == (1, 2)
        assert 0.5 < stats.kv_cache_usage <= 1.0
        for conn, _ in conns:
            conn.connection_lost(None)

    asyncio.run(go())


def test_sleep_refuses_work_until_wake_up_and_is_refused_while_busy() -> None:
    async def go() -> None:
        api = make_api()
        asleep, refused, state, _, served = await exchange(
            api,
            post("/sleep", b""),
            post("/v1/chat/completions", CHAT),
            get("/is_sleeping"),
            post("/wake_up", b""),
            post("/v1/chat/completions", CHAT),
        )
        assert asleep.status == 200 and refused.status == 503 and state.json() == {"is_sleeping": True}
        assert served.status == 200
        conn, _ = connect(api)
        conn.data_received(post("/v1/chat/completions", {**CHAT, "max_tokens": 500}))
        [busy] = await exchange(api, post("/sleep", b""))
        assert busy.status == 409
        conn.connection_lost(None)

    asyncio.run(go())


def test_with_an_api_key_every_route_answers_401_unless_the_request_carries_it() -> None:
    async def go() -> None:
        api = make_api()
        api.settings = replace(api.settings, api_key="s3cret-key")
        health = b"GET /health HTTP/1.1\r\nhost: x\r\n%b\r\n"
        no_key, wrong, basic, right = await exchange(
            api,
            health % b"",
            health % b"authorization: Bearer s3cret-kez\r\n",
            health % b"authorization: Basic s3cret-key\r\n",
            health % b"authorization: Bearer s3cret-key\r\n",
        )
        assert [r.status for r in (no_key, wrong, basic, right)] == [401, 401, 401, 200]
        assert no_key.json()["error"]["code"] == 401
        for path in ("/metrics", "/v1/models", "/is_sleeping"):
            [refused] = await exchange(api, get(path))
            assert refused.status == 401, path
        [sleep] = await exchange(api, post("/sleep", b""))
        [chat] = await exchange(api, post("/v1/chat/completions", CHAT))
        assert sleep.status == 401 and chat.status == 401 and not api.sleeping
        [served] = await exchange(api, post("/v1/chat/completions", CHAT, "authorization: Bearer s3cret-key\r\n"))
        assert served.status == 200 and served.json()["usage"]["completion_tokens"] == 5

    asyncio.run(go())


def test_the_sim_server_takes_its_api_key_from_the_environment_only() -> None:
    argv = ["--model", "m", "--port", "0"]
    assert parse_options(argv).api_key == ""
    options = parse_options(argv, {API_KEY_ENV: "from-env"})
    assert options.api_key == "from-env" and "from-env" not in repr(options)
    assert ENGINE_KEY_ENV["sim"] == API_KEY_ENV  # where engine_exec puts the replica's key for the sim engine
