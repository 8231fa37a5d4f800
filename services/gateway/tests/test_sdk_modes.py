"""The openai SDK's response modes through the real gateway: ``with_raw_response`` and
``with_streaming_response`` (sync and async, streamed and not) read headers and bodies
like ``create`` does, the caller's SDK call options never reach (or steer) the
gateway's own client, and every answer, a 500 included, carries ``X-Request-Id``."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2
from openai import AsyncOpenAI, OpenAI

CHAT = "/v1/chat/completions"
QUESTION = "Say hello"
SDK_OPTIONS = {"x-stainless-raw-response", "x-stainless-retry-count", "x-stainless-read-timeout"}


def chat_args(question: str = QUESTION, **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": question}]
    return {"model": "test-model", "messages": messages, "user": "bob", **extra}


def assert_upstream_saw_a_plain_call(upstream: Any, *, stream: bool) -> None:
    """One request per SDK call (no retries), the caller's custom header forwarded, the
    caller's SDK call options not; the gateway's own client counted its own retries."""
    assert len(upstream.requests) == 1, [r.path for r in upstream.requests]
    request = upstream.requests[0]
    assert request.body.get("stream", False) is stream
    assert request.headers["x-caller-tag"] == "matrix"
    assert request.headers["x-stainless-lang"] == "python"  # informational: passes
    assert request.headers.get("x-stainless-raw-response") is None
    assert request.headers["x-stainless-retry-count"] == "0"  # the gateway's own count


async def test_async_with_raw_response_and_streaming_response(
    gateway: Any, scripted_upstream: Any, jetstream: Any
) -> None:
    scripted_upstream.replies = ["Hello there"]
    headers = {"X-Caller-Tag": "matrix"}
    async with AsyncOpenAI(
        base_url=gateway.url + "/v1", api_key="k", max_retries=0, default_headers=headers
    ) as sdk:
        raw = await sdk.chat.completions.with_raw_response.create(**chat_args("Say hello 1"))
        assert raw.status_code == 200
        assert raw.headers["x-request-id"]
        assert raw.headers["x-engram-memory"] == "empty"
        assert raw.parse().choices[0].message.content == "Hello there"
        assert_upstream_saw_a_plain_call(scripted_upstream, stream=False)

        scripted_upstream.requests.clear()
        raw_stream = await sdk.chat.completions.with_raw_response.create(
            **chat_args("Say hello 2", stream=True)
        )
        assert raw_stream.headers["x-request-id"]
        text = "".join(
            [c.choices[0].delta.content or "" async for c in raw_stream.parse() if c.choices]
        )
        assert text == "Hello there"
        assert_upstream_saw_a_plain_call(scripted_upstream, stream=True)

        scripted_upstream.requests.clear()
        async with sdk.chat.completions.with_streaming_response.create(
            **chat_args("Say hello 3")
        ) as reply:
            assert reply.headers["x-request-id"]
            completion = await reply.parse()
        assert completion.choices[0].message.content == "Hello there"
        assert_upstream_saw_a_plain_call(scripted_upstream, stream=False)

        scripted_upstream.requests.clear()
        async with sdk.chat.completions.with_streaming_response.create(
            **chat_args("Say hello 4", stream=True)
        ) as reply:
            assert reply.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in reply.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert_upstream_saw_a_plain_call(scripted_upstream, stream=True)
    # four different chats, no retries: a user and an assistant turn each, nothing twice
    assert await _settled_count(jetstream, 8) == 8


async def test_sync_sdk_modes(gateway: Any, scripted_upstream: Any) -> None:
    # The sync client runs in a thread: the gateway is served on this test's loop.
    scripted_upstream.replies = ["Hello there"]
    await asyncio.to_thread(_sync_calls, gateway.url, scripted_upstream)


def _sync_calls(url: str, upstream: Any) -> None:
    with OpenAI(
        base_url=url + "/v1",
        api_key="k",
        max_retries=0,
        default_headers={"X-Caller-Tag": "matrix"},
    ) as sdk:
        raw = sdk.chat.completions.with_raw_response.create(**chat_args())
        assert raw.headers["x-request-id"]
        assert raw.parse().choices[0].message.content == "Hello there"
        assert_upstream_saw_a_plain_call(upstream, stream=False)

        upstream.requests.clear()
        raw_stream = sdk.chat.completions.with_raw_response.create(**chat_args(stream=True))
        text = "".join(c.choices[0].delta.content or "" for c in raw_stream.parse() if c.choices)
        assert text == "Hello there"
        assert_upstream_saw_a_plain_call(upstream, stream=True)

        upstream.requests.clear()
        with sdk.chat.completions.with_streaming_response.create(**chat_args()) as reply:
            assert reply.headers["x-request-id"]
            assert reply.parse().choices[0].message.content == "Hello there"
        assert_upstream_saw_a_plain_call(upstream, stream=False)

        upstream.requests.clear()
        with sdk.chat.completions.with_streaming_response.create(**chat_args(stream=True)) as reply:
            chunks = list(reply.parse())
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
            "Hello there"
        )
        assert_upstream_saw_a_plain_call(upstream, stream=True)

        # The plain call, for comparison: the same answer through the same path.
        upstream.requests.clear()
        plain = sdk.chat.completions.create(**chat_args())
        assert plain.choices[0].message.content == "Hello there"
        assert_upstream_saw_a_plain_call(upstream, stream=False)


async def test_sdk_call_options_sent_by_hand_cannot_switch_the_gateway_to_raw_mode(
    client: httpx2.AsyncClient, scripted_upstream: Any
) -> None:
    """Whatever the caller's call options say, the gateway reads the upstream's reply
    itself (memory_hits added) and forwards none of them."""
    scripted_upstream.replies = ["Hello there"]
    for value in ("true", "stream", "raw"):
        scripted_upstream.requests.clear()
        response = await client.post(
            CHAT,
            json=chat_args(),
            headers={
                "X-Stainless-Raw-Response": value,
                "X-Stainless-Retry-Count": "7",
                "X-Stainless-Read-Timeout": "1",
                "X-Stainless-Timeout": "1",
            },
        )
        assert response.status_code == 200, response.text
        assert response.json()["memory_hits"] == []
        sent = scripted_upstream.requests[0].headers
        assert sent["x-stainless-retry-count"] == "0"
        assert "x-stainless-raw-response" not in sent and "x-stainless-timeout" not in sent
        assert sent["x-stainless-read-timeout"] != "1"


async def test_an_unhandled_error_is_a_500_with_the_request_id(gateway: Any) -> None:
    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret internals")

    gateway.app.state.gateway.upstream.chat = broken
    response = await gateway.client().post(
        CHAT, json=chat_args(), headers={"X-Request-Id": "req-500-check"}
    )
    assert response.status_code == 500
    assert response.headers["x-request-id"] == "req-500-check"
    assert response.json()["error"]["code"] == "internal_error"
    assert "secret internals" not in response.text

    generated = await gateway.client().post(CHAT, json=chat_args())
    assert generated.status_code == 500
    assert len(generated.headers["x-request-id"]) == 32  # one made up for it


async def test_every_error_answer_carries_the_request_id(
    start_gateway: Any, scripted_upstream: Any
) -> None:
    gateway = await start_gateway(api_keys="sha256:" + "0" * 64 + "=acme")
    client = gateway.client()
    unauthorised = await client.post(CHAT, json=chat_args(), headers={"X-Request-Id": "r-401"})
    assert unauthorised.status_code == 401
    assert unauthorised.headers["x-request-id"] == "r-401"
    missing = await client.get("/nowhere", headers={"X-Request-Id": "r-404"})
    assert missing.status_code in (401, 404)
    assert missing.headers["x-request-id"] == "r-404"


async def _settled_count(jetstream: Any, expected: int) -> int:
    """The stream's message count once ``expected`` arrived (or after 10 s), plus a
    moment for a stray duplicate to show."""
    for _ in range(100):
        if await jetstream.count() >= expected:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.3)
    return int(await jetstream.count())
