"""Pure pieces: settings, memory controls, the memory message, the SSE reader."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from engram_core.proto import pb, to_timestamp
from engram_core.settings import ConfigError, load_settings
from engram_gateway.controls import split_memory_controls
from engram_gateway.errors import GatewayError
from engram_gateway.memory import (
    hit_json,
    inject,
    latest_user_index,
    message_text,
    render_memory,
    search_request,
)
from engram_gateway.settings import GatewaySettings
from engram_gateway.sse import ChatStreamReader
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


def test_search_request_sends_only_what_was_set() -> None:
    controls, _ = split_memory_controls({"memory_top_k": 4, "memory_id": "c9"}, {})
    request = search_request(tenant="t", query="q", user_id="u", controls=controls)
    assert (request.tenant, request.query, request.user_id, request.conversation_id) == (
        "t",
        "q",
        "u",
        "c9",
    )
    assert request.HasField("top_k") and request.top_k == 4
    assert not request.HasField("recency_weight")
    assert not request.HasField("score_threshold")
    assert not request.HasField("mmr_lambda")
    assert list(request.scopes) == []  # retrieval's default scopes


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
    text = render_memory(response, now=NOW)
    assert text is not None
    assert "Today is 2025-03-10." in text
    assert "Conversation summary (as of 2025-03-09):\nPlanning a trip to Lisbon." in text
    assert "- preference/diet: vegetarian" in text
    assert "1. [2025-03-04] fact: Lives in Berlin." in text
    assert "2. [2025-03-04] user said: I love hiking" in text


def test_render_memory_nothing_relevant_and_empty() -> None:
    text = render_memory(pb.SearchResponse(outcome=pb.SEARCH_OUTCOME_NOTHING_RELEVANT), now=NOW)
    assert text is not None and "No stored memory is relevant" in text
    assert render_memory(pb.SearchResponse(outcome=pb.SEARCH_OUTCOME_EMPTY), now=NOW) is None


def test_hit_json_carries_the_score_breakdown() -> None:
    hit = pb.SearchHit(
        memory=_memory(pb.MEMORY_KIND_TURN, "hello", role="assistant", conversation_id="c"),
        scores=pb.ScoreBreakdown(dense=0.5, relevance=0.8, recency=0.25, total=0.7, mmr=0.1),
        scope=pb.SCOPE_USER,
    )
    assert hit_json(hit) == {
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


def test_turn_ids_are_deterministic() -> None:
    scope = TurnScope("default", "u", "c", "req-1", "m")
    user, again = scope.event("user", "hi"), scope.event("user", "hi")
    assert user.turn_id == again.turn_id == turn_id("default", "req-1", "user")
    assert user.event_id == again.event_id
    assert scope.event("assistant", "yo").turn_id != user.turn_id
    assert TurnScope("other", "u", "c", "req-1", "m").event("user", "hi").turn_id != user.turn_id


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
