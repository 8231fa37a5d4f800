"""A person on Open WebUI (user info forwarded): each chat is a conversation of its own,
the person's other chats are still recalled, a temporary chat is not remembered, and
the title prompts Open WebUI sends in the background are neither recalled into nor
stored."""

from __future__ import annotations

import pytest

from .conftest import Engram

pytestmark = pytest.mark.e2e

USER = "owui-5f1c"


async def open_webui_chat(engram: Engram, chat_id: str, text: str) -> tuple[dict, str]:
    """What Open WebUI sends with ENABLE_FORWARD_USER_INFO_HEADERS: the person and the
    chat in headers, nothing of Engram's in the body. The reply and X-Engram-Memory."""
    client = engram.openai()
    raw = await client.chat.completions.with_raw_response.create(
        model="scripted",
        messages=[{"role": "user", "content": text}],
        extra_headers={
            "X-OpenWebUI-User-Name": "Mia",
            "X-OpenWebUI-User-Id": USER,
            "X-OpenWebUI-User-Role": "user",
            "X-OpenWebUI-Chat-Id": chat_id,
        },
    )
    await client.close()
    return raw.parse().to_dict(), raw.headers["x-engram-memory"]


def title_prompt(history: str) -> str:
    """Open WebUI's default title task, as its template renders it."""
    return (
        "### Task:\nGenerate a concise, 3-5 word title with an emoji summarizing the chat "
        "history.\n### Guidelines:\n- The title should clearly represent the main theme.\n"
        f"### Chat History:\n<chat_history>\n{history}\n</chat_history>"
    )


async def test_open_webui_chats_temporary_chats_and_title_prompts(engram: Engram) -> None:
    _, memory = await open_webui_chat(engram, "2b7e-first", "My sister is called Eva.")
    assert memory != "bypassed"
    _, memory = await open_webui_chat(
        engram, "2b7e-first", title_prompt("USER: My sister is called Eva.\nASSISTANT: Noted.")
    )
    assert memory == "bypassed"
    _, memory = await open_webui_chat(engram, "local:Qx81-socket", "My locker code is 9876.")
    assert memory == "bypassed"
    await engram.until_facts(USER, ["Eva"])
    await engram.settled()

    stored = await engram.memories(user=USER)
    assert {m["conversation_id"] for m in stored} == {"2b7e-first"}
    assert not [m for m in stored if "### Task" in m["text"] or "9876" in m["text"]]
    turns = [m["text"] for m in stored if m["kind"] == "turn" and m["role"] == "user"]
    assert turns == ["My sister is called Eva."]  # one turn: the title prompt added none

    # a new chat of the same person recalls the first one's fact, and is its own
    reply, memory = await open_webui_chat(engram, "9d4a-second", "What is my sister called?")
    assert memory == "used"
    assert any("Eva" in hit["text"] for hit in reply["memory_hits"])
    assert "Eva" in engram.injected("What is my sister called?")
    await engram.settled()
    asked = [m for m in await engram.memories(user=USER) if "sister called?" in m["text"]]
    assert [m["conversation_id"] for m in asked] == ["9d4a-second"]
