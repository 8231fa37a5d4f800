"""A correction wins over what it corrects: once a fact is superseded, the turn that said
the old thing stops competing with the current fact, in any conversation of that user."""

from __future__ import annotations

import pytest
from openai.types.chat import ChatCompletionMessageParam

from .conftest import Engram, wait_for

pytestmark = pytest.mark.e2e


async def say(
    engram: Engram,
    text: str,
    conversation: str,
    history: list[ChatCompletionMessageParam] | None = None,
):
    client = engram.openai()
    reply = await client.chat.completions.create(
        model="scripted",
        messages=[*(history or []), {"role": "user", "content": text}],
        user="gil",
        extra_body={"memory_id": conversation},
    )
    await client.close()
    return reply.to_dict()


async def test_a_correction_is_recalled_first_from_another_conversation(engram: Engram) -> None:
    await say(engram, "My wife's name is Anne.", "home")
    await engram.until_facts("gil", ["Anne"])
    history: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "My wife's name is Anne."},
        {"role": "assistant", "content": "Noted."},
    ]
    await say(engram, "Actually, my wife's name is Jane.", "home", history)

    async def corrected() -> bool:
        return any("Jane" in f for f in await engram.facts("gil")) and not any(
            "Anne" in f for f in await engram.facts("gil")
        )

    await wait_for(corrected, 45, what="the Jane fact to supersede the Anne fact")
    await engram.settled()

    # the turn that said "Anne" is marked as corrected, in the index and the API
    [anne_turn] = [
        m
        for m in await engram.memories(user="gil", kind="turn", conversation="home")
        if m["text"] == "My wife's name is Anne."
    ]
    assert anne_turn["metadata"]["corrected_at"]
    jane_fact = next(
        m for m in await engram.memories(user="gil", kind="fact") if "Jane" in m["text"]
    )
    assert anne_turn["metadata"]["corrected_by"] == jane_fact["id"]

    # asked in another conversation: the current fact comes first; the corrected statement,
    # if recalled at all, comes after it and is labelled as corrected for the model
    reply = await say(engram, "What is my wife's name?", "trip")
    texts = [hit["text"] for hit in reply["memory_hits"]]
    assert "Jane" in texts[0], texts
    assert reply["memory_hits"][0]["kind"] == "fact"
    injected = engram.injected("What is my wife's name?")
    lines = [line for line in injected.splitlines() if "Anne" in line or "Jane" in line]
    assert "Jane" in lines[0], injected
    for line in lines:
        if "Anne" in line:
            assert "corrected on" in line and "do not rely on it" in line, line

    # with more memories than a small store holds (ranked recall), the same order holds
    for text in (
        "I work as a pharmacist in Porto.",
        "I play the cello on weekends.",
        "My brother lives in Montreal.",
        "I am learning Japanese.",
    ):
        await say(engram, text, "work")
    await engram.until_facts("gil", ["pharmacist", "cello", "Montreal", "Japanese"])
    reply = await say(engram, "Remind me, what is my wife's name?", "trip2")
    hits = reply["memory_hits"]
    assert "Jane" in hits[0]["text"] and hits[0]["kind"] == "fact", hits
    anne = [h for h in hits if "Anne" in h["text"]]
    assert all(h["kind"] == "turn" and h.get("corrected_at") for h in anne), anne
