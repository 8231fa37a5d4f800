"""Recall helpers: the client's history is the short-term window (nothing in it is
re-injected), a small store is injected whole and said to be, "nothing relevant" is
said, and the user's other conversations are searched unless a control says not to."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest

from engram_core.memory import SearchHit, SearchResult
from engram_gateway.controls import MemoryControls, split_memory_controls
from engram_gateway.errors import GatewayError
from engram_gateway.recall import drop_in_window, render_memory, search_query
from engram_gateway.settings import GatewaySettings
from engram_testing.memory_store import InMemoryPort
from engram_testing.worker_stack import RealRetrieval, running_retrieval

from .conftest import StartGateway

CHAT = "/v1/chat/completions"
NOW = datetime(2025, 3, 10, tzinfo=UTC)


def body(*messages: tuple[str, str], **extra: Any) -> dict[str, Any]:
    return {
        "model": "test-model",
        "messages": [{"role": role, "content": text} for role, text in messages],
        **extra,
    }


def injected(upstream: Any) -> str:
    """The memory system message the upstream received in the last chat."""
    messages = upstream.chat_requests()[-1]["messages"]
    memory = [m for m in messages if m["role"] == "system" and "Engram" in m["content"]]
    assert len(memory) == 1, messages
    return memory[0]["content"]


# --- the short-term window ------------------------------------------------------------------


def test_hits_already_in_the_request_are_dropped(hit: Callable[..., SearchHit]) -> None:
    response = SearchResult(
        outcome="ranked",
        hits=[
            hit("I  moved to\nLISBON in May.", kind="turn", role="user"),
            hit("User's cat is Miso."),
            hit("What a lovely city!", kind="turn", role="assistant"),
            hit("user's cat is  miso."),  # the same text twice: injected once
        ],
    )
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "i moved to lisbon in may."}]},
        {"role": "assistant", "content": "What a lovely city!"},
        {"role": "user", "content": "What is my cat called?"},
        {"role": "assistant", "content": None, "tool_calls": []},
    ]
    assert drop_in_window(response, messages) == 3
    assert [h.memory.text for h in response.hits] == ["User's cat is Miso."]
    assert drop_in_window(response, messages) == 0


async def test_chat_does_not_reinject_its_own_history(
    start_gateway: StartGateway,
    memory_store: InMemoryPort,
    scripted_upstream: Any,
    hit: Callable[..., SearchHit],
) -> None:
    memory_store.scripted_search = SearchResult(
        outcome="ranked",
        hits=[
            hit("My sister Eva lives in Porto.", kind="turn", role="user"),
            hit("User's sister is Eva.", id="22222222-2222-2222-2222-222222222222"),
        ],
    )
    client = (await start_gateway()).client()
    response = await client.post(
        CHAT,
        json=body(
            ("user", "my sister eva lives in  Porto."),
            ("assistant", "Nice!"),
            ("user", "Where does my sister live?"),
        ),
    )
    assert response.status_code == 200
    assert [h["text"] for h in response.json()["memory_hits"]] == ["User's sister is Eva."]
    assert response.headers["x-engram-memory-hits"] == "1"
    text = injected(scripted_upstream)
    assert "User's sister is Eva." in text and "lives in Porto" not in text

    # Every hit already in the window and nothing else to say: nothing is injected.
    memory_store.scripted_search = SearchResult(
        outcome="ranked", hits=[hit("Where does my sister live?")]
    )
    response = await client.post(CHAT, json=body(("user", "Where does my sister live?")))
    assert response.headers["x-engram-memory"] == "empty"
    assert response.json()["memory_hits"] == []
    sent = scripted_upstream.chat_requests()[-1]["messages"]
    assert sent == [{"role": "user", "content": "Where does my sister live?"}]


# --- small store and nothing relevant -------------------------------------------------------


def test_small_store_is_injected_whole_and_says_so(hit: Callable[..., SearchHit]) -> None:
    hits = [hit("Has a cat."), hit("Lives in Berlin.")]
    complete = SearchResult(outcome="small_store", hits=hits, candidates_considered=2)
    text = render_memory(complete, now=NOW)
    assert text is not None
    assert "All 2 stored memories, facts first, then newest first (there are no others):" in text
    assert '1. [4 March 2025] fact: "Has a cat."\n2. [4 March 2025] fact: "Lives in Berlin."' in (
        text
    )
    assert "most relevant" not in text

    capped = SearchResult(outcome="small_store", hits=hits, candidates_considered=4)
    capped_text = render_memory(capped, now=NOW) or ""
    assert "The 2 newest of the 4 stored memories:" in capped_text
    text = render_memory(complete, now=NOW, in_window=1)
    assert "All 2 other stored memories, facts first, then newest first (the rest are" in (
        text or ""
    )

    ranked = SearchResult(outcome="ranked", hits=hits)
    ranked_text = render_memory(ranked, now=NOW) or ""
    assert "Relevant memories (most relevant first):" in ranked_text


async def test_small_store_and_nothing_relevant_in_a_chat(
    start_gateway: StartGateway,
    memory_store: InMemoryPort,
    scripted_upstream: Any,
    hit: Callable[..., SearchHit],
) -> None:
    client = (await start_gateway()).client()
    memory_store.scripted_search = SearchResult(
        outcome="small_store",
        hits=[hit("Has a cat."), hit("Lives in Berlin.")],
        candidates_considered=2,
    )
    response = await client.post(CHAT, json=body(("user", "Hello")))
    assert len(response.json()["memory_hits"]) == 2
    assert "All 2 stored memories, facts first" in injected(scripted_upstream)

    memory_store.scripted_search = SearchResult(outcome="nothing_relevant")
    response = await client.post(CHAT, json=body(("user", "Hello again")))
    text = injected(scripted_upstream)
    assert "No stored memory is relevant to this message." in text
    assert "Relevant memories" not in text and "stored memories" not in text
    assert response.headers["x-engram-memory"] == "used"


# --- cross-session --------------------------------------------------------------------------


def test_cross_session_control_body_header_and_default() -> None:
    settings = GatewaySettings()
    controls, forwarded = split_memory_controls({"memory_cross_session": False, "x": 1}, {})
    assert forwarded == {"x": 1}
    query = search_query(
        tenant="t", query="q", user_id="u", controls=controls.with_defaults(settings)
    )
    assert query.scopes == ("conversation", "global")

    controls, _ = split_memory_controls({}, {"X-Engram-Memory-Cross-Session": "off"})
    assert controls.memory_cross_session is False
    default = MemoryControls().with_defaults(settings)
    assert default.memory_cross_session is True
    query = search_query(tenant="t", query="q", user_id="u", controls=default)
    assert query.scopes == ()  # retrieval's default: conversation, user, global

    operator_off = GatewaySettings(gateway_memory_cross_session=False)
    assert MemoryControls().with_defaults(operator_off).memory_cross_session is False
    request_on = MemoryControls(memory_cross_session=True).with_defaults(operator_off)
    assert request_on.memory_cross_session is True

    with pytest.raises(GatewayError) as bad:
        split_memory_controls({}, {"X-Engram-Memory-Cross-Session": "maybe"})
    assert bad.value.param == "X-Engram-Memory-Cross-Session"
    with pytest.raises(GatewayError):
        split_memory_controls({"memory_cross_session": "no"}, {})  # strict: not a boolean


@pytest.fixture
async def retrieval(tmp_path: Path) -> AsyncIterator[RealRetrieval]:
    async with running_retrieval(tmp_path / "retrieval") as running:
        yield running


async def test_one_users_other_conversation_is_recalled_unless_turned_off(
    start_gateway: StartGateway, retrieval: RealRetrieval, scripted_upstream: Any
) -> None:
    gateway = await start_gateway(retrieval_address=retrieval.address)
    client: httpx2.AsyncClient = gateway.client()
    for text, conversation, user in (
        ("User's dog is called Biscuit.", "home", "alice"),
        ("User's dog is called Rex.", "home", "bob"),  # another user: never recalled
    ):
        created = await client.post(
            "/v1/memories", json={"text": text, "conversation": conversation, "user": user}
        )
        assert created.status_code == 201, created.text

    ask = body(("user", "What is my dog called?"), user="alice", memory_id="work")
    response = await client.post(CHAT, json=ask)
    hits = response.json()["memory_hits"]
    assert [(h["text"], h["scope"], h["conversation_id"]) for h in hits] == [
        ("User's dog is called Biscuit.", "user", "home")
    ]
    assert "User's dog is called Biscuit." in injected(scripted_upstream)

    response = await client.post(CHAT, json={**ask, "memory_cross_session": False})
    assert response.json()["memory_hits"] == []
    assert response.headers["x-engram-memory"] == "empty"
    assert "memory_cross_session" not in scripted_upstream.chat_requests()[-1]
