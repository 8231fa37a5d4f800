"""The questions people ask a memory most ("what do you know about me?") are answered
from the user's profile, facts and summaries across their conversations."""

from __future__ import annotations

import pytest

from .conftest import Engram

pytestmark = pytest.mark.e2e


async def chat(engram: Engram, text: str, conversation: str, user: str = "kim") -> dict:
    client = engram.openai()
    reply = await client.chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": text}],
        user=user,
        extra_body={"memory_id": conversation},
    )
    await client.close()
    return reply.to_dict()


async def test_what_do_you_know_about_me_recalls_profile_facts_and_summaries(
    engram: Engram,
) -> None:
    await chat(engram, "My name is Kim.", "intro")
    await chat(engram, "I am allergic to shellfish.", "food")
    await chat(engram, "I love climbing in the Dolomites.", "travel")
    await chat(engram, "A stranger's note.", "travel", user="lee")  # another user
    await engram.until_facts("kim", ["Kim", "shellfish", "Dolomites"])
    await engram.settled()

    for question in (
        "What do you know about me?",
        "what have we talked about so far?",
        "Summarise what you remember.",
    ):
        reply = await chat(engram, question, "new-chat")
        texts = " ".join(hit["text"] for hit in reply["memory_hits"])
        assert {"Kim", "shellfish", "Dolomites"} <= {w for w in texts.replace(".", " ").split()}
        assert "stranger" not in texts
        injected = engram.injected(question)
        assert "Everything remembered about this user" in injected
        assert '"constraint/allergy": "shellfish"' in injected  # the profile, attached
        assert "summary of conversation" in injected  # their conversations' summaries
