"""Retried and failed requests leave no junk: a turn is stored once however often the
client sends it, and a request the model did not answer leaves nothing behind."""

from __future__ import annotations

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from .conftest import Engram

pytestmark = pytest.mark.e2e


async def turns_saying(engram: Engram, user: str, text: str) -> int:
    memories = await engram.memories(user=user, kind="turn")
    return sum(m["text"] == text for m in memories)


async def test_a_retried_request_is_recorded_once(engram: Engram) -> None:
    question = "Where do I like to hike?"
    client = engram.openai()
    messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": question}]
    for request_id in ("first-try", "network-retry", "network-retry"):
        await client.chat.completions.create(
            model="scripted",
            messages=messages,
            user="hana",
            extra_headers={"X-Request-Id": request_id},
        )
    await client.close()
    await engram.settled()
    assert await turns_saying(engram, "hana", question) == 1
    # asked again later in the conversation, it is a new turn
    client = engram.openai()
    later: list[ChatCompletionMessageParam] = [
        *messages,
        {"role": "assistant", "content": "Noted."},
        *messages,
    ]
    await client.chat.completions.create(model="scripted", messages=later, user="hana")
    await client.close()
    await engram.settled()
    assert await turns_saying(engram, "hana", question) == 2
    # recalled once even so: the same words are never injected twice
    client = engram.openai()
    reply = await client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": "Hiking plans?"}], user="hana"
    )
    await client.close()
    memory_hits = reply.to_dict()["memory_hits"]
    assert isinstance(memory_hits, list), memory_hits
    hits = [h["text"] for h in memory_hits]
    assert hits.count(question) <= 1


async def test_an_upstream_failure_then_the_sdk_retry_leaves_one_turn(engram: Engram) -> None:
    text = "I keep my passport in the blue drawer."
    engram.model.fail_next[text] = 1  # the model answers 500 once
    client = engram.openai(max_retries=2)  # the official SDK retries the 502 by itself
    reply = await client.chat.completions.create(
        model="scripted", messages=[{"role": "user", "content": text}], user="ivan"
    )
    await client.close()
    assert reply.choices[0].message.content == "Noted."
    assert len(engram.sent_upstream(text)) == 2  # the failed call and the retry
    await engram.until_facts("ivan", ["passport"])
    await engram.settled()
    assert await turns_saying(engram, "ivan", text) == 1
    assert len(await engram.facts("ivan")) == 1


async def test_a_request_the_model_never_answered_leaves_nothing(engram: Engram) -> None:
    text = "My bank PIN hint is the cat's birthday."
    engram.model.fail_next[text] = 5
    client = engram.openai(max_retries=1)
    with pytest.raises(openai.APIStatusError) as failed:
        await client.chat.completions.create(
            model="scripted", messages=[{"role": "user", "content": text}], user="june"
        )
    await client.close()
    assert failed.value.status_code == 502
    assert failed.value.response.headers["x-request-id"]
    await engram.settled()
    assert await turns_saying(engram, "june", text) == 0
    assert await engram.facts("june") == []
