"""The rule-based brain behind `engram scripted-llm`, the write-path benchmark and the
seed-scenario tests: deterministic answers to each worker task."""

from __future__ import annotations

import json

import pytest

from engram_cli.scripted_llm import RuleBasedBrain

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
