"""One user, however the client spells the id: the chat's ``user`` (body or header), the
memory API and browsing normalise a user id the same way (Unicode NFC, trimmed), and a
blank one is refused. Through the gateway with the real retrieval service (embedded
store, real embedder), the real nats-server and the scripted upstream."""

from __future__ import annotations

import json
import unicodedata
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from engram_gateway.controls import chat_user, normalize_user_id
from engram_gateway.keys import entry_for
from engram_testing.upstream import ScriptedUpstream
from engram_testing.worker_stack import RealRetrieval, running_retrieval

from .conftest import JetStreamReader, RunningGateway, StartGateway

KEY = "key-of-tenant-a"
AUTH = {"Authorization": f"Bearer {KEY}"}
NFC = unicodedata.normalize("NFC", "José")
NFD = unicodedata.normalize("NFD", "José")
CHAT = "/v1/chat/completions"
FACT = "José's favourite colour is teal."
NBSP = "\u00a0".encode()  # a header cannot start with an ASCII space; this one is blank too


def auth_and_raw_header(name: str, value: bytes) -> list[tuple[bytes, bytes]]:
    """AUTH and one header whose value goes on the wire as these bytes (httpx takes
    headers all as str or all as bytes)."""
    return [*((k.encode(), v.encode()) for k, v in AUTH.items()), (name.encode(), value)]


@pytest.fixture
async def retrieval(tmp_path: Path) -> AsyncIterator[RealRetrieval]:
    async with running_retrieval(tmp_path / "retrieval") as running:
        yield running


@pytest.fixture
async def http(start_gateway: StartGateway, retrieval: RealRetrieval) -> httpx2.AsyncClient:
    gateway: RunningGateway = await start_gateway(
        retrieval_address=retrieval.address, api_keys=entry_for(KEY, "tenant-a")
    )
    return gateway.client()


def _chat(**extra: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "What is my favourite colour?"}],
        **extra,
    }


def _memory_message(upstream: ScriptedUpstream) -> str:
    """The memory system message of the upstream's latest chat request ('' if none)."""
    messages = upstream.chat_requests()[-1]["messages"]
    return "\n".join(m["content"] for m in messages if m["role"] == "system")


def test_the_same_name_in_two_unicode_spellings_is_one_id() -> None:
    assert NFC != NFD
    assert normalize_user_id(NFD) == normalize_user_id(f"  {NFC}\t") == NFC
    assert normalize_user_id("") == ""
    for bad in (" ", "\t \u3000", "a\x00b", "a\x85b", "x" * 257):
        with pytest.raises(ValueError):
            normalize_user_id(bad)


def test_a_user_header_sent_as_utf8_names_the_same_user() -> None:
    # Open WebUI forwards the user in a header: UTF-8 bytes that the server decoded as
    # latin-1.
    on_the_wire = {"x-openwebui-user-id": NFD.encode().decode("latin-1")}
    assert chat_user({}, on_the_wire, "x-openwebui-user-id") == NFC
    assert chat_user({"user": NFD}, {}, "x-openwebui-user-id") == NFC
    latin1 = {"x-openwebui-user-id": "Jos\xe9"}  # a latin-1 byte that is no UTF-8
    assert chat_user({}, latin1, "x-openwebui-user-id") == NFC


async def test_a_fact_stored_for_one_spelling_is_recalled_for_the_other(
    http: httpx2.AsyncClient, scripted_upstream: ScriptedUpstream, jetstream: JetStreamReader
) -> None:
    created = await http.post("/v1/memories", json={"text": FACT, "user": NFC}, headers=AUTH)
    assert created.status_code == 201, created.text
    assert created.json()["user_id"] == NFC

    reply = await http.post(CHAT, json=_chat(user=f" {NFD} "), headers=AUTH)
    assert reply.status_code == 200, reply.text
    assert "teal" in _memory_message(scripted_upstream)
    user_turn, _ = await jetstream.events(2)
    assert user_turn.data["user_id"] == NFC

    listed = await http.get("/v1/memories", params={"user": NFD}, headers=AUTH)
    assert FACT in [m["text"] for m in listed.json()["data"]]
    searched = await http.post(
        "/v1/memories/search", json={"query": "favourite colour", "user": NFD}, headers=AUTH
    )
    assert FACT in [h["text"] for h in searched.json()["hits"]]
    users = (await http.get("/v1/users", headers=AUTH)).json()["data"]
    assert [u["id"] for u in users] == [NFC]
    conversations = await http.get("/v1/conversations", params={"user": NFD}, headers=AUTH)
    assert {c["user_id"] for c in conversations.json()["data"]} == {NFC}


async def test_a_blank_user_is_refused_everywhere_and_nothing_is_stored_or_forwarded(
    http: httpx2.AsyncClient, scripted_upstream: ScriptedUpstream, jetstream: JetStreamReader
) -> None:
    refused = [
        await http.post(CHAT, json=_chat(user="   "), headers=AUTH),
        await http.post(
            CHAT, json=_chat(), headers=auth_and_raw_header("X-OpenWebUI-User-Id", NBSP)
        ),
        await http.post("/v1/memories", json={"text": FACT, "user": " "}, headers=AUTH),
        await http.post("/v1/memories/add", json={"text": FACT, "user": " "}, headers=AUTH),
        await http.post("/v1/memories/search", json={"query": "q", "user": " "}, headers=AUTH),
        await http.get("/v1/memories", params={"user": " "}, headers=AUTH),
        await http.get("/v1/conversations", params={"user": " "}, headers=AUTH),
    ]
    for response in refused:
        assert response.status_code == 400, (response.request.url, response.text)
        error = response.json()["error"]
        assert "must not be blank" in error["message"], error
        assert error["param"] in ("user", "X-OpenWebUI-User-Id"), error
    assert json.loads(refused[1].text)["error"]["param"] == "X-OpenWebUI-User-Id"
    assert scripted_upstream.chat_requests() == []
    assert await jetstream.count() == 0
    assert (await http.get("/v1/users", headers=AUTH)).json()["data"] == []

    # '' stays what it always was: no user.
    assert (await http.post(CHAT, json=_chat(user=""), headers=AUTH)).status_code == 200


async def test_a_user_header_sent_as_utf8_recalls_that_users_memory(
    http: httpx2.AsyncClient, scripted_upstream: ScriptedUpstream
) -> None:
    created = await http.post("/v1/memories", json={"text": FACT, "user": NFC}, headers=AUTH)
    assert created.status_code == 201, created.text
    # Open WebUI forwards the user in a header: UTF-8 bytes on the wire, here in NFD.
    headers = auth_and_raw_header("X-OpenWebUI-User-Id", NFD.encode())
    reply = await http.post(CHAT, json=_chat(), headers=headers)
    assert reply.status_code == 200, reply.text
    assert "teal" in _memory_message(scripted_upstream)
