"""The retrieval port's contract, asserted on both implementations: the in-memory port
the gateway and worker tests use (``engram_testing.memory_store``), the gRPC port to
the real retrieval service (in-process, on a free port), and the port on the same
service called without a channel (``InProcessRetrievalClient``: ``engram up``'s light
layout, where the workers share retrieval's process). What holds for one holds for the
others, so a test passing against the in-memory port says something about production.

Search ranking is not compared (the in-memory port scores by shared words, the service by
its models): the outcomes, scopes, filters and attachments are.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest

from engram_core.lifecycle import summary_memory_id
from engram_core.memory import (
    MemoryFilter,
    MemoryRecord,
    ProposedProfileFact,
    SearchQuery,
    UpsertStatus,
)
from engram_core.memory_port import MemoryPort, RetrievalError
from engram_core.retrieval_client import InProcessRetrievalClient
from engram_testing.memory_store import InMemoryPort
from engram_testing.worker_stack import running_retrieval

T0 = datetime(2026, 1, 10, 12, 0, tzinfo=UTC)
ACME, OTHER = "acme", "other-tenant"


def uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def fact(n: int, text: str, **fields: object) -> MemoryRecord:
    values: dict[str, object] = {
        "id": uid(n),
        "kind": "fact",
        "text": text,
        "user_id": "u1",
        "conversation_id": "c1",
        "created_at": T0 + timedelta(minutes=n),
        **fields,
    }
    return MemoryRecord.model_validate(values)


@pytest.fixture(
    params=[
        "in-memory",
        pytest.param("grpc", marks=pytest.mark.integration),
        pytest.param("in-process", marks=pytest.mark.integration),
    ]
)
async def port(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MemoryPort]:
    if request.param == "in-memory":
        yield InMemoryPort()
        return
    async with running_retrieval(tmp_path / "retrieval") as retrieval:
        if request.param == "grpc":
            yield MemoryPort(retrieval.client)
        else:
            yield MemoryPort(InProcessRetrievalClient(retrieval.server.servicer, timeout_s=30))


async def test_upsert_reports_created_unchanged_updated_and_keeps_created_at(
    port: MemoryPort,
) -> None:
    record = fact(1, "The user's cat is Miso.", tags=["pets"], metadata={"source": "test"})
    [created] = await port.upsert(ACME, [record])
    assert created.status == UpsertStatus.CREATED
    assert created.record.created_at == record.created_at
    assert created.record.updated_at is not None

    [again] = await port.upsert(ACME, [record])
    assert again.status == UpsertStatus.UNCHANGED

    rewrite = record.model_copy(update={"text": "The user's cat is Mochi.", "created_at": None})
    [updated] = await port.upsert(ACME, [rewrite])
    assert updated.status == UpsertStatus.UPDATED
    assert updated.record.created_at == record.created_at

    stored = await port.get_one(ACME, record.id)
    assert stored is not None
    assert stored.model_dump(exclude={"updated_at"}) == rewrite.model_dump(
        exclude={"updated_at", "created_at"}
    ) | {"created_at": record.created_at}


async def test_a_profile_entry_round_trips(port: MemoryPort) -> None:
    entry = ProposedProfileFact(
        category="preference", key="diet", value="vegetarian", confidence=0.75, importance=0.5
    )
    record = fact(2, "", kind="profile", profile=entry)
    await port.upsert(ACME, [record])
    stored = await port.get_one(ACME, record.id)
    assert stored is not None
    assert stored.profile == entry
    assert stored.display_text == "preference diet: vegetarian"


async def test_bad_writes_are_the_callers_error(port: MemoryPort) -> None:
    with pytest.raises(RetrievalError) as not_a_uuid:
        await port.upsert(ACME, [fact(1, "x").model_copy(update={"id": "not-a-uuid"})])
    assert (not_a_uuid.value.code, not_a_uuid.value.http_status) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        400,
    )
    with pytest.raises(RetrievalError) as empty:
        await port.upsert(ACME, [fact(1, "  ")])
    assert empty.value.http_status == 400
    with pytest.raises(RetrievalError) as no_tenant:
        await port.upsert("", [fact(1, "x")])
    assert no_tenant.value.http_status == 400


async def test_a_tenant_never_reaches_another_tenants_memories(port: MemoryPort) -> None:
    mine = fact(1, "Acme's secret.")
    await port.upsert(ACME, [mine])
    assert await port.get(OTHER, [mine.id]) == {}
    assert await port.delete(OTHER, [mine.id]) == []
    assert (await port.list_page(OTHER, MemoryFilter())).records == []
    assert (await port.count(OTHER, MemoryFilter())).total == 0
    with pytest.raises(RetrievalError) as taken:
        await port.upsert(OTHER, [mine.model_copy(update={"text": "Taken over."})])
    assert (taken.value.code, taken.value.http_status) == (grpc.StatusCode.ALREADY_EXISTS, 409)
    assert (await port.get_one(ACME, mine.id)) is not None
    assert list(await port.get(ACME, [mine.id, "not-a-uuid", uid(99)])) == [mine.id]


async def test_delete_returns_what_it_deleted(port: MemoryPort) -> None:
    await port.upsert(ACME, [fact(1, "One."), fact(2, "Two.")])
    assert await port.delete(ACME, [uid(1), uid(3)]) == [uid(1)]
    assert list(await port.get(ACME, [uid(1), uid(2)])) == [uid(2)]


async def test_list_is_newest_first_in_pages_and_filters(port: MemoryPort) -> None:
    records = [
        fact(1, "Oldest fact."),
        fact(2, "A turn.", kind="turn", role="user", source_id="D1:1"),
        fact(3, "Superseded.", superseded_by=uid(4)),
        fact(4, "Tagged.", tags=["work", "travel"]),
        fact(5, "Other user.", user_id="u2", conversation_id="c9"),
        fact(6, "No user.", user_id="", conversation_id="global"),
    ]
    await port.upsert(ACME, records)

    async def ids(flt: MemoryFilter) -> list[str]:
        return [r.id for r in await port.list_all(ACME, flt)]

    assert await ids(MemoryFilter()) == [uid(6), uid(5), uid(4), uid(2), uid(1)]
    assert await ids(MemoryFilter(include_superseded=True)) == [uid(n) for n in (6, 5, 4, 3, 2, 1)]
    assert await ids(MemoryFilter(kinds=("turn",))) == [uid(2)]
    assert await ids(MemoryFilter(user_id="")) == [uid(6)]
    assert await ids(MemoryFilter(user_id="u1", conversation_id="c1")) == [uid(4), uid(2), uid(1)]
    assert await ids(MemoryFilter(tags=("travel", "nothing"))) == [uid(4)]
    assert await ids(MemoryFilter(source_ids=("D1:1",), role="user")) == [uid(2)]
    window = MemoryFilter(
        created_after=T0 + timedelta(minutes=2), created_before=records[4].created_at
    )
    assert await ids(window) == [uid(4), uid(2)]

    first = await port.list_page(ACME, MemoryFilter(), page_size=2)
    assert [r.id for r in first.records] == [uid(6), uid(5)]
    assert first.next_token
    second = await port.list_page(ACME, MemoryFilter(), page_size=2, page_token=first.next_token)
    assert [r.id for r in second.records] == [uid(4), uid(2)]
    last = await port.list_page(ACME, MemoryFilter(), page_size=2, page_token=second.next_token)
    assert ([r.id for r in last.records], last.next_token) == ([uid(1)], "")


async def test_count_by_kind_and_scopes(port: MemoryPort) -> None:
    await port.upsert(
        ACME,
        [
            fact(1, "One."),
            fact(2, "Two."),
            fact(3, "Three.", conversation_id="c2"),
            fact(4, "Said.", kind="turn", role="user"),
            fact(5, "Theirs.", user_id="u2"),
            fact(6, "Old.", superseded_by=uid(1)),
        ],
    )
    counts = await port.count(ACME, MemoryFilter(user_id="u1", kinds=("fact", "episode")))
    assert (counts.total, counts.by_kind) == (3, {"fact": 3, "episode": 0})
    everything = await port.count(ACME, MemoryFilter())
    assert everything.total == 5
    assert set(everything.by_kind) == {"turn", "fact", "profile", "summary", "episode"}

    users = await port.list_scopes(ACME)
    assert [(s.user_id, s.memories) for s in users.scopes] == [("u1", 4), ("u2", 1)]
    assert not users.truncated
    conversations = await port.list_scopes(ACME, user_id="u1", limit=1)
    assert [(s.user_id, s.conversation_id, s.memories) for s in conversations.scopes] == [
        ("u1", "c1", 3)
    ]
    assert conversations.truncated


async def test_search_outcomes_scopes_and_attachments(port: MemoryPort) -> None:
    query = SearchQuery(tenant=ACME, text="Where does the user live?", user_id="u1")
    empty = await port.search(SearchQuery(tenant=ACME, text="anything", user_id="nobody"))
    assert (empty.outcome, empty.hits) == ("empty", [])

    summary = fact(
        10,
        "The user talked about moving.",
        id=summary_memory_id(ACME, "u1", "default"),
        kind="summary",
        conversation_id="default",
    )
    profile = fact(
        11,
        "",
        kind="profile",
        conversation_id="default",
        profile=ProposedProfileFact(
            category="identity", key="city", value="Lisbon", confidence=0.9
        ),
    )
    await port.upsert(
        ACME,
        [
            fact(1, "The user lives in Lisbon.", conversation_id="default"),
            fact(2, "The user moved from Porto.", conversation_id="other"),
            fact(3, "Everyone in the team uses Rust.", user_id="", conversation_id="global"),
            fact(4, "Another user lives in Berlin.", user_id="u2", conversation_id="default"),
            fact(5, "The user lived in Madrid.", conversation_id="default", superseded_by=uid(1)),
            summary,
            profile,
        ],
    )
    small = await port.search(query)
    assert small.outcome == "small_store"
    by_id = {h.memory.id: h.scope for h in small.hits}
    assert by_id == {uid(1): "conversation", uid(2): "user", uid(3): "global"}
    assert small.summary is not None and small.summary.id == summary.id
    assert [p.id for p in small.profile] == [profile.id]

    bare = await port.search(SearchQuery(tenant=ACME, text="live", user_id="u1", attachments=False))
    assert (bare.summary, bare.profile) == (None, [])

    for bad in (
        SearchQuery(tenant=ACME, text="x", kinds=("summary",)),
        SearchQuery(tenant=ACME, text="x", top_k=0),
        SearchQuery(tenant=ACME, text="   "),
    ):
        with pytest.raises(RetrievalError) as refused:
            await port.search(bad)
        assert refused.value.http_status == 400


async def test_a_larger_store_is_ranked_and_the_matching_memory_comes_first(
    port: MemoryPort,
) -> None:
    texts = [
        "The user's dog is called Biscuit.",
        "The user has a severe peanut allergy.",
        "The user's sister Anna was born on March 3rd.",
        "The user mostly writes Rust.",
        "The user drives a blue Toyota Corolla.",
        "The user loves hiking in the mountains.",
        "The user plays the cello on Sundays.",
    ]
    await port.upsert(ACME, [fact(n, text) for n, text in enumerate(texts, 1)])
    result = await port.search(
        SearchQuery(
            tenant=ACME,
            text="What colour is the Toyota Corolla?",
            user_id="u1",
            conversation_id="c1",
            top_k=3,
        )
    )
    assert result.outcome == "ranked"
    assert result.candidates_considered == len(texts)
    assert 1 <= len(result.hits) <= 3
    assert result.hits[0].memory.text == "The user drives a blue Toyota Corolla."
