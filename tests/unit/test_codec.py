"""The gRPC edge's vocabulary: what the client encodes, the service decodes to the same
domain value, and every name of the domain has its protobuf value (and back)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import get_args

import pytest

from engram_core import codec, memory_port
from engram_core.codec import pb
from engram_core.memory import (
    KIND_NAMES,
    MemoryFilter,
    MemoryRecord,
    ScopeName,
    SearchOutcome,
    SearchQuery,
    UpsertStatus,
)

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def test_every_domain_name_has_its_protobuf_value_and_back() -> None:
    assert {codec.KIND_NAMES[int(v)] for v in codec.KIND_BY_NAME.values()} == set(KIND_NAMES)
    assert set(codec.SCOPE_NAMES.values()) == set(get_args(ScopeName))
    assert set(codec.OUTCOME_BY_NAME) == set(get_args(SearchOutcome))
    assert set(codec.STATUS_BY_NAME) == set(UpsertStatus)
    assert codec.KIND_BY_NAME["fact"] == pb.MEMORY_KIND_FACT
    assert codec.kind_name(pb.MEMORY_KIND_UNSPECIFIED) == "unspecified"


def test_the_client_pages_within_the_service_limits() -> None:
    """One definition: the port batches ids and pages by the service's own caps."""
    assert vars(memory_port)["MAX_IDS"] is codec.MAX_IDS
    assert vars(memory_port)["MAX_PAGE_SIZE"] is codec.MAX_PAGE_SIZE


def test_a_filter_reaches_the_service_as_sent() -> None:
    sent = MemoryFilter(
        user_id="",
        conversation_id="c1",
        kinds=("fact", "profile"),
        tags=("a",),
        source_ids=("s",),
        role="user",
        include_superseded=True,
        created_after=T0,
        created_before=T0.replace(year=2027),
    )
    assert codec.filter_from_pb(codec.filter_to_pb(sent)) == sent
    assert codec.filter_from_pb(codec.filter_to_pb(MemoryFilter())) == MemoryFilter()


def test_a_query_reaches_the_service_as_sent() -> None:
    sent = SearchQuery(
        tenant="t",
        text="tea?",
        user_id="u",
        conversation_id="c",
        top_k=3,
        recency_weight=0.5,
        score_threshold=0.25,
        mmr_lambda=0.5,
        scopes=("user", "global"),
        kinds=("fact",),
        now=T0,
        include_superseded=True,
        attachments=False,
    )
    assert codec.search_query(codec.query_to_pb(sent)) == sent
    unset = SearchQuery(tenant="t", text="tea?")
    assert codec.search_query(codec.query_to_pb(unset)) == unset


def test_unknown_enum_values_are_the_callers_error() -> None:
    with pytest.raises(codec.DecodeError, match="scopes: unknown scope 9"):
        codec.search_query(pb.SearchRequest(tenant="t", query="q", scopes=[9]))  # type: ignore[list-item]
    with pytest.raises(codec.DecodeError, match=r"filter\.kinds: unknown memory kind 42"):
        codec.filter_from_pb(pb.MemoryFilter(kinds=[42]))  # type: ignore[list-item]


def test_a_memory_written_without_an_id_gets_the_one_derived_from_its_content() -> None:
    memory = pb.Memory(kind=pb.MEMORY_KIND_TURN, role="user", text="hi", source_id="d1:3")
    record = codec.record_to_write("t", memory, "memories[0]")
    assert record.id == "21ea2220-b9d3-55d3-9876-ada3d195af2d"  # pinned in test_ids
    named = pb.Memory(kind=pb.MEMORY_KIND_FACT, text="x", id="6F1C1D0E-3F5E-5A57-9D8E-656E6772616D")
    assert codec.record_to_write("t", named, "m").id == "6f1c1d0e-3f5e-5a57-9d8e-656e6772616d"


@pytest.mark.parametrize(
    ("memory", "message"),
    [
        (pb.Memory(text="x"), "memories[0].kind: unknown memory kind 0"),
        (pb.Memory(kind=pb.MEMORY_KIND_FACT, text="x", tenant="b"), "tenant differs"),
        (pb.Memory(kind=pb.MEMORY_KIND_FACT, text="x", id="nope"), "is not a UUID"),
        (pb.Memory(kind=pb.MEMORY_KIND_FACT, text=" "), "text is empty"),
        (
            pb.Memory(
                kind=pb.MEMORY_KIND_PROFILE,
                profile=pb.ProfileEntry(category="hobby", key="k", value="v", confidence=0.5),
            ),
            "memories[0].category",
        ),
    ],
)
def test_a_memory_to_write_is_checked_field_by_field(memory: pb.Memory, message: str) -> None:
    with pytest.raises(codec.DecodeError) as refused:
        codec.record_to_write("a", memory, "memories[0]")
    assert message in refused.value.message


def test_a_search_hit_decodes_to_what_it_says_now() -> None:
    """Search replies' memories are decoded once per distinct content: a memory that
    comes back unchanged is the same record, and any change to it (its text, a field a
    worker set) is read afresh, never the record decoded before."""
    memory = pb.Memory(
        id="m1",
        kind=pb.MEMORY_KIND_TURN,
        text="My cat is called Miso.",
        role="user",
        user_id="u1",
        conversation_id="c1",
        created_at=codec.to_timestamp(T0),
        tags=["pets"],
    )

    def decoded(memory: pb.Memory) -> MemoryRecord:
        reply = pb.SearchResponse(hits=[pb.SearchHit(memory=memory)])
        return codec.result_from_pb(reply).hits[0].memory

    first = decoded(memory)
    assert first == codec.record_from_pb(memory)
    assert decoded(memory) is first
    renamed = pb.Memory()
    renamed.CopyFrom(memory)
    renamed.text = "My cat is called Mochi."
    assert decoded(renamed).text == "My cat is called Mochi."
    superseded = pb.Memory()
    superseded.CopyFrom(memory)
    superseded.superseded_by = "m2"
    assert decoded(superseded).superseded_by == "m2"
    assert decoded(memory) == first  # the first content still decodes as it did
