"""The Responses, Messages and Ollama chat routes (issue 31) against the real
nats-server, the scripted upstream (which speaks all three) and the retrieval port in
memory: what reached the upstream (memory where each API carries instructions,
everything else as sent), what the caller got (each API's framing and error shape),
and the turns recorded (identity rules, tool results never the person speaking)."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from typing import Any

import httpx2
import pytest

from engram_core.events import TurnPersisted
from engram_core.memory import SearchHit, SearchResult
from engram_gateway.turns import chained_turn_key, chat_turn_key, turn_id
from engram_testing.memory_store import InMemoryPort

FACT = "The user's cat is called Miso."


@pytest.fixture
def remembers(memory_store: InMemoryPort, hit: Callable[..., SearchHit]) -> None:
    memory_store.scripted_search = SearchResult(outcome="ranked", hits=[hit(FACT, total=0.9)])


def sent(upstream: Any, path: str) -> dict[str, Any]:
    (request,) = [r for r in upstream.requests if r.path == path]
    return dict(request.body)


def without(body: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in keys}


async def turns(jetstream: Any, count: int) -> list[TurnPersisted]:
    return [TurnPersisted.model_validate(e.data) for e in await jetstream.events(count)]


# --- Responses ---------------------------------------------------------------------------

WEATHER_FUNCTION = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
RESPONSES_BODY: dict[str, Any] = {
    "model": "gpt-test",
    "instructions": "Be brief.",
    "input": [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "Hi!"}]},
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is my cat called?"},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="},
            ],
        },
    ],
    "tools": [WEATHER_FUNCTION],
    "metadata": {"app": "x"},
    "user": "ana",
    "memory_id": "pets",
}


async def test_responses_memory_goes_into_instructions_and_the_rest_is_forwarded_as_sent(
    client: httpx2.AsyncClient, scripted_upstream: Any, remembers: None, jetstream: Any
) -> None:
    response = await client.post("/v1/responses", json=RESPONSES_BODY)
    assert response.status_code == 200, response.text
    assert response.headers["x-engram-memory"] == "used"
    assert response.headers["x-engram-memory-hits"] == "1"
    payload = response.json()
    assert payload["object"] == "response" and [h["text"] for h in payload["memory_hits"]] == [FACT]

    forwarded = sent(scripted_upstream, "/v1/responses")
    assert without(forwarded, "instructions") == without(
        RESPONSES_BODY, "instructions", "memory_id"
    )
    instructions = forwarded["instructions"]
    assert instructions.startswith("Be brief.\n\n") and FACT in instructions

    user, assistant = await turns(jetstream, 2)
    assert (user.role, user.text, user.user_id, user.conversation_id) == (
        "user",
        "What is my cat called?",
        "ana",
        "pets",
    )
    assert user.turn_index == 2  # two message items before it
    assert assistant.role == "assistant" and assistant.text == "OK."


async def test_responses_stream_is_relayed_event_by_event_with_the_hits_on_the_first(
    client: httpx2.AsyncClient, scripted_upstream: Any, remembers: None, jetstream: Any
) -> None:
    scripted_upstream.replies = ["Your cat is Miso."]
    body = {"model": "m", "input": "What is my cat called?", "stream": True, "user": "ana"}
    async with client.stream("POST", "/v1/responses", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = b"".join([chunk async for chunk in response.aiter_raw()])
    events = [b for b in raw.decode().split("\n\n") if b]
    assert all(block.startswith("event: response.") for block in events), events
    first = json.loads(events[0].split("data: ", 1)[1])
    assert first["type"] == "response.created" and first["memory_hits"][0]["text"] == FACT
    assert FACT in sent(scripted_upstream, "/v1/responses")["instructions"]
    user, assistant = await turns(jetstream, 2)
    assert (user.text, assistant.text) == ("What is my cat called?", "Your cat is Miso.")


async def test_a_chained_response_records_only_its_new_item_once_per_retry(
    client: httpx2.AsyncClient, scripted_upstream: Any, jetstream: Any
) -> None:
    body = {"model": "m", "previous_response_id": "resp_1", "input": "And the dog?", "user": "ana"}
    for _ in range(2):  # the SDK's retry: one turn
        assert (await client.post("/v1/responses", json=body)).status_code == 200
    user, assistant = await turns(jetstream, 2)
    key = chained_turn_key("resp_1", 0, "And the dog?")
    assert user.turn_id == turn_id("default", "ana", "default", key, "user")
    assert assistant.role == "assistant"
    assert await jetstream.count() == 2  # the retry's events were de-duplicated
    assert sent_input(scripted_upstream) == ["And the dog?", "And the dog?"]


def sent_input(upstream: Any) -> list[Any]:
    return [r.body["input"] for r in upstream.requests if r.path == "/v1/responses"]


async def test_a_function_result_is_not_recorded_as_the_person_speaking(
    client: httpx2.AsyncClient, scripted_upstream: Any, jetstream: Any
) -> None:
    body = {
        "model": "m",
        "user": "ana",
        "input": [
            {"role": "user", "content": "Weather in Lisbon?"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "Sunny, 24 C"},
        ],
    }
    for _ in range(2):  # a retry records each turn once
        assert (await client.post("/v1/responses", json=body)).status_code == 200
    user, *model = await turns(jetstream, 3)
    assert user.text == "Weather in Lisbon?" and "Sunny" not in user.text
    key = chat_turn_key(0, user.text)
    assert user.turn_id == turn_id("default", "ana", "default", key, "user")
    # The call and its result: the model's turn, labelled, never the person speaking.
    assert sorted((t.role, t.text) for t in model) == [
        ("assistant", "OK."),
        ("assistant", "[tool call] get_weather({}) returned: Sunny, 24 C"),
    ]
    tool = next(t for t in model if t.text.startswith("[tool call]"))
    assert tool.turn_id == turn_id("default", "ana", "default", f"{key}/tool/c1", "assistant")
    assert await jetstream.count() == 3


async def test_responses_errors_are_openai_shaped(
    client: httpx2.AsyncClient, scripted_upstream: Any
) -> None:
    response = await client.post("/v1/responses", json={"model": "m", "input": 5})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "input"
    scripted_upstream.fail_with = 500
    failed = await client.post("/v1/responses", json={"model": "m", "input": "hi"})
    assert failed.status_code == 502 and failed.json()["error"]["code"] == "upstream_error"


# --- Anthropic Messages ------------------------------------------------------------------

MESSAGES_BODY: dict[str, Any] = {
    "model": "claude-test",
    "max_tokens": 256,
    "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": [{"type": "text", "text": "Hi!"}]},
        {"role": "user", "content": [{"type": "text", "text": "What is my cat called?"}]},
    ],
    "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
    "metadata": {"user_id": "ana"},
}


async def test_messages_memory_is_a_block_appended_to_system(
    client: httpx2.AsyncClient, scripted_upstream: Any, remembers: None, jetstream: Any
) -> None:
    response = await client.post(
        "/v1/messages",
        json=MESSAGES_BODY,
        headers={"X-Engram-Memory-Id": "pets", "anthropic-version": "2023-06-01"},
    )
    assert response.status_code == 200, response.text
    assert response.json()["type"] == "message"
    assert [h["text"] for h in response.json()["memory_hits"]] == [FACT]
    forwarded = sent(scripted_upstream, "/v1/messages")
    assert without(forwarded, "system") == without(MESSAGES_BODY, "system")
    kept, added = forwarded["system"][:-1], forwarded["system"][-1]
    assert kept == MESSAGES_BODY["system"] and added["type"] == "text" and FACT in added["text"]
    (request,) = [r for r in scripted_upstream.requests if r.path == "/v1/messages"]
    assert request.headers["anthropic-version"] == "2023-06-01"
    assert not [h for h in request.headers if h.startswith("x-engram")]
    user, _ = await turns(jetstream, 2)
    assert (user.text, user.user_id, user.conversation_id) == (
        "What is my cat called?",
        "ana",
        "pets",
    )


async def test_messages_string_system_gets_a_paragraph_and_streams_keep_their_framing(
    client: httpx2.AsyncClient, scripted_upstream: Any, remembers: None, jetstream: Any
) -> None:
    scripted_upstream.replies = ["Miso."]
    body = {**copy.deepcopy(MESSAGES_BODY), "system": "Be brief.", "stream": True}
    async with client.stream("POST", "/v1/messages", json=body) as response:
        assert response.status_code == 200
        raw = b"".join([chunk async for chunk in response.aiter_raw()]).decode()
    names = [block.split("\n")[0] for block in raw.split("\n\n") if block]
    assert names[0] == "event: message_start" and names[-1] == "event: message_stop"
    start = json.loads(raw.split("\n\n")[0].split("data: ", 1)[1])
    assert start["message"]["memory_hits"][0]["text"] == FACT
    system = sent(scripted_upstream, "/v1/messages")["system"]
    assert system.startswith("Be brief.\n\n") and FACT in system
    _, assistant = await turns(jetstream, 2)
    assert assistant.text == "Miso."


async def test_a_tool_result_is_not_the_person_speaking(
    client: httpx2.AsyncClient, scripted_upstream: Any, jetstream: Any
) -> None:
    body = copy.deepcopy(MESSAGES_BODY)
    body["messages"] += [
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "get_weather", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"}],
        },
    ]
    assert (await client.post("/v1/messages", json=body)).status_code == 200
    user, *model = await turns(jetstream, 3)
    assert user.text == "What is my cat called?" and user.turn_index == 2
    assert "[tool call] get_weather({}) returned: Sunny" in [t.text for t in model]


async def test_ollama_tool_results_are_recorded_as_the_models_labelled_turns(
    client: httpx2.AsyncClient, scripted_upstream: Any, jetstream: Any
) -> None:
    body = copy.deepcopy(OLLAMA_BODY)
    body["messages"] += [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Lisbon"}}}],
        },
        {"role": "tool", "content": "Sunny", "tool_name": "get_weather"},
    ]
    assert (await client.post("/api/chat", json=body)).status_code == 200
    user, *model = await turns(jetstream, 3)
    assert user.text == "What is my cat called?"
    assert '[tool call] get_weather({"city": "Lisbon"}) returned: Sunny' in [t.text for t in model]


async def test_messages_errors_are_anthropic_shaped(
    client: httpx2.AsyncClient, scripted_upstream: Any
) -> None:
    bad = await client.post("/v1/messages", json={"model": "m", "messages": []})
    assert bad.status_code == 400
    assert bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "invalid_request_error"
    scripted_upstream.fail_with = 503
    failed = await client.post("/v1/messages", json=MESSAGES_BODY)
    assert failed.status_code == 502
    assert failed.json()["error"]["type"] == "api_error" and failed.json()["error"]["message"]
    scripted_upstream.fail_with = 429
    relayed = await client.post("/v1/messages", json=MESSAGES_BODY)
    assert relayed.status_code == 429  # the upstream's own error, relayed as it came
    assert relayed.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "scripted failure"},
    }


# --- Ollama chat -----------------------------------------------------------------------

OLLAMA_BODY: dict[str, Any] = {
    "model": "llama3",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is my cat called?", "images": ["iVBORw0KGgo="]},
    ],
    "options": {"temperature": 0},
    "stream": False,
}


async def test_ollama_memory_is_a_system_message_before_the_question(
    client: httpx2.AsyncClient, scripted_upstream: Any, remembers: None, jetstream: Any
) -> None:
    response = await client.post(
        "/api/chat", json=OLLAMA_BODY, headers={"X-OpenWebUI-User-Id": "ana"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["message"]["content"] == "OK."
    assert response.json()["memory_hits"][0]["text"] == FACT
    forwarded = sent(scripted_upstream, "/api/chat")
    messages = forwarded["messages"]
    assert messages[0] == OLLAMA_BODY["messages"][0] and messages[2] == OLLAMA_BODY["messages"][1]
    assert messages[1]["role"] == "system" and FACT in messages[1]["content"]
    assert without(forwarded, "messages") == without(OLLAMA_BODY, "messages")
    user, assistant = await turns(jetstream, 2)
    assert (user.user_id, user.text, assistant.text) == ("ana", "What is my cat called?", "OK.")


async def test_ollama_streams_ndjson_by_default(
    client: httpx2.AsyncClient, scripted_upstream: Any, remembers: None, jetstream: Any
) -> None:
    scripted_upstream.replies = ["It is Miso."]
    body = without(OLLAMA_BODY, "stream")
    async with client.stream("POST", "/api/chat", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in (await response.aread()).decode().splitlines()]
    assert lines[0]["memory_hits"][0]["text"] == FACT
    assert "".join(line["message"]["content"] for line in lines) == "It is Miso."
    assert lines[-1]["done"] is True
    _, assistant = await turns(jetstream, 2)
    assert assistant.text == "It is Miso."


async def test_ollama_errors_are_ollama_shaped(
    client: httpx2.AsyncClient, scripted_upstream: Any, jetstream: Any
) -> None:
    bad = await client.post("/api/chat", json={"model": "m", "stream": "yes"})
    assert bad.status_code == 400 and isinstance(bad.json()["error"], str)
    scripted_upstream.fail_with = 500
    failed = await client.post("/api/chat", json=OLLAMA_BODY)
    assert failed.status_code == 502 and "HTTP 500" in failed.json()["error"]
    assert await jetstream.count() == 0  # a failed upstream call leaves no turn


# --- the pipeline ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"model": "m", "input": "hi"}),
        (
            "/v1/messages",
            {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
        ),
        ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("upstream_fails", [False, True])
async def test_the_upstream_call_span_ends_once_whatever_happens(
    gateway: Any,
    scripted_upstream: Any,
    path: str,
    body: dict[str, Any],
    stream: bool,
    upstream_fails: bool,
) -> None:
    scripted_upstream.fail_with = 500 if upstream_fails else None
    response = await gateway.client().post(path, json={**body, "stream": stream})
    assert response.status_code == (502 if upstream_fails else 200)
    calls = [s for s in gateway.spans.get_finished_spans() if s.name == "chat m"]
    assert len(calls) == 1
    assert (calls[0].status.status_code.name == "ERROR") is upstream_fails


async def test_a_callers_x_api_key_never_reaches_the_upstream_when_engram_has_keys(
    start_gateway: Any, scripted_upstream: Any
) -> None:
    # Anthropic's SDKs send their key in x-api-key: with Engram's own keys configured it
    # may be the caller's Engram key, which the upstream must never see.
    key = "engram-key-1"
    gateway = await start_gateway(
        api_keys=f"sha256:{hashlib.sha256(key.encode()).hexdigest()}=acme"
    )
    headers = {"Authorization": f"Bearer {key}", "x-api-key": key}
    for path, body in (("/v1/messages", MESSAGES_BODY), ("/v1/chat/completions", CHAT_BODY)):
        response = await gateway.client().post(path, json=body, headers=headers)
        assert response.status_code == 200, response.text
    assert [r.headers.get("x-api-key") for r in scripted_upstream.requests] == [None, None]


async def test_the_operators_key_goes_in_x_api_key_to_the_messages_upstream(
    start_gateway: Any, scripted_upstream: Any
) -> None:
    gateway = await start_gateway(llm_api_key="sk-operator")
    response = await gateway.client().post("/v1/messages", json=MESSAGES_BODY)
    assert response.status_code == 200, response.text
    (request,) = scripted_upstream.requests
    assert request.headers["x-api-key"] == "sk-operator"
    assert "authorization" not in request.headers


CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_controls_in_metadata_are_read_and_removed_the_rest_of_metadata_kept(
    client: httpx2.AsyncClient, scripted_upstream: Any, jetstream: Any
) -> None:
    body = {
        "model": "m",
        "input": "hi",
        "user": "ana",
        "metadata": {"memory_id": "pets", "app": "x"},
    }
    assert (await client.post("/v1/responses", json=body)).status_code == 200
    assert sent(scripted_upstream, "/v1/responses")["metadata"] == {"app": "x"}
    user, _ = await turns(jetstream, 2)
    assert user.conversation_id == "pets"

    off = {**MESSAGES_BODY, "metadata": {"user_id": "ana", "memory": "false"}}
    response = await client.post("/v1/messages", json=off)
    assert response.headers["x-engram-memory"] == "bypassed"
    assert sent(scripted_upstream, "/v1/messages")["metadata"] == {"user_id": "ana"}

    unknown = {**MESSAGES_BODY, "metadata": {"memory_colour": "teal"}}
    refused = await client.post("/v1/messages", json=unknown)
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "metadata.memory_colour"
