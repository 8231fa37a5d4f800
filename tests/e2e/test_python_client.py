"""The Python client (engram_client), sync and async, against the whole stack (every
worker process, the rule-based scripted LLM) with API keys: every method, the pages of a
list with its filters kept, If-Match and its 412, add-and-wait until the facts are
learned, and the API's errors as typed exceptions carrying its code."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from engram_cli.stack.nats_server import free_port
from engram_cli.stack.up import Stack
from engram_client import (
    AsyncEngramClient,
    AuthenticationError,
    BadRequest,
    EngramClient,
    GatewayUnreachable,
    NotFound,
    PreconditionFailed,
)
from engram_gateway.keys import entry_for

from .test_learning import start_stack

pytestmark = pytest.mark.e2e

KEY_A, KEY_B = "client-key-a", "client-key-b"


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    keys = f"{entry_for(KEY_A, 'acme')},{entry_for(KEY_B, 'beta')}"
    stack: Stack
    stack, upstream = start_stack(
        tmp_path_factory.mktemp("python-client") / "data",
        ENGRAM_API_KEYS=keys,
        # add sends no model: the workers' own decides what extraction uses
        ENGRAM_LLM_MODEL="scripted-model",
    )
    try:
        yield f"http://{stack.settings.gateway_host}:{stack.settings.gateway_port}"
    finally:
        stack.stop()
        upstream.stop()


@pytest.fixture
def client(base_url: str) -> Iterator[EngramClient]:
    with EngramClient(base_url, KEY_A) as engram:
        yield engram


def test_create_get_patch_with_if_match_history_delete(client: EngramClient) -> None:
    created = client.create("User's cat is called Miso.", user="ana", tags=["pets"])
    assert (created.kind, created.user_id, created.conversation_id) == ("fact", "ana", "default")
    assert created.duplicate_of is None and created.etag
    again = client.create("User's cat is called Miso.", user="ana")
    assert again.duplicate_of == created.id  # the API's 200: nothing new stored

    fetched = client.get(created.id)
    assert fetched.text == created.text and fetched.etag == created.etag
    edited = client.patch(created.id, text="User's cat is called Mochi.", if_match=fetched)
    assert edited.text == "User's cat is called Mochi." and edited.etag != fetched.etag

    # the version read before the edit is stale now: 412, naming the current version
    with pytest.raises(PreconditionFailed) as stale:
        client.patch(created.id, tags=["cats"], if_match=fetched)
    assert (stale.value.status, stale.value.code) == (412, "precondition_failed")
    assert stale.value.current_etag == edited.etag
    with pytest.raises(PreconditionFailed):
        client.delete(created.id, if_match=fetched.etag)

    (old,) = client.history(created.id).data
    assert old.text == "User's cat is called Miso." and old.superseded_by
    deleted = client.delete(created.id, if_match=edited)
    assert deleted.deleted and created.id in deleted.deleted_ids
    with pytest.raises(NotFound) as missing:
        client.get(created.id)
    assert missing.value.code == "memory_not_found"


def test_list_follows_every_page_with_its_filters(client: EngramClient) -> None:
    texts = [f"User owns guitar number {n}." for n in range(7)]
    for text in texts:
        client.create(text, user="bruno", conversation="gear", tags=["music"])
    client.create("User owns a bicycle.", user="bruno", conversation="gear", tags=["sport"])
    listed = list(client.list(user="bruno", tags=["music"], kinds=["fact"], page_size=3))
    assert sorted(m.text for m in listed) == sorted(texts)  # 3 pages, the filter on each
    page = client.list_page(user="bruno", tags=["music"], limit=3)
    assert page.has_more and len(page.data) == 3
    rest = client.list_page(user="bruno", tags=["music"], limit=3, cursor=page.next_cursor)
    assert {m.id for m in rest.data}.isdisjoint(m.id for m in page.data)


def test_search_and_add_and_wait_until_the_fact_is_learned(client: EngramClient) -> None:
    events = client.add_and_wait(
        ["I am allergic to peanuts.", "Hello there!"], user="carla", timeout_s=60
    )
    assert {e.status for e in events} <= {"applied", "skipped"}
    assert events[0].status == "applied", events
    found = client.search("What am I allergic to?", user="carla")
    assert any("peanut" in hit.text.lower() for hit in found.hits), found
    assert all(0.0 <= hit.scores.relevance <= 1.0 for hit in found.hits)


def test_errors_are_typed_and_carry_the_apis_code(base_url: str, client: EngramClient) -> None:
    with pytest.raises(BadRequest) as bad:
        client.patch("0b7c4f7e-3f2a-4c7e-9a55-3c1f1a0e2b11")  # nothing to change
    assert bad.value.code == "nothing_to_update" and bad.value.request_id
    with pytest.raises(NotFound):
        client.get("../../v1/users")  # an id never names another path
    with pytest.raises(ValidationError, match="memory_top_k"):
        client.search("x", top_k=0)  # the API's own model refuses it before any request
    with EngramClient(base_url, "not-a-key") as stranger, pytest.raises(AuthenticationError):
        stranger.search("anything")
    nowhere = EngramClient(f"http://127.0.0.1:{free_port()}", KEY_A)
    with nowhere, pytest.raises(GatewayUnreachable, match="cannot reach"):
        nowhere.get("0b7c4f7e-3f2a-4c7e-9a55-3c1f1a0e2b11")


def test_another_tenants_memory_is_not_found(base_url: str, client: EngramClient) -> None:
    mine = client.create("User lives in Porto.", user="dora")
    with EngramClient(base_url, KEY_B) as other, pytest.raises(NotFound):
        other.get(mine.id)


async def test_the_async_client_does_the_same(base_url: str) -> None:
    async with AsyncEngramClient(f"{base_url}/v1", KEY_A) as engram:
        created = await engram.create("User's favourite colour is teal.", user="eva")
        edited = await engram.patch(created.id, tags=["colours"], if_match=created)
        with pytest.raises(PreconditionFailed):
            await engram.delete(created.id, if_match=created)
        # facts only: the summarize worker may already have written eva's summary
        listed = [m async for m in engram.list(user="eva", kinds=["fact"], page_size=1)]
        assert [m.id for m in listed] == [created.id]
        events = await engram.add_and_wait("I live in Lisbon.", user="eva", timeout_s=60)
        assert [e.status for e in events] == ["applied"]
        found = await engram.search("Where do I live?", user="eva")
        assert any("lisbon" in hit.text.lower() for hit in found.hits)
        assert (await engram.delete(created.id, if_match=edited)).deleted
