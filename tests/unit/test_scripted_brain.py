"""The rule-based brain behind `engram scripted-llm`, the write-path benchmark and the
seed-scenario tests: deterministic answers to each worker task."""

from __future__ import annotations

import json

import pytest

from engram_cli.stack.scripted_grammar import third_person
from engram_cli.stack.scripted_llm import RuleBasedBrain

brain = RuleBasedBrain(chat_reply="Sure.")


def ask(task: str, payload: dict) -> dict:
    body = {
        "messages": [
            {"role": "system", "content": f"engram-task: {task}\nInstructions."},
            {"role": "user", "content": json.dumps(payload)},
        ]
    }
    return json.loads(brain(body))


@pytest.mark.parametrize(
    ("message", "facts", "profile"),
    [
        (
            "My wife's name is Jane.",
            ["User's wife's name is Jane"],
            [("identity", "wife_name", "Jane", 0.9)],
        ),
        (
            "Sorry, I misspoke: my wife's name is Anne.",
            ["User's wife's name is Anne"],
            [("identity", "wife_name", "Anne", 0.9)],
        ),
        ("I love pizza!", ["User loves pizza"], []),
        ("Hello!", [], []),
        ("Where do I like to hike?", [], []),
        (
            "I think my name might be Rob.",
            ["User's name is Rob"],
            [("identity", "name", "Rob", 0.4)],
        ),
        (
            "Actually my name is Robert, definitely.",
            ["User's name is Robert"],
            [("identity", "name", "Robert", 0.95)],
        ),
    ],
)
def test_extraction(message: str, facts: list[str], profile: list[tuple]) -> None:
    assert_extracts(message, facts, profile)


def assert_extracts(message: str, facts: list[str], profile: list[tuple]) -> None:
    answer = ask("extract_facts", {"message": message, "date": "2026-01-01"})
    assert answer["facts"] == facts
    assert [
        (p["category"], p["key"], p["value"], p["confidence"]) for p in answer["profile"]
    ] == profile


@pytest.mark.parametrize(
    ("existing", "new", "decision"),
    [
        (
            ["User's wife's name is Jane"],
            "User's wife's name is Anne",
            {"event": "UPDATE", "target": 1, "text": "User's wife's name is Anne"},
        ),
        (["User loves pizza"], "User hates pizza", {"event": "DELETE", "target": 1}),
        (["User loves pizza"], "User loves pizza", {"event": "NONE", "target": 1}),
        (["User loves pizza"], "User works as a nurse", {"event": "ADD"}),
        # the user alone is no subject: a new job does not replace an allergy
        (["User is allergic to peanuts"], "User is a teacher", {"event": "ADD"}),
        (["User is a nurse"], "User is not a nurse", {"event": "DELETE", "target": 1}),
    ],
)
def test_reconcile(existing: list[str], new: str, decision: dict) -> None:
    answer = ask(
        "reconcile",
        {
            "existing": [{"id": i + 1, "text": t} for i, t in enumerate(existing)],
            "new_facts": [new],
        },
    )
    assert answer == {"decisions": [{"fact": 0, **decision}]}


@pytest.mark.parametrize(
    ("message", "fact"),
    [
        ("Actually, I hate pizza now.", "User hates pizza"),
        ("I hate pizza now!", "User hates pizza"),
        ("These days I hate pizza.", "User hates pizza"),
        ("I no longer love pizza.", "User no longer loves pizza"),
        ("I don't love pizza anymore.", "User doesn't love pizza anymore"),
    ],
)
def test_the_common_ways_of_correcting_oneself_are_extracted_as_the_new_claim(
    message: str, fact: str
) -> None:
    assert ask("extract_facts", {"message": message, "date": "2026-01-01"})["facts"] == [fact]


@pytest.mark.parametrize(
    "correction",
    [
        "Actually, I hate pizza now.",
        "I hate pizza now.",
        "I no longer love pizza.",
        "I don't love pizza anymore.",
        "Actually, I do not love pizza any more.",
    ],
)
def test_a_correction_as_people_word_it_supersedes_the_old_fact(correction: str) -> None:
    """README's quick start: "I love pizza." then a correction leaves one current fact."""
    (new,) = ask("extract_facts", {"message": correction, "date": "2026-01-01"})["facts"]
    answer = ask(
        "reconcile", {"existing": [{"id": 1, "text": "User loves pizza"}], "new_facts": [new]}
    )
    assert answer == {"decisions": [{"fact": 0, "event": "DELETE", "target": 1}]}


@pytest.mark.parametrize(
    ("existing", "new"),
    [
        ("User loves pizza", "User loves pizza now"),
        ("User doesn't love pizza anymore", "User no longer loves pizza"),
    ],
)
def test_the_same_claim_worded_as_a_change_is_not_a_contradiction(existing: str, new: str) -> None:
    answer = ask("reconcile", {"existing": [{"id": 1, "text": existing}], "new_facts": [new]})
    assert answer["decisions"][0]["event"] != "DELETE"


def test_summary_accumulates_without_repeats_and_chat_gets_the_fixed_reply() -> None:
    first = ask("summarize", {"previous_summary": "", "new_facts": ["User loves pizza"]})
    second = ask(
        "summarize",
        {
            "previous_summary": first["summary"],
            "new_facts": ["User loves pizza", "User works as a nurse"],
        },
    )
    assert second["summary"] == "User loves pizza. User works as a nurse."
    assert brain({"messages": [{"role": "user", "content": "hi"}]}) == "Sure."


@pytest.mark.parametrize(
    ("message", "facts", "profile"),
    [
        ("I moved to Lisbon.", ["User moved to Lisbon"], []),
        (
            "My wife's name is Anne and I love hiking.",
            ["User's wife's name is Anne", "User loves hiking"],
            [("identity", "wife_name", "Anne", 0.9)],
        ),
        ("I love hiking and swimming.", ["User loves hiking and swimming"], []),
        (
            "I live in Lisbon, but my family lives in Porto; I visit them often.",
            ["User lives in Lisbon", "User's family lives in Porto", "User visits them often"],
            [],
        ),
        (
            "I'm allergic to peanuts.",
            ["User is allergic to peanuts"],
            [("constraint", "allergy", "peanuts", 0.9)],
        ),
        ("I study law and I watch films.", ["User studies law", "User watches films"], []),
        ("I don't eat meat.", ["User doesn't eat meat"], []),
        ("I think I prefer tea.", ["User prefers tea"], [("preference", "general", "tea", 0.4)]),
        ("Hi! I have two cats. Do you like cats?", ["User has two cats"], []),
    ],
)
def test_extraction_of_compound_and_past_statements(
    message: str, facts: list[str], profile: list[tuple]
) -> None:
    assert_extracts(message, facts, profile)


@pytest.mark.parametrize(
    ("first_person", "third"),
    [
        ("I moved to Lisbon", "User moved to Lisbon"),
        ("I love hiking", "User loves hiking"),
        ("I study law", "User studies law"),
        ("I play chess", "User plays chess"),
        ("I go to the gym", "User goes to the gym"),
        ("I watch films", "User watches films"),
        ("I fix bikes", "User fixes bikes"),
        ("I miss my dog", "User misses User's dog"),
        ("I have two cats", "User has two cats"),
        ("I need a new laptop", "User needs a new laptop"),
        ("I went to Paris", "User went to Paris"),
        ("I was born in Oslo", "User was born in Oslo"),
        ("I can swim", "User can swim"),
        ("I don't eat meat", "User doesn't eat meat"),
        ("I do not smoke", "User does not smoke"),
        ("I never drink coffee", "User never drinks coffee"),
        ("I really enjoy jazz", "User really enjoys jazz"),
        ("I'm a nurse", "User is a nurse"),
        ("I am a nurse", "User is a nurse"),
        ("I've got a dog", "User has got a dog"),
        ("I'll start a new job", "User will start a new job"),
        ("My wife and I live in Porto", "User's wife and User live in Porto"),
        ("My sister gave me a book", "User's sister gave User a book"),
        ("my name is Rob.", "User's name is Rob"),
    ],
)
def test_third_person(first_person: str, third: str) -> None:
    assert third_person(first_person) == third
