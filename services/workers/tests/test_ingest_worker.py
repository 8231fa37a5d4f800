"""The ingest worker in-process against a real nats-server and the retrieval port in memory."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from datetime import UTC, datetime

import grpc
import pytest

from engram_cli.stack.nats_server import free_port
from engram_core.bus import publish_event
from engram_core.events import STREAM_NAME, TurnPersisted
from engram_testing.worker_stack import HORIZON_AFTER_TWO_DELIVERIES
from engram_workers.ingest import turn_memory_id

pytestmark = pytest.mark.integration

CREATED = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)


def turn(**overrides: object) -> TurnPersisted:
    values: dict[str, object] = {
        "tenant": "acme",
        "user_id": "u1",
        "conversation_id": "c1",
        "turn_id": "t-1",
        "role": "user",
        "text": "I moved to Lisbon last spring.",
        "created_at": CREATED,
        "model": "gpt-test",
        "source_id": "D1:3",
        **overrides,
    }
    return TurnPersisted(**values)


async def test_turn_is_upserted_with_its_fields_and_a_deterministic_id(
    ingest, publisher, eventually
) -> None:
    await ingest.start()
    event = turn()
    await publish_event(publisher, event)

    memories = ingest.memories
    await eventually(lambda: len(memories.upserts) == 1, what="the Upsert")
    call = memories.upserts[0]
    assert call.tenant == "acme"
    [memory] = call.records
    # Pinned: a change would give every stored turn a new id.
    assert (
        memory.id == turn_memory_id("acme", "c1", "t-1") == ("f446aed3-a438-5d8b-9e65-5d41f6fb601a")
    )
    assert memory.kind == "turn"
    assert (memory.role, memory.text) == ("user", "I moved to Lisbon last spring.")
    assert (memory.user_id, memory.conversation_id, memory.source_id) == ("u1", "c1", "D1:3")
    assert memory.created_at == CREATED
    assert memory.metadata == {
        "turn_id": "t-1",
        "event_id": event.event_id,
        "model": "gpt-test",
    }
    await eventually(ingest.settled, what="the ack")
    assert await ingest.dead_letter_count() == 0


async def test_duplicates_never_create_a_second_memory(ingest, publisher, eventually) -> None:
    await ingest.start()
    event = turn()
    first = await publish_event(publisher, event)
    again = await publish_event(publisher, event)  # same event_id: JetStream drops it
    assert not first.duplicate
    assert again.duplicate
    memories = ingest.memories
    await eventually(lambda: len(memories.upserts) == 1, what="the first Upsert")
    # The same turn re-published as a new event (a retried request after the
    # de-duplication window) is delivered again, and recognised as a repeat...
    await publish_event(publisher, turn(event_id="another-event-id"))
    await eventually(ingest.settled, what="the repeat's ack")
    # ...while a new text for the same turn (a regenerated reply) replaces it.
    await publish_event(publisher, turn(event_id="third-event-id", text="Changed my mind."))

    await eventually(lambda: len(memories.upserts) == 2, what="two Upserts")
    await eventually(ingest.settled, what="the acks")
    assert len(memories.upserts) == 2
    assert {m.id for call in memories.upserts for m in call.records} == {
        turn_memory_id("acme", "c1", "t-1")
    }
    [stored] = memories.records("acme")
    assert stored.text == "Changed my mind."


async def test_transient_failure_is_retried_with_backoff(ingest, publisher, eventually) -> None:
    await ingest.start(max_deliver=5, retry_backoff_s=(0.3, 0.6))
    memories = ingest.memories
    memories.fail_upserts_next = [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED]
    await publish_event(publisher, turn())

    await eventually(lambda: len(memories.upserts) == 1, what="the successful Upsert")
    first, second, third = memories.upsert_attempts
    assert second - first >= 0.3 - 0.05
    assert third - second >= 0.6 - 0.05
    await eventually(ingest.settled, what="the ack")
    assert await ingest.dead_letter_count() == 0


async def test_a_dependency_down_longer_than_max_deliver_retries_loses_nothing(
    ingest, publisher, eventually
) -> None:
    """Retried by time, not by count: six UNAVAILABLE answers with max_deliver 3."""
    await ingest.start(max_deliver=3, retry_backoff_s=(0.05,))
    memories = ingest.memories
    memories.fail_upserts_next = [grpc.StatusCode.UNAVAILABLE] * 6
    await publish_event(publisher, turn())

    await eventually(lambda: len(memories.upserts) == 1, what="the Upsert once it answers")
    assert len(memories.upsert_attempts) == 7
    await eventually(ingest.settled, what="the ack")
    assert await ingest.dead_letter_count() == 0


async def test_a_dependency_down_past_the_retry_horizon_is_dead_lettered(
    ingest, publisher, eventually
) -> None:
    await ingest.start(max_deliver=5, **HORIZON_AFTER_TWO_DELIVERIES)
    memories = ingest.memories
    memories.fail_upserts_always = grpc.StatusCode.UNAVAILABLE
    event = turn()
    await publish_event(publisher, event)

    [letter] = await ingest.dead_letters(1)
    assert letter.worker == "ingest"
    assert letter.subject == TurnPersisted.subject
    assert letter.deliveries == 2
    assert "still failing after" in letter.reason
    assert "retry horizon 0.8s" in letter.reason
    assert "UNAVAILABLE" in letter.reason
    assert TurnPersisted.model_validate_json(letter.original_body) == event
    assert letter.original_headers["Nats-Msg-Id"] == event.event_id
    await eventually(ingest.settled, what="the original to be terminated")
    await asyncio.sleep(0.6)  # longer than the backoff: no third attempt comes
    assert len(memories.upsert_attempts) == 2
    assert memories.upserts == []


async def test_an_unexpected_failure_is_dead_lettered_after_max_deliver(
    ingest, publisher, eventually
) -> None:
    await ingest.start(max_deliver=3, retry_backoff_s=(0.1,))
    memories = ingest.memories
    memories.fail_upserts_always = grpc.StatusCode.INTERNAL  # not a "try again"
    await publish_event(publisher, turn())

    [letter] = await ingest.dead_letters(1)
    assert letter.deliveries == 3
    assert "gave up after 3 deliveries" in letter.reason
    assert "INTERNAL" in letter.reason
    await eventually(ingest.settled, what="the original to be terminated")
    await asyncio.sleep(0.3)  # longer than the backoff: no fourth attempt comes
    assert len(memories.upsert_attempts) == 3


async def test_invalid_argument_is_dead_lettered_at_once(ingest, publisher, eventually) -> None:
    await ingest.start(max_deliver=5)
    memories = ingest.memories
    memories.fail_upserts_next = [grpc.StatusCode.INVALID_ARGUMENT]
    await publish_event(publisher, turn())

    [letter] = await ingest.dead_letters(1)
    assert letter.deliveries == 1
    assert "INVALID_ARGUMENT" in letter.reason
    await eventually(ingest.settled, what="the original to be terminated")
    assert len(memories.upsert_attempts) == 1


async def test_malformed_payloads_go_straight_to_the_dead_letter_subject(
    ingest, publisher, eventually
) -> None:
    await ingest.start(max_deliver=5)
    not_json = b"{not json"
    missing_role = turn().model_dump(mode="json")
    del missing_role["role"]
    missing_role["text"] = "private words"
    for body in (not_json, json.dumps(missing_role).encode()):
        await publisher.publish(body, subject=TurnPersisted.subject, stream=STREAM_NAME)

    letters = await ingest.dead_letters(2)
    by_body = {letter.original_body: letter for letter in letters}
    assert by_body[not_json.decode()].reason.startswith("malformed event: body: Invalid JSON")
    role_letter = by_body[json.dumps(missing_role)]
    assert role_letter.reason == "malformed event: role: Field required"
    assert "private words" not in role_letter.reason
    assert all(letter.deliveries == 1 for letter in letters)
    await eventually(ingest.settled, what="both originals to be terminated")
    assert ingest.memories.upsert_attempts == []


async def test_empty_turn_is_acknowledged_without_an_upsert(ingest, publisher, eventually) -> None:
    await ingest.start()
    await publish_event(publisher, turn(text="  \n"))
    await eventually(ingest.settled, what="the ack")
    assert ingest.memories.upsert_attempts == []
    assert await ingest.dead_letter_count() == 0


async def test_a_second_replica_shares_the_durable_consumer(ingest, publisher, eventually) -> None:
    await ingest.start(worker_concurrency=1)
    await ingest.start(worker_concurrency=1)
    for n in range(6):
        await publish_event(publisher, turn(turn_id=f"t-{n}"))
    memories = ingest.memories
    # in batches of any size: two replicas may each fetch several
    await eventually(
        lambda: sum(len(c.records) for c in memories.upserts) == 6, what="six turns upserted"
    )
    await eventually(ingest.settled, what="the acks")
    assert len(memories.records("acme")) == 6


def http_get(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.load(error)


async def test_health_endpoints(ingest) -> None:
    port = free_port()
    await ingest.start(health_port=port, health_host="127.0.0.1")
    base = f"http://127.0.0.1:{port}"

    assert await asyncio.to_thread(http_get, f"{base}/healthz") == (200, {"status": "alive"})
    status, body = await asyncio.to_thread(http_get, f"{base}/readyz")
    assert (status, body) == (
        200,
        {"status": "ready", "checks": {"consuming": True, "nats": True, "retrieval": True}},
    )

    ingest.memories.set_serving(False)
    status, body = await asyncio.to_thread(http_get, f"{base}/readyz")
    assert status == 503
    assert body["checks"] == {"consuming": True, "nats": True, "retrieval": False}
    assert (await asyncio.to_thread(http_get, f"{base}/nope"))[0] == 404


async def test_shutdown_lets_the_in_flight_message_finish(ingest, publisher, eventually) -> None:
    port = free_port()
    running = await ingest.start(health_port=port, health_host="127.0.0.1")
    memories = ingest.memories
    memories.upsert_delay_s = 1.0
    await publish_event(publisher, turn())
    await eventually(lambda: len(memories.upsert_attempts) == 1, what="the Upsert to start")

    await running.shutdown()

    assert len(memories.upserts) == 1  # finished, not cancelled
    assert not running.worker.consuming
    assert await ingest.settled()  # and acknowledged before the connection closed
    with pytest.raises(urllib.error.URLError):
        await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/healthz")


async def test_a_slow_handler_keeps_its_message_past_ack_wait(
    ingest, publisher, eventually
) -> None:
    await ingest.start(ack_wait_s=0.6)
    memories = ingest.memories
    memories.upsert_delay_s = 1.5
    await publish_event(publisher, turn())
    await eventually(lambda: len(memories.upserts) == 1, what="the slow Upsert")
    await eventually(ingest.settled, what="the ack")
    assert len(memories.upsert_attempts) == 1  # not handed out again while still in progress


async def test_a_worker_waits_for_retrieval_before_consuming(ingest, publisher, eventually) -> None:
    """Started before retrieval serves (``engram up``, a pod rescheduled): alive, not
    ready, not consuming; a turn said meanwhile is indexed on its first delivery once
    retrieval serves, instead of failing and waiting out the retry backoff."""
    ingest.memories.set_serving(False)
    worker = ingest.worker()
    stop = asyncio.Event()
    serving = asyncio.create_task(worker.serve(stop))
    try:
        await asyncio.sleep(1.0)  # the stream and consumer are declared before the wait
        await publish_event(publisher, turn())
        await asyncio.sleep(0.5)
        assert not worker.consuming and not serving.done()
        assert ingest.memories.upsert_attempts == []  # nothing tried, nothing naked
        ingest.memories.set_serving(True)
        await eventually(lambda: len(ingest.memories.upserts) == 1, 10, what="the turn")
        assert len(ingest.memories.upsert_attempts) == 1  # the first delivery did it
        assert (await worker.readiness())["retrieval"]
    finally:
        stop.set()
        await asyncio.wait_for(serving, 20)


async def test_a_stop_while_waiting_for_retrieval_ends_the_wait(ingest) -> None:
    ingest.memories.set_serving(False)
    stop = asyncio.Event()
    worker = ingest.worker()
    serving = asyncio.create_task(worker.serve(stop))
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.wait_for(serving, 10)
