"""Two users of one tenant never recall each other's memories, whatever memory_id they
pick or leave out; memories created without a user are the tenant's, recalled for all."""

from __future__ import annotations

import pytest

from .conftest import Engram

pytestmark = pytest.mark.e2e


async def chat(engram: Engram, user: str, text: str, **extra: object) -> dict:
    client = engram.openai()
    reply = await client.chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": text}],
        user=user,
        extra_body=extra or None,
    )
    await client.close()
    return reply.to_dict()


async def test_two_users_without_memory_id_never_recall_each_other(engram: Engram) -> None:
    secret = "My dog is called Rex and my locker code is 4321."
    await chat(engram, "ana", secret)
    await engram.until_facts("ana", ["Rex", "4321"])
    await engram.settled()

    # bob asks the question ana's memory would answer, in the same (default) conversation
    reply = await chat(engram, "bob", "What is my dog called?")
    assert reply["memory_hits"] == []
    assert "Rex" not in engram.injected("What is my dog called?")
    assert "4321" not in engram.injected("What is my dog called?")
    # ...and the memory API answers bob the same
    async with engram.http() as http:
        found = (
            await http.post("/memories/search", json={"query": "dog locker", "user": "bob"})
        ).json()
    # (bob's own question and its reply are his memories now; nothing of ana's)
    assert {hit["user_id"] for hit in found["hits"]} <= {"bob"}
    assert "Rex" not in str(found) and "4321" not in str(found)
    # ana herself is reminded
    mine = await chat(engram, "ana", "What is my dog called?")
    assert any("Rex" in hit["text"] for hit in mine["memory_hits"])


async def test_two_users_with_the_same_memory_id_never_recall_each_other(
    engram: Engram,
) -> None:
    await chat(engram, "carla", "My favourite hiking trail is the Levada do Rei.", memory_id="pets")
    await chat(engram, "dan", "I have a parrot named Kiwi.", memory_id="pets")
    await engram.until_facts("carla", ["Levada do Rei"])
    await engram.until_facts("dan", ["Kiwi"])
    await engram.settled()

    # a small store is injected whole: still only dan's own memories
    reply = await chat(engram, "dan", "Tell me about my trails and pets.", memory_id="pets")
    texts = " ".join(hit["text"] for hit in reply["memory_hits"])
    assert "Kiwi" in texts and "Levada" not in texts
    injected = engram.injected("Tell me about my trails and pets.")
    assert "Kiwi" in injected and "Levada" not in injected
    # each has a summary of their own "pets" conversation
    async with engram.http() as http:
        for user, own, other in (("carla", "Levada", "Kiwi"), ("dan", "Kiwi", "Levada")):
            found = (
                await http.post(
                    "/memories/search",
                    json={"query": "what did I say?", "user": user, "conversation": "pets"},
                )
            ).json()
            summary = (found["summary"] or {}).get("text", "")
            assert own in summary and other not in summary, (user, summary)


async def test_a_memory_created_without_a_user_is_recalled_for_every_user(
    engram: Engram,
) -> None:
    async with engram.http() as http:
        created = await http.post(
            "/memories", json={"text": "The office wifi password is sunflower-42."}
        )
    assert created.status_code == 201
    assert (created.json()["user_id"], created.json()["conversation_id"]) == ("", "global")
    for user in ("erin", "felix"):
        reply = await chat(engram, user, "What is the office wifi password?")
        hit = next(h for h in reply["memory_hits"] if "sunflower" in h["text"])
        assert hit["scope"] == "global"
