"""The summarize worker's rolling summary, through the real nats-server, the real
retrieval service (in-process) and a scripted model keyed on the prompt."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from engram_core.bus import ensure_stream, publish_event
from engram_core.codec import pb, to_timestamp
from engram_core.events import MemoryChanged
from engram_testing.upstream import ScriptedUpstream, UpstreamError
from engram_testing.waiting import eventually
from engram_testing.worker_stack import (
    HORIZON_AFTER_TWO_DELIVERIES,
    RealRetrieval,
    ScriptedModel,
    WorkerStack,
    changed,
    consumer_settled,
    dead_letter_count,
    published,
)
from engram_workers.summarize import SUMMARIZE, SummarizeSettings
from engram_workers.summarize.core import summary_memory_id

pytestmark = pytest.mark.integration

TENANT = "acme"
CONVERSATION = "c1"
START = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def appending_summary(payload: dict[str, Any]) -> str:
    """A well-behaved summarizer: the previous summary plus the new facts."""
    parts = [payload["previous_summary"], *payload["new_facts"]]
    return json.dumps({"summary": " ".join(p for p in parts if p)})


@pytest.fixture
def model(scripted_upstream: ScriptedUpstream) -> ScriptedModel:
    scripted = ScriptedModel(summarize=appending_summary)
    scripted_upstream.replies = [scripted]
    return scripted


def settings(
    workers: WorkerStack, upstream: ScriptedUpstream, **overrides: Any
) -> SummarizeSettings:
    return SummarizeSettings(
        **{
            **workers.common(),
            "llm_base_url": upstream.base_url,
            "llm_model": "scripted",
            "llm_timeout_s": 5.0,
            "lock_wait_s": 10.0,
            **overrides,
        }
    )


async def store_fact(retrieval: RealRetrieval, text: str, minute: int, **fields: Any) -> pb.Memory:
    fact = pb.Memory(
        id=str(uuid.uuid4()),
        tenant=TENANT,
        user_id="u1",
        conversation_id=CONVERSATION,
        kind=pb.MEMORY_KIND_FACT,
        text=text,
        created_at=to_timestamp(START + timedelta(minutes=minute)),
        **fields,
    )
    await retrieval.client.upsert(pb.UpsertRequest(tenant=TENANT, memories=[fact]))
    return fact


async def get_summary(retrieval: RealRetrieval) -> pb.Memory | None:
    reply = await retrieval.client.get(
        pb.GetRequest(tenant=TENANT, ids=[summary_memory_id(TENANT, "u1", CONVERSATION)])
    )
    return reply.memories[0] if reply.memories else None


async def summary_at(retrieval: RealRetrieval, revision: int) -> pb.Memory:
    async def check() -> pb.Memory | None:
        summary = await get_summary(retrieval)
        if summary is not None and int(summary.metadata["revision"]) >= revision:
            return summary
        return None

    return await eventually(check, what=f"summary revision {revision}")


async def summary_count(retrieval: RealRetrieval) -> int:
    reply = await retrieval.client.count(
        pb.CountRequest(
            tenant=TENANT,
            filter=pb.MemoryFilter(
                conversation_id=CONVERSATION,
                kinds=[pb.MEMORY_KIND_SUMMARY],
                include_superseded=True,
            ),
        )
    )
    return reply.count


async def test_rolling_summary_folds_each_new_fact_into_the_previous_summary(
    workers, retrieval, scripted_upstream, model, publisher
) -> None:
    await workers.start(SUMMARIZE, settings(workers, scripted_upstream))
    lisbon = await store_fact(retrieval, "User lives in Lisbon.", 1)
    await publish_event(publisher, changed(TENANT, lisbon))
    first = await summary_at(retrieval, 1)

    assert model.inputs("summarize") == [
        {"previous_summary": "", "new_facts": ["User lives in Lisbon."]}
    ]
    assert first.id == summary_memory_id(TENANT, "u1", CONVERSATION)
    assert first.kind == pb.MEMORY_KIND_SUMMARY
    assert first.text == "User lives in Lisbon."
    assert first.metadata["summarizer"] == "llm"
    assert first.metadata["folded_fact_ids"] == lisbon.id

    cello = await store_fact(retrieval, "User plays the cello.", 2)
    await publish_event(publisher, changed(TENANT, cello))
    second = await summary_at(retrieval, 2)

    # the model saw the previous summary and only the new fact
    assert model.inputs("summarize")[1] == {
        "previous_summary": "User lives in Lisbon.",
        "new_facts": ["User plays the cello."],
    }
    assert second.text == "User lives in Lisbon. User plays the cello."
    assert second.metadata["folded_fact_ids"].split() == [lisbon.id, cello.id]
    assert second.metadata["facts_folded"] == "2"
    assert await summary_count(retrieval) == 1  # one point per conversation

    # Search attaches it alongside the hits
    found = await retrieval.client.search(
        pb.SearchRequest(
            tenant=TENANT, query="What instrument?", user_id="u1", conversation_id=CONVERSATION
        )
    )
    assert found.summary.id == first.id
    assert found.summary.text == second.text

    # and both versions were announced (the file mirror writes summaries/summary.md)
    await eventually(lambda: consumer_settled(workers.nats_url, "summarize"), what="the acks")
    announced = [
        e for e in await published(workers.nats_url, MemoryChanged) if e.memory.kind == "summary"
    ]
    assert [(e.op, e.cause, e.memory.text) for e in announced] == [
        ("created", "summarize:summary", "User lives in Lisbon."),
        ("updated", "summarize:summary", second.text),
    ]
    # its own announcements came back to it and were ignored: no further model call
    assert len(model.calls) == 2


async def test_a_redelivered_fact_is_not_folded_twice(
    workers, retrieval, scripted_upstream, model, publisher
) -> None:
    await workers.start(SUMMARIZE, settings(workers, scripted_upstream))
    fact = await store_fact(retrieval, "User is vegetarian.", 1)
    await publish_event(publisher, changed(TENANT, fact))
    await summary_at(retrieval, 1)

    # the same change delivered again under another event id (a re-publish)
    await publish_event(publisher, changed(TENANT, fact, event_id="republished"))
    # a fact superseded before the worker saw it, and kinds that do not feed the summary
    old = await store_fact(
        retrieval, "User eats fish.", 2, superseded_by=fact.id, valid_to=to_timestamp(START)
    )
    await publish_event(publisher, changed(TENANT, old))
    profile = pb.Memory(
        id=str(uuid.uuid4()),
        user_id="u1",
        conversation_id=CONVERSATION,
        kind=pb.MEMORY_KIND_PROFILE,
        profile=pb.ProfileEntry(category="identity", key="name", value="Ana", confidence=0.9),
    )
    await publish_event(publisher, changed(TENANT, profile))
    await eventually(lambda: consumer_settled(workers.nats_url, "summarize"), what="the acks")

    summary = await get_summary(retrieval)
    assert summary is not None
    assert summary.metadata["revision"] == "1"
    assert summary.text == "User is vegetarian."
    assert len(model.calls) == 1
    assert await dead_letter_count(workers.nats_url, "summarize") == 0


async def test_two_replicas_fold_a_burst_without_losing_or_repeating_a_fact(
    workers, retrieval, scripted_upstream, model, publisher
) -> None:
    scripted_upstream.delay_s = 0.05  # long enough for the replicas to overlap
    for _ in range(2):
        await workers.start(SUMMARIZE, settings(workers, scripted_upstream, worker_concurrency=4))
    facts = [await store_fact(retrieval, f"User fact number {i}.", i) for i in range(8)]
    for fact in facts:
        await publish_event(publisher, changed(TENANT, fact))

    async def all_folded() -> bool:
        summary = await get_summary(retrieval)
        return summary is not None and summary.metadata["facts_folded"] == "8"

    await eventually(all_folded, what="all eight facts folded")
    await eventually(lambda: consumer_settled(workers.nats_url, "summarize"), what="the acks")
    summary = await get_summary(retrieval)
    assert summary is not None
    assert sorted(summary.metadata["folded_fact_ids"].split()) == sorted(f.id for f in facts)
    # every fact reached the model exactly once, and each fold built on the last one
    folded = [text for call in model.inputs("summarize") for text in call["new_facts"]]
    assert sorted(folded) == sorted(f.text for f in facts)
    assert all(f.text in summary.text for f in facts)
    assert await summary_count(retrieval) == 1


async def test_model_junk_falls_back_to_a_rule_based_summary(
    workers, retrieval, scripted_upstream, model, publisher
) -> None:
    model.answers["summarize"] = lambda payload: "Sorry, I can't summarise that."
    await workers.start(SUMMARIZE, settings(workers, scripted_upstream))
    fact = await store_fact(retrieval, "User is allergic to peanuts", 1)
    await publish_event(publisher, changed(TENANT, fact))

    summary = await summary_at(retrieval, 1)
    assert summary.text == "User is allergic to peanuts."
    assert summary.metadata["summarizer"] == "rule-based"
    assert "invalid output" in summary.metadata["fallback_reason"]
    assert len(model.calls) == 2  # the request and one re-ask

    # the model recovers: the next fold is the model's again, over the fallback text
    model.answers["summarize"] = appending_summary
    other = await store_fact(retrieval, "User lives in Porto.", 2)
    await publish_event(publisher, changed(TENANT, other))
    summary = await summary_at(retrieval, 2)
    assert summary.metadata["summarizer"] == "llm"
    assert "fallback_reason" not in summary.metadata
    assert summary.text == "User is allergic to peanuts. User lives in Porto."


async def test_an_unavailable_model_is_retried_then_falls_back_at_the_retry_horizon(
    workers, retrieval, scripted_upstream, model, publisher
) -> None:
    model.answers["summarize"] = lambda payload: UpstreamError(503)
    await workers.start(
        SUMMARIZE, settings(workers, scripted_upstream, **HORIZON_AFTER_TWO_DELIVERIES)
    )
    fact = await store_fact(retrieval, "User works night shifts.", 1)
    await publish_event(publisher, changed(TENANT, fact))

    summary = await summary_at(retrieval, 1)
    assert summary.text == "User works night shifts."
    assert summary.metadata["summarizer"] == "rule-based"
    assert "unavailable until the retry horizon" in summary.metadata["fallback_reason"]
    assert len(model.calls) == 2  # one per delivery
    await eventually(lambda: consumer_settled(workers.nats_url, "summarize"), what="the ack")
    assert await dead_letter_count(workers.nats_url, "summarize") == 0


async def test_a_superseded_fact_leaves_a_verbatim_summary(
    workers, retrieval, scripted_upstream, model, publisher
) -> None:
    model.answers["summarize"] = lambda payload: "no json here"  # rule-based throughout
    await workers.start(SUMMARIZE, settings(workers, scripted_upstream))
    loves = await store_fact(retrieval, "User loves pizza.", 1)
    await publish_event(publisher, changed(TENANT, loves))
    await summary_at(retrieval, 1)

    # reconcile: "I hate pizza" supersedes the old fact and adds the new one
    hates = await store_fact(retrieval, "User hates pizza.", 2)
    loves.superseded_by = hates.id
    await retrieval.client.upsert(pb.UpsertRequest(tenant=TENANT, memories=[loves]))
    await publish_event(publisher, changed(TENANT, hates))
    await summary_at(retrieval, 2)  # "User loves pizza. User hates pizza."
    await publish_event(publisher, changed(TENANT, loves, op="superseded"))
    summary = await summary_at(retrieval, 3)
    assert summary.text == "User hates pizza."

    # the user deletes the last fact: nothing is left to summarise
    await retrieval.client.delete(pb.DeleteRequest(tenant=TENANT, ids=[hates.id]))
    await publish_event(publisher, changed(TENANT, hates, op="deleted"))
    await eventually(lambda: _is_none(get_summary(retrieval)), what="the summary deleted")
    await eventually(lambda: consumer_settled(workers.nats_url, "summarize"), what="the acks")
    ops = [
        (e.op, e.memory.text)
        for e in await published(workers.nats_url, MemoryChanged)
        if e.memory.kind == "summary"
    ]
    assert ops == [
        ("created", "User loves pizza."),
        ("updated", "User loves pizza. User hates pizza."),
        ("updated", "User hates pizza."),
        ("deleted", "User hates pizza."),
    ]


async def _is_none(awaitable: Any) -> bool:
    return (await awaitable) is None


async def test_without_a_configured_model_the_chat_model_of_the_source_turn_is_used(
    workers, retrieval, scripted_upstream, model, publisher
) -> None:
    await workers.start(SUMMARIZE, settings(workers, scripted_upstream, llm_model=""))
    turn = pb.Memory(
        id=str(uuid.uuid4()),
        user_id="u1",
        conversation_id=CONVERSATION,
        kind=pb.MEMORY_KIND_TURN,
        role="user",
        text="I moved to Lisbon.",
        metadata={"turn_id": "t1", "model": "the-chat-model"},
    )
    await retrieval.client.upsert(pb.UpsertRequest(tenant=TENANT, memories=[turn]))
    fact = await store_fact(retrieval, "User lives in Lisbon.", 1, source_turn_ids=[turn.id])
    await publish_event(publisher, changed(TENANT, fact))

    summary = await summary_at(retrieval, 1)
    assert summary.metadata["summarizer"] == "llm"
    assert summary.metadata["model"] == "the-chat-model"
    assert [body["model"] for body in scripted_upstream.chat_requests()] == ["the-chat-model"]


async def test_a_removal_in_the_batch_keeps_its_conversation_in_stream_order(
    workers, retrieval, scripted_upstream, model, publisher
) -> None:
    """A fact created and then removed within one batch: the conversation's changes run
    one by one, so the removal finds the fact in the summary and takes it out."""
    kept = await store_fact(retrieval, "User lives in Porto.", 1)
    gone = await store_fact(retrieval, "User owns a red bike.", 2)
    await ensure_stream(workers.nats_url)
    await publish_event(publisher, changed(TENANT, kept))
    await publish_event(publisher, changed(TENANT, gone))
    await publish_event(publisher, changed(TENANT, gone, "deleted"))
    await workers.start(SUMMARIZE, settings(workers, scripted_upstream, batch_size=16))
    await eventually(lambda: consumer_settled(workers.nats_url, "summarize"), what="the acks")

    summary = await get_summary(retrieval)
    assert summary is not None
    # the first fold took both (the store still held the bike as current), then the
    # removal, after it as in the stream, took the bike's sentence out again
    assert [call["new_facts"] for call in model.inputs("summarize")] == [[kept.text, gone.text]]
    assert summary.text == "User lives in Porto."
    assert await dead_letter_count(workers.nats_url, "summarize") == 0
