"""Pure pieces: settings, memory controls, the memory message, the SSE reader."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from engram_core.memory_port import result_from_pb
from engram_core.proto import pb, to_timestamp
from engram_core.settings import ConfigError, load_settings
from engram_gateway.controls import split_memory_controls
from engram_gateway.errors import GatewayError
from engram_gateway.recall import (
    hit_json,
    inject,
    latest_user_index,
    message_text,
    render_memory,
    search_query,
)
from engram_gateway.settings import GatewaySettings
from engram_gateway.sse import ChatStreamReader, with_first_event_field
from engram_gateway.turns import TurnScope, turn_id

NOW = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)

# --- settings ------------------------------------------------------------------------


def test_settings_defaults() -> None:
    settings = GatewaySettings()
    assert (settings.gateway_host, settings.gateway_port) == ("127.0.0.1", 8100)
    assert settings.llm_base_url == "http://localhost:11434/v1"
    assert settings.llm_api_key is None
    assert settings.gateway_memory_top_k is None  # retrieval's default applies


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_GATEWAY_PORT", "9000")
    monkeypatch.setenv("ENGRAM_LLM_BASE_URL", "https://api.example.com/v1/")
    monkeypatch.setenv("ENGRAM_LLM_API_KEY", "sk-secret")
    settings = load_settings(GatewaySettings)
    assert settings.gateway_port == 9000
    assert settings.llm_base_url == "https://api.example.com/v1"
    assert settings.llm_api_key is not None
    assert "sk-secret" not in repr(settings)


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("ENGRAM_GATEWAY_PORT", "70000"),
        ("ENGRAM_LLM_BASE_URL", "localhost:11434"),
        ("ENGRAM_LLM_TIMEOUT_S", "0"),
        ("ENGRAM_GATEWAY_MEMORY_TOP_K", "0"),
        ("ENGRAM_GATEWAY_MAX_BODY_BYTES", "many"),
    ],
)
def test_bad_settings_fail_fast_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, var: str, value: str
) -> None:
    monkeypatch.setenv(var, value)
    with pytest.raises(ConfigError) as info:
        load_settings(GatewaySettings)
    assert var in str(info.value)


# --- memory controls -----------------------------------------------------------------


def test_controls_are_split_from_the_body_in_order() -> None:
    body = {
        "model": "m",
        "memory_id": "c1",
        "messages": [],
        "memory_top_k": 3,
        "user": "u",
        "memory": True,
        "x": 1,
    }
    controls, forwarded = split_memory_controls(body, {})
    assert list(forwarded) == ["model", "messages", "user", "x"]
    assert controls.memory_id == "c1"
    assert controls.memory_top_k == 3
    assert controls.enabled


def test_body_wins_over_header() -> None:
    controls, _ = split_memory_controls(
        {"memory_top_k": 2, "memory_id": None},
        {
            "x-engram-memory-top-k": "9",
            "x-engram-memory-id": "from-header",
            "x-engram-memory-recency-weight": "0.5",
            "x-engram-memory": "off",
        },
    )
    assert controls.memory_top_k == 2  # body
    assert controls.memory_id == "from-header"  # null in the body: not set
    assert controls.memory_recency_weight == 0.5
    assert controls.enabled is False


def test_operator_defaults_fill_the_gaps() -> None:
    settings = GatewaySettings(gateway_memory_top_k=7, gateway_memory_enabled=False)
    controls, _ = split_memory_controls({"memory_mmr_lambda": 1}, {})
    controls = controls.with_defaults(settings)
    assert (controls.memory_top_k, controls.memory_mmr_lambda, controls.enabled) == (7, 1.0, False)
    assert controls.memory_score_threshold is None


@pytest.mark.parametrize(
    ("body", "headers", "param"),
    [
        ({"memory_topk": 3}, {}, "memory_topk"),
        ({"memory_top_k": "3"}, {}, "memory_top_k"),
        ({"memory_top_k": 3.0}, {}, "memory_top_k"),
        ({"memory_top_k": 0}, {}, "memory_top_k"),
        ({"memory_recency_weight": 1.5}, {}, "memory_recency_weight"),
        ({"memory": "false"}, {}, "memory"),
        ({"memory_id": "../etc"}, {}, "memory_id"),
        ({"memory_id": ""}, {}, "memory_id"),
        ({}, {"x-engram-memory-top-k": "three"}, "X-Engram-Memory-Top-K"),
        ({}, {"x-engram-memory-score-threshold": "2"}, "X-Engram-Memory-Score-Threshold"),
        ({}, {"x-engram-memory": "maybe"}, "X-Engram-Memory"),
        ({}, {"x-engram-memory-colour": "blue"}, "x-engram-memory-colour"),
    ],
)
def test_bad_controls_are_400_naming_the_control(
    body: dict[str, object], headers: dict[str, str], param: str
) -> None:
    with pytest.raises(GatewayError) as info:
        split_memory_controls(body, headers)
    assert info.value.status == 400
    assert info.value.param == param
    assert param in info.value.message


def test_search_query_sends_only_what_was_set() -> None:
    controls, _ = split_memory_controls({"memory_top_k": 4, "memory_id": "c9"}, {})
    query = search_query(tenant="t", query="q", user_id="u", controls=controls)
    assert (query.tenant, query.text, query.user_id, query.conversation_id) == ("t", "q", "u", "c9")
    assert query.top_k == 4
    assert query.recency_weight is None
    assert query.score_threshold is None
    assert query.mmr_lambda is None
    assert query.scopes == ()  # retrieval's default scopes


# --- reading messages, injecting memory ----------------------------------------------


def test_message_text_and_latest_user() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "t"}]},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "x"}},
                {"type": "text", "text": "here"},
            ],
        },
        {"role": "tool", "content": "r", "tool_call_id": "t"},
    ]
    assert latest_user_index(messages) == 3
    assert message_text(messages[3]) == "look\nhere"
    assert message_text(messages[2]) == ""
    assert latest_user_index([{"role": "system", "content": "s"}]) is None
    memory = {"role": "system", "content": "m"}
    assert inject(messages, 3, memory)[3:5] == [memory, messages[3]]
    assert len(messages) == 5  # not mutated


def _memory(kind: int, text: str, **fields: object) -> pb.Memory:
    return pb.Memory(
        id="m",
        kind=kind,
        text=text,
        created_at=to_timestamp(datetime(2025, 3, 4, tzinfo=UTC)),
        **fields,
    )


def test_render_memory_has_summary_profile_and_dated_hits() -> None:
    response = pb.SearchResponse(
        outcome=pb.SEARCH_OUTCOME_RANKED,
        summary=_memory(
            pb.MEMORY_KIND_SUMMARY,
            "Planning a trip to Lisbon.",
            updated_at=to_timestamp(datetime(2025, 3, 9, tzinfo=UTC)),
        ),
        profile=[
            _memory(
                pb.MEMORY_KIND_PROFILE,
                "diet: vegetarian",
                profile=pb.ProfileEntry(category="preference", key="diet", value="vegetarian"),
            )
        ],
        hits=[
            pb.SearchHit(memory=_memory(pb.MEMORY_KIND_FACT, "Lives in Berlin.")),
            pb.SearchHit(memory=_memory(pb.MEMORY_KIND_TURN, "I love\n hiking", role="user")),
        ],
    )
    text = render_memory(result_from_pb(response), now=NOW)
    assert text is not None
    assert "Today is 2025-03-10." in text
    assert 'Conversation summary (as of 2025-03-09):\n"Planning a trip to Lisbon."' in text
    assert '- "preference/diet": "vegetarian"' in text
    assert '1. [2025-03-04] fact: "Lives in Berlin."' in text
    assert '2. [2025-03-04] user said: "I love hiking"' in text


def test_render_memory_nothing_relevant_and_empty() -> None:
    nothing = pb.SearchResponse(outcome=pb.SEARCH_OUTCOME_NOTHING_RELEVANT)
    text = render_memory(result_from_pb(nothing), now=NOW)
    assert text is not None and "No stored memory is relevant" in text
    empty = pb.SearchResponse(outcome=pb.SEARCH_OUTCOME_EMPTY)
    assert render_memory(result_from_pb(empty), now=NOW) is None


def test_render_memory_labels_a_corrected_statement_and_an_overview() -> None:
    corrected = _memory(
        pb.MEMORY_KIND_TURN,
        "My wife's name is Anne.",
        role="user",
        metadata={"corrected_by": "f2", "corrected_at": "2025-03-05T10:00:00Z"},
    )
    fact = _memory(pb.MEMORY_KIND_FACT, "User's wife's name is Jane")
    response = pb.SearchResponse(
        outcome=pb.SEARCH_OUTCOME_RANKED,
        hits=[pb.SearchHit(memory=fact), pb.SearchHit(memory=corrected)],
    )
    text = render_memory(result_from_pb(response), now=NOW) or ""
    assert "1. [2025-03-04] fact: \"User's wife's name is Jane\"" in text
    assert (
        "2. [2025-03-04] user said (earlier; corrected on 2025-03-05, do not rely on it): "
        '"My wife\'s name is Anne."' in text
    )
    summary = _memory(pb.MEMORY_KIND_SUMMARY, "Talked about the trip.", conversation_id="trip")
    overview = pb.SearchResponse(
        outcome=pb.SEARCH_OUTCOME_OVERVIEW,
        hits=[pb.SearchHit(memory=fact), pb.SearchHit(memory=summary)],
    )
    text = render_memory(result_from_pb(overview), now=NOW) or ""
    assert "Everything remembered about this user" in text
    assert '2. [2025-03-04] summary of conversation "trip": "Talked about the trip."' in text


def test_hit_json_carries_the_score_breakdown() -> None:
    hit = pb.SearchHit(
        memory=_memory(pb.MEMORY_KIND_TURN, "hello", role="assistant", conversation_id="c"),
        scores=pb.ScoreBreakdown(dense=0.5, relevance=0.8, recency=0.25, total=0.7, mmr=0.1),
        scope=pb.SCOPE_USER,
    )
    assert hit_json(result_from_pb(pb.SearchResponse(hits=[hit])).hits[0]) == {
        "id": "m",
        "text": "hello",
        "kind": "turn",
        "score": 0.7,
        "created_at": "2025-03-04T00:00:00Z",
        "scope": "user",
        "conversation_id": "c",
        "role": "assistant",
        "scores": {
            "dense": 0.5,
            "sparse": None,
            "relevance": 0.8,
            "recency": 0.25,
            "total": 0.7,
            "mmr": 0.1,
        },
    }


# --- turn ids ------------------------------------------------------------------------


def _chat_scope(**change: object) -> TurnScope:
    values: dict[str, object] = {
        "tenant": "default",
        "user_id": "u",
        "conversation_id": "c",
        "request_id": "req-1",
        "model": "m",
        "turn_index": 4,
        "prompt": "Where do I like to hike?",
        **change,
    }
    return TurnScope.chat(**values)


def test_a_turn_is_identified_by_what_it_is_not_by_the_request() -> None:
    scope = _chat_scope()
    user = scope.event("user", "Where do I like to hike?")
    # a retried request (new request id, same history position and text): the same turn
    retried = _chat_scope(request_id="req-2").event("user", "Where do I like to hike?")
    assert retried.turn_id == user.turn_id and retried.event_id == user.event_id
    assert user.turn_id == turn_id("default", "u", "c", scope.key, "user")
    # another user, conversation, tenant, position or text: another turn
    for change in (
        {"user_id": "v"},
        {"conversation_id": "d"},
        {"tenant": "other"},
        {"turn_index": 6},
        {"prompt": "Where do I like to swim?"},
    ):
        assert _chat_scope(**change).event("user", "x").turn_id != user.turn_id, change
    # the reply to that turn has one identity; a regenerated reply is a new event for it
    reply, regenerated = scope.event("assistant", "The Alps."), scope.event("assistant", "Alps!")
    assert reply.turn_id == regenerated.turn_id != user.turn_id
    assert reply.event_id != regenerated.event_id
    assert (user.turn_index, reply.turn_index) == (4, 5)


async def test_the_first_stream_event_carries_an_extra_field() -> None:
    async def upstream():
        yield b'data: {"id":"c1","choices":[{"index":0,"delta":{"role":"assistant"}}]}'
        yield b'\r\n\r\ndata: {"id":"c1","choices":[]}\n\n'
        yield b"data: [DONE]\n\n"

    out = b"".join([c async for c in with_first_event_field(upstream(), "memory_hits", [1])])
    events = [e for e in out.replace(b"\r\n", b"\n").split(b"\n\n") if e]
    assert events[0].startswith(b"data: ") and b'"memory_hits":[1]' in events[0]
    assert events[1:] == [b'data: {"id":"c1","choices":[]}', b"data: [DONE]"]


# --- SSE reader ----------------------------------------------------------------------


def test_sse_reader_across_arbitrary_chunk_boundaries() -> None:
    stream = (
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\r\n\r\n'
        b": keep-alive\n\n"
        b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}},'
        b'{"index":1,"delta":{"content":"Other"}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":"lo \xc3\xa9"}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        b'data: {"choices":[],"usage":{"total_tokens":3}}\n\n'
        b"data: [DONE]\n\n"
    )
    for size in (1, 7, len(stream)):
        reader = ChatStreamReader()
        for start in range(0, len(stream), size):
            reader.feed(stream[start : start + size])
        assert reader.text(0) == "Hello é"
        assert reader.text(1) == "Other"
        assert reader.done and reader.complete


def test_sse_reader_incomplete_and_error() -> None:
    reader = ChatStreamReader()
    reader.feed(b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n')
    assert not reader.complete
    reader.feed(b'data: {"error":{"message":"boom"}}\n\n')
    reader.feed(b"data: [DONE]\n\n")
    assert reader.error == {"message": "boom"} and not reader.complete
