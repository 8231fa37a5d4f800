"""The memory message: the search query a chat sends, reading the request's messages,
rendering what retrieval found (summary, profile, dated hits, corrections, an overview)
and the hits reported to the caller."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from engram_core.memory import (
    MemoryKindName,
    MemoryRecord,
    ProposedProfileFact,
    Scores,
    SearchHit,
    SearchResult,
)
from engram_gateway.controls import split_memory_controls
from engram_gateway.recall import (
    hit_json,
    inject,
    latest_user_index,
    message_text,
    render_memory,
    search_query,
)

NOW = datetime(2025, 3, 10, 12, 0, tzinfo=UTC)


def test_search_query_sends_only_what_was_set() -> None:
    controls, _ = split_memory_controls({"memory_top_k": 4, "memory_id": "c9"}, {})
    query = search_query(tenant="t", query="q", user_id="u", controls=controls)
    assert (query.tenant, query.text, query.user_id, query.conversation_id) == ("t", "q", "u", "c9")
    assert query.top_k == 4
    assert query.recency_weight is None
    assert query.score_threshold is None
    assert query.mmr_lambda is None
    assert query.scopes == ()  # retrieval's default scopes


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


def _memory(kind: MemoryKindName, text: str, **fields: Any) -> MemoryRecord:
    return MemoryRecord(
        id="m", kind=kind, text=text, created_at=datetime(2025, 3, 4, tzinfo=UTC), **fields
    )


def _hit(memory: MemoryRecord) -> SearchHit:
    scores = Scores(dense=0.0, sparse=None, relevance=0.0, recency=0.0, total=0.0, mmr=0.0)
    return SearchHit(memory=memory, scores=scores, scope=None)


def test_render_memory_has_summary_profile_and_dated_hits() -> None:
    response = SearchResult(
        outcome="ranked",
        summary=_memory(
            "summary",
            "Planning a trip to Lisbon.",
            updated_at=datetime(2025, 3, 9, tzinfo=UTC),
        ),
        profile=[
            _memory(
                "profile",
                "diet: vegetarian",
                profile=ProposedProfileFact(
                    category="preference", key="diet", value="vegetarian", confidence=0.9
                ),
            )
        ],
        hits=[
            _hit(_memory("fact", "Lives in Berlin.")),
            _hit(_memory("turn", "I love\n hiking", role="user")),
        ],
    )
    text = render_memory(response, now=NOW)
    assert text is not None
    assert "Today is 10 March 2025." in text
    assert 'Conversation summary (as of 9 March 2025):\n"Planning a trip to Lisbon."' in text
    assert '- "preference/diet": "vegetarian"' in text
    assert '1. [4 March 2025] fact: "Lives in Berlin."' in text
    assert '2. [4 March 2025] user said: "I love hiking"' in text


def test_render_memory_nothing_relevant_and_empty() -> None:
    nothing = SearchResult(outcome="nothing_relevant")
    text = render_memory(nothing, now=NOW)
    assert text is not None and "No stored memory is relevant" in text
    empty = SearchResult(outcome="empty")
    assert render_memory(empty, now=NOW) is None


def test_render_memory_labels_a_corrected_statement_and_an_overview() -> None:
    corrected = _memory(
        "turn",
        "My wife's name is Anne.",
        role="user",
        metadata={"corrected_by": "f2", "corrected_at": "2025-03-05T10:00:00Z"},
    )
    fact = _memory("fact", "User's wife's name is Jane")
    response = SearchResult(
        outcome="ranked",
        hits=[_hit(fact), _hit(corrected)],
    )
    text = render_memory(response, now=NOW) or ""
    assert "1. [4 March 2025] fact: \"User's wife's name is Jane\"" in text
    assert (
        "2. [4 March 2025] user said (earlier; corrected on 5 March 2025, do not rely on it): "
        '"My wife\'s name is Anne."' in text
    )
    summary = _memory("summary", "Talked about the trip.", conversation_id="trip")
    overview = SearchResult(
        outcome="overview",
        hits=[_hit(fact), _hit(summary)],
    )
    text = render_memory(overview, now=NOW) or ""
    assert "Everything remembered about this user" in text
    assert '2. [4 March 2025] summary of conversation "trip": "Talked about the trip."' in text


def test_hit_json_carries_the_score_breakdown() -> None:
    hit = SearchHit(
        memory=_memory("turn", "hello", role="assistant", conversation_id="c"),
        scores=Scores(dense=0.5, sparse=None, relevance=0.8, recency=0.25, total=0.7, mmr=0.1),
        scope="user",
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
