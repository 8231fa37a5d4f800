"""A memory kind is a row (engram_core.kinds): the table names every kind once, and each
reader that treats kinds differently — search defaults, ranking, lifecycle, the mirror,
recall, the memory API, the MCP tools, evict and summarize — follows the table rather than a list of
its own. Several tests swap rows of the table and check the reader follows the swap,
so a reader that still names kinds itself fails them."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast, get_args

import httpx2
import numpy as np
import pytest
from mcp import Client

from engram_client.mcp_tools import GatewayApi, build_mcp_server
from engram_core import kinds, lifecycle, mirror_format
from engram_core.api_models import SearchMemories
from engram_core.events import MemoryChanged
from engram_core.grpc_gen.engram.memory.v1 import memory_pb2
from engram_core.kinds import KINDS, KindPolicy, kind_names
from engram_core.memory import (
    KIND_NAMES,
    KindCounts,
    MemoryKindName,
    MemoryRecord,
    Scores,
    SearchHit,
    SearchQuery,
    SearchResult,
)
from engram_gateway import memory_api
from engram_gateway.recall import quoted, render_memory
from engram_retrieval.pipeline import DEFAULT_SEARCH_KINDS, RequestError, SearchPipeline
from engram_retrieval.ranking import Candidate, RankingParams, rank
from engram_workers import evict
from engram_workers.summarize import app as summarize_app

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
TENANT = "acme"


def record(kind: MemoryKindName, **fields: Any) -> MemoryRecord:
    values: dict[str, Any] = {
        "id": f"00000000-0000-4000-8000-{KIND_NAMES.index(kind):012d}",
        "kind": kind,
        "text": f"a {kind}",
        "role": "user",
        "user_id": "alice",
        "conversation_id": "c1",
        "created_at": NOW - timedelta(days=1),
        "turn_range": (1, 20),
        "source_turn_ids": ["t1"],
    }
    return MemoryRecord.model_validate(values | fields)


@pytest.fixture
def swap_rows(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Replace fields of rows, as the readers see the table at call time."""

    def swap(change: Callable[[KindPolicy], dict[str, Any]]) -> None:
        rows = {k.name: dataclasses.replace(k, **change(k)) for k in KINDS}
        monkeypatch.setattr(kinds, "_BY_NAME", rows)

    return swap


# --- the table itself --------------------------------------------------------------------


def test_the_table_the_literal_and_the_proto_enum_name_the_same_kinds() -> None:
    names = tuple(k.name for k in KINDS)
    assert len(set(names)) == len(names)
    assert names == KIND_NAMES == get_args(MemoryKindName)
    values = [v.name for v in memory_pb2.MemoryKind.DESCRIPTOR.values if v.number != 0]
    assert sorted(values) == sorted(f"MEMORY_KIND_{name.upper()}" for name in names)


def test_every_row_names_the_producer_that_writes_its_kind() -> None:
    for row in KINDS:
        source = inspect.getsource(importlib.import_module(row.producer))
        assert f'kind="{row.name}"' in source, row.name


def test_the_memory_api_creates_the_one_kind_the_table_says() -> None:
    (created,) = kind_names(lambda k: k.created_by_memory_api)
    assert created == memory_api.CREATED_KIND


def test_a_kind_never_searched_is_not_searched_by_default() -> None:
    for row in KINDS:
        assert row.embedded or not row.searched_by_default, row.name


# --- search and ranking ----------------------------------------------------------------


def pipeline() -> SearchPipeline:
    unused = cast(Any, None)
    store = cast(Any, SimpleNamespace(reads_inline=True, kept_search_points=0))
    return SearchPipeline(store, unused, unused, RankingParams())


def test_a_search_naming_no_kinds_searches_the_rows_searched_by_default() -> None:
    expected = kind_names(lambda k: k.searched_by_default)
    assert expected == DEFAULT_SEARCH_KINDS
    for scope in pipeline().scopes(SearchQuery(tenant=TENANT, text="q", user_id="alice")):
        assert scope.flt.kinds == expected


def test_the_search_api_documents_the_kinds_searched_by_default() -> None:
    described = SearchMemories.model_fields["kinds"].description
    expected = ", ".join(kind_names(lambda k: k.searched_by_default))
    assert described == f"Empty: {expected}."


def test_a_search_naming_a_kind_that_is_not_embedded_is_refused(
    swap_rows: Callable[..., None],
) -> None:
    for row in KINDS:
        query = SearchQuery(tenant=TENANT, text="q", kinds=(row.name,))
        if row.embedded:
            assert pipeline().scopes(query)
        else:
            with pytest.raises(RequestError, match=row.name):
                pipeline().scopes(query)
    swap_rows(lambda k: {"embedded": k.name != "fact"})
    with pytest.raises(RequestError, match="fact"):
        pipeline().scopes(SearchQuery(tenant=TENANT, text="q", kinds=("fact",)))


def candidates() -> list[Candidate]:
    return [
        Candidate(
            id=f"{row.name}-id",
            scope="conversation",
            dense=0.5,
            vector=np.eye(len(KINDS))[i],
            created_at=NOW - timedelta(days=i),
            kind=row.name,
        )
        for i, row in enumerate(KINDS)
    ]


def small_store_order() -> list[str]:
    params = RankingParams(top_k=len(KINDS), small_store_size=len(KINDS))
    relevance = np.full(len(KINDS), 0.9)
    result = rank(candidates(), relevance, params, NOW, complete=True)
    return [h.candidate.kind for h in result.hits]


def test_a_small_store_lists_kinds_by_their_rank_in_the_table(
    swap_rows: Callable[..., None],
) -> None:
    def expected() -> list[str]:
        by_rank = sorted(
            enumerate(KINDS),
            key=lambda item: (kinds.kind_policy(item[1].name).small_store_rank, -item[0]),
            reverse=True,
        )
        return [row.name for _, row in by_rank]

    assert small_store_order() == expected()
    # Reversed ranks: the order follows the table, not a list of the ranking's own.
    swap_rows(lambda k: {"small_store_rank": 10 - k.small_store_rank})
    assert small_store_order() == expected()


def test_the_kinds_listed_first_lead_the_ranked_hits(swap_rows: Callable[..., None]) -> None:
    params = RankingParams(top_k=len(KINDS), small_store_size=0, score_threshold=0.0)
    # The fact-like kinds are slightly less relevant, yet within the margin of the best.
    relevance = np.array([0.9 - 0.01 * i for i in range(len(KINDS))])

    def leading() -> set[str]:
        hits = rank(candidates(), relevance, params, NOW, complete=False).hits
        first = [h.candidate.kind for h in hits]
        count = len(kind_names(lambda k: kinds.kind_policy(k.name).listed_first))
        return set(first[:count])

    assert leading() == set(kind_names(lambda k: k.listed_first))
    swap_rows(lambda k: {"listed_first": k.name == "episode"})
    assert leading() == {"episode"}


# --- lifecycle ---------------------------------------------------------------------------


def test_the_kinds_that_correct_their_source_turns_are_the_table_s(
    swap_rows: Callable[..., None],
) -> None:
    def correcting() -> set[str]:
        return {row.name for row in KINDS if lifecycle.corrects_its_turns(record(row.name), None)}

    def correctable() -> set[str]:
        return {
            row.name
            for row in KINDS
            if lifecycle.corrected(record(row.name), by="f2", at=NOW) is not None
        }

    assert correcting() == set(kind_names(lambda k: k.corrects_source_turns))
    assert correctable() == set(kind_names(lambda k: k.chat_message))
    swap_rows(lambda k: {"corrects_source_turns": k.name == "episode", "chat_message": False})
    assert correcting() == {"episode"}
    assert correctable() == set()


# --- the file mirror ---------------------------------------------------------------------


def test_every_kind_has_its_own_mirror_folder_and_round_trips_through_the_mirror() -> None:
    folders = [row.mirror_dir for row in KINDS]
    assert len(set(folders)) == len(folders)
    assert {row.name: row.mirror_dir for row in KINDS} == mirror_format.KIND_DIRS
    for row in KINDS:
        memory = record(row.name)
        for path in (
            mirror_format.live_path(TENANT, memory),
            mirror_format.tombstone_path(TENANT, memory),
        ):
            where = mirror_format.classify(path)
            assert where is not None and where.kind == row.name, path
            assert row.mirror_dir in path.parts
            assert (where.role == "user") == row.chat_message, path
        live = mirror_format.live_path(TENANT, memory)
        assert (live.name == mirror_format.SUMMARY_FILE) == row.one_per_conversation
        parsed = mirror_format.parse(
            mirror_format.render(memory, TENANT), where=mirror_format.classify(live)
        )
        assert parsed.record == memory


def test_the_mirror_keeps_a_folder_per_role_for_the_chat_message_kinds(
    swap_rows: Callable[..., None],
) -> None:
    swap_rows(lambda k: {"chat_message": k.name == "fact"})
    path = mirror_format.live_path(TENANT, record("fact", role="assistant"))
    assert path.parts[-3:-1] == ("facts", "assistant")
    assert mirror_format.live_path(TENANT, record("turn")).parts[-2] == "turns"


# --- recall ------------------------------------------------------------------------------


def rendered(memory: MemoryRecord) -> str:
    scores = Scores(dense=0.5, sparse=None, relevance=0.9, recency=1.0, total=0.9, mmr=0.9)
    result = SearchResult("ranked", [SearchHit(memory, scores, "conversation")])
    text = render_memory(result, now=NOW)
    assert text is not None
    return text


def test_recall_labels_each_kind_with_its_prompt_label() -> None:
    for row in KINDS:
        memory = record(row.name)
        label = row.prompt_label.format(
            role="user", conversation=quoted("c1"), turn_range=" (turns 1-20)"
        )
        assert f"] {label}: {quoted(memory.text)}" in rendered(memory), row.name


def test_recall_reads_the_labels_from_the_table(swap_rows: Callable[..., None]) -> None:
    swap_rows(lambda k: {"prompt_label": f"label of a {k.name} {{role}}{{turn_range}}"})
    for row in KINDS:
        assert f"] label of a {row.name} user (turns 1-20): " in rendered(record(row.name))
    no_range = rendered(record("episode", turn_range=None))
    assert "] label of a episode user: " in no_range


# --- evict and summarize -----------------------------------------------------------------


def test_evict_counts_and_orders_the_kinds_the_table_makes_evictable() -> None:
    evictable = kind_names(lambda k: k.eviction is not None)
    assert evictable == evict.COUNTED_KINDS
    memories: dict[str, list[MemoryRecord]] = {
        row.name: [record(row.name, id=f"{row.name}-{i}", superseded_by="") for i in range(2)]
        + [record(row.name, id=f"{row.name}-old", superseded_by="x")]
        for row in KINDS
    }
    order = evict.eviction_order(memories)
    assert {m.kind for m in order} == set(evictable)
    ranks = []
    for memory in order:
        eviction = kinds.kind_policy(memory.kind).eviction
        assert eviction is not None
        ranks.append(eviction.rank_of(bool(memory.superseded_by)))
    assert ranks == sorted(ranks)
    for row in KINDS:
        if row.eviction is not None:
            kept = 1 if row.eviction.keep_newest else 0
            assert sum(m.kind == row.name for m in order) == 3 - kept


class CountingMemories:
    def __init__(self) -> None:
        self.counted: list[tuple[str, ...]] = []

    async def count(self, tenant: str, scope: Any) -> KindCounts:
        self.counted.append(tuple(scope.kinds))
        return KindCounts(total=0, by_kind={})


async def test_only_a_new_memory_of_an_evictable_kind_triggers_a_count(
    swap_rows: Callable[..., None],
) -> None:
    async def triggering() -> set[str]:
        found: set[str] = set()
        for row in KINDS:
            memories = CountingMemories()
            delivery = SimpleNamespace(settings=SimpleNamespace(max_entries=10), memories=memories)
            event = MemoryChanged(tenant=TENANT, op="created", memory=record(row.name))
            await evict.evict(event, cast(Any, delivery))
            if memories.counted:
                found.add(row.name)
        return found

    assert await triggering() == set(kind_names(lambda k: k.eviction is not None))
    swap_rows(lambda k: {"eviction": kinds.Eviction(rank=1) if k.name == "profile" else None})
    assert await triggering() == {"profile"}


def test_summarize_folds_and_compresses_the_kinds_the_table_names() -> None:
    assert kind_names(lambda k: k.folded_into_summary) == summarize_app.FOLDED_KINDS
    assert kind_names(lambda k: k.compressed_into_episodes) == summarize_app.EPISODE_SOURCE_KINDS


async def test_summarize_dispatches_on_the_table(
    monkeypatch: pytest.MonkeyPatch, swap_rows: Callable[..., None]
) -> None:
    calls: list[tuple[str, str]] = []

    def recorder(job: str) -> Callable[..., Any]:
        async def record_call(event: MemoryChanged, delivery: Any) -> None:
            calls.append((job, event.memory.kind))

        return record_call

    for job in ("fold_facts", "drop_superseded", "update_episodes"):
        monkeypatch.setattr(summarize_app, job, recorder(job))

    async def dispatched() -> list[tuple[str, str]]:
        calls.clear()
        for row in KINDS:
            for op in ("created", "superseded"):
                event = MemoryChanged(tenant=TENANT, op=op, memory=record(row.name))
                await summarize_app.summarize(event, cast(Any, SimpleNamespace()))
        return sorted(calls)

    folded, compressed = summarize_app.FOLDED_KINDS, summarize_app.EPISODE_SOURCE_KINDS
    assert await dispatched() == sorted(
        [("fold_facts", k) for k in folded]
        + [("drop_superseded", k) for k in folded]
        + [("update_episodes", k) for k in compressed]
    )
    swap_rows(
        lambda k: {
            "folded_into_summary": k.name == "profile",
            "compressed_into_episodes": k.name == "fact",
        }
    )
    assert await dispatched() == [
        ("drop_superseded", "profile"),
        ("fold_facts", "profile"),
        ("update_episodes", "fact"),
    ]


# --- the MCP tools -----------------------------------------------------------------------


async def test_the_mcp_list_tool_offers_and_describes_every_kind() -> None:
    async with (
        httpx2.AsyncClient(base_url="http://127.0.0.1:9") as http,
        Client(build_mcp_server(GatewayApi(http))) as client,
    ):
        tools = {t.name: t for t in (await client.list_tools()).tools}
    listing = tools["list_memories"]
    assert listing.description is not None
    for row in KINDS:
        assert f"`{row.name}` ({row.description})" in listing.description
    kinds_schema = listing.input_schema["properties"]["kinds"]
    offered = next(s["items"]["enum"] for s in kinds_schema["anyOf"] if "items" in s)
    assert offered == list(KIND_NAMES)
