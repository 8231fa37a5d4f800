"""The memory API through the whole stack (every worker process, the rule-based scripted
LLM) with API keys: text added is learned and reported applied; memories created and
deleted through the API reach the Markdown mirror as files and tombstones."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from engram_cli.stack.up import Stack
from engram_gateway.keys import entry_for

from .conftest import wait_for
from .test_learning import start_stack

pytestmark = pytest.mark.e2e

A = {"Authorization": "Bearer e2e-key-a"}
B = {"Authorization": "Bearer e2e-key-b"}


@pytest.fixture(scope="module")
def keyed_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    keys = f"{entry_for('e2e-key-a', 'acme')},{entry_for('e2e-key-b', 'beta')}"
    stack, upstream = start_stack(
        tmp_path_factory.mktemp("memory-api") / "data", ENGRAM_API_KEYS=keys
    )
    try:
        yield stack
    finally:
        stack.stop()
        upstream.stop()


@pytest.fixture
async def http(keyed_stack: Stack) -> AsyncIterator[httpx2.AsyncClient]:
    base = f"http://{keyed_stack.settings.gateway_host}:{keyed_stack.settings.gateway_port}"
    async with httpx2.AsyncClient(base_url=base, timeout=30) as client:
        yield client


async def test_added_text_is_learned_and_reported_applied(http: httpx2.AsyncClient) -> None:
    added = await http.post(
        "/v1/memories/add",
        json={"text": ["I love tea.", "Hello there!"], "conversation": "e2e-add", "model": "m"},
        headers=A,
    )
    assert added.status_code == 202, added.text
    fact_event, chit_chat_event = added.json()["event_ids"]

    async def applied(event_id: str) -> dict[str, Any] | None:
        status = (await http.get(f"/v1/events/{event_id}", headers=A)).json()
        return status if status["status"] == "applied" else None

    await wait_for(lambda: applied(chit_chat_event), 30, what="the chit-chat turn applied")
    await wait_for(lambda: applied(fact_event), 45, what="the fact turn reconciled")
    facts = await http.get(
        "/v1/memories", params={"conversation": "e2e-add", "kind": "fact"}, headers=A
    )
    assert [m["text"] for m in facts.json()["data"]] == ["User loves tea"]
    other = await http.get("/v1/memories", params={"conversation": "e2e-add"}, headers=B)
    assert other.json()["data"] == []
    assert (await http.get(f"/v1/events/{fact_event}", headers=B)).status_code == 404


async def test_created_then_deleted_memory_is_mirrored_then_tombstoned(
    http: httpx2.AsyncClient, keyed_stack: Stack
) -> None:
    created = await http.post(
        "/v1/memories",
        json={"text": "User's bike is green.", "conversation": "e2e-mirror", "tags": ["bike"]},
        headers=A,
    )
    assert created.status_code == 201, created.text
    memory_id = created.json()["id"]
    conversation_dir = keyed_stack.data_dir / "mirror" / "acme" / "e2e-mirror"

    def files(pattern: str, needle: str) -> list[Path]:
        found = []
        for path in conversation_dir.glob(pattern):
            try:
                if needle in path.read_text():
                    found.append(path)
            except FileNotFoundError:  # moved by the mirror between glob and read
                continue
        return found

    await wait_for(lambda: files("facts/*.md", memory_id), 30, what="the fact file")
    edited = await http.patch(
        f"/v1/memories/{memory_id}", json={"text": "User's bike is red."}, headers=A
    )
    assert edited.status_code == 200
    await wait_for(
        lambda: files("facts/*.md", "User's bike is red."), 30, what="the edited fact file"
    )
    await wait_for(
        lambda: files("deleted/**/*.md", "User's bike is green."), 30, what="the old version"
    )

    deleted = await http.delete(f"/v1/memories/{memory_id}", headers=A)
    assert deleted.status_code == 200

    def tombstoned() -> bool:
        return not files("facts/*.md", memory_id) and bool(files("deleted/**/*.md", memory_id))

    await wait_for(tombstoned, 30, what="the fact file moved to deleted/")
    assert (await http.get(f"/v1/memories/{memory_id}", headers=A)).status_code == 404


def _files_naming(root: Path, pattern: str, needle: str) -> list[Path]:
    found = []
    for path in root.glob(pattern):
        try:
            if needle in path.read_text():
                found.append(path)
        except FileNotFoundError:  # moved by the mirror between glob and read
            continue
    return found


async def _mirror_caught_up(http: httpx2.AsyncClient, conversation_dir: Path) -> None:
    """The mirror applies changes in stream order: once a marker created now has its
    file, every earlier change has been applied."""
    marker = await http.post(
        "/v1/memories",
        json={"text": "A marker for the mirror.", "conversation": conversation_dir.name},
        headers=A,
    )
    assert marker.status_code in (200, 201), marker.text
    await wait_for(
        lambda: _files_naming(conversation_dir, "facts/*.md", marker.json()["id"]),
        30,
        what="the marker's file",
    )


async def test_a_delete_racing_edits_leaves_no_memory_and_no_live_file(
    http: httpx2.AsyncClient, keyed_stack: Stack
) -> None:
    """One DELETE and four PATCHes of one memory at once, several rounds: a DELETE that
    answered 200 leaves the memory gone from the index and its history, and the mirror
    agrees — a tombstone, no live file beside it."""
    conversation_dir = keyed_stack.data_dir / "mirror" / "acme" / "e2e-race"
    deleted: list[str] = []
    for round_no in range(6):
        created = await http.post(
            "/v1/memories",
            json={"text": f"User's gate code is {round_no}00.", "conversation": "e2e-race"},
            headers=A,
        )
        memory_id = created.json()["id"]
        patches = [
            http.patch(
                f"/v1/memories/{memory_id}",
                json={"text": f"User's gate code is {round_no}0{n}."},
                headers=A,
            )
            for n in range(1, 5)
        ]
        answers = await asyncio.gather(
            *patches[: round_no % 5],
            http.delete(f"/v1/memories/{memory_id}", headers=A),
            *patches[round_no % 5 :],
        )
        assert answers[round_no % 5].status_code == 200, answers[round_no % 5].text
        deleted.append(memory_id)
        assert (await http.get(f"/v1/memories/{memory_id}", headers=A)).status_code == 404

    async def listed() -> list[dict[str, Any]]:
        everything = await http.get(
            "/v1/memories",
            params={"conversation": "e2e-race", "include_superseded": "true"},
            headers=A,
        )
        return list(everything.json()["data"])

    # No fact, version or history is left once the DELETEs answered.
    assert [m for m in await listed() if m["kind"] != "summary"] == []

    # The conversation's summary is derived: a fact folded into it moments before its
    # DELETE is taken out when summarize handles the deletion, so it goes too.
    async def nothing_left() -> bool:
        return not await listed()

    await wait_for(nothing_left, 30, what="the summary of the deleted facts gone")

    await _mirror_caught_up(http, conversation_dir)
    for memory_id in deleted:
        assert _files_naming(conversation_dir, "facts/*.md", memory_id) == []
        assert _files_naming(conversation_dir, "deleted/**/*.md", f"id: {memory_id}")


async def test_twenty_edits_at_once_are_all_kept_and_the_mirror_agrees(
    http: httpx2.AsyncClient, keyed_stack: Stack
) -> None:
    conversation_dir = keyed_stack.data_dir / "mirror" / "acme" / "e2e-twenty"
    created = await http.post(
        "/v1/memories",
        json={"text": "User's lucky number is 0.", "conversation": "e2e-twenty"},
        headers=A,
    )
    memory_id = created.json()["id"]
    texts = [f"User's lucky number is {n}." for n in range(1, 21)]
    answers = await asyncio.gather(
        *(http.patch(f"/v1/memories/{memory_id}", json={"text": t}, headers=A) for t in texts)
    )
    assert [a.status_code for a in answers] == [200] * 20
    current = (await http.get(f"/v1/memories/{memory_id}", headers=A)).json()
    history = (await http.get(f"/v1/memories/{memory_id}/history", headers=A)).json()["data"]
    assert set(texts) <= {current["text"], *(v["text"] for v in history)}

    await _mirror_caught_up(http, conversation_dir)
    (live,) = _files_naming(conversation_dir, "facts/*.md", f"id: {memory_id}")
    assert live.read_text().rstrip().endswith(current["text"])
    for version in history:
        (tombstone,) = _files_naming(conversation_dir, "deleted/**/*.md", f"id: {version['id']}")
        assert version["text"] in tombstone.read_text()
