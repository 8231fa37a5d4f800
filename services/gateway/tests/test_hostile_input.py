"""Hostile and broken requests: each gets a clear, OpenAI-shaped 4xx (or a 500 that
keeps the connection), and the *same* keep-alive connection then serves a good request.

A raw HTTP/1.1 socket is used so that "the same connection" is a fact of the test, not
a pool's choice: a server that closed it would make the second request fail.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import structlog

from engram_gateway.bodies import MAX_JSON_DEPTH
from engram_testing.raw_http import RawConnection

from .conftest import RunningGateway, StartGateway

CHAT = "/v1/chat/completions"
GOOD_CHAT = {"model": "m", "messages": [{"role": "user", "content": "Hello there."}]}


@pytest.fixture
async def conn(gateway: RunningGateway) -> AsyncIterator[RawConnection]:
    connection = await RawConnection.open(gateway.url)
    try:
        yield connection
    finally:
        await connection.close()


def nested(depth: int) -> bytes:
    return b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "x": ' + (
        b"[" * depth + b"]" * depth + b"}"
    )


SURROGATE_CONTENT = b'{"model": "m", "messages": [{"role": "user", "content": "bad \\ud800 text"}]}'
SURROGATE_USER = (
    b'{"model": "m", "user": "\\udfff", "messages": [{"role": "user", "content": "hi"}]}'
)

# (method, path, body, status, code, param): one trigger each, on one keep-alive connection
TRIGGERS: list[tuple[str, str, object, int, str | None, str | None]] = [
    ("POST", CHAT, SURROGATE_CONTENT, 400, "invalid_json", "messages[0].content"),
    ("POST", CHAT, SURROGATE_USER, 400, "invalid_json", "user"),
    ("POST", CHAT, nested(1000), 400, "invalid_json", None),
    ("POST", CHAT, nested(MAX_JSON_DEPTH + 1), 400, "invalid_json", "x"),
    ("POST", "/v1/memories", b'{"text": "tea \\ud800"}', 400, "invalid_json", "text"),
    ("POST", "/v1/memories", b'{"text": ' + b"[" * 1000 + b"]" * 1000 + b"}", 400, None, None),
    (
        "POST",
        "/v1/memories",
        {"text": "I like tea.", "created_at": "9999-12-31T23:59:59-14:00"},
        400,
        "invalid_request",
        "created_at",
    ),
    (
        "POST",
        "/v1/memories",
        {"text": "I like tea.", "created_at": "0001-01-01T00:00:00+01:00"},
        400,
        "invalid_request",
        "created_at",
    ),
    (
        "POST",
        "/v1/memories/add",
        {"text": "I like tea.", "created_at": "10000-01-01T00:00:00Z"},
        400,
        "invalid_request",
        "created_at",
    ),
    ("POST", "/v1/memories/search", {"query": "tea", "memory_top_k": "5"}, 400, None, None),
    ("POST", "/v1/memories/search", {"query": "tea", "memory_top_k": True}, 400, None, None),
    (
        "POST",
        "/v1/memories/search",
        {"query": "tea", "memory_mmr_lambda": False},
        400,
        None,
        "memory_mmr_lambda",
    ),
    ("POST", CHAT, {**GOOD_CHAT, "memory_top_k": "5"}, 400, "invalid_memory_control", None),
    ("GET", "/v1/memories/", None, 404, "not_found", None),
    ("GET", "/v1/files", None, 404, "not_found", None),
    ("POST", "/v1/assistants", {"name": "x"}, 404, "not_found", None),
    ("GET", "/nowhere", None, 404, "not_found", None),
    ("DELETE", "/healthz", None, 405, "method_not_allowed", None),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "code", "param"),
    TRIGGERS,
    ids=[f"{t[0]} {t[1]} {t[3]} {t[5] or t[4] or ''}" for t in TRIGGERS],
)
async def test_a_bad_request_then_a_good_one_on_the_same_connection(
    conn: RawConnection,
    method: str,
    path: str,
    body: Any,
    status: int,
    code: str | None,
    param: str | None,
) -> None:
    bad = await conn.request(method, path, body)
    assert bad.status == status, bad.body
    error = bad.error()
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
        assert param.split("[")[0] in error["message"]
    good = await conn.request("POST", CHAT, GOOD_CHAT)
    assert good.status == 200, good.body
    assert good.json()["choices"][0]["message"]["content"]


async def test_an_unexpected_error_is_a_500_that_keeps_the_connection(
    gateway: RunningGateway, conn: RawConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = gateway.app.state.gateway.upstream
    real_chat = upstream.chat

    async def broken_once(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(upstream, "chat", real_chat)
        raise RuntimeError("a bug")

    monkeypatch.setattr(upstream, "chat", broken_once)
    bad = await conn.request("POST", CHAT, GOOD_CHAT)
    assert bad.status == 500
    assert bad.error()["code"] == "internal_error"
    assert "a bug" not in bad.body.decode()  # never the internals
    good = await conn.request("POST", CHAT, GOOD_CHAT)
    assert good.status == 200


async def test_texts_too_large_for_an_event_are_413_before_anything_is_forwarded(
    start_gateway: StartGateway, scripted_upstream: Any, jetstream: Any
) -> None:
    gateway = await start_gateway(max_text_bytes=2048)
    conn = await RawConnection.open(gateway.url)
    try:
        big = "é" * 1100  # 2200 bytes in UTF-8, 1100 characters
        chat = {"model": "m", "messages": [{"role": "user", "content": big}]}
        reply = await conn.request("POST", CHAT, chat)
        assert reply.status == 413
        error = reply.error()
        assert (error["code"], error["param"]) == ("text_too_large", "messages[0]")
        assert "ENGRAM_MAX_TEXT_BYTES" in error["message"]
        assert scripted_upstream.requests == []
        assert await jetstream.count() == 0  # nothing half-written either

        memory = await conn.request("POST", "/v1/memories", {"text": big})
        assert (memory.status, memory.error()["param"]) == (413, "text")
        added = await conn.request("POST", "/v1/memories/add", {"text": ["ok", big]})
        assert (added.status, added.error()["param"]) == (413, "text[1]")
        assert await jetstream.count() == 0
        # bypassing memory records nothing, so nothing to refuse
        bypass = await conn.request("POST", CHAT, {**chat, "memory": False})
        assert bypass.status == 200
    finally:
        await conn.close()


async def test_a_half_sent_body_times_out_with_408_and_the_connection_closes(
    start_gateway: StartGateway,
) -> None:
    gateway = await start_gateway(gateway_body_timeout_s=0.5)
    conn = await RawConnection.open(gateway.url)
    try:
        head = f"POST {CHAT} HTTP/1.1\r\nHost: g\r\nContent-Length: 1000\r\n\r\n"
        conn.writer.write(head.encode() + b'{"model": "m", ')
        await conn.writer.drain()
        reply = await conn.response(timeout_s=5)
        assert reply.status == 408
        assert reply.error()["code"] == "request_timeout"
        assert reply.headers["connection"] == "close"
        assert await conn.closed_by_server()
    finally:
        await conn.close()
    # the gateway is fine for everybody else
    assert (await gateway.client().post(CHAT, json=GOOD_CHAT)).status_code == 200


async def test_a_client_hanging_up_mid_upload_is_one_info_line(
    gateway: RunningGateway, caplog: pytest.LogCaptureFixture
) -> None:
    with structlog.testing.capture_logs() as logs:
        for path in (CHAT, "/v1/memories"):
            conn = await RawConnection.open(gateway.url)
            head = f"POST {path} HTTP/1.1\r\nHost: g\r\nContent-Length: 1000\r\n\r\n"
            conn.writer.write(head.encode() + b'{"text": ')
            await conn.writer.drain()
            await asyncio.sleep(0.2)
            await conn.close()
        await asyncio.sleep(0.5)
        assert (await gateway.client().post(CHAT, json=GOOD_CHAT)).status_code == 200
    gone = [line for line in logs if line["event"] == "request.client_gone"]
    assert [line["log_level"] for line in gone] == ["info"]  # the chat's; the other never ran
    assert not [line for line in logs if line["log_level"] in ("error", "critical")]
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
