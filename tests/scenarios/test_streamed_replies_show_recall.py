"""A streaming UI can show what was recalled: the first chunk of a streamed reply carries
``memory_hits``, which the official clients keep as an extra field and otherwise ignore."""

from __future__ import annotations

import pytest

from .conftest import Engram

pytestmark = pytest.mark.e2e


async def test_the_first_streamed_chunk_carries_memory_hits(engram: Engram) -> None:
    client = engram.openai()
    await client.chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "I collect vinyl records."}],
        user="rosa",
    )
    await engram.until_facts("rosa", ["vinyl"])
    await engram.settled()

    stream = await client.chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "What do I collect?"}],
        user="rosa",
        stream=True,
    )
    chunks = [chunk async for chunk in stream]
    await client.close()
    first = chunks[0].model_extra or {}
    assert any("vinyl" in hit["text"] for hit in first["memory_hits"])
    assert all("memory_hits" not in (c.model_extra or {}) for c in chunks[1:])
    # the reply itself reaches the client unchanged
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Noted."
