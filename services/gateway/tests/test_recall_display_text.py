"""A memory reads the same everywhere: a profile entry stored without text (created
through the API or the mirror) is ``category key: value`` in ``memory_hits`` and in the
injected message, as retrieval indexes it (MemoryRecord.display_text)."""

from __future__ import annotations

from datetime import UTC, datetime

from engram_core.memory import (
    MemoryRecord,
    ProposedProfileFact,
    Scores,
    SearchHit,
    SearchResult,
)
from engram_gateway.recall import hit_json, render_memory

NOW = datetime(2025, 3, 10, tzinfo=UTC)
ENTRY = MemoryRecord(
    id="6f1c1d0e-3f5e-5a57-9d8e-656e6772616d",
    kind="profile",
    text="",
    user_id="u",
    created_at=NOW,
    profile=ProposedProfileFact(category="preference", key="drink", value="tea", confidence=0.9),
)
HIT = SearchHit(
    memory=ENTRY,
    scores=Scores(dense=0.9, sparse=None, relevance=0.9, recency=1.0, total=0.9, mmr=0.9),
    scope="user",
)


def test_a_profile_hit_without_text_reads_as_its_entry() -> None:
    assert hit_json(HIT)["text"] == "preference drink: tea"
    assert ENTRY.display_text == "preference drink: tea"


def test_the_injected_message_shows_what_it_says() -> None:
    text = render_memory(SearchResult(outcome="ranked", hits=[HIT]), now=NOW) or ""
    assert "preference drink: tea" in text
