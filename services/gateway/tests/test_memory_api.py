"""The memory API against the real retrieval service (embedded store, real embedder)
and the real nats-server, with API keys for two tenants."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client

from engram_client.mcp_tools import GatewayApi, build_mcp_server
from engram_core.codec import pb, to_timestamp
from engram_core.event_status import EventStatusStore
from engram_core.ids import summary_memory_id
from engram_gateway.keys import entry_for
from engram_testing.mcp_results import tool_text
from engram_testing.worker_stack import RealRetrieval, running_retrieval

from .conftest import JetStreamReader, RunningGateway, StartGateway

KEY_A, KEY_B = "key-of-tenant-a", "key-of-tenant-b"
A = {"Authorization": f"Bearer {KEY_A}"}
B = {"Authorization": f"Bearer {KEY_B}"}
KEYS = f"{entry_for(KEY_A, 'tenant-a')},{entry_for(KEY_B, 'tenant-b')}"
MEM = "/v1/memories"


@pytest.fixture
async def retrieval(tmp_path: Path) -> AsyncIterator[RealRetrieval]:
    async with running_retrieval(tmp_path / "retrieval") as running:
        yield running


@pytest.fixture
async def keyed(start_gateway: StartGateway, retrieval: RealRetrieval) -> RunningGateway:
    return await start_gateway(retrieval_address=retrieval.address, api_keys=KEYS)


@pytest.fixture
async def http(keyed: RunningGateway) -> httpx2.AsyncClient:
    return keyed.client()


def _assert_error(response: httpx2.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code, error
    return error


async def _create(http: httpx2.AsyncClient, headers: dict, **body: Any) -> dict:
    response = await http.post(MEM, json=body, headers=headers)
    assert response.status_code == 201, response.text
    return response.json()


# --- CRUD and history --------------------------------------------------------------------


async def test_create_get_update_history_delete(
    http: httpx2.AsyncClient, jetstream: JetStreamReader
) -> None:
    created = await _create(
        http, A, text="User's cat is called Miso.", tags=["pets", "pets"], conversation="c1"
    )
    assert created["object"] == "memory"
    assert (created["kind"], created["conversation_id"], created["tags"]) == (
        "fact",
        "c1",
        ["pets"],
    )
    memory_id = created["id"]
    assert (await http.get(f"{MEM}/{memory_id}", headers=A)).json()["text"] == created["text"]

    first = await http.patch(f"{MEM}/{memory_id}", json={"text": "User's cat is Mochi."}, headers=A)
    assert first.status_code == 200, first.text
    assert first.json()["id"] == memory_id
    assert first.json()["text"] == "User's cat is Mochi."
    assert first.json()["tags"] == ["pets"]
    unchanged = await http.patch(f"{MEM}/{memory_id}", json={"tags": ["pets"]}, headers=A)
    assert unchanged.json()["text"] == "User's cat is Mochi."
    await http.patch(f"{MEM}/{memory_id}", json={"text": "User has no cat.", "tags": []}, headers=A)

    history = (await http.get(f"{MEM}/{memory_id}/history", headers=A)).json()
    assert history["id"] == memory_id
    texts = [v["text"] for v in history["data"]]
    assert texts == ["User's cat is called Miso.", "User's cat is Mochi."]  # oldest first
    for version in history["data"]:
        assert version["superseded_by"] == memory_id
        assert version["valid_to"] and version["valid_from"]
    assert history["data"][0]["valid_to"] <= history["data"][1]["valid_from"]
    assert history["data"][1]["tags"] == ["pets"]

    current = (await http.get(MEM, headers=A, params={"conversation": "c1"})).json()
    assert [m["text"] for m in current["data"]] == ["User has no cat."]
    everything = await http.get(
        MEM, headers=A, params={"conversation": "c1", "include_superseded": "true"}
    )
    assert len(everything.json()["data"]) == 3

    superseded_id = history["data"][0]["id"]
    conflict = await http.patch(f"{MEM}/{superseded_id}", json={"text": "x"}, headers=A)
    _assert_error(conflict, 409, "memory_superseded")
    # a failing precondition does not hide why the edit could not happen anyway (RFC 9110)
    stale = {**A, "If-Match": '"not-its-version"'}
    conflict = await http.patch(f"{MEM}/{superseded_id}", json={"text": "x"}, headers=stale)
    _assert_error(conflict, 409, "memory_superseded")

    deleted = await http.delete(f"{MEM}/{memory_id}", headers=A)
    assert deleted.status_code == 200
    assert deleted.json()["deleted"] is True
    assert set(deleted.json()["deleted_ids"]) == {memory_id, *(v["id"] for v in history["data"])}
    _assert_error(await http.get(f"{MEM}/{memory_id}", headers=A), 404, "memory_not_found")
    _assert_error(await http.delete(f"{MEM}/{memory_id}", headers=A), 404)

    # The mirror hears about every change (cause "api"), in order.
    changes = [e.data for e in await jetstream.events(8)]
    assert [(c["op"], c["cause"], c["tenant"]) for c in changes] == [
        ("created", "api", "tenant-a"),
        ("superseded", "api", "tenant-a"),
        ("updated", "api", "tenant-a"),
        ("superseded", "api", "tenant-a"),
        ("updated", "api", "tenant-a"),
        *[("deleted", "api", "tenant-a")] * 3,
    ]
    assert changes[0]["memory"]["id"] == memory_id
    assert changes[2]["memory"]["text"] == "User's cat is Mochi."


async def test_list_filters_and_cursor_pagination(http: httpx2.AsyncClient) -> None:
    for day in range(1, 6):
        await _create(
            http,
            A,
            text=f"Fact number {day} about travel.",
            tags=["travel"] if day % 2 else ["work"],
            user="alice" if day < 4 else "bob",
            conversation="trips",
            created_at=f"2025-03-0{day}T10:00:00Z",
        )
    seen: list[str] = []
    cursor = None
    while True:
        params: dict[str, Any] = {"conversation": "trips", "limit": 2}
        if cursor:
            params["cursor"] = cursor
        page = (await http.get(MEM, headers=A, params=params)).json()
        seen += [m["created_at"][:10] for m in page["data"]]
        assert page["has_more"] == bool(page["next_cursor"])
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == [f"2025-03-0{d}" for d in (5, 4, 3, 2, 1)]  # newest first, no repeats

    travel = (await http.get(MEM, headers=A, params={"tag": "travel"})).json()["data"]
    assert len(travel) == 3
    both = (await http.get(MEM, headers=A, params=[("tag", "travel"), ("tag", "work")])).json()
    assert len(both["data"]) == 5
    assert len((await http.get(MEM, headers=A, params={"user": "bob"})).json()["data"]) == 2
    assert (await http.get(MEM, headers=A, params={"kind": "turn"})).json()["data"] == []
    assert len((await http.get(MEM, headers=A, params={"kind": "fact"})).json()["data"]) == 5


async def test_times_at_the_ends_of_the_range_round_trip(http: httpx2.AsyncClient) -> None:
    """Years before 1000 and offsets at the extremes are stored and read back as given
    (in UTC); the list order holds across them."""
    cases = {
        "0999-03-01T10:00:00Z": "0999-03-01T10:00:00Z",
        "0001-01-01T14:00:00+14:00": "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59+14:00": "9999-12-31T09:59:59Z",
        "2025-06-01T12:00:00-14:00": "2025-06-02T02:00:00Z",
    }
    ids = {}
    for given, stored in cases.items():
        created = await _create(
            http, A, text=f"A fact from {given}.", conversation="edges", created_at=given
        )
        assert created["created_at"] == stored
        ids[stored] = created["id"]
    for stored, memory_id in ids.items():
        fetched = (await http.get(f"{MEM}/{memory_id}", headers=A)).json()
        assert fetched["created_at"] == stored
    listed = (await http.get(MEM, headers=A, params={"conversation": "edges"})).json()
    assert [m["created_at"] for m in listed["data"]] == sorted(cases.values(), reverse=True)


async def test_search_returns_hits_scores_summary_and_profile(
    http: httpx2.AsyncClient, retrieval: RealRetrieval
) -> None:
    await _create(http, A, text="User's wife is named Anne.", user="alice", conversation="fam")
    await _create(http, A, text="User loves hiking in the Alps.", user="alice", conversation="fam")
    await retrieval.client.upsert(
        pb.UpsertRequest(
            tenant="tenant-a",
            memories=[
                pb.Memory(
                    # the summarize worker's id for alice's "fam": the one search attaches
                    id=summary_memory_id("tenant-a", "alice", "fam"),
                    kind=pb.MEMORY_KIND_SUMMARY,
                    conversation_id="fam",
                    user_id="alice",
                    text="Talking about family.",
                    created_at=to_timestamp(__import__("datetime").datetime.now().astimezone()),
                ),
                pb.Memory(
                    kind=pb.MEMORY_KIND_PROFILE,
                    conversation_id="fam",
                    user_id="alice",
                    text="preference/diet: vegetarian",
                    profile=pb.ProfileEntry(
                        category="preference", key="diet", value="vegetarian", confidence=0.9
                    ),
                ),
            ],
        )
    )
    response = await http.post(
        f"{MEM}/search",
        json={
            "query": "What is my wife's name?",
            "user": "alice",
            "conversation": "fam",
            "memory_top_k": 5,
            "memory_score_threshold": 0,
        },
        headers=A,
    )
    assert response.status_code == 200, response.text
    result = response.json()
    assert result["object"] == "memory.search"
    # Two memories in scope: a small store returns both, newest first.
    assert {h["text"] for h in result["hits"]} == {
        "User's wife is named Anne.",
        "User loves hiking in the Alps.",
    }
    hit = result["hits"][0]
    assert hit["scope"] == "conversation"
    assert set(hit["scores"]) == {"dense", "sparse", "relevance", "recency", "total", "mmr"}
    assert hit["score"] == hit["scores"]["total"]
    assert result["summary"]["text"] == "Talking about family."
    assert [p["profile"]["value"] for p in result["profile"]] == ["vegetarian"]
    assert result["outcome"] in ("ranked", "small_store")


# --- tenants ------------------------------------------------------------------------------


async def test_tenant_b_can_never_reach_tenant_a(
    http: httpx2.AsyncClient, scripted_upstream: Any
) -> None:
    secret = await _create(
        http, A, text="Tenant A's launch code is 1234.", user="u", conversation="shared-name"
    )
    sid = secret["id"]
    await http.patch(f"{MEM}/{sid}", json={"text": "Tenant A's launch code is 5678."}, headers=A)
    history_id = (await http.get(f"{MEM}/{sid}/history", headers=A)).json()["data"][0]["id"]
    mine = await _create(http, B, text="Tenant B likes tea.", user="u", conversation="shared-name")

    for memory_id in (sid, history_id):  # guessing (knowing, even) the ids does not help
        _assert_error(await http.get(f"{MEM}/{memory_id}", headers=B), 404, "memory_not_found")
        _assert_error(await http.get(f"{MEM}/{memory_id}/history", headers=B), 404)
        _assert_error(
            await http.patch(f"{MEM}/{memory_id}", json={"text": "pwned"}, headers=B), 404
        )
        _assert_error(await http.delete(f"{MEM}/{memory_id}", headers=B), 404)
    listed = await http.get(
        MEM,
        headers=B,
        params={"conversation": "shared-name", "user": "u", "include_superseded": "true"},
    )
    assert [m["id"] for m in listed.json()["data"]] == [mine["id"]]
    found = await http.post(
        f"{MEM}/search",
        json={
            "query": "launch code",
            "user": "u",
            "conversation": "shared-name",
            "memory_score_threshold": 0,
            "include_superseded": True,
        },
        headers=B,
    )
    assert [h["id"] for h in found.json()["hits"]] == [mine["id"]]
    scripted_upstream.replies = ["ok"] * 2
    chat = await http.post(
        "/v1/chat/completions",
        json={
            "model": "m",
            "user": "u",
            "memory_id": "shared-name",
            "memory_score_threshold": 0,
            "messages": [{"role": "user", "content": "What is the launch code?"}],
        },
        headers={**B, "X-Upstream-Authorization": "Bearer upstream"},
    )
    assert chat.status_code == 200, chat.text
    assert [h["id"] for h in chat.json()["memory_hits"]] == [mine["id"]]
    assert "launch code is" not in json.dumps(scripted_upstream.requests[-1].body)

    # A's memory is untouched by all of that.
    still = (await http.get(f"{MEM}/{sid}", headers=A)).json()
    assert still["text"] == "Tenant A's launch code is 5678."
    added = await http.post(f"{MEM}/add", json={"text": "I like jazz."}, headers=A)
    event_id = added.json()["event_ids"][0]
    _assert_error(await http.get(f"/v1/events/{event_id}", headers=B), 404, "event_not_found")
    assert (await http.get(f"/v1/events/{event_id}", headers=A)).status_code == 200


async def test_keys_are_required_and_the_upstream_key_is_separate(
    http: httpx2.AsyncClient, scripted_upstream: Any
) -> None:
    for method, path in (
        ("GET", MEM),
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/models"),
        ("GET", "/v1/events/0b7f1b8e-0000-4000-8000-000000000000"),
        ("GET", "/openapi.json"),
        ("GET", "/nope"),
    ):
        error = _assert_error(await http.request(method, path), 401, "invalid_api_key")
        assert error["type"] == "invalid_request_error"
        bad = await http.request(method, path, headers={"Authorization": "Bearer wrong"})
        _assert_error(bad, 401, "invalid_api_key")
        assert bad.headers["www-authenticate"] == "Bearer"
        assert "wrong" not in bad.text
    basic = await http.get(MEM, headers={"Authorization": f"Basic {KEY_A}"})
    _assert_error(basic, 401)
    assert (await http.get("/healthz")).status_code == 200
    assert (await http.get("/readyz")).status_code == 200

    await http.get("/v1/models", headers={**A, "X-Upstream-Authorization": "Bearer sk-up"})
    forwarded = scripted_upstream.requests[-1].headers
    assert forwarded["authorization"] == "Bearer sk-up"
    assert "x-upstream-authorization" not in forwarded
    await http.get("/v1/models", headers=A)
    assert "authorization" not in scripted_upstream.requests[-1].headers  # never A's key


async def test_an_anthropic_style_x_api_key_is_an_engram_key_and_never_forwarded(
    http: httpx2.AsyncClient, scripted_upstream: Any
) -> None:
    """Anthropic's SDKs (and the agents built on them) send their key only as X-Api-Key:
    it names the tenant like a bearer token, a bearer token wins when both come, and
    the key never reaches the upstream."""
    key_a = {"X-Api-Key": KEY_A}
    created = await http.post(MEM, json={"text": "Owned by A via X-Api-Key."}, headers=key_a)
    assert created.status_code == 201, created.text
    assert (await http.get(f"{MEM}/{created.json()['id']}", headers=A)).status_code == 200
    _assert_error(await http.get(MEM, headers={"X-Api-Key": "wrong"}), 401, "invalid_api_key")
    both = await http.get(MEM, headers={**key_a, "Authorization": "Bearer wrong"})
    _assert_error(both, 401, "invalid_api_key")
    await http.get("/v1/models", headers=key_a)
    assert "x-api-key" not in scripted_upstream.requests[-1].headers


# --- validation ---------------------------------------------------------------------------


BAD_REQUESTS: list[tuple[str, str, Any, int, str | None]] = [
    ("POST", MEM, {"text": "x", "colour": "red"}, 400, "invalid_request"),
    ("POST", MEM, {"text": "   "}, 400, "empty_text"),
    ("POST", MEM, {"text": "x" * 101}, 400, "text_too_long"),
    ("POST", MEM, {"text": "x", "conversation": "../etc"}, 400, "invalid_request"),
    ("POST", MEM, {"text": "x", "tags": [""]}, 400, "invalid_request"),
    ("POST", MEM, {"tags": ["a"]}, 400, "invalid_request"),
    ("POST", MEM, {"text": "x", "created_at": "2025-01-01T00:00:00"}, 400, "invalid_request"),
    ("GET", f"{MEM}/not-a-uuid", None, 400, "invalid_id"),
    ("GET", f"{MEM}/0b7f1b8e-0000-4000-8000-000000000000", None, 404, "memory_not_found"),
    ("PATCH", f"{MEM}/0b7f1b8e-0000-4000-8000-000000000000", {}, 400, "nothing_to_update"),
    ("PATCH", f"{MEM}/0b7f1b8e-0000-4000-8000-000000000000", {"txt": "a"}, 400, None),
    ("DELETE", f"{MEM}/x", None, 400, "invalid_id"),
    ("GET", f"{MEM}?limit=0", None, 400, "invalid_request"),
    ("GET", f"{MEM}?kind=gossip", None, 400, "invalid_request"),
    ("GET", f"{MEM}?colour=red", None, 400, "invalid_request"),
    ("GET", f"{MEM}?cursor=bogus", None, 400, "invalid_cursor"),
    ("POST", f"{MEM}/search", {"query": ""}, 400, "invalid_request"),
    ("POST", f"{MEM}/search", {"query": "q", "memory_top_k": 0}, 400, "invalid_request"),
    ("POST", f"{MEM}/add", {"text": []}, 400, "invalid_request"),
    ("POST", f"{MEM}/add", {"text": ["ok", ""]}, 400, "empty_text"),
    ("GET", "/v1/events/nope", None, 400, "invalid_id"),
    ("GET", "/v1/events/0b7f1b8e-0000-4000-8000-000000000000", None, 404, "event_not_found"),
]


async def test_bad_requests_are_openai_shaped(
    start_gateway: StartGateway, retrieval: RealRetrieval
) -> None:
    gateway = await start_gateway(retrieval_address=retrieval.address, max_memory_chars=100)
    client = gateway.client()
    for method, path, body, status, code in BAD_REQUESTS:
        response = await client.request(method, path, json=body)
        try:
            _assert_error(response, status, code)
        except AssertionError as exc:
            raise AssertionError(f"{method} {path} {body!r}: {exc}") from None


async def test_malformed_and_oversized_bodies(start_gateway: StartGateway) -> None:
    gateway = await start_gateway(gateway_max_body_bytes=2048)
    client = gateway.client()
    malformed = await client.post(
        MEM, content=b"{nope", headers={"content-type": "application/json"}
    )
    _assert_error(malformed, 400)
    huge = await client.post(MEM, json={"text": "x" * 5000})
    _assert_error(huge, 413, "request_too_large")

    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(5):
            yield b" " * 1000

    chunked = await client.post(f"{MEM}/add", content=chunks())
    _assert_error(chunked, 413, "request_too_large")


# --- add and event status ---------------------------------------------------------------


async def test_add_publishes_user_turns_and_reports_their_status(
    http: httpx2.AsyncClient, keyed: RunningGateway, jetstream: JetStreamReader
) -> None:
    response = await http.post(
        f"{MEM}/add",
        json={
            "text": ["I moved to Lisbon.", "My sister is Eva."],
            "user": "alice",
            "conversation": "life",
            "created_at": "2025-02-01T09:00:00Z",
            "model": "small",
        },
        headers={**A, "X-Request-Id": "add-1"},
    )
    assert response.status_code == 202, response.text
    ids = response.json()["event_ids"]
    assert len(ids) == 2
    turns = [e.data for e in await jetstream.events(2)]
    assert [(t["role"], t["text"], t["tenant"], t["user_id"]) for t in turns] == [
        ("user", "I moved to Lisbon.", "tenant-a", "alice"),
        ("user", "My sister is Eva.", "tenant-a", "alice"),
    ]
    assert [t["event_id"] for t in turns] == ids
    assert [t["followed"] for t in turns] == [True, True]  # the workers report on them
    assert turns[0]["created_at"].startswith("2025-02-01T09:00:00")
    assert turns[0]["model"] == "small"
    again = await http.post(
        f"{MEM}/add",
        json={
            "text": ["I moved to Lisbon.", "My sister is Eva."],
            "user": "alice",
            "conversation": "life",
            "created_at": "2025-02-01T09:00:00Z",
            "model": "small",
        },
        headers={**A, "X-Request-Id": "add-1"},
    )
    assert again.json()["event_ids"] == ids  # a retry is the same events (de-duplicated)

    first = (await http.get(f"/v1/events/{ids[0]}", headers=A)).json()
    assert (first["status"], first["stage"], first["applied_at"]) == ("pending", "ingest", None)
    # What ingest and reconcile do (services/workers): the first turn yields facts, the
    # second nothing.
    async with EventStatusStore.connect(keyed.settings.nats_url) as statuses:
        proposal = "7a7a7a7a-0000-4000-8000-000000000000"
        await statuses.update_if_followed("tenant-a", ids[0], follow_up=proposal)
        await statuses.update_if_followed("tenant-a", ids[1])
        waiting = (await http.get(f"/v1/events/{ids[0]}", headers=A)).json()
        assert (waiting["status"], waiting["stage"]) == ("pending", "reconcile")
        # reconcile took its fallback (the facts added as they were), and says why
        unusable = "the model's answer was unusable (small): reconcile: …"
        await statuses.update_if_followed("tenant-a", proposal, fallback=unusable)
        await statuses.update_if_followed("tenant-a", ids[0], follow_up="ignored-redelivery")
    for event_id, fallback in zip(ids, [unusable, None], strict=True):
        done = (await http.get(f"/v1/events/{event_id}", headers=A)).json()
        assert (done["status"], done["stage"], done["fallback"]) == ("applied", None, fallback)
        assert done["applied_at"] >= done["accepted_at"]


async def test_openapi_lists_the_memory_api_without_422(http: httpx2.AsyncClient) -> None:
    schema = (await http.get("/openapi.json", headers=A)).json()
    paths = schema["paths"]
    assert set(paths[MEM]) == {"get", "post"}
    assert set(paths[MEM + "/{memory_id}"]) == {"get", "patch", "delete"}
    for path in (
        MEM + "/{memory_id}/history",
        MEM + "/search",
        MEM + "/add",
        "/v1/events/{event_id}",
    ):
        assert path in paths
    for operations in paths.values():
        for operation in operations.values():
            assert "422" not in operation.get("responses", {})
    assert paths[MEM]["post"]["responses"]["400"]["content"]["application/json"]["schema"]
    assert schema["components"]["schemas"]["CreateMemory"]["additionalProperties"] is False


async def test_a_cursor_carries_the_filters_of_the_first_page(http: httpx2.AsyncClient) -> None:
    for n, user in enumerate(("alice", "bob", "alice", "bob", "alice")):
        await _create(http, A, text=f"Note {n} of {user}.", user=user, conversation="notes")
    first = (await http.get(MEM, headers=A, params={"user": "alice", "limit": 1})).json()
    texts = [m["text"] for m in first["data"]]
    cursor = first["next_cursor"]
    while cursor:  # the docs' loop: only the cursor after the first page
        page = (await http.get(MEM, headers=A, params={"cursor": cursor, "limit": 1})).json()
        texts += [m["text"] for m in page["data"]]
        cursor = page["next_cursor"]
    assert sorted(texts) == ["Note 0 of alice.", "Note 2 of alice.", "Note 4 of alice."]
    # repeating the same filters is fine; other filters with the cursor are refused
    same = await http.get(MEM, headers=A, params={"user": "alice", "cursor": first["next_cursor"]})
    assert same.status_code == 200
    other = await http.get(MEM, headers=A, params={"user": "bob", "cursor": first["next_cursor"]})
    error = _assert_error(other, 400, "cursor_filters_mismatch")
    assert "user" in error["message"]


async def test_create_without_a_user_is_tenant_wide_and_a_retry_creates_nothing_new(
    http: httpx2.AsyncClient,
) -> None:
    shared = await _create(http, A, text="The office is closed on Fridays.")
    assert (shared["user_id"], shared["conversation_id"]) == ("", "global")
    mine = await _create(http, A, text="I take the train.", user="alice")
    assert (mine["user_id"], mine["conversation_id"]) == ("alice", "default")

    retry = {**A, "X-Request-Id": "create-1"}
    first = await _create(http, retry, text="User is allergic to peanuts.", user="alice")
    again = await _create(http, retry, text="User is allergic to peanuts.", user="alice")
    assert again["id"] == first["id"]
    listed = (await http.get(MEM, headers=A, params={"user": "alice"})).json()["data"]
    assert [m["text"] for m in listed].count("User is allergic to peanuts.") == 1
    reused = await http.post(MEM, json={"text": "Something else."}, headers=retry)
    _assert_error(reused, 409, "request_id_reused")


# --- duplicates: reconcile's near-duplicate rule --------------------------------------------


async def test_creating_a_fact_its_scope_already_holds_returns_the_existing_one(
    http: httpx2.AsyncClient,
) -> None:
    scope = {"user": "alice", "conversation": "pets"}
    first = await _create(http, A, text="User's cat is called Miso.", **scope)
    assert first["duplicate_of"] is None
    for again in ("User's cat is called Miso.", "  user's cat is called miso  "):
        response = await http.post(MEM, json={"text": again, **scope}, headers=A)
        assert response.status_code == 200, response.text
        assert response.json()["id"] == response.json()["duplicate_of"] == first["id"]
        assert response.json()["text"] == "User's cat is called Miso."
        assert response.headers["ETag"]
    near = await http.post(MEM, json={"text": "User's cat is named Miso.", **scope}, headers=A)
    assert (near.status_code, near.json()["duplicate_of"]) == (200, first["id"])

    # Another name or number, another scope: a new fact.
    for text, where in (
        ("User's cat is called Mochi.", scope),
        ("User's cat is called Miso.", {"user": "bob", "conversation": "pets"}),
        ("User's cat is called Miso.", {"user": "alice", "conversation": "other"}),
    ):
        created = await http.post(MEM, json={"text": text, **where}, headers=A)
        assert created.status_code == 201, (text, where, created.text)
        assert created.json()["duplicate_of"] is None
    listed = (await http.get(MEM, headers=A, params=scope)).json()["data"]
    assert sorted(m["text"] for m in listed) == [
        "User's cat is called Miso.",
        "User's cat is called Mochi.",
    ]


async def test_the_same_fact_created_at_once_is_stored_once(http: httpx2.AsyncClient) -> None:
    scope = {"user": "carol", "conversation": "at-once"}
    answers = await asyncio.gather(
        *(
            http.post(MEM, json={"text": "User works night shifts.", **scope}, headers=A)
            for _ in range(5)
        )
    )
    assert sorted(a.status_code for a in answers) == [200, 200, 200, 200, 201]
    assert len({a.json()["id"] for a in answers}) == 1
    listed = (await http.get(MEM, headers=A, params=scope)).json()["data"]
    assert [m["text"] for m in listed] == ["User works night shifts."]


async def test_remember_fact_twice_keeps_one_fact_and_says_so(keyed: RunningGateway) -> None:
    async with (
        httpx2.AsyncClient(base_url=keyed.url, headers=A, timeout=30) as api,
        Client(build_mcp_server(GatewayApi(api))) as mcp,
    ):
        args = {"text": "User is allergic to peanuts.", "user": "dave"}
        first = await mcp.call_tool("remember_fact", args)
        second = await mcp.call_tool("remember_fact", args)
    assert not first.is_error and not second.is_error
    created, repeated = json.loads(tool_text(first)), json.loads(tool_text(second))
    assert created["duplicate_of"] is None
    assert repeated["id"] == repeated["duplicate_of"] == created["id"]
    listed = (await api_list(keyed, {"user": "dave"}))["data"]
    assert [m["text"] for m in listed] == ["User is allergic to peanuts."]


async def api_list(gateway: RunningGateway, params: dict[str, str]) -> dict[str, Any]:
    async with httpx2.AsyncClient(base_url=gateway.url, headers=A, timeout=30) as http:
        return dict((await http.get(MEM, params=params)).json())
