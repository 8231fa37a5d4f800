"""``engram bench overhead --api``: each API's chats go to its own route with its own
body, the APIs take turns within a phase, and the gateway's own pre-upstream time is
what Server-Timing says minus recall."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx2

from engram_cli.bench.load import ChatSample
from engram_cli.bench.overhead import ApiChatter, _own_time, _taking_turns

GATEWAY, UPSTREAM = "http://gw", "http://up:1/v1"


def chatter(api: str) -> ApiChatter:
    return ApiChatter(
        api, httpx2.AsyncClient(), gateway=GATEWAY, upstream=UPSTREAM, conversations=2, history=2
    )


def test_each_api_has_its_routes_and_body() -> None:
    urls = {api: chatter(api).urls for api in ("chat", "responses", "messages", "ollama")}
    assert urls["responses"] == {
        "direct": "http://up:1/v1/responses",
        "off": "http://gw/v1/responses",
        "on": "http://gw/v1/responses",
    }
    assert urls["messages"]["on"] == "http://gw/v1/messages"
    assert urls["ollama"] == {
        "direct": "http://up:1/api/chat",
        "off": "http://gw/api/chat",
        "on": "http://gw/api/chat",
    }
    responses = chatter("responses").body("on")
    assert "messages" not in responses and responses["input"][-1]["role"] == "user"
    assert chatter("messages").body("off")["max_tokens"] > 0
    assert chatter("ollama").body("direct")["stream"] is False


def test_the_apis_take_turns_and_each_sample_is_attributed() -> None:
    asked: list[str] = []

    class Recording(ApiChatter):
        async def send(self, mode: str) -> ChatSample:
            asked.append(self.api)
            return ChatSample(0.0, 1.0, 200)

    chatters: dict[str, Any] = {
        api: Recording(
            api,
            httpx2.AsyncClient(),
            gateway=GATEWAY,
            upstream=UPSTREAM,
            conversations=1,
            history=0,
        )
        for api in ("chat", "responses", "messages")
    }
    sent: list[str] = []
    send = _taking_turns(chatters, "on", sent)

    async def run() -> None:
        for _ in range(6):
            await asyncio.create_task(send())

    asyncio.run(run())
    assert sent == asked == ["chat", "responses", "messages"] * 2


def test_own_time_is_pre_upstream_minus_recall() -> None:
    samples = [
        ChatSample(0, 10, 200, {"pre-upstream": 12.0, "recall": 10.0}),
        ChatSample(0, 10, 200, {"pre-upstream": 3.0}),
        ChatSample(0, 10, 503, {"pre-upstream": 99.0}),
    ]
    assert _own_time(samples)["own_pre_upstream_ms"]["p50"] == 2.5
