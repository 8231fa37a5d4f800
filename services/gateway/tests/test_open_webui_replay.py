"""The real Open WebUI's requests (captured from 0.12.4, tests/fixtures/open_webui/)
replayed through the gateway, against the real nats-server, the scripted upstream and the
retrieval port in memory: a temporary chat is not remembered, the background tasks are
left alone, a saved chat is a conversation named by its chat id, and the person's
non-ASCII name breaks nothing and is shown beside the person's id."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from engram_cli.stack.scripted_llm import ToolCall
from engram_gateway.settings import GatewaySettings
from engram_gateway.user_names import display_name
from engram_testing.memory_store import InMemoryPort
from engram_testing.open_webui import OPEN_WEBUI_VERSION, CapturedRequest, capture, replay
from engram_testing.waiting import eventually
from engram_testing.worker_stack import RealRetrieval, running_retrieval

from .conftest import JetStreamReader, StartGateway
from .test_memory_api import KEYS, A, B, _create


async def replay_all(
    client: httpx2.AsyncClient, requests: list[CapturedRequest]
) -> list[tuple[CapturedRequest, str]]:
    """Each chat request replayed in order (200 expected), with its X-Engram-Memory."""
    answered = []
    for request in requests:
        if not request.is_chat:
            continue
        response = await replay(client, request)
        assert response.status_code == 200, response.text
        answered.append((request, response.headers["x-engram-memory"]))
    return answered


def assert_forwarded_unchanged(sent: list[dict[str, Any]], requests: list[CapturedRequest]) -> None:
    for body, request in zip(sent, [r for r in requests if r.is_chat], strict=True):
        assert body == request.body


async def test_a_temporary_chat_is_not_remembered(
    client: httpx2.AsyncClient,
    scripted_upstream: Any,
    memory_store: InMemoryPort,
    jetstream: JetStreamReader,
) -> None:
    """Open WebUI 0.12 names a temporary chat ``temporary:<socket id>``: neither its
    message nor its follow-up task is recalled into or recorded."""
    requests = capture("temporary_chat")
    assert requests[0].chat_id.startswith("temporary:")

    answered = await replay_all(client, requests)

    assert [memory for _, memory in answered] == ["bypassed", "bypassed"]
    assert memory_store.searches == []
    assert_forwarded_unchanged(scripted_upstream.chat_requests(), requests)
    await asyncio.sleep(0.2)
    assert await jetstream.count() == 0


def test_temporary_chat_prefixes_are_a_list(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both names Open WebUI has used by default; a comma-separated list; the deprecated
    single-value variable only adds a prefix, so an old explicit 'local:' never makes
    0.12's 'temporary:' chats remembered."""
    assert GatewaySettings().temporary_chat_prefixes == ("temporary:", "local:")
    monkeypatch.setenv("ENGRAM_GATEWAY_TEMPORARY_CHAT_PREFIXES", " temp: , local:,")
    assert GatewaySettings().temporary_chat_prefixes == ("temp:", "local:")
    monkeypatch.setenv("ENGRAM_GATEWAY_TEMPORARY_CHAT_PREFIXES", "")
    assert GatewaySettings().temporary_chat_prefixes == ()
    monkeypatch.delenv("ENGRAM_GATEWAY_TEMPORARY_CHAT_PREFIXES")
    monkeypatch.setenv("ENGRAM_GATEWAY_TEMPORARY_CHAT_PREFIX", "tmp-")
    assert GatewaySettings().temporary_chat_prefixes == ("temporary:", "local:", "tmp-")
    monkeypatch.setenv("ENGRAM_GATEWAY_TEMPORARY_CHAT_PREFIX", "local:")
    assert GatewaySettings().temporary_chat_prefixes == ("temporary:", "local:")
    monkeypatch.setenv("ENGRAM_GATEWAY_TEMPORARY_CHAT_PREFIX", "")
    assert GatewaySettings().temporary_chat_prefixes == ("temporary:", "local:")
    with pytest.raises(ValueError, match="1-200 characters"):
        GatewaySettings(gateway_temporary_chat_prefixes=("x" * 201,))


async def test_a_saved_chat_is_one_conversation_and_its_tasks_are_left_alone(
    client: httpx2.AsyncClient,
    scripted_upstream: Any,
    memory_store: InMemoryPort,
    jetstream: JetStreamReader,
) -> None:
    """Two messages of one saved chat, with the title, tags and follow-up tasks Open
    WebUI runs around them: the messages are recalled into and recorded in the
    conversation its chat id names, for the user its user id header names; the tasks
    are neither, and reach the upstream unchanged."""
    requests = capture("normal_chat")
    chat_id, user_id = requests[1].chat_id, requests[1].user_id
    tasks = [r for r in requests if r.is_chat and r.is_background_task]
    assert len(tasks) == 4 and chat_id and user_id

    answered = await replay_all(client, requests)

    for request, memory in answered:
        assert (memory == "bypassed") == request.is_background_task, request.last_user_text
    assert [(r.conversation_id, r.user_id) for r in memory_store.searches] == [
        (chat_id, user_id),
        (chat_id, user_id),
    ]
    assert_forwarded_unchanged(scripted_upstream.chat_requests(), requests)
    events = await jetstream.events(4)
    assert {(e.data["conversation_id"], e.data["user_id"]) for e in events} == {(chat_id, user_id)}
    said = [e.data["text"] for e in events if e.data["role"] == "user"]
    assert said == ["My cat is called Whiskers.", "She is three years old."]
    await asyncio.sleep(0.2)
    assert await jetstream.count() == 4


async def test_a_document_prompt_is_remembered_and_its_query_task_is_not(
    client: httpx2.AsyncClient, memory_store: InMemoryPort, jetstream: JetStreamReader
) -> None:
    """With a file attached, Open WebUI first asks for search queries (a task over the
    chat history), then sends the person's question inside its document prompt: that
    one is the person asking, so it is recalled into and recorded."""
    requests = capture("document_chat")
    answered = await replay_all(client, requests)

    remembered = [request for request, memory in answered if memory != "bypassed"]
    assert len(remembered) == 1
    prompt = remembered[0].last_user_text
    assert prompt.startswith("### Task:") and "<context>" in prompt
    assert prompt.endswith("When does my lease end?")
    tasks = [request.last_user_text for request, memory in answered if memory == "bypassed"]
    assert any("generating search queries" in task for task in tasks)
    user_turn, _ = await jetstream.events(2)
    assert user_turn.data["text"] == prompt
    assert user_turn.data["conversation_id"] == remembered[0].chat_id


async def test_a_web_search_round_trip_records_the_question_once(
    client: httpx2.AsyncClient, scripted_upstream: Any, jetstream: JetStreamReader
) -> None:
    """With web search on, the model calls Open WebUI's search_web tool and Open WebUI
    sends the same question again with the tool's result: one user turn, and the
    answer that followed the search as the assistant's."""
    requests = capture("web_search_chat")

    def model(body: dict[str, Any]) -> Any:
        if body.get("tools") and body["messages"][-1]["role"] == "user":
            return ToolCall("search_web", {"query": "Lisbon weather today"})
        return "Sunny, 19 C."

    scripted_upstream.replies = [model]
    answered = await replay_all(client, requests)

    questions = [r for r, memory in answered if memory != "bypassed"]
    assert [r.last_user_text for r in questions] == ["What is the weather in Lisbon today?"] * 2
    await asyncio.sleep(0.5)
    events = await jetstream.events(await jetstream.count())
    users = [e for e in events if e.data["role"] == "user"]
    assert [e.data["text"] for e in users] == ["What is the weather in Lisbon today?"]
    answers = [e.data["text"] for e in events if e.data["role"] == "assistant"]
    assert "Sunny, 19 C." in answers


def test_the_captures_say_where_they_came_from() -> None:
    for scenario in ("normal_chat", "temporary_chat", "document_chat", "web_search_chat"):
        requests = capture(scenario)
        assert requests, scenario
        for request in requests:
            assert "authorization" not in request.headers
            assert request.headers["x-openwebui-user-name"] == "Jos%C3%A9 M%C3%BCller"
    assert OPEN_WEBUI_VERSION == "0.12.4"


# --- the person's name ---------------------------------------------------------------


def test_a_forwarded_name_is_read_as_text() -> None:
    """Percent-encoded (what Open WebUI sends), raw UTF-8 (read by the server as
    Latin-1), or plain; control characters dropped, NFC, capped; blank is none."""
    header = "X-OpenWebUI-User-Name"
    assert display_name({header: "Jos%C3%A9 M%C3%BCller"}, header) == "José Müller"
    assert display_name({header: "José Müller".encode().decode("latin-1")}, header) == "José Müller"
    assert display_name({header: "Jose\u0301"}, header) == "José"
    assert display_name({header: "Ana%0A%1B[31m Lima"}, header) == "Ana[31m Lima"
    assert display_name({header: "100% Mia"}, header) == "100% Mia"
    assert display_name({header: "  "}, header) is None
    assert display_name({}, header) is None
    assert display_name({header: "Mia"}, "") is None
    assert len(display_name({header: "x" * 500}, header) or "") == 200


@pytest.fixture
async def retrieval(tmp_path: Path) -> AsyncIterator[RealRetrieval]:
    async with running_retrieval(tmp_path / "retrieval") as running:
        yield running


async def _listed(http: httpx2.AsyncClient, key: dict[str, str]) -> dict[str, dict[str, Any]]:
    users = (await http.get("/v1/users", headers=key)).json()["data"]
    return {user["id"]: user for user in users}


async def test_users_are_listed_with_the_name_their_client_forwarded(
    start_gateway: StartGateway, retrieval: RealRetrieval
) -> None:
    """After José's Open WebUI chat, ``GET /v1/users`` shows his name beside his id; for
    his tenant only (another tenant's user with the same id has none); a temporary chat
    records no name."""
    gateway = await start_gateway(retrieval_address=retrieval.address, api_keys=KEYS)
    http = gateway.client()
    chat = capture("normal_chat")
    jose = chat[1].user_id
    for key in (A, B):
        await _create(http, key, text="User has a cat.", user=jose, conversation="notes")
    await _create(http, A, text="User likes tea.", user="ana", conversation="notes")
    assert "name" not in (await _listed(http, A))[jose]

    for request in chat[:3]:  # the models list, the title task, the first message
        assert (await replay(http, request, headers=A)).status_code == 200

    async def named() -> bool:
        return (await _listed(http, A))[jose].get("name") == "José Müller"

    await eventually(named, 10, what="José's name in /v1/users")
    assert (await _listed(http, A))[jose] == {
        "object": "user",
        "id": jose,
        "name": "José Müller",
        "memories": 1,
    }
    assert "name" not in (await _listed(http, B))[jose]

    temporary = capture("temporary_chat")[0]
    as_ana = {"x-openwebui-user-id": "ana", "x-openwebui-user-name": "Ana%20Lima", **A}
    assert (await replay(http, temporary, headers=as_ana)).status_code == 200
    await asyncio.sleep(0.5)
    assert "name" not in (await _listed(http, A))["ana"]


async def test_a_name_sent_as_raw_utf8_is_read_the_same(
    start_gateway: StartGateway, retrieval: RealRetrieval
) -> None:
    """A client that puts the name's UTF-8 bytes in the header as they are (not
    percent-encoded like Open WebUI): the chat is answered, and the name reads right."""
    gateway = await start_gateway(retrieval_address=retrieval.address, api_keys=KEYS)
    http = gateway.client()
    await _create(http, A, text="User likes tea.", user="zoe", conversation="notes")
    raw = {"x-openwebui-user-id": "zoe", "x-openwebui-user-name": "Zoë Ana".encode(), **A}
    assert (await replay(http, capture("normal_chat")[2], headers=raw)).status_code == 200

    async def zoe_named() -> str | None:
        return (await _listed(http, A))["zoe"].get("name")

    assert await eventually(zoe_named, 10, what="Zoë's name in /v1/users") == "Zoë Ana"
