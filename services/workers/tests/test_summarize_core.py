"""Summarize's core with a fake model: what is folded, what the model is asked, and
the rule-based fallbacks. No NATS, no retrieval, no HTTP."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from engram_core.memory import MemoryRecord
from engram_testing.fake_llm import FakeAsk
from engram_workers import prompts
from engram_workers.llm import FellBack
from engram_workers.summarize import core

T0 = datetime(2026, 2, 1, tzinfo=UTC)


def fact(memory_id: str, minutes: int, **fields: object) -> MemoryRecord:
    values: dict[str, object] = {
        "id": memory_id,
        "kind": "fact",
        "text": f"fact {memory_id}",
        "user_id": "alice",
        "conversation_id": "c1",
        "created_at": T0 + timedelta(minutes=minutes),
    }
    return MemoryRecord.model_validate(values | fields)


def turn(n: int) -> MemoryRecord:
    return MemoryRecord(
        id=f"t{n}",
        kind="turn",
        role="user" if n % 2 else "assistant",
        text=f"turn {n}",
        user_id="alice",
        conversation_id="c1",
        created_at=T0 + timedelta(minutes=n),
        turn_index=n,
    )


def test_only_current_facts_not_folded_yet_are_folded_oldest_first() -> None:
    trigger = fact("new", 30)
    others = [
        fact("b", 20),
        fact("a", 10),
        fact("done", 5),
        fact("replaced", 1, superseded_by="a"),
    ]
    assert [f.id for f in core.facts_to_fold(trigger, others, {"done"})] == ["a", "b", "new"]
    # a trigger superseded before its turn came is left out (it would bring stale news back)
    gone = fact("new", 30, superseded_by="newer")
    assert [f.id for f in core.facts_to_fold(gone, [], set())] == []


async def test_the_model_folds_the_facts_into_the_previous_summary() -> None:
    ask = FakeAsk({"summarize": {"summary": "  The user lives in Lisbon and has a dog. "}})
    written = await core.write_summary(
        "The user lives in Lisbon.", ["User has a dog"], ask, max_chars=300
    )
    assert written.text == "The user lives in Lisbon and has a dog."
    assert written.how == {"summarizer": core.SUMMARIZER_LLM, "model": "fake-model"}
    [question] = ask.asked
    assert question.payload == prompts.SummarizeInput(
        previous_summary="The user lives in Lisbon.", new_facts=["User has a dog"]
    )
    assert question.params == {"max_chars": 300}


async def test_a_failed_or_empty_answer_appends_the_facts_verbatim() -> None:
    failed = FakeAsk({"summarize": FellBack("unavailable", "stayed unavailable")})
    written = await core.write_summary("The user lives in Lisbon.", ["User has a dog"], failed, 300)
    assert written.text == "The user lives in Lisbon. User has a dog."
    assert written.fell_back and written.how["fallback_reason"] == "stayed unavailable"
    empty = FakeAsk({"summarize": {"summary": "   "}})
    written = await core.write_summary("", ["User has a dog"], empty, 300)
    assert written.text == "User has a dog."
    assert "empty summary" in written.how["fallback_reason"]


def test_the_rule_based_summary_drops_the_oldest_sentences_over_the_bound() -> None:
    text = core.rule_based_summary("One fact here. Two fact here.", ["Three fact here"], 31)
    assert text == "Two fact here. Three fact here."


def test_a_superseded_fact_is_taken_out_where_the_summary_holds_it_verbatim() -> None:
    summary = fact("s", 0, kind="summary", text="User loves pizza. User has a dog.")
    assert core.without_sentences(summary, "User loves pizza") == ["User has a dog."]
    assert core.without_sentences(summary, "User hates pizza") is None


def test_the_fold_metadata_counts_and_remembers_the_folded_ids() -> None:
    previous = fact(
        "s", 0, kind="summary", metadata={"facts_folded": "2", "folded_fact_ids": "a b"}
    )
    metadata = core.fold_metadata(previous, [fact("c", 1)], {"summarizer": "llm"})
    assert metadata == {"summarizer": "llm", "facts_folded": "3", "folded_fact_ids": "a b c"}
    nxt = core.next_summary("acme", "alice", "c1", previous, "text", metadata)
    assert nxt.metadata["revision"] == "1"  # the previous one had no revision yet
    again = core.next_summary("acme", "alice", "c1", nxt, "text 2", metadata)
    assert (again.id, again.metadata["revision"]) == (nxt.id, "2")


# --- episodes -----------------------------------------------------------------------------


def test_a_window_closes_only_once_a_later_turn_exists() -> None:
    turns = [turn(n) for n in range(1, 5)]
    assert core.closed_windows(turns[:2], core.Anchor(), 2) == []
    windows = core.closed_windows(turns, core.Anchor(), 2)
    assert [(first, [t.id for t in w]) for first, w in windows] == [(1, ["t1", "t2"])]
    # numbering continues after the newest episode
    anchor = core.Anchor(last_turn=40)
    assert [first for first, _ in core.closed_windows(turns, anchor, 1)] == [41, 42, 43]


async def test_the_model_is_asked_for_the_numbered_window() -> None:
    ask = FakeAsk({"episode": {"summary": "The user greeted the assistant."}})
    numbered = core.numbered_turns([turn(1), turn(2)], first=7)
    written = await core.write_episode(numbered, ask, max_chars=500)
    assert written.text == "The user greeted the assistant."
    [question] = ask.asked
    assert question.params == {"first_turn": 7, "last_turn": 8, "max_chars": 500}
    assert isinstance(question.payload, prompts.EpisodeInput)
    assert [t.n for t in question.payload.turns] == [7, 8]


async def test_a_failed_episode_is_extracted_from_the_users_sentences() -> None:
    numbered = [
        prompts.EpisodeTurn(n=1, role="user", text="Hi! I adopted a dog named Rex yesterday."),
        prompts.EpisodeTurn(n=2, role="assistant", text="Congratulations!"),
    ]
    ask = FakeAsk({"episode": FellBack("unusable", "junk")})
    written = await core.write_episode(numbered, ask, max_chars=500)
    assert written.text.startswith("Turns 1-2 (rule-based summary")
    assert "User: I adopted a dog named Rex yesterday." in written.text
    assert written.how == {"summarizer": core.SUMMARIZER_RULES, "fallback_reason": "junk"}
