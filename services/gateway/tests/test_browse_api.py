"""Browsing a tenant's memory over HTTP: its users and their conversations with counts,
and lists within a created_at window — against the real retrieval service, two keys."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from engram_testing.worker_stack import RealRetrieval, running_retrieval

from .conftest import RunningGateway, StartGateway
from .test_memory_api import KEYS, A, B, _assert_error, _create


@pytest.fixture
async def retrieval(tmp_path: Path) -> AsyncIterator[RealRetrieval]:
    async with running_retrieval(tmp_path / "retrieval") as running:
        yield running


@pytest.fixture
async def http(start_gateway: StartGateway, retrieval: RealRetrieval) -> httpx2.AsyncClient:
    keyed: RunningGateway = await start_gateway(retrieval_address=retrieval.address, api_keys=KEYS)
    return keyed.client()


async def test_users_and_their_conversations_with_counts(http: httpx2.AsyncClient) -> None:
    for text, user, conversation in [
        ("User likes tea.", "alice", "home"),
        ("User likes jazz.", "alice", "home"),
        ("User bakes bread.", "alice", "work"),
        ("The office closes at six.", "", "global"),
    ]:
        await _create(http, A, text=text, user=user, conversation=conversation)
    await _create(http, B, text="User sails.", user="eve", conversation="boat")

    users = (await http.get("/v1/users", headers=A)).json()
    assert users["object"] == "list" and users["has_more"] is False
    assert users["data"][0] == {"object": "user", "id": "alice", "memories": 3}
    assert sorted((u["id"], u["memories"]) for u in users["data"]) == [("", 1), ("alice", 3)]

    alice = (await http.get("/v1/conversations", params={"user": "alice"}, headers=A)).json()
    assert alice["data"] == [
        {"object": "conversation", "id": "home", "user_id": "alice", "memories": 2},
        {"object": "conversation", "id": "work", "user_id": "alice", "memories": 1},
    ]
    tenant_wide = (await http.get("/v1/conversations", headers=A)).json()
    assert [(c["id"], c["user_id"]) for c in tenant_wide["data"]] == [("global", "")]
    first = (await http.get("/v1/users", params={"limit": 1}, headers=A)).json()
    assert [u["id"] for u in first["data"]] == ["alice"] and first["has_more"] is True

    # another tenant sees only its own; the other tenant's user is simply absent
    other = (await http.get("/v1/users", headers=B)).json()
    assert [u["id"] for u in other["data"]] == ["eve"]
    nobody = (await http.get("/v1/conversations", params={"user": "alice"}, headers=B)).json()
    assert nobody["data"] == []

    _assert_error(await http.get("/v1/users", params={"limit": 0}, headers=A), 400)
    _assert_error(await http.get("/v1/users", params={"who": "x"}, headers=A), 400)
    _assert_error(await http.get("/v1/users"), 401, "invalid_api_key")


async def test_list_within_a_created_at_window(http: httpx2.AsyncClient) -> None:
    for day in (1, 2, 3, 4):
        await _create(
            http,
            A,
            text=f"Note of day {day}.",
            conversation="diary",
            created_at=f"2025-05-0{day}T12:00:00Z",
        )
    window = {
        "conversation": "diary",
        "created_after": "2025-05-02T12:00:00Z",
        "created_before": "2025-05-04T00:00:00+00:00",
    }
    listed = (await http.get("/v1/memories", params=window, headers=A)).json()
    assert [m["text"] for m in listed["data"]] == ["Note of day 3.", "Note of day 2."]
    paged = (await http.get("/v1/memories", params={**window, "limit": 1}, headers=A)).json()
    assert paged["has_more"] is True
    rest = await http.get(
        "/v1/memories", params={**window, "cursor": paged["next_cursor"]}, headers=A
    )
    assert [m["text"] for m in rest.json()["data"]] == ["Note of day 2."]
    # the cursor carries the window: page 2 without it is the same page
    bare = await http.get("/v1/memories", params={"cursor": paged["next_cursor"]}, headers=A)
    assert [m["text"] for m in bare.json()["data"]] == ["Note of day 2."]
    moved = {**window, "created_after": "2025-05-01T00:00:00Z", "cursor": paged["next_cursor"]}
    mismatch = _assert_error(await http.get("/v1/memories", params=moved, headers=A), 400)
    assert "created_after" in mismatch["message"]
    since = {"conversation": "diary", "created_after": "2025-05-04T00:00:00Z"}
    latest = (await http.get("/v1/memories", params=since, headers=A)).json()
    assert [m["text"] for m in latest["data"]] == ["Note of day 4."]

    naive = await http.get("/v1/memories", params={"created_after": "2025-05-02"}, headers=A)
    assert _assert_error(naive, 400)["param"] == "created_after"
    backwards = {"created_after": "2025-05-03T00:00:00Z", "created_before": "2025-05-02T00:00:00Z"}
    error = _assert_error(await http.get("/v1/memories", params=backwards, headers=A), 400)
    assert "earlier than created_before" in error["message"]
