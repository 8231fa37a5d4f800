"""The memory lifecycle every writer shares (engram_core.lifecycle): supersede, edit with
history, correct the source turns, and announce each change under one event id."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from engram_core import lifecycle
from engram_core.memory import MemoryRecord, ProposedProfileFact

SAID = datetime(2026, 1, 1, 9, tzinfo=UTC)
LATER = datetime(2026, 3, 1, 9, tzinfo=UTC)


def fact(text: str = "User loves pizza", **fields: object) -> MemoryRecord:
    values: dict[str, object] = {
        "id": "f1",
        "kind": "fact",
        "text": text,
        "user_id": "alice",
        "conversation_id": "c1",
        "created_at": SAID,
        "source_turn_ids": ["t1"],
    }
    return MemoryRecord.model_validate(values | fields)


def turn(**fields: object) -> MemoryRecord:
    values: dict[str, object] = {
        "id": "t1",
        "kind": "turn",
        "role": "user",
        "text": "I love pizza",
        "created_at": SAID,
    }
    return MemoryRecord.model_validate(values | fields)


def test_a_superseded_memory_keeps_its_text_and_leaves_current_search() -> None:
    old = lifecycle.superseded(fact(), by="f2", at=LATER)
    assert (old.text, old.superseded_by, old.valid_to) == ("User loves pizza", "f2", LATER)
    assert old.valid_from == SAID  # it held from when it was said
    assert not old.is_current


def test_an_edit_stays_current_and_its_earlier_state_becomes_history() -> None:
    current = fact(tags=["food"])
    history = lifecycle.history_version("acme", current, at=LATER)
    edited = lifecycle.edited(current, at=LATER, cause="api", text="User loves pasta")
    assert (edited.id, edited.text, edited.valid_from, edited.is_current) == (
        "f1",
        "User loves pasta",
        LATER,
        True,
    )
    assert edited.metadata["edited_by"] == "api"
    assert history.id != current.id and history.text == "User loves pizza"
    assert (history.superseded_by, history.metadata[lifecycle.HISTORY_OF]) == ("f1", "f1")
    # the same state edited twice (a retried request) keeps one history version
    assert lifecycle.history_version("acme", current, at=LATER).id == history.id
    assert lifecycle.history_version("acme", edited, at=LATER).id != history.id
    assert lifecycle.history_version("other", current, at=LATER).id != history.id


def test_the_source_turns_are_outdated_only_when_what_they_said_changed() -> None:
    before = fact()
    assert lifecycle.corrects_its_turns(before, None)  # deleted
    assert lifecycle.corrects_its_turns(before, lifecycle.superseded(before, by="x", at=LATER))
    assert lifecycle.corrects_its_turns(before, fact("User hates pizza"))
    assert not lifecycle.corrects_its_turns(before, fact("User  loves pizza"))  # spacing
    assert not lifecycle.corrects_its_turns(before, fact(tags=["food"]))  # a tag edit
    assert not lifecycle.corrects_its_turns(turn(), None)  # only facts and profile entries


def test_a_turn_is_marked_corrected_once() -> None:
    marked = lifecycle.corrected(turn(), by="f2", at=LATER)
    assert marked is not None
    assert marked.metadata == {"corrected_by": "f2", "corrected_at": "2026-03-01T09:00:00Z"}
    assert lifecycle.is_corrected(marked.metadata)
    assert lifecycle.corrected(marked, by="f3", at=LATER + timedelta(days=1)) is None
    assert lifecycle.corrected(fact(), by="f2", at=LATER) is None  # not a turn


def test_one_stored_state_is_one_event_id_however_it_is_described() -> None:
    stored = fact(
        created_at=datetime(2026, 1, 1, 10, tzinfo=timezone(timedelta(hours=1))),
        tags=["b", "a", "a"],
        kind="profile",
        profile=ProposedProfileFact(
            category="preference", key="food", value="pizza", confidence=0.9, importance=0.5
        ),
    )
    assert stored.profile is not None
    # the same state as the store gives it back: UTC, tags sorted and unique, float32
    as_read = stored.model_copy(
        update={
            "created_at": SAID,
            "tags": ["a", "b"],
            "profile": stored.profile.model_copy(update={"confidence": 0.8999999761581421}),
        }
    )
    event = lifecycle.change("acme", stored, "created", cause="reconcile:ADD", related=["f0"])
    assert lifecycle.change_event_id("acme", as_read, "created") == event.event_id
    assert (event.tenant, event.user_id, event.op, event.related_ids) == (
        "acme",
        "alice",
        "created",
        ["f0"],
    )
    # another op, another state or another tenant is another event
    assert lifecycle.change_event_id("acme", stored, "updated") != event.event_id
    assert lifecycle.change_event_id("acme", fact("User hates pizza"), "created") != (
        event.event_id
    )
    assert lifecycle.change_event_id("beta", stored, "created") != event.event_id


def test_a_users_summary_id_and_the_single_user_one_before_it() -> None:
    mine = lifecycle.summary_memory_id("acme", "alice", "c1")
    assert mine == lifecycle.summary_memory_id("acme", "alice", "c1")
    assert mine != lifecycle.summary_memory_id("acme", "bob", "c1")
    # no user: the id summaries had before conversations belonged to users
    assert lifecycle.summary_memory_id("acme", "", "c1") != mine


def test_source_turns_of_several_records_each_once_in_order() -> None:
    records = [fact(source_turn_ids=["t1", "t2"]), fact(source_turn_ids=["t2", "t3"])]
    assert lifecycle.source_turn_ids(records) == ["t1", "t2", "t3"]
