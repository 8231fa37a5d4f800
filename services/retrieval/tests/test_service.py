"""The MemoryService through a real in-process grpc.aio server and RetrievalClient."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import AsyncIterator, Awaitable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import grpc
import pytest
import structlog
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from engram_core import rpc_tracing
from engram_core.codec import pb, to_timestamp
from engram_core.lifecycle import summary_memory_id
from engram_core.memory import SearchQuery
from engram_core.metrics import setup_metrics
from engram_core.retrieval_client import RetrievalClient
from engram_retrieval.embedder import Embedder
from engram_retrieval.ranking import sigmoid
from engram_retrieval.server import RunningServer, build_server, warn_of_other_models
from engram_retrieval.settings import RetrievalSettings
from engram_retrieval.store import MemoryStore, StoreError
from engram_testing.metrics import metric

if TYPE_CHECKING:  # the fixture's type; conftest is not importable at run time
    from .conftest import TinyReranker

FIXED_NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
FACTS = [
    "My dog is called Biscuit.",
    "I moved to Lisbon last year.",
    "I have a severe peanut allergy.",
    "My sister Anna was born on March 3rd.",
    "I mostly write Rust and prefer it over Go.",
    "The user drives a blue Toyota Corolla.",
    "I love hiking in the mountains on weekends.",
]


@pytest.fixture
def settings(tmp_path: Path) -> RetrievalSettings:
    return RetrievalSettings(data_dir=tmp_path / "data", retrieval_listen="127.0.0.1:0")


@pytest.fixture
async def server(
    settings: RetrievalSettings, embedder: Embedder, tracer_provider: TracerProvider
) -> AsyncIterator[RunningServer]:
    running = await build_server(
        settings,
        embedder=embedder,
        tracer=tracer_provider.get_tracer("test"),
        clock=lambda: FIXED_NOW,
    )
    try:
        yield running
    finally:
        await running.stop(grace_s=0)


def fact(
    text: str,
    *,
    days_ago: float = 1.0,
    conversation: str = "c1",
    user: str = "u1",
    **fields: Any,
) -> pb.Memory:
    fields.setdefault("created_at", to_timestamp(FIXED_NOW - timedelta(days=days_ago)))
    return pb.Memory(
        kind=pb.MEMORY_KIND_FACT, text=text, user_id=user, conversation_id=conversation, **fields
    )


async def store_facts(client: RetrievalClient, tenant: str = "acme") -> list[str]:
    reply = await client.upsert(
        pb.UpsertRequest(
            tenant=tenant, memories=[fact(t, days_ago=i + 1) for i, t in enumerate(FACTS)]
        )
    )
    return [r.id for r in reply.results]


async def search_everything(client: RetrievalClient, query: str) -> pb.SearchResponse:
    """u1's search in acme's conversation c1, every candidate passing the threshold."""
    return await client.search(
        pb.SearchRequest(
            tenant="acme", query=query, user_id="u1", conversation_id="c1", score_threshold=0.0
        )
    )


def span_attributes(exporter: InMemorySpanExporter) -> dict[str, Mapping[str, Any]]:
    """The attributes of each finished span, by span name."""
    return {s.name: s.attributes or {} for s in exporter.get_finished_spans()}


async def expect_invalid(call: Awaitable[object], match: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as exc:
        await call
    assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert match in (exc.value.details() or "")


async def test_health_is_serving(client: RetrievalClient) -> None:
    assert await client.is_serving()


async def test_upsert_then_search_with_score_breakdown(client: RetrievalClient) -> None:
    created = FIXED_NOW - timedelta(days=3, microseconds=5)
    reply = await client.upsert(
        pb.UpsertRequest(
            tenant="acme",
            memories=[
                fact(
                    "My dog is called Biscuit.", source_id="dia:7", created_at=to_timestamp(created)
                ),
                *(fact(t) for t in FACTS[1:]),
            ],
        )
    )
    assert [r.status for r in reply.results] == [pb.UPSERT_STATUS_CREATED] * len(FACTS)
    result = await client.search(
        pb.SearchRequest(
            tenant="acme", query="What is my dog's name?", user_id="u1", conversation_id="c1"
        )
    )
    assert result.outcome == pb.SEARCH_OUTCOME_RANKED
    assert result.candidates_considered == len(FACTS)
    top = result.hits[0]
    assert top.memory.text == "My dog is called Biscuit."
    assert top.memory.id == reply.results[0].id
    assert top.memory.source_id == "dia:7"
    assert top.memory.created_at.ToDatetime(tzinfo=UTC) == created
    assert top.memory.embedding_model == "all-MiniLM-L6-v2-onnx-int8+dynamic-int8"
    assert top.scope == pb.SCOPE_CONVERSATION
    s = top.scores
    assert 0.4 < s.dense < 1 and s.relevance > 0.35
    assert s.HasField("sparse") and s.sparse > 0  # "dog" matched lexically too
    assert s.recency == pytest.approx(2.718281828 ** (-3 / 30), rel=1e-4)
    # total = 0.98·order + 0.02·recency; the order is the linear fusion's relevance
    # (docs/retrieval.md), which gives this best memory of all a higher one
    assert 0.98 * s.relevance + 0.02 * s.recency < s.total <= 1.0
    assert s.mmr == pytest.approx(0.9 * s.total, rel=1e-5)  # the first pick: λ·total
    assert all(h.scores.relevance >= 0.35 for h in result.hits)
    assert result.timings.total_ms >= result.timings.embed_ms > 0


async def test_repeated_upsert_is_unchanged_and_no_duplicate(client: RetrievalClient) -> None:
    memories = [fact(t) for t in FACTS[:3]] + [
        pb.Memory(kind=pb.MEMORY_KIND_TURN, role="user", text="hello", source_id="t-1")
    ]
    first = await client.upsert(pb.UpsertRequest(tenant="acme", memories=memories))
    again = await client.upsert(pb.UpsertRequest(tenant="acme", memories=memories))
    assert [r.id for r in again.results] == [r.id for r in first.results]
    assert {r.status for r in again.results} == {pb.UPSERT_STATUS_UNCHANGED}
    assert (await client.count(pb.CountRequest(tenant="acme"))).count == 4
    # the same source_id with new text updates the same point, keeping created_at
    before = await client.get(pb.GetRequest(tenant="acme", ids=[first.results[3].id]))
    edited = pb.Memory(kind=pb.MEMORY_KIND_TURN, role="user", text="hello there", source_id="t-1")
    reply = await client.upsert(pb.UpsertRequest(tenant="acme", memories=[edited]))
    assert reply.results[0].status == pb.UPSERT_STATUS_UPDATED
    assert reply.results[0].id == first.results[3].id
    after = await client.get(pb.GetRequest(tenant="acme", ids=[reply.results[0].id]))
    assert after.memories[0].text == "hello there"
    assert after.memories[0].created_at == before.memories[0].created_at
    assert (await client.count(pb.CountRequest(tenant="acme"))).count == 4


async def test_a_rewritten_memory_is_ranked_by_what_it_now_says(client: RetrievalClient) -> None:
    """Retrieval remembers what each searched memory's payload says (its text, kind,
    turn) between searches; a memory written again is read afresh. Here the second fact
    is rewritten to repeat the first, so the two are now one statement, recalled once."""
    stored = await client.upsert(
        pb.UpsertRequest(
            tenant="acme",
            memories=[
                fact("My sister lives in Lisbon.", days_ago=2),
                fact("My brother lives in Porto.", days_ago=1),
            ],
        )
    )
    sister, brother = (r.id for r in stored.results)

    async def recalled() -> list[str]:
        reply = await search_everything(client, "Where does my family live?")
        return [hit.memory.id for hit in reply.hits]

    assert sorted(await recalled()) == sorted([sister, brother])
    rewritten = fact("My sister lives in Lisbon.", days_ago=1, id=brother)
    reply = await client.upsert(pb.UpsertRequest(tenant="acme", memories=[rewritten]))
    assert reply.results[0].status == pb.UPSERT_STATUS_UPDATED
    assert len(await recalled()) == 1  # identical statements of one owner: merged


async def test_a_rewritten_memory_is_returned_as_it_now_reads(client: RetrievalClient) -> None:
    """The reply's message of a searched memory is encoded once and reused while the
    memory is unchanged; once it is written again, the next search returns what it now
    says, not the message encoded before."""
    stored = await client.upsert(
        pb.UpsertRequest(tenant="acme", memories=[fact("My sister lives in Lisbon.", days_ago=2)])
    )
    (sister,) = (r.id for r in stored.results)

    async def hit_texts() -> dict[str, str]:
        reply = await search_everything(client, "Where does my sister live?")
        return {hit.memory.id: hit.memory.text for hit in reply.hits}

    assert await hit_texts() == {sister: "My sister lives in Lisbon."}
    assert await hit_texts() == {sister: "My sister lives in Lisbon."}  # served again
    moved = fact("My sister lives in Madrid.", days_ago=1, id=sister)
    await client.upsert(pb.UpsertRequest(tenant="acme", memories=[moved]))
    assert await hit_texts() == {sister: "My sister lives in Madrid."}


async def test_tenant_isolation(client: RetrievalClient) -> None:
    ids = await store_facts(client, "acme")
    get = await client.get(pb.GetRequest(tenant="evil", ids=ids[:2]))
    assert list(get.memories) == [] and list(get.missing_ids) == ids[:2]
    search = await client.search(
        pb.SearchRequest(tenant="evil", query="dog", user_id="u1", conversation_id="c1")
    )
    assert search.outcome == pb.SEARCH_OUTCOME_EMPTY and not search.hits
    listed = await client.list(pb.ListRequest(tenant="evil"))
    assert list(listed.memories) == []
    assert (await client.count(pb.CountRequest(tenant="evil"))).count == 0
    deleted = await client.delete(pb.DeleteRequest(tenant="evil", ids=ids[:1]))
    assert list(deleted.deleted_ids) == [] and list(deleted.missing_ids) == ids[:1]
    with pytest.raises(grpc.aio.AioRpcError) as exc:  # nor overwrite it by id
        await client.upsert(
            pb.UpsertRequest(
                tenant="evil", memories=[pb.Memory(id=ids[0], kind=pb.MEMORY_KIND_FACT, text="x")]
            )
        )
    assert exc.value.code() == grpc.StatusCode.ALREADY_EXISTS
    still = await client.get(pb.GetRequest(tenant="acme", ids=ids[:1]))
    assert still.memories[0].text == FACTS[0]
    mine = await client.delete(pb.DeleteRequest(tenant="acme", ids=[ids[0], "not-a-uuid"]))
    assert list(mine.deleted_ids) == ids[:1] and list(mine.missing_ids) == ["not-a-uuid"]


async def test_now_shifts_recency(client: RetrievalClient) -> None:
    await store_facts(client)
    request = pb.SearchRequest(
        tenant="acme", user_id="u1", query="What is my dog's name?", conversation_id="c1"
    )
    today = await client.search(request)
    request.now.CopyFrom(to_timestamp(FIXED_NOW + timedelta(days=29)))
    later = await client.search(request)
    hit_now, hit_later = today.hits[0], later.hits[0]
    assert hit_now.memory.id == hit_later.memory.id
    assert hit_now.scores.recency == pytest.approx(2.718281828 ** (-1 / 30), rel=1e-4)
    assert hit_later.scores.recency == pytest.approx(2.718281828 ** (-1), rel=1e-4)
    assert hit_later.scores.total < hit_now.scores.total


async def test_outcomes_small_store_nothing_relevant_empty(client: RetrievalClient) -> None:
    empty = await client.search(pb.SearchRequest(tenant="acme", user_id="u1", query="anything"))
    assert empty.outcome == pb.SEARCH_OUTCOME_EMPTY
    await client.upsert(
        pb.UpsertRequest(
            tenant="acme",
            memories=[
                fact("I have a severe peanut allergy.", days_ago=2),
                fact("I like jazz.", days_ago=1),
            ],
        )
    )
    small = await client.search(
        pb.SearchRequest(
            tenant="acme", user_id="u1", query="quantum chromodynamics", conversation_id="c1"
        )
    )
    assert small.outcome == pb.SEARCH_OUTCOME_SMALL_STORE
    assert [h.memory.text for h in small.hits] == [
        "I like jazz.",
        "I have a severe peanut allergy.",
    ]
    await store_facts(client)
    nothing = await client.search(
        pb.SearchRequest(
            tenant="acme",
            user_id="u1",
            query="quantum chromodynamics lattice gauge theory",
            conversation_id="c1",
        )
    )
    assert nothing.outcome == pb.SEARCH_OUTCOME_NOTHING_RELEVANT
    # The allergy is stored twice (two dates) in one conversation: one candidate.
    assert not nothing.hits and nothing.candidates_considered == len(FACTS) + 1


async def test_scopes_summary_and_profile(client: RetrievalClient) -> None:
    await client.upsert(
        pb.UpsertRequest(
            tenant="acme",
            memories=[
                *(fact(t) for t in FACTS),
                fact("My dog Biscuit is a beagle.", conversation="c2"),
                fact("Dogs are welcome in the office.", conversation="global", user=""),
                fact("Another user's dog is named Rex.", conversation="c9", user="u2"),
                # A summary under another id (written before summaries were per user):
                # not attached.
                pb.Memory(
                    kind=pb.MEMORY_KIND_SUMMARY,
                    user_id="u1",
                    conversation_id="c1",
                    text="We talked about pets.",
                    created_at=to_timestamp(FIXED_NOW - timedelta(days=2)),
                ),
                pb.Memory(
                    id=summary_memory_id("acme", "u1", "c1"),
                    kind=pb.MEMORY_KIND_SUMMARY,
                    user_id="u1",
                    conversation_id="c1",
                    text="Pets and travel.",
                    created_at=to_timestamp(FIXED_NOW - timedelta(days=1)),
                ),
                # Another user's conversation of the same name: never attached for u1.
                pb.Memory(
                    id=summary_memory_id("acme", "u2", "c1"),
                    kind=pb.MEMORY_KIND_SUMMARY,
                    user_id="u2",
                    conversation_id="c1",
                    text="Rex and the locker code.",
                    created_at=to_timestamp(FIXED_NOW),
                ),
                fact("My dog Rex knows my locker code.", conversation="c1", user="u2"),
                pb.Memory(
                    kind=pb.MEMORY_KIND_PROFILE,
                    user_id="u1",
                    profile=pb.ProfileEntry(
                        category="identity", key="name", value="Sam", confidence=0.9
                    ),
                ),
                pb.Memory(
                    kind=pb.MEMORY_KIND_PROFILE,
                    user_id="u1",
                    profile=pb.ProfileEntry(
                        category="identity", key="name", value="Samuel", confidence=0.5
                    ),
                ),
                pb.Memory(
                    kind=pb.MEMORY_KIND_PROFILE,
                    user_id="u2",
                    profile=pb.ProfileEntry(
                        category="identity", key="name", value="Kim", confidence=0.9
                    ),
                ),
            ],
        )
    )
    ask = pb.SearchRequest(
        tenant="acme",
        query="Tell me about my dog",
        user_id="u1",
        conversation_id="c1",
        top_k=10,
        score_threshold=0.3,
    )
    result = await client.search(ask)
    scopes = {h.memory.text: h.scope for h in result.hits}
    assert scopes["My dog is called Biscuit."] == pb.SCOPE_CONVERSATION
    assert scopes["My dog Biscuit is a beagle."] == pb.SCOPE_USER
    assert scopes["Dogs are welcome in the office."] == pb.SCOPE_GLOBAL
    assert "Another user's dog is named Rex." not in scopes
    assert "My dog Rex knows my locker code." not in scopes  # u2's own "c1"
    assert all(h.memory.kind == pb.MEMORY_KIND_FACT for h in result.hits)
    assert result.summary.text == "Pets and travel."
    assert [(p.profile.key, p.profile.value) for p in result.profile] == [("name", "Sam")]
    # a caller that only ranks (reconcile's duplicate check) gets the same hits, bare
    ask.hits_only = True
    bare = await client.search(ask)
    assert [h.memory.id for h in bare.hits] == [h.memory.id for h in result.hits]
    assert not bare.HasField("summary") and list(bare.profile) == []
    only_conv = await client.search(
        pb.SearchRequest(
            tenant="acme",
            query="Tell me about my dog",
            user_id="u1",
            conversation_id="c1",
            scopes=[pb.SCOPE_CONVERSATION],
            score_threshold=0.3,
        )
    )
    assert {h.scope for h in only_conv.hits} == {pb.SCOPE_CONVERSATION}


async def test_superseded_leave_default_search_and_list(client: RetrievalClient) -> None:
    ids = await store_facts(client)
    old = (await client.get(pb.GetRequest(tenant="acme", ids=[ids[0]]))).memories[0]
    new = await client.upsert(
        pb.UpsertRequest(tenant="acme", memories=[fact("My dog is called Pretzel now.")])
    )
    old.superseded_by = new.results[0].id
    reply = await client.upsert(pb.UpsertRequest(tenant="acme", memories=[old]))
    assert reply.results[0].status == pb.UPSERT_STATUS_UPDATED
    request = pb.SearchRequest(
        tenant="acme", user_id="u1", query="What is my dog's name?", conversation_id="c1", top_k=10
    )
    texts = [h.memory.text for h in (await client.search(request)).hits]
    assert "My dog is called Pretzel now." in texts and FACTS[0] not in texts
    request.include_superseded = True
    assert FACTS[0] in [h.memory.text for h in (await client.search(request)).hits]
    listed = await client.list(pb.ListRequest(tenant="acme", page_size=100))
    assert ids[0] not in [m.id for m in listed.memories]
    listed = await client.list(
        pb.ListRequest(
            tenant="acme", filter=pb.MemoryFilter(include_superseded=True), page_size=100
        )
    )
    assert ids[0] in [m.id for m in listed.memories]


async def test_list_pages_and_count(client: RetrievalClient) -> None:
    ids = await store_facts(client)
    await client.upsert(
        pb.UpsertRequest(
            tenant="acme",
            memories=[
                pb.Memory(kind=pb.MEMORY_KIND_TURN, role="user", text="hi", conversation_id="c1")
            ],
        )
    )
    seen: list[str] = []
    token = ""
    while True:
        page = await client.list(
            pb.ListRequest(
                tenant="acme",
                page_size=3,
                page_token=token,
                filter=pb.MemoryFilter(kinds=[pb.MEMORY_KIND_FACT]),
            )
        )
        seen += [m.id for m in page.memories]
        token = page.next_page_token
        if not token:
            break
    assert seen == ids  # FACTS[i] is i+1 days old: newest first is request order
    count = await client.count(pb.CountRequest(tenant="acme"))
    assert count.count == len(FACTS) + 1
    assert count.by_kind["fact"] == len(FACTS) and count.by_kind["turn"] == 1
    only_turns = await client.count(
        pb.CountRequest(
            tenant="acme", filter=pb.MemoryFilter(kinds=[pb.MEMORY_KIND_TURN], role="user")
        )
    )
    assert only_turns.count == 1 and dict(only_turns.by_kind) == {"turn": 1}


async def test_list_within_created_bounds(client: RetrievalClient) -> None:
    ids = await store_facts(client)  # FACTS[i] is i+1 days old
    window = pb.MemoryFilter(
        created_after=to_timestamp(FIXED_NOW - timedelta(days=4)),
        created_before=to_timestamp(FIXED_NOW - timedelta(days=1)),
    )
    listed = await client.list(pb.ListRequest(tenant="acme", filter=window, page_size=50))
    assert [m.id for m in listed.memories] == ids[1:4]
    counted = await client.count(pb.CountRequest(tenant="acme", filter=window))
    assert counted.count == 3
    other = await client.list(pb.ListRequest(tenant="other", filter=window, page_size=50))
    assert list(other.memories) == []


async def test_list_scopes_users_then_conversations(client: RetrievalClient) -> None:
    await client.upsert(
        pb.UpsertRequest(
            tenant="acme",
            memories=[
                fact("Alice likes tea.", user="alice", conversation="home"),
                fact("Alice likes jazz.", user="alice", conversation="home"),
                fact("Alice works at a bakery.", user="alice", conversation="work"),
                fact("Bob plays chess.", user="bob", conversation="home"),
                fact("The office closes at six.", user="", conversation="global"),
            ],
        )
    )
    await client.upsert(pb.UpsertRequest(tenant="other", memories=[fact("Eve sails.", user="eve")]))
    users = await client.list_scopes(pb.ListScopesRequest(tenant="acme"))
    # most memories first; "" holds the tenant-wide ones
    assert sorted((s.user_id, s.conversation_id, s.memories) for s in users.scopes) == [
        ("", "", 1),
        ("alice", "", 3),
        ("bob", "", 1),
    ]
    assert users.scopes[0].user_id == "alice" and not users.truncated
    alice = await client.list_scopes(pb.ListScopesRequest(tenant="acme", user_id="alice"))
    assert [(s.user_id, s.conversation_id, s.memories) for s in alice.scopes] == [
        ("alice", "home", 2),
        ("alice", "work", 1),
    ]
    nobody = await client.list_scopes(pb.ListScopesRequest(tenant="acme", user_id=""))
    assert [(s.conversation_id, s.memories) for s in nobody.scopes] == [("global", 1)]
    first = await client.list_scopes(pb.ListScopesRequest(tenant="acme", limit=1))
    assert [s.user_id for s in first.scopes] == ["alice"] and first.truncated
    await expect_invalid(client.list_scopes(pb.ListScopesRequest()), "tenant")
    await expect_invalid(
        client.list_scopes(pb.ListScopesRequest(tenant="acme", limit=1001)), "limit"
    )


async def test_invalid_requests(client: RetrievalClient) -> None:
    await expect_invalid(client.search(pb.SearchRequest(query="x")), "tenant is required")
    await expect_invalid(
        client.search(pb.SearchRequest(tenant="a", query="x", top_k=0)),
        "top_k must be within [1, 100]",
    )
    await expect_invalid(client.search(pb.SearchRequest(tenant="a", query="x", top_k=101)), "top_k")
    await expect_invalid(
        client.search(pb.SearchRequest(tenant="a", query="x", recency_weight=1.5)), "recency_weight"
    )
    await expect_invalid(
        client.search(pb.SearchRequest(tenant="a", query="x", mmr_lambda=-0.1)), "mmr_lambda"
    )
    await expect_invalid(
        client.search(pb.SearchRequest(tenant="a", query="x", score_threshold=2)), "score_threshold"
    )
    await expect_invalid(
        client.search(pb.SearchRequest(tenant="a", query="x", kinds=[cast(pb.MemoryKind, 42)])),
        "unknown memory kind 42",
    )
    await expect_invalid(client.search(pb.SearchRequest(tenant="a", query="  ")), "query")
    await expect_invalid(client.upsert(pb.UpsertRequest(memories=[fact("x")])), "tenant")
    await expect_invalid(
        client.upsert(pb.UpsertRequest(tenant="a", memories=[pb.Memory(text="x")])),
        "memories[0].kind",
    )
    await expect_invalid(
        client.upsert(
            pb.UpsertRequest(
                tenant="a", memories=[pb.Memory(kind=pb.MEMORY_KIND_FACT, text="x", tenant="b")]
            )
        ),
        "tenant differs",
    )
    await expect_invalid(
        client.upsert(
            pb.UpsertRequest(
                tenant="a", memories=[pb.Memory(kind=pb.MEMORY_KIND_FACT, text="x", id="nope")]
            )
        ),
        "not a UUID",
    )
    await expect_invalid(
        client.upsert(pb.UpsertRequest(tenant="a", memories=[pb.Memory(kind=pb.MEMORY_KIND_FACT)])),
        "text is empty",
    )
    await expect_invalid(client.get(pb.GetRequest(ids=["x"])), "tenant")
    await expect_invalid(client.delete(pb.DeleteRequest(ids=["x"])), "tenant")
    await expect_invalid(
        client.list(pb.ListRequest(tenant="a", page_token="garbage")), "page_token"
    )
    await expect_invalid(client.list(pb.ListRequest(tenant="a", page_size=-1)), "page_size")
    await expect_invalid(
        client.count(
            pb.CountRequest(tenant="a", filter=pb.MemoryFilter(kinds=[cast(pb.MemoryKind, 9)]))
        ),
        "unknown memory kind",
    )


async def test_a_memory_no_client_could_read_back_is_refused_whole(
    client: RetrievalClient,
) -> None:
    """A profile score outside 0..1 used to be stored, and every reader of the memory
    (gateway, workers: MemoryRecord) then failed on it. The batch is refused, naming the
    field, and nothing of it is written."""
    bad = pb.Memory(
        kind=pb.MEMORY_KIND_PROFILE,
        user_id="u1",
        profile=pb.ProfileEntry(category="identity", key="name", value="Bob", confidence=1.5),
    )
    await expect_invalid(
        client.upsert(pb.UpsertRequest(tenant="refused", memories=[fact("kept?"), bad])),
        "memories[1].confidence",
    )
    reply = await client.count(pb.CountRequest(tenant="refused"))
    assert reply.count == 0


async def test_a_call_is_a_client_span_continued_by_a_server_span(
    client: RetrievalClient,
    span_exporter: InMemorySpanExporter,
    tracer_provider: TracerProvider,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rpc_tracing, "_tracer", tracer_provider.get_tracer("engram.rpc"))
    await store_facts(client)
    span_exporter.clear()
    await client.search(pb.SearchRequest(tenant="acme", user_id="u1", query="my dog"))
    await expect_invalid(client.count(pb.CountRequest(tenant="")), "tenant")

    def rpc(name: str, kind: SpanKind) -> list[ReadableSpan]:
        return [
            s
            for s in span_exporter.get_finished_spans()
            if s.name == f"/engram.memory.v1.MemoryService/{name}" and s.kind == kind
        ]

    (client_search,) = rpc("Search", SpanKind.CLIENT)
    (served_search,) = rpc("Search", SpanKind.SERVER)
    assert served_search.parent is not None and client_search.context is not None
    assert served_search.parent.span_id == client_search.context.span_id  # one trace
    for span in (client_search, served_search):
        assert span.attributes is not None
        assert span.attributes["rpc.system"] == "grpc"
        assert span.attributes["rpc.method"] == "Search"
        assert span.attributes["rpc.grpc.status_code"] == 0
        assert span.status.status_code is not StatusCode.ERROR
    (embed,) = [s for s in span_exporter.get_finished_spans() if s.name == "embed"]
    assert embed.parent is not None and embed.parent.span_id == served_search.context.span_id

    for span in rpc("Count", SpanKind.CLIENT) + rpc("Count", SpanKind.SERVER):
        assert span.attributes is not None
        assert span.attributes["rpc.grpc.status_code"] == 3  # INVALID_ARGUMENT
        assert span.status.status_code is StatusCode.ERROR
        assert "INVALID_ARGUMENT" in (span.status.description or "")
    assert len(rpc("Count", SpanKind.SERVER)) == 1


async def test_search_spans(client: RetrievalClient, span_exporter: InMemorySpanExporter) -> None:
    await store_facts(client)
    span_exporter.clear()
    await client.search(
        pb.SearchRequest(tenant="acme", user_id="u1", query="my dog", conversation_id="c1")
    )
    spans = span_attributes(span_exporter)
    assert {"embed", "candidates", "rerank", "mmr"} <= set(spans)
    assert spans["candidates"]["engram.candidates"] == len(FACTS)
    assert spans["rerank"]["engram.scorer"] == "calibrated-similarity"
    assert spans["mmr"]["engram.outcome"] == "ranked"
    assert spans["embed"]["engram.tenant"] == "acme"
    assert spans["candidates"]["engram.lexical"] is True


def stage_durations(stage: str) -> tuple[float, float]:
    """(count, sum in s) of ``engram.search.stage.duration`` for ``stage`` in this process."""
    name = "engram_search_stage_duration_seconds"
    return metric(f"{name}_count", engram_search_stage=stage), metric(
        f"{name}_sum", engram_search_stage=stage
    )


async def test_the_service_records_the_stage_durations_of_a_search_it_served(
    client: RetrievalClient,
) -> None:
    """Once per Search, with the durations its reply reports (the caller records none:
    tests/unit/test_genai_metrics.py)."""
    setup_metrics(Resource.create({"service.name": "engram-test"}))
    await store_facts(client)
    count, total = stage_durations("total")
    embed_count, _ = stage_durations("embed")
    reply = await search_everything(client, "my dog")
    await asyncio.sleep(0)  # recorded once the reply is sent; in one process, by now
    after_count, after_total = stage_durations("total")
    assert after_count == count + 1
    assert after_total - total == pytest.approx(reply.timings.total_ms / 1e3)
    assert stage_durations("embed")[0] == embed_count + 1


async def store_facts_and_stop(server: RunningServer) -> list[str]:
    client = RetrievalClient(server.address)
    try:
        return await store_facts(client)
    finally:
        await client.close()
        await server.stop(grace_s=0)


async def test_data_persists_across_restart(
    server: RunningServer, settings: RetrievalSettings, embedder: Embedder
) -> None:
    ids = await store_facts_and_stop(server)
    restarted = await build_server(settings, embedder=embedder)
    client = RetrievalClient(restarted.address)
    try:
        got = await client.get(pb.GetRequest(tenant="acme", ids=ids))
        assert [m.text for m in got.memories] == FACTS
        result = await client.search(
            pb.SearchRequest(
                tenant="acme",
                user_id="u1",
                query="Where do I live?",
                conversation_id="c1",
                now=to_timestamp(datetime(2025, 6, 1, tzinfo=UTC)),
            )
        )
        assert result.hits[0].memory.text == "I moved to Lisbon last year."
    finally:
        await client.close()
        await restarted.stop(grace_s=0)


async def test_a_restart_on_another_model_warns_until_the_memories_are_reembedded(
    settings: RetrievalSettings, embedder: Embedder
) -> None:
    packaged = Embedder.default(threads=1, quantization="none")
    assert packaged.model_id != embedder.model_id
    ids = await store_facts_and_stop(await build_server(settings, embedder=packaged))

    with structlog.testing.capture_logs() as logs:
        restarted = await build_server(settings, embedder=embedder)
    client = RetrievalClient(restarted.address)
    try:
        assert restarted.other_model_memories == len(FACTS)
        (warning,) = [e for e in logs if e["event"] == "store.other_embedding_models"]
        assert warning["log_level"] == "warning" and warning["memories"] == len(FACTS)
        assert "engram reembed" in warning["detail"]
        # what `engram reembed` does: read each memory and write it back unchanged
        stored = await client.get(pb.GetRequest(tenant="acme", ids=ids))
        reply = await client.upsert(pb.UpsertRequest(tenant="acme", memories=stored.memories))
        assert {r.status for r in reply.results} == {pb.UPSERT_STATUS_UPDATED}
    finally:
        await client.close()
        await restarted.stop(grace_s=0)

    with structlog.testing.capture_logs() as logs:
        again = await build_server(settings, embedder=embedder)
        await again.stop(grace_s=0)
    assert again.other_model_memories == 0
    assert not [e for e in logs if e["event"] == "store.other_embedding_models"]


async def test_a_failing_model_check_is_logged_and_start_up_goes_on() -> None:
    class Unreadable:
        async def count_embedded_by_others(self, model_id: str) -> int:
            raise StoreError("shard is locked")

    with structlog.testing.capture_logs() as logs:
        assert await warn_of_other_models(cast(MemoryStore, Unreadable()), "m") == 0
    (failed,) = logs
    assert failed["event"] == "store.model_check_failed"
    assert failed["error"] == "StoreError: shard is locked"


async def test_cross_encoder_from_settings_without_lexical(
    tmp_path: Path, embedder: Embedder, tiny_reranker: TinyReranker
) -> None:
    settings = RetrievalSettings(
        data_dir=tmp_path / "rerank",
        retrieval_listen="127.0.0.1:0",
        reranker_path=tiny_reranker.path,
        search_candidates="dense",
    )
    running = await build_server(settings, embedder=embedder, clock=lambda: FIXED_NOW)
    client = RetrievalClient(running.address)
    try:
        texts = ["the cat sat", "dog", "the mat", "cat cat", "sat mat", "the dog sat"]
        await client.upsert(pb.UpsertRequest(tenant="acme", memories=[fact(t) for t in texts]))
        result = await client.search(
            pb.SearchRequest(
                tenant="acme",
                user_id="u1",
                query="cat",
                conversation_id="c1",
                top_k=6,
                score_threshold=0.5,
                mmr_lambda=1,
            )
        )
        assert result.outcome == pb.SEARCH_OUTCOME_RANKED
        expected = {t: float(sigmoid(tiny_reranker.logit(t))) for t in texts}
        passing = {t for t, r in expected.items() if r >= 0.5}
        assert {h.memory.text for h in result.hits} == passing and passing != set(texts)
        for hit in result.hits:
            assert hit.scores.relevance == pytest.approx(expected[hit.memory.text], rel=1e-5)
            assert not hit.scores.HasField("sparse")
        relevances = [h.scores.relevance for h in result.hits]  # λ = 1, equal recency
        assert relevances == sorted(relevances, reverse=True)
    finally:
        await client.close()
        await running.stop(grace_s=0)


@pytest.mark.parametrize("sources", ["dense", "lexical"])
async def test_search_candidate_sources_from_settings(
    tmp_path: Path,
    embedder: Embedder,
    tracer_provider: TracerProvider,
    span_exporter: InMemorySpanExporter,
    sources: str,
) -> None:
    settings = RetrievalSettings(
        data_dir=tmp_path / sources, retrieval_listen="127.0.0.1:0", search_candidates=sources
    )
    running = await build_server(
        settings,
        embedder=embedder,
        tracer=tracer_provider.get_tracer("test"),
        clock=lambda: FIXED_NOW,
    )
    client = RetrievalClient(running.address)
    try:
        await store_facts(client)
        span_exporter.clear()
        result = await client.search(
            pb.SearchRequest(
                tenant="acme",
                user_id="u1",
                query="Which car does the user drive? A Toyota?",
                conversation_id="c1",
                top_k=len(FACTS),
                score_threshold=0,
                recency_weight=0,
                mmr_lambda=1,
            )
        )
        texts = [h.memory.text for h in result.hits]
        assert texts[0] == "The user drives a blue Toyota Corolla."
        spans = span_attributes(span_exporter)
        assert spans["candidates"]["engram.candidate_sources"] == sources
        if sources == "dense":  # every memory is a dense neighbour; no BM25 scores
            assert len(texts) == len(FACTS)
            assert not any(h.scores.HasField("sparse") for h in result.hits)
            assert spans["rerank"]["engram.scorer"] == "calibrated-similarity"
        else:  # only BM25 matches, ranked by BM25 relative to the best
            assert len(texts) < len(FACTS)
            sparse = [h.scores.sparse for h in result.hits]
            assert all(s > 0 for s in sparse) and sparse == sorted(sparse, reverse=True)
            assert result.hits[0].scores.relevance == pytest.approx(1.0)
            for hit in result.hits:
                assert hit.scores.relevance == pytest.approx(hit.scores.sparse / sparse[0])
            assert spans["rerank"]["engram.scorer"] == "bm25-relative"
    finally:
        await client.close()
        await running.stop(grace_s=0)


async def test_a_full_disk_is_unavailable_so_callers_retry(
    server: RunningServer, client: RetrievalClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """UNAVAILABLE says "try again": the workers retry it until space is freed instead
    of dead-lettering the turn as they would an INTERNAL error after max_deliver."""

    async def no_space(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(server.store, "upsert", no_space)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client.upsert(pb.UpsertRequest(tenant="t1", memories=[fact("I like tea.")]))
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    assert caught.value.details() == "memory store: disk full"


async def test_what_do_you_know_about_me_is_answered_from_facts_and_summaries(
    client: RetrievalClient,
) -> None:
    await store_facts(client)
    await client.upsert(
        pb.UpsertRequest(
            tenant="acme",
            memories=[
                fact("My dog Biscuit is a beagle.", conversation="c2", days_ago=0.5),
                fact("Another user's secret.", conversation="c1", user="u2", days_ago=0.1),
                pb.Memory(
                    kind=pb.MEMORY_KIND_SUMMARY,
                    user_id="u1",
                    conversation_id="c2",
                    text="Talked about Biscuit.",
                ),
            ],
        )
    )
    for question in ("What do you know about me?", "what have we talked about so far"):
        result = await client.search(
            pb.SearchRequest(tenant="acme", user_id="u1", conversation_id="c1", query=question)
        )
        assert result.outcome == pb.SEARCH_OUTCOME_OVERVIEW
        texts = [h.memory.text for h in result.hits]
        # every current fact of u1, newest first, across conversations, then summaries
        assert texts[: len(FACTS) + 1] == ["My dog Biscuit is a beagle.", *FACTS]
        assert texts[-1] == "Talked about Biscuit."
        assert "Another user's secret." not in texts
    # a user with nothing learned yet falls back to ordinary search
    empty = await client.search(
        pb.SearchRequest(tenant="acme", user_id="u3", query="What do you know about me?")
    )
    assert empty.outcome == pb.SEARCH_OUTCOME_EMPTY


async def test_a_corrected_turn_ranks_below_the_fact_that_corrected_it(
    client: RetrievalClient,
) -> None:
    def turn(text: str, days_ago: float, **metadata: str) -> pb.Memory:
        return pb.Memory(
            kind=pb.MEMORY_KIND_TURN,
            role="user",
            text=text,
            user_id="u1",
            conversation_id="c1",
            created_at=to_timestamp(FIXED_NOW - timedelta(days=days_ago)),
            metadata=metadata,
        )

    turns = await client.upsert(
        pb.UpsertRequest(
            tenant="acme",
            memories=[
                turn("My wife's name is Anne.", 2, corrected_at="2025-05-31T12:00:00Z"),
                turn("Actually, my wife's name is Jane.", 1),
            ],
        )
    )
    jane_turn = turns.results[1].id
    await client.upsert(
        pb.UpsertRequest(
            tenant="acme",
            memories=[
                fact("User's wife's name is Jane", days_ago=1, source_turn_ids=[jane_turn]),
                *(fact(t, days_ago=3) for t in FACTS),
            ],
        )
    )
    result = await client.search(
        pb.SearchRequest(tenant="acme", user_id="u1", conversation_id="c1", query="wife's name")
    )
    texts = [h.memory.text for h in result.hits]
    assert texts.index("User's wife's name is Jane") < texts.index(
        "Actually, my wife's name is Jane."
    )
    if "My wife's name is Anne." in texts:
        assert texts.index("My wife's name is Anne.") > texts.index("User's wife's name is Jane")


async def test_upsert_reports_the_stored_timestamps(client: RetrievalClient) -> None:
    first = await client.upsert(pb.UpsertRequest(tenant="acme", memories=[fact("I like tea.")]))
    again = await client.upsert(pb.UpsertRequest(tenant="acme", memories=[fact("I like tea.")]))
    (created,), (unchanged,) = first.results, again.results
    assert unchanged.status == pb.UPSERT_STATUS_UNCHANGED
    assert created.updated_at == unchanged.updated_at  # a no-op keeps the stored state
    assert created.created_at == to_timestamp(FIXED_NOW - timedelta(days=1))
    assert created.updated_at == to_timestamp(FIXED_NOW)


async def test_a_summary_is_stored_without_a_model_run_and_still_attached(
    client: RetrievalClient, server: RunningServer
) -> None:
    """Summaries are attached by id, never searched by similarity: storing one costs no
    embedding (a long summary would cost several turns' worth), and search still
    returns it."""
    encoder = server.servicer.pipeline.encoder
    await client.upsert(pb.UpsertRequest(tenant="acme", memories=[fact(FACTS[0])]))
    runs, texts = encoder.stats.runs, encoder.stats.texts
    summary = pb.Memory(
        id=summary_memory_id("acme", "u1", "c1"),
        kind=pb.MEMORY_KIND_SUMMARY,
        text="The user has a dog called Biscuit. " * 50,
        user_id="u1",
        conversation_id="c1",
    )
    reply = await client.upsert(pb.UpsertRequest(tenant="acme", memories=[summary]))
    assert reply.results[0].status == pb.UPSERT_STATUS_CREATED
    assert (encoder.stats.runs, encoder.stats.texts) == (runs, texts)

    result = await client.search(
        pb.SearchRequest(tenant="acme", query="my dog", user_id="u1", conversation_id="c1")
    )
    assert result.summary.text == summary.text
    assert all(hit.memory.kind != pb.MEMORY_KIND_SUMMARY for hit in result.hits)


@pytest.mark.parametrize("inline", [True, False], ids=["inline", "in-a-thread"])
async def test_a_search_runs_through_without_giving_the_loop_away(
    server: RunningServer, client: RetrievalClient, inline: bool
) -> None:
    """With the query embedded on the loop and the embedded store's reads inline, a
    Search (its summary and profile too) never yields: no worker's call can run in
    between and delay the person waiting. Embedded in a thread, it yields while the
    model runs."""
    await client.upsert(
        pb.UpsertRequest(
            tenant="acme",
            memories=[
                *(fact(t) for t in FACTS),
                pb.Memory(
                    id=summary_memory_id("acme", "u1", "c1"),
                    kind=pb.MEMORY_KIND_SUMMARY,
                    user_id="u1",
                    conversation_id="c1",
                    text="Pets and travel.",
                ),
                pb.Memory(
                    kind=pb.MEMORY_KIND_PROFILE,
                    user_id="u1",
                    profile=pb.ProfileEntry(category="identity", key="name", value="Sam"),
                ),
            ],
        )
    )
    pipeline = server.servicer.pipeline
    pipeline.encoder.inline_searches = pipeline.runs_through = inline
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    await asyncio.sleep(0)
    try:
        for n in range(3):  # new texts: never answered from the vector cache
            before = ticks
            ranked = await pipeline.run(
                SearchQuery(
                    tenant="acme",
                    text=f"What is my dog called? ({n})",
                    user_id="u1",
                    conversation_id="c1",
                )
            )
            assert ranked.hits and ranked.summary is not None and ranked.profile
            assert (ticks == before) is inline
    finally:
        ticker.cancel()
