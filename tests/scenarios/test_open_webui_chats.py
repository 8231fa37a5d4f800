"""A person on Open WebUI (user info forwarded): each chat is a conversation of its own,
the person's other chats are still recalled, a temporary chat is not remembered, and
the title prompts Open WebUI sends in the background are neither recalled into nor
stored; and the same with the requests the real Open WebUI sent."""

from __future__ import annotations

import httpx2
import pytest

from engram_cli.stack.scripted_llm import is_task_request
from engram_testing.open_webui import capture, replay

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


async def test_what_the_real_open_webui_sends(engram: Engram) -> None:
    """The requests Open WebUI 0.12.4 really sent (tests/fixtures/open_webui/), replayed
    through the whole stack: what was said in a temporary chat (``temporary:<id>``) is
    never stored nor recalled in the person's next chat; the saved chat is one
    conversation, named by its chat id, with the person's two messages and none of the
    title / tags / follow-up prompts; the person is listed by the name Open WebUI
    forwarded (percent-encoded, non-ASCII)."""
    temporary, saved, document = (
        capture("temporary_chat"),
        capture("normal_chat"),
        capture("document_chat"),
    )
    person, chat_id = saved[1].user_id, saved[1].chat_id
    async with httpx2.AsyncClient(base_url=engram.base_url.removesuffix("/v1"), timeout=30) as http:
        for request in temporary:
            response = await replay(http, request)
            assert response.headers["x-engram-memory"] == "bypassed"
        for request in saved:
            response = await replay(http, request)
            assert response.status_code == 200, response.text
            if request.is_chat:
                bypassed = response.headers["x-engram-memory"] == "bypassed"
                assert bypassed == request.is_background_task
        await engram.until_facts(person, ["Whiskers"])
        await engram.settled()

        stored = await engram.memories(user=person)
        assert {m["conversation_id"] for m in stored} == {chat_id}
        assert not [m for m in stored if "9876" in m["text"] or "### Task" in m["text"]]
        said = sorted(m["text"] for m in stored if m["kind"] == "turn" and m["role"] == "user")
        assert said == ["My cat is called Whiskers.", "She is three years old."]
        users = (await http.get("/v1/users", params={"limit": 1000})).json()["data"]
        assert {"object": "user", "id": person, "name": "José Müller"}.items() <= next(
            u for u in users if u["id"] == person
        ).items()

        # the person's next chat (a document question): the code is recalled nowhere
        for request in document:
            if request.is_chat:
                assert (await replay(http, request)).status_code == 200
        await engram.settled()
    # (the first scenario says the same words in its own temporary chat, as 'scripted';
    # the workers extract with the model the chat named)
    extractions = [b for b in engram.upstream.chat_requests() if is_task_request(b)]
    assert any(body["model"] == "engram-test" for body in extractions)
    with_code = [
        body
        for body in engram.upstream.chat_requests()
        if "9876" in str(body) and body["model"] == "engram-test"
    ]
    assert with_code == [request.body for request in temporary]  # its own two, nothing else
    asked = next(r for r in document if r.is_chat and not r.is_background_task)
    assert asked.chat_id != chat_id
    assert [
        m["conversation_id"]
        for m in await engram.memories(user=person, kind="turn")
        if m["role"] == "user" and "lease" in m["text"]
    ] == [asked.chat_id]
