"""Deterministic ids are stored: every memory, history version and event id was derived
from these namespaces. Each value and one id per function is pinned, so a change that
would re-key stored memories (or let a redelivered event duplicate one) fails here."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from engram_core import ids
from engram_core.memory import MemoryRecord, ProposedProfileFact

T0 = datetime(2025, 3, 4, 5, 6, 7, 890123, tzinfo=UTC)


def test_the_namespaces_never_change() -> None:
    namespaces = {
        "memory": ids.MEMORY_NAMESPACE,
        "lifecycle": ids.LIFECYCLE_NAMESPACE,
        "summary": ids.SUMMARY_NAMESPACE,
        "event": ids.EVENT_NAMESPACE,
        "gateway": ids.GATEWAY_NAMESPACE,
        "turn": ids.TURN_NAMESPACE,
        "fact": ids.FACT_NAMESPACE,
        "episode": ids.EPISODE_NAMESPACE,
    }
    assert namespaces == {
        "memory": uuid.UUID("6f1c1d0e-3f5e-5a57-9d8e-656e6772616d"),
        "lifecycle": uuid.UUID("3f0e7d1c-5a8b-4c2e-9f61-6c6966656379"),
        "summary": uuid.UUID("0b5c0a8e-6d1f-5f7a-9b2e-73756d6d6172"),
        "event": uuid.UUID("6f1d3c52-2b8e-4f0e-9a51-0c7e2f0d9a11"),
        "gateway": uuid.UUID("5b0f4d4e-7c1a-4a53-9c64-2a1f0e9d6c11"),
        "turn": uuid.UUID("6f1d3c52-8a57-4f55-9a0e-2f1e8a5b7c31"),
        "fact": uuid.UUID("0b7e3a56-5c2d-4f1e-8f43-7265636f6e63"),
        "episode": uuid.UUID("0b5c0a8e-6d1f-5f7a-9b2e-657069736f64"),
    }


def test_memory_ids_derived_by_retrieval_are_the_stored_ones() -> None:
    profile = MemoryRecord(
        id="ignored",
        kind="profile",
        text="",
        user_id="u",
        profile=ProposedProfileFact(category="identity", key="name", value="Bob", confidence=0.9),
    )
    assert ids.memory_id("t", profile) == "7d0a6496-b31d-5ad1-9848-fda5b09a6076"
    dated = MemoryRecord(id="x", kind="fact", text="likes tea", conversation_id="c", created_at=T0)
    assert ids.memory_id("t", dated) == "bd6f8a8f-f8f2-5424-9fcb-02fb8812f96c"
    turn = MemoryRecord(id="x", kind="turn", role="user", text="hi", source_id="d1:3")
    assert ids.memory_id("t", turn) == "21ea2220-b9d3-55d3-9876-ada3d195af2d"


def test_every_derived_id_is_pinned() -> None:
    assert {
        "summary": ids.summary_memory_id("t", "u", "c"),
        "summary without a user": ids.summary_memory_id("t", "", "c"),
        "history": ids.history_version_id("t", "m1", "d1"),
        "changed": ids.memory_changed_event_id("t", "m1", "upserted", "d1"),
        "event": ids.event_id("a", "b"),
        "turn": ids.turn_id("t", "u", "c", "chat/0/x", "user"),
        "turn event": ids.turn_event_id("turn-1", "hello"),
        "created": ids.created_memory_id("t", "req-1"),
        "turn memory": ids.turn_memory_id("t", "c", "turn-1"),
        "fact": ids.fact_memory_id("t", "u", "c", "User likes Tea."),
        "fact reasserted": ids.fact_memory_id("t", "u", "", "likes tea", "r1"),
        "profile": ids.profile_memory_id("t", "u", "preference", "drink", "Tea"),
        "profile reasserted": ids.profile_memory_id("t", "u", "preference", "drink", "Tea", "r1"),
        "episode": ids.episode_memory_id("t", "c", ["b", "a"]),
    } == {
        "summary": "e43a8f87-7643-5dcb-b9eb-f241ca546db5",
        "summary without a user": "4d9ae52a-a635-5d33-b28e-67022cc47036",
        "history": "c4af3f6b-3426-5ee8-88cc-6d252a1684a7",
        "changed": "efc2c86c-8b16-52f1-add8-086f3a01fc49",
        "event": "b74e1497-8d9b-50bc-962f-fa4add103cc2",
        "turn": "67b5b19e-70d0-56a1-b85a-a8419dcc3dae",
        "turn event": "6c1d345e-10fe-5579-9ea1-d3333a26ed2d",
        "created": "5373612a-a845-5d54-96b7-b15d6270aabd",
        "turn memory": "84f6587c-72c8-5564-a179-c7963f845b55",
        "fact": "2fecd5f8-7980-551d-828c-67b8ad388b7c",
        "fact reasserted": "2171d32f-8603-5276-8ac5-92041e7cf85c",
        "profile": "06635bb8-c884-5283-bd0a-3312fcfb41fc",
        "profile reasserted": "fecbaa9d-571f-5c1b-bdc6-0b28dbccce6b",
        "episode": "af65e85c-e3e2-511b-9a2e-4755f234b8b8",
    }


def test_normalize_id_gives_the_canonical_uuid() -> None:
    assert ids.normalize_id("6F1C1D0E-3F5E-5A57-9D8E-656E6772616D") == (
        "6f1c1d0e-3f5e-5a57-9d8e-656e6772616d"
    )
    assert ids.normalize_id("nope") is None
