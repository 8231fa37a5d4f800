"""A followed event says when a task took its fallback because the model's answers were
unusable (issue 36): ingest's ends ``skipped`` with the reason, reconcile's ``applied``
(every fact added) with it. A real nats-server, the real retrieval service, the workers
in-process and the scripted upstream in a reply style no parser can use."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest

from engram_cli.stack.reply_styles import styled
from engram_cli.stack.scripted_llm import RuleBasedBrain, ScriptedUpstream
from engram_core.bus import make_broker, publish_event
from engram_core.event_status import EventStatus, EventStatusStore
from engram_core.events import FactProposed, TurnPersisted
from engram_testing.waiting import eventually
from engram_testing.worker_stack import RealRetrieval, WorkerStack, consumer_settled, current_facts
from engram_workers.ingest import INGEST, IngestSettings
from engram_workers.reconcile import RECONCILE, ReconcileSettings

pytestmark = pytest.mark.integration

SAID_AT = datetime(2026, 3, 1, 12, tzinfo=UTC)


@pytest.fixture
async def statuses(nats_url: str) -> AsyncIterator[EventStatusStore]:
    async with EventStatusStore.connect(nats_url) as store:
        yield store


@pytest.fixture
async def broker(nats_url: str):
    running = make_broker(nats_url, client_name="test-fallback-status")
    await running.connect()
    try:
        yield running
    finally:
        await running.stop()


def llm(upstream: ScriptedUpstream) -> dict[str, Any]:
    return {"llm_base_url": upstream.base_url, "llm_timeout_s": 2.0, "llm_model": "small-model"}


async def settled(nats_url: str, durable: str) -> None:
    await eventually(lambda: consumer_settled(nats_url, durable), what=f"{durable} idle")


async def test_an_extraction_that_fell_back_says_skipped_with_the_reason(
    nats_url: str,
    workers: WorkerStack,
    scripted_upstream: ScriptedUpstream,
    statuses: EventStatusStore,
    broker,
) -> None:
    scripted_upstream.replies = [styled(RuleBasedBrain(), "refusal")]
    await workers.start(INGEST, IngestSettings(**workers.common(), **llm(scripted_upstream)))
    turn = TurnPersisted(
        tenant="acme",
        user_id="u1",
        conversation_id="c1",
        turn_id="t-1",
        role="user",
        text="My kayak is called Zephyr.",
        created_at=SAID_AT,
        followed=True,
    )
    await statuses.register("acme", turn.event_id)
    await publish_event(broker, turn)
    await settled(nats_url, "ingest")

    status = await statuses.get("acme", turn.event_id)
    assert status is not None and status.status == "skipped"
    assert "unusable (small-model)" in status.fallback
    assert status.fallback in status.reason and "reextract" in status.reason


async def test_a_reconcile_that_fell_back_applies_the_facts_and_says_why(
    nats_url: str,
    retrieval: RealRetrieval,
    workers: WorkerStack,
    scripted_upstream: ScriptedUpstream,
    statuses: EventStatusStore,
    broker,
) -> None:
    scripted_upstream.replies = [styled(RuleBasedBrain(), "truncated")]
    settings = ReconcileSettings(**workers.common(), **llm(scripted_upstream))
    await workers.start(RECONCILE, settings)

    def proposal(n: int, fact: str, **fields: object) -> FactProposed:
        return FactProposed(
            tenant="acme",
            user_id="u1",
            conversation_id="c1",
            source_turn_id=f"turn-{n}",
            turn_created_at=SAID_AT,
            facts=[fact],
            **fields,
        )

    # nothing similar stored yet: added without asking, so no fallback to report
    first = proposal(1, "User's kayak is called Zephyr", followed=True)
    await statuses.register("acme", first.event_id)
    await publish_event(broker, first)
    await settled(nats_url, "reconcile")
    applied = await statuses.get("acme", first.event_id)
    assert applied is not None and applied.status == "applied" and applied.fallback == ""

    second = proposal(2, "User's kayak is called Zephyrus", followed=True)
    await statuses.register("acme", second.event_id)
    await publish_event(broker, second)
    await settled(nats_url, "reconcile")

    status = await statuses.get("acme", second.event_id)
    assert status is not None and status.status == "applied"
    assert "unusable (small-model)" in status.fallback
    assert "cut at the token limit" in status.fallback
    facts = await current_facts(retrieval.client, "acme")
    assert sorted(m.text for m in facts) == [
        "User's kayak is called Zephyr",
        "User's kayak is called Zephyrus",
    ]  # nothing lost


def test_a_status_without_a_fallback_is_stored_as_before_the_field_existed() -> None:
    status = EventStatus(status="pending", stage="ingest")
    assert b"fallback" not in status.stored()
    before = b'{"status":"applied","stage":null,"accepted_at":null,"applied_at":null,'
    before += b'"follow_up":"","reason":""}'
    assert EventStatus.model_validate_json(before).fallback == ""
    fell_back = status.applied("reconcile: the model's answer was unusable")
    assert EventStatus.model_validate_json(fell_back.stored()) == fell_back
