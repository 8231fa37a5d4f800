"""The reconcile worker: a real nats-server, the real retrieval service in-process and
a scripted LLM (the rule-based brain keyed on the prompt, or scripted failures)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from engram_cli.stack.nats_server import free_port
from engram_cli.stack.scripted_llm import RuleBasedBrain, ScriptedUpstream, UpstreamError
from engram_core.bus import make_broker, publish_event
from engram_core.codec import from_timestamp, pb
from engram_core.event_status import EventStatusStore
from engram_core.events import FactProposed, MemoryChanged, TurnPersisted, deterministic_event_id
from engram_core.ids import fact_memory_id
from engram_core.memory import ProposedProfileFact
from engram_core.near_duplicates import specifics
from engram_core.retrieval_client import RetrievalClient
from engram_testing.waiting import eventually
from engram_testing.worker_stack import (
    HORIZON_AFTER_TWO_DELIVERIES,
    RealRetrieval,
    WorkerStack,
    consumer_settled,
    current_facts,
    dead_letter_count,
    published,
)
from engram_workers.ingest import INGEST, IngestSettings, turn_memory_id
from engram_workers.reconcile import RECONCILE, ReconcileSettings
from engram_workers.reconcile.app import reconcile_facts
from engram_workers.runtime import Delivery, RetryableError

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@dataclass
class Stack:
    nats_url: str
    upstream: ScriptedUpstream
    retrieval: RetrievalClient
    retrieval_address: str
    workers: WorkerStack
    broker: Any

    def settings(self, **overrides: object) -> ReconcileSettings:
        values: dict[str, Any] = {
            **self.workers.common(),
            "max_deliver": 4,
            "llm_base_url": self.upstream.base_url,
            "llm_timeout_s": 2.0,
            "llm_model": "house-model",
            "lock_wait_s": 10.0,
            **overrides,
        }
        return ReconcileSettings(**values)

    async def start(self, spec=RECONCILE, **overrides: object) -> None:
        await self.workers.start(spec, self.settings(**overrides))

    async def settled(self, durable: str = "reconcile") -> None:
        await eventually(lambda: consumer_settled(self.nats_url, durable), what=f"{durable} idle")

    async def propose(
        self, n: int, *facts: str, settle: bool = True, **fields: Any
    ) -> FactProposed:
        event = proposal(n, *facts, **fields)
        await publish_event(self.broker, event)
        if settle:
            await self.settled()
        return event

    async def facts(self, *, superseded: bool = False, **flt: Any) -> list[pb.Memory]:
        return await current_facts(self.retrieval, "acme", include_superseded=superseded, **flt)

    async def texts(self, **flt: Any) -> list[str]:
        return sorted(m.text for m in await self.facts(**flt))

    async def changes(self) -> list[MemoryChanged]:
        return await published(self.nats_url, MemoryChanged)

    def reconcile_inputs(self) -> list[dict[str, Any]]:
        return [
            json.loads(body["messages"][1]["content"])
            for body in self.upstream.chat_requests()
            if body["messages"][0]["content"].startswith("engram-task: reconcile\n")
        ]


@pytest.fixture
async def stack(
    nats_url: str,
    retrieval: RealRetrieval,
    workers: WorkerStack,
    scripted_upstream: ScriptedUpstream,
) -> AsyncIterator[Stack]:
    scripted_upstream.replies = [RuleBasedBrain()]
    broker = make_broker(nats_url, client_name="test-ingest")
    await broker.connect()
    try:
        yield Stack(
            nats_url, scripted_upstream, retrieval.client, retrieval.address, workers, broker
        )
    finally:
        await broker.stop()


def turn_time(n: int) -> datetime:
    return T0 + timedelta(minutes=n)


def proposal(
    n: int,
    *facts: str,
    conversation: str = "c1",
    user: str = "u1",
    profile: list[ProposedProfileFact] | tuple = (),
    **fields: Any,
) -> FactProposed:
    source = turn_memory_id("acme", conversation, f"t-{n}")
    values: dict[str, Any] = {
        "event_id": deterministic_event_id(source, "fact.proposed"),
        "tenant": "acme",
        "user_id": user,
        "conversation_id": conversation,
        "source_turn_id": source,
        "source_id": f"D1:{n}",
        "turn_created_at": turn_time(n),
        "facts": list(facts),
        "profile": list(profile),
        "model": "gpt-test",
        **fields,
    }
    return FactProposed(**values)


def name(value: str, confidence: float, key: str = "name") -> ProposedProfileFact:
    return ProposedProfileFact(
        category="identity", key=key, value=value, confidence=confidence, importance=0.8
    )


def scripted_reconcile(answer: Any):
    """The brain for every task except reconcile, which gets ``answer`` (str or error)."""
    brain = RuleBasedBrain()

    def reply(body: dict[str, Any]) -> Any:
        if body["messages"][0]["content"].startswith("engram-task: reconcile\n"):
            return answer(body) if callable(answer) else answer
        return brain(body)

    return reply


# --- the seed scenarios -----------------------------------------------------------------


async def test_a_corrected_name_updates_the_fact_and_keeps_the_old_one_as_history(
    stack: Stack,
) -> None:
    await stack.start()
    first = await stack.propose(1, "User's wife's name is Jane")
    assert stack.reconcile_inputs() == []  # nothing to compare with: added without a call
    await stack.propose(2, "User's wife's name is Anne")

    [anne] = await stack.facts()
    assert anne.text == "User's wife's name is Anne"
    assert anne.id == fact_memory_id("acme", "u1", "c1", anne.text)
    assert list(anne.source_turn_ids) == [turn_memory_id("acme", "c1", "t-2")]
    assert from_timestamp(anne.valid_from) == from_timestamp(anne.created_at) == turn_time(2)
    jane = next(m for m in await stack.facts(superseded=True) if m.id != anne.id)
    assert jane.text == "User's wife's name is Jane"  # kept, with its text
    assert jane.superseded_by == anne.id
    assert from_timestamp(jane.valid_to) == turn_time(2)
    assert list(jane.source_turn_ids) == [first.source_turn_id]

    # The model saw short integer ids only, never a uuid.
    [shown] = stack.reconcile_inputs()
    assert shown == {
        "existing": [{"id": 1, "text": "User's wife's name is Jane"}],
        "new_facts": ["User's wife's name is Anne"],
    }
    assert not UUID.search(json.dumps(stack.upstream.chat_requests()))

    query = pb.SearchRequest(tenant="acme", query="wife's name", conversation_id="c1", user_id="u1")
    assert [h.memory.id for h in (await stack.retrieval.search(query)).hits] == [anne.id]
    query.include_superseded = True
    assert {h.memory.id for h in (await stack.retrieval.search(query)).hits} == {anne.id, jane.id}

    changes = [(c.op, c.memory.id, c.cause, c.related_ids) for c in await stack.changes()]
    assert changes == [
        ("created", jane.id, "reconcile:ADD", []),
        ("created", anne.id, "reconcile:UPDATE", [jane.id]),
        ("superseded", jane.id, "reconcile:UPDATE", [anne.id]),
    ]


async def test_love_then_hate_leaves_exactly_one_current_fact(stack: Stack) -> None:
    await stack.start()
    await stack.propose(1, "User loves pizza")
    await stack.propose(2, "User hates pizza")

    assert await stack.texts() == ["User hates pizza"]
    [hates] = await stack.facts()
    loves = next(m for m in await stack.facts(superseded=True) if m.text == "User loves pizza")
    assert loves.superseded_by == hates.id
    assert from_timestamp(loves.valid_to) == turn_time(2)
    assert hates.metadata["decision"] == "DELETE"
    query = pb.SearchRequest(
        tenant="acme", query="pizza", user_id="u1", conversation_id="c1", include_superseded=True
    )
    assert loves.id in {h.memory.id for h in (await stack.retrieval.search(query)).hits}


async def test_an_unrelated_fact_leaves_the_old_ones_untouched(stack: Stack) -> None:
    await stack.start()
    await stack.propose(1, "User loves pizza")
    [before] = await stack.facts()
    await stack.propose(2, "User works as a nurse")

    assert await stack.texts() == ["User loves pizza", "User works as a nurse"]
    after = {m.id: m for m in await stack.facts()}
    assert after[before.id] == before  # not even rewritten
    assert [(c.op, c.memory.text) for c in await stack.changes()] == [
        ("created", "User loves pizza"),
        ("created", "User works as a nurse"),
    ]


async def test_the_same_fact_told_twice_is_stored_once(stack: Stack) -> None:
    await stack.start()
    await stack.propose(1, "User likes green tea")
    await stack.propose(2, "User likes green tea.")  # the model: NONE
    await stack.propose(3, "The user likes green tea")  # the model: ADD; cosine 0.98
    await stack.propose(4, "User likes green tea", conversation="c2")  # the user's other chat
    assert await stack.texts() == ["User likes green tea"]
    assert len(await stack.facts(superseded=True)) == 1


async def test_statements_that_differ_in_a_number_or_name_are_not_duplicates(
    stack: Stack,
) -> None:
    await stack.start()
    await stack.propose(1, "User loves painting number 1")
    await stack.propose(2, "User loves painting number 2")  # cosine 0.91
    await stack.propose(3, "User loves painting number 2.")  # the same again
    assert await stack.texts() == ["User loves painting number 1", "User loves painting number 2"]
    assert specifics("User\u2019s son Tom is 5") == {"tom", "5"}
    assert specifics("The user likes green tea") == specifics("User likes green tea") == set()


async def test_a_less_confident_profile_value_never_replaces_a_surer_one(stack: Stack) -> None:
    await stack.start()

    async def profile() -> list[tuple[str, float]]:
        reply = await stack.retrieval.list(
            pb.ListRequest(
                tenant="acme",
                filter=pb.MemoryFilter(
                    user_id="u1", kinds=[pb.MEMORY_KIND_PROFILE], include_superseded=True
                ),
            )
        )
        return sorted(
            (
                m.profile.value + ("" if not m.superseded_by else " (superseded)"),
                round(m.profile.confidence, 2),
            )
            for m in reply.memories
        )

    await stack.propose(1, profile=[name("Robert", 0.95)])
    await stack.propose(2, profile=[name("Rob", 0.4)])  # less sure: dropped
    assert await profile() == [("Robert", 0.95)]
    await stack.propose(3, profile=[name("Bob", 0.95)])  # as sure: replaces
    assert await profile() == [("Bob", 0.95), ("Robert (superseded)", 0.95)]
    await stack.propose(4, profile=[name("Bob", 0.99)])  # the same value, surer: raised
    assert await profile() == [("Bob", 0.99), ("Robert (superseded)", 0.95)]
    await stack.propose(5, profile=[name("Robert", 0.99)])  # true again: a new version
    assert await profile() == [
        ("Bob (superseded)", 0.99),
        ("Robert", 0.99),
        ("Robert (superseded)", 0.95),
    ]

    search = await stack.retrieval.search(
        pb.SearchRequest(tenant="acme", query="name", user_id="u1", conversation_id="c1")
    )
    [active] = search.profile
    assert (active.text, active.profile.key) == ("identity/name: Robert", "name")
    ops = []
    for change in await stack.changes():
        assert change.memory.profile is not None, change
        ops.append((change.op, change.memory.profile.value, change.cause))
    assert ops == [
        ("created", "Robert", "reconcile:profile"),
        ("created", "Bob", "reconcile:profile"),
        ("superseded", "Robert", "reconcile:profile"),
        ("updated", "Bob", "reconcile:profile"),
        ("created", "Robert", "reconcile:profile"),
        ("superseded", "Bob", "reconcile:profile"),
    ]


async def test_a_correction_in_another_conversation_of_the_user_supersedes(stack: Stack) -> None:
    await stack.start()
    await stack.propose(1, "User's wife's name is Jane", conversation="c1")
    await stack.propose(2, "User's wife's name is Anne", conversation="c2")
    await stack.propose(3, "User's wife's name is Beth", conversation="c3", user="u2")
    assert await stack.texts(user_id="u1") == ["User's wife's name is Anne"]
    assert await stack.texts(user_id="u2") == ["User's wife's name is Beth"]  # not u1's
    [jane] = [m for m in await stack.facts(superseded=True) if "Jane" in m.text]
    assert jane.conversation_id == "c1" and jane.superseded_by


# --- the model's answers, checked --------------------------------------------------------


async def test_a_decision_about_an_unknown_id_is_rejected(stack: Stack) -> None:
    stack.upstream.replies = [
        scripted_reconcile('{"decisions": [{"fact": 0, "event": "UPDATE", "target": 99}]}')
    ]
    await stack.start()
    await stack.propose(1, "User loves pizza")
    await stack.propose(2, "User lives in Lisbon")
    assert await stack.texts() == ["User lives in Lisbon", "User loves pizza"]
    assert len(await stack.facts(superseded=True)) == 2


async def test_a_delete_alone_still_stores_the_new_fact(stack: Stack) -> None:
    stack.upstream.replies = [
        scripted_reconcile('{"decisions": [{"fact": 0, "event": "DELETE", "target": 1}]}')
    ]
    await stack.start()
    await stack.propose(1, "User has a dog")
    await stack.propose(2, "User no longer has a dog")
    assert await stack.texts() == ["User no longer has a dog"]


async def test_junk_from_the_model_adds_the_new_facts(stack: Stack) -> None:
    stack.upstream.replies = [scripted_reconcile("Sure! Here is what I think: nothing.")]
    await stack.start()
    await stack.propose(1, "User loves pizza")
    await stack.propose(2, "User works as a nurse", "User loves pizza.")
    assert len(stack.reconcile_inputs()) == 2  # asked, and asked again
    # Nothing lost, and the near-duplicate check still holds.
    assert await stack.texts() == ["User loves pizza", "User works as a nurse"]
    nurse = next(m for m in await stack.facts() if "nurse" in m.text)
    assert nurse.metadata["decision"] == "FALLBACK"
    assert await dead_letter_count(stack.nats_url, "reconcile") == 0


def failing_then_brain(failures: list[str]):
    """Reconcile calls fail as scripted (a status, or "timeout"), then the brain answers."""
    brain = RuleBasedBrain()
    pending = list(failures)

    def answer(body: dict[str, Any]) -> Any:
        if pending:
            failure = pending.pop(0)
            if failure == "timeout":
                # Blocks the upstream past the client's 0.5 s, but not past the retry.
                time.sleep(0.7)
            else:
                return UpstreamError(int(failure))
        return brain(body)

    return scripted_reconcile(answer)


async def test_errors_and_timeouts_are_retried_until_the_model_answers(stack: Stack) -> None:
    stack.upstream.replies = [failing_then_brain(["500", "timeout", "429"])]
    await stack.start(llm_timeout_s=0.5, max_deliver=5, retry_backoff_s=(0.2,))
    await stack.propose(1, "User loves pizza")
    await stack.propose(2, "User hates pizza")
    assert len(stack.reconcile_inputs()) == 4
    assert await stack.texts() == ["User hates pizza"]
    assert await dead_letter_count(stack.nats_url, "reconcile") == 0


async def test_a_model_down_until_the_retry_horizon_falls_back_to_add(stack: Stack) -> None:
    stack.upstream.replies = [scripted_reconcile(UpstreamError(503))]
    await stack.start(**HORIZON_AFTER_TWO_DELIVERIES)
    await stack.propose(1, "User loves pizza")
    await stack.propose(2, "User hates pizza")
    assert len(stack.reconcile_inputs()) == 2
    assert await stack.texts() == ["User hates pizza", "User loves pizza"]  # nothing lost
    assert await dead_letter_count(stack.nats_url, "reconcile") == 0


# --- idempotency and concurrency --------------------------------------------------------


async def test_a_redelivery_after_the_changes_were_applied_changes_nothing(stack: Stack) -> None:
    async def apply_then_fail_once(event: FactProposed, delivery: Delivery) -> None:
        await reconcile_facts(event, delivery)
        if delivery.attempt == 1:
            raise RetryableError("lost the ack after applying")

    await stack.start(replace(RECONCILE, handle=apply_then_fail_once))
    await stack.propose(1, "User's wife's name is Jane", profile=[name("Jane", 0.9, "wife_name")])
    later = await stack.propose(
        2, "User's wife's name is Anne", profile=[name("Anne", 0.9, "wife_name")]
    )
    # The same proposal once more, as a new message (a re-extracted turn, much later).
    await publish_event(stack.broker, later.model_copy(update={"event_id": "again"}))
    await stack.settled()

    assert len(stack.reconcile_inputs()) == 1  # the redeliveries did not even ask
    assert await stack.texts() == ["User's wife's name is Anne"]
    assert len(await stack.facts(superseded=True)) == 2
    changes = await stack.changes()
    assert len({c.event_id for c in changes}) == len(changes) == 6  # announced once each
    assert sorted((c.op, c.memory.kind) for c in changes) == [
        ("created", "fact"),
        ("created", "fact"),
        ("created", "profile"),
        ("created", "profile"),
        ("superseded", "fact"),
        ("superseded", "profile"),
    ]


async def test_two_replicas_never_add_the_same_fact_twice(stack: Stack) -> None:
    await stack.start(worker_concurrency=4)
    await stack.start(worker_concurrency=4)
    paraphrases = [
        "User likes green tea",
        "The user likes green tea",
        "User really likes green tea",
        "User likes green tea a lot",
        "User likes drinking green tea",
        "User enjoys green tea",
    ]
    for n, text in enumerate(paraphrases * 2, start=1):
        await stack.propose(n, text, settle=False)
    await stack.settled()
    assert len(await stack.facts(superseded=True)) == 1


# --- through ingest -------------------------------------------------------------------------


async def test_turns_through_ingest_and_reconcile(stack: Stack) -> None:
    await stack.workers.start(
        INGEST,
        IngestSettings(
            nats_url=stack.nats_url,
            retrieval_address=stack.retrieval_address,
            health_port=0,
            llm_base_url=stack.upstream.base_url,
            llm_timeout_s=2.0,
        ),
    )
    await stack.start()
    said = [
        "My wife's name is Jane.",
        "Hello!",
        "I love pizza!",
        "Sorry, I misspoke: my wife's name is Anne.",
        "I hate pizza.",
    ]
    for n, text in enumerate(said, start=1):
        await publish_event(
            stack.broker,
            TurnPersisted(
                tenant="acme",
                user_id="u1",
                conversation_id="c1",
                turn_id=f"t-{n}",
                role="user",
                text=text,
                created_at=turn_time(n),
                model="gpt-test",
            ),
        )
        await stack.settled("ingest")
        await stack.settled()
    assert await stack.texts() == ["User hates pizza", "User's wife's name is Anne"]
    search = await stack.retrieval.search(
        pb.SearchRequest(tenant="acme", query="wife", user_id="u1", conversation_id="c1")
    )
    assert [m.text for m in search.profile] == ["identity/wife_name: Anne"]


# --- the installed entry point ----------------------------------------------------------------


def ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as reply:
            return reply.status == 200
    except OSError:
        return False


async def test_engram_reconcile_runs_and_stops_on_sigterm(stack: Stack, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENGRAM_", "OTEL_"))}
    env.update(
        ENGRAM_NATS_URL=stack.nats_url,
        ENGRAM_RETRIEVAL_ADDRESS=stack.retrieval_address,
        ENGRAM_HEALTH_PORT=str(port),
        ENGRAM_LLM_BASE_URL=stack.upstream.base_url,
        ENGRAM_LOG_FORMAT="json",
    )
    log_path = tmp_path / "reconcile.log"
    with log_path.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            str(Path(sys.executable).parent / "engram-reconcile"),
            env=env,
            stdout=log_file,
            stderr=log_file,
        )
    try:
        await eventually(lambda: asyncio.to_thread(ready, port), 30, "/readyz")
        await stack.propose(1, "User loves pizza")
        await stack.propose(2, "User hates pizza")
        assert await stack.texts() == ["User hates pizza"]
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    output = log_path.read_text()
    assert "pizza" not in output  # memory text is never logged
    assert json.loads(output.splitlines()[-1])["event"] == "worker.stopped"


@pytest.mark.parametrize("followed", [False, True, None])
async def test_only_a_proposal_that_may_be_followed_is_looked_up_in_the_status_store(
    stack: Stack, monkeypatch: pytest.MonkeyPatch, followed: bool | None
) -> None:
    calls: list[str] = []

    async def spy(self: EventStatusStore, tenant: str, event_id: str, **_: Any) -> None:
        calls.append(event_id)

    monkeypatch.setattr(EventStatusStore, "update_if_followed", spy)
    await stack.start()
    event = await stack.propose(1, "User loves pizza", followed=followed)
    assert await stack.texts() == ["User loves pizza"]
    assert calls == ([] if followed is False else [event.event_id])
