"""Fact extraction in the ingest worker: a real nats-server, the real retrieval service
in-process and a scripted LLM (the rule-based brain, or scripted failures)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import nats.errors
import pytest

from engram_cli.stack.scripted_llm import RuleBasedBrain, ScriptedUpstream, UpstreamError
from engram_core.bus import make_broker, publish_event
from engram_core.codec import pb
from engram_core.event_status import EventStatusStore
from engram_core.events import FactProposed, MemoryChanged, TurnPersisted, deterministic_event_id
from engram_core.lifecycle import change_event_id
from engram_core.retrieval_client import RetrievalClient
from engram_testing.waiting import eventually
from engram_testing.worker_stack import (
    HORIZON_AFTER_TWO_DELIVERIES,
    RealRetrieval,
    WorkerStack,
    consumer_settled,
    dead_letter_count,
    published,
)
from engram_workers.extraction import clean_output, normalise_key
from engram_workers.ingest import INGEST, IngestSettings, turn_memory_id
from engram_workers.prompts import ExtractOutput

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


@dataclass
class Stack:
    nats_url: str
    upstream: ScriptedUpstream
    retrieval: RetrievalClient
    retrieval_address: str
    workers: WorkerStack
    broker: Any

    def settings(self, **overrides: object) -> IngestSettings:
        values: dict[str, Any] = {
            **self.workers.common(),
            "llm_base_url": self.upstream.base_url,
            "llm_timeout_s": 2.0,
            "extraction_model": "extract-mini",
            **overrides,
        }
        return IngestSettings(**values)

    async def start(self, **overrides: object) -> None:
        await self.workers.start(INGEST, self.settings(**overrides))

    async def send(self, event: TurnPersisted) -> None:
        await publish_event(self.broker, event)
        await eventually(lambda: consumer_settled(self.nats_url, "ingest"), what="ingest to settle")

    def extraction_requests(self) -> list[dict[str, Any]]:
        return [
            body
            for body in self.upstream.chat_requests()
            if body["messages"][0]["content"].startswith("engram-task: extract_facts\n")
        ]


@pytest.fixture
async def stack(
    nats_url: str,
    retrieval: RealRetrieval,
    workers: WorkerStack,
    scripted_upstream: ScriptedUpstream,
) -> AsyncIterator[Stack]:
    scripted_upstream.replies = [RuleBasedBrain()]
    broker = make_broker(nats_url, client_name="test-gateway")
    await broker.connect()
    try:
        yield Stack(
            nats_url, scripted_upstream, retrieval.client, retrieval.address, workers, broker
        )
    finally:
        await broker.stop()


def turn(n: int = 1, text: str = "My wife's name is Jane. I love pizza!", **fields: Any):
    values: dict[str, Any] = {
        "tenant": "acme",
        "user_id": "u1",
        "conversation_id": "c1",
        "turn_id": f"t-{n}",
        "role": "user",
        "text": text,
        "created_at": T0 + timedelta(minutes=n),
        "model": "gpt-test",
        "source_id": f"D1:{n}",
        **fields,
    }
    return TurnPersisted(**values)


async def test_user_turn_is_indexed_announced_and_its_facts_proposed(stack: Stack) -> None:
    await stack.start()
    event = turn()
    await stack.send(event)
    memory_id = turn_memory_id("acme", "c1", "t-1")

    [proposal] = await published(stack.nats_url, FactProposed)
    assert proposal.event_id == deterministic_event_id(memory_id, "fact.proposed")
    assert proposal.facts == ["User's wife's name is Jane", "User loves pizza"]
    [profile] = proposal.profile
    assert (profile.category, profile.key, profile.value) == ("identity", "wife_name", "Jane")
    assert (proposal.tenant, proposal.user_id, proposal.conversation_id) == ("acme", "u1", "c1")
    assert (proposal.source_turn_id, proposal.source_id) == (memory_id, "D1:1")
    assert (proposal.turn_created_at, proposal.model) == (event.created_at, "gpt-test")

    [request] = stack.extraction_requests()
    assert request["model"] == "extract-mini"
    assert json.loads(request["messages"][1]["content"]) == {
        "message": event.text,
        "date": event.created_at.isoformat(),
        "recent_context": [],
    }
    assert request["response_format"]["type"] == "json_schema"

    [changed] = await published(stack.nats_url, MemoryChanged)
    assert changed.event_id == change_event_id("acme", changed.memory, "created")
    assert (changed.op, changed.cause, changed.memory.id) == ("created", "ingest", memory_id)
    assert (changed.memory.kind, changed.memory.text) == ("turn", event.text)
    stored = await stack.retrieval.get(pb.GetRequest(tenant="acme", ids=[memory_id]))
    assert [m.text for m in stored.memories] == [event.text]


async def test_greetings_and_questions_propose_nothing(stack: Stack) -> None:
    await stack.start()
    await stack.send(turn(1, "Hello!"))
    await stack.send(turn(2, "Where do I like to hike?"))
    assert len(stack.extraction_requests()) == 2
    assert await published(stack.nats_url, FactProposed) == []
    assert len(await published(stack.nats_url, MemoryChanged)) == 2  # the turns themselves


async def test_assistant_turns_are_never_extracted(stack: Stack) -> None:
    await stack.start()
    await stack.send(turn(1, "I love pizza too! My name is Bot.", role="assistant"))
    assert stack.upstream.chat_requests() == []
    assert await published(stack.nats_url, FactProposed) == []
    [changed] = await published(stack.nats_url, MemoryChanged)
    assert changed.memory.role == "assistant"


async def test_model_is_the_configured_one_then_the_turns(stack: Stack) -> None:
    # The workers' upstream need not serve the chat's model: configured beats inferred.
    await stack.start(extraction_model="", llm_model="house-model")
    await stack.send(turn(1, "I love pizza."))
    await stack.workers.stop_all()
    await stack.start(extraction_model="", llm_model="")
    await stack.send(turn(2, "I love pasta."))
    assert [r["model"] for r in stack.extraction_requests()] == ["house-model", "gpt-test"]


async def test_earlier_turns_resolve_references(stack: Stack) -> None:
    await stack.start()
    await stack.send(turn(1, "My wife's name is Jane."))
    await stack.send(turn(2, "What a lovely name!", role="assistant"))
    await stack.send(turn(3, "She loves pizza."))
    await stack.send(turn(4, "Unrelated other user.", user_id="u2"))
    third = json.loads(stack.extraction_requests()[1]["messages"][1]["content"])
    assert third["recent_context"] == [
        "user: My wife's name is Jane.",
        "assistant: What a lovely name!",
    ]
    other = json.loads(stack.extraction_requests()[2]["messages"][1]["content"])
    assert other["recent_context"] == []  # another user's turns are not context


def slow_then_brain(delay_s: float):
    brain = RuleBasedBrain()
    calls = {"n": 0}

    def reply(body: dict[str, Any]) -> str:
        calls["n"] += 1
        if calls["n"] == 1:
            time.sleep(delay_s)  # the upstream's own thread: the client times out first
        return brain(body)

    return reply


@pytest.mark.parametrize("failure", ["503", "timeout"])
async def test_llm_outage_is_retried_and_the_turn_written_once(stack: Stack, failure: str) -> None:
    if failure == "503":
        stack.upstream.replies = [UpstreamError(503), RuleBasedBrain()]
    else:
        stack.upstream.replies = [slow_then_brain(0.7)]
    await stack.start(llm_timeout_s=0.5, retry_backoff_s=(0.2,))
    await stack.send(turn(1, "I love pizza."))

    assert len(stack.extraction_requests()) == 2
    [proposal] = await published(stack.nats_url, FactProposed)
    assert proposal.facts == ["User loves pizza"]
    # The retry re-ran the Upsert (a no-op) and re-announced the turn under the same id.
    [changed] = await published(stack.nats_url, MemoryChanged)
    assert changed.op == "created"
    assert await dead_letter_count(stack.nats_url, "ingest") == 0


async def test_junk_output_gives_up_and_the_turn_stays_searchable(stack: Stack) -> None:
    stack.upstream.replies = ["I am not JSON, sorry."]
    await stack.start()
    await stack.send(turn(1, "I love pizza."))
    assert len(stack.extraction_requests()) == 2  # the client re-asked once
    assert await published(stack.nats_url, FactProposed) == []
    assert await dead_letter_count(stack.nats_url, "ingest") == 0
    hits = await stack.retrieval.search(
        pb.SearchRequest(tenant="acme", query="pizza", conversation_id="c1", user_id="u1")
    )
    assert [h.memory.text for h in hits.hits] == ["I love pizza."]


async def test_an_llm_down_until_the_retry_horizon_leaves_the_turn_to_reextract(
    stack: Stack,
) -> None:
    stack.upstream.replies = [UpstreamError(503)]
    await stack.start(**HORIZON_AFTER_TWO_DELIVERIES)
    await stack.send(turn(1, "I love pizza."))
    # retried once, then the fallback on the last delivery: nothing learned, nothing
    # dead-lettered (`engram reextract` learns from the stored turn later)
    assert len(stack.extraction_requests()) == 2
    assert await dead_letter_count(stack.nats_url, "ingest") == 0
    assert await published(stack.nats_url, FactProposed) == []
    stored = await stack.retrieval.get(
        pb.GetRequest(tenant="acme", ids=[turn_memory_id("acme", "c1", "t-1")])
    )
    assert len(stored.memories) == 1  # indexed all the same


async def test_a_repeated_turn_is_neither_stored_nor_extracted_again(stack: Stack) -> None:
    await stack.start()
    await stack.send(turn(1, "I love pizza."))
    await stack.send(turn(1, "I love pizza.", event_id="retried-request"))
    assert len(stack.extraction_requests()) == 1
    assert len(await published(stack.nats_url, FactProposed)) == 1
    ops = [c.op for c in await published(stack.nats_url, MemoryChanged)]
    assert ops == ["created"]
    # asked to re-extract (engram reextract), the stored turn is learned from again
    await stack.send(turn(1, "I love pizza.", event_id="reextract-run", reextract=True))
    assert len(stack.extraction_requests()) == 2
    assert len(await published(stack.nats_url, FactProposed)) == 2  # a new proposal id
    assert [c.op for c in await published(stack.nats_url, MemoryChanged)] == ["created"]


async def test_a_disabled_extraction_makes_no_llm_call(stack: Stack) -> None:
    await stack.start(extraction_enabled=False)
    await stack.send(turn(1, "I love pizza."))
    await asyncio.sleep(0.1)
    assert stack.upstream.chat_requests() == []
    assert await published(stack.nats_url, FactProposed) == []


def test_output_is_cleaned() -> None:
    output = ExtractOutput.model_validate(
        {
            "facts": ["  User  loves pizza ", "user loves pizza", ""],
            "profile": [
                {
                    "category": "preference",
                    "key": "Favorite Food",
                    "value": "pizza",
                    "confidence": 0.6,
                },
                {
                    "category": "preference",
                    "key": "favorite-food",
                    "value": "pasta",
                    "confidence": 0.8,
                },
                {"category": "identity", "key": "!!", "value": "x", "confidence": 0.9},
            ],
        }
    )
    facts, profile = clean_output(output)
    assert facts == ["User loves pizza"]
    assert [(p.key, p.value, p.confidence) for p in profile] == [("favorite_food", "pasta", 0.8)]
    assert normalise_key(" Home City ") == "home_city"


async def test_a_refused_request_dead_letters_the_turn_event_at_once(stack: Stack) -> None:
    stack.upstream.replies = [UpstreamError(404, "model not found")]
    await stack.start(max_deliver=3)
    await stack.send(turn(1, "I love pizza."))
    assert len(stack.extraction_requests()) == 1  # not retried: it would be refused again
    assert await dead_letter_count(stack.nats_url, "ingest") == 1


async def test_a_status_store_that_fails_never_holds_back_the_facts(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event-status bucket unreachable (its node down): the facts are proposed all
    the same, after a bounded wait, and nothing is dead-lettered."""
    calls: list[str] = []

    async def unreachable(self: EventStatusStore, tenant: str, event_id: str, **_: Any) -> None:
        calls.append(event_id)
        raise nats.errors.TimeoutError

    monkeypatch.setattr(EventStatusStore, "update_if_followed", unreachable)
    await stack.start(publish_retry_s=0.5)
    event = turn(1, "I love pizza.")
    await stack.send(event)
    [proposal] = await published(stack.nats_url, FactProposed)
    assert proposal.facts == ["User loves pizza"]
    assert len(calls) >= 2 and set(calls) == {event.event_id}  # retried, then given up
    assert await dead_letter_count(stack.nats_url, "ingest") == 0


@pytest.mark.parametrize("followed", [False, True, None])
async def test_only_a_turn_that_may_be_followed_is_looked_up_in_the_status_store(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, followed: bool | None
) -> None:
    """A chat turn says it is not followed: ingest never reads the status store for it,
    and its proposal says so too, for reconcile. A followed one (memories/add), or one
    from before the flag (None), is looked up, and its proposal carries the flag on."""
    calls: list[tuple[str, str]] = []

    async def spy(self: EventStatusStore, tenant: str, event_id: str, **kw: Any) -> None:
        calls.append((event_id, kw.get("follow_up", "")))

    monkeypatch.setattr(EventStatusStore, "update_if_followed", spy)
    await stack.start()
    event = turn(1, "I love pizza.", followed=followed)
    await stack.send(event)
    [proposal] = await published(stack.nats_url, FactProposed)
    assert proposal.followed is followed
    if followed is False:
        assert calls == []
    else:
        assert calls == [(event.event_id, proposal.event_id)]
