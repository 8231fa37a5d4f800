"""``engram dlq`` and ``engram_core.dead_letters`` against a real nats-server: a turn the
ingest worker dead-lettered (the LLM refused the request) is replayed once the model is
fixed and learned once; filters select what is listed and dropped; a replay after the
duplicate window keeps the original event id."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from datetime import timedelta

import nats
import pytest
from nats.js.api import StorageType, StreamConfig

from engram_cli.main import build_parser
from engram_cli.memory.dlq import dlq_command
from engram_cli.stack.scripted_llm import RuleBasedBrain, ScriptedUpstream, UpstreamError
from engram_core.bus import ensure_stream, make_broker, publish_event
from engram_core.dead_letters import (
    DeadLetterFilter,
    ReplayOutcome,
    list_dead_letters,
    replay_dead_letter,
)
from engram_core.events import (
    STREAM_NAME,
    STREAM_SUBJECTS,
    DeadLetter,
    FactProposed,
    TurnPersisted,
    dlq_subject,
    utcnow,
)
from engram_testing.waiting import eventually
from engram_testing.worker_stack import (
    RealRetrieval,
    WorkerStack,
    consumer_settled,
    dead_letter_count,
    published,
    running_retrieval,
)
from engram_workers.ingest import INGEST, IngestSettings

pytestmark = pytest.mark.integration


def turn(tenant: str = "acme", n: int = 1, text: str = "I love pizza.") -> TurnPersisted:
    return TurnPersisted(
        tenant=tenant,
        user_id="u1",
        conversation_id="c1",
        turn_id=f"t-{n}",
        role="user",
        text=text,
        model="gpt-test",
    )


async def run_cli(*argv: str) -> tuple[int, str]:
    """``engram <argv>`` in a thread (it runs its own event loop); status and stdout."""
    out = io.StringIO()
    args = build_parser().parse_args(list(argv))
    status = await asyncio.to_thread(dlq_command, args, out)
    return status, out.getvalue()


@pytest.fixture
async def retrieval(tmp_path) -> AsyncIterator[RealRetrieval]:
    async with running_retrieval(tmp_path / "retrieval") as running:
        yield running


async def test_a_replayed_dead_letter_is_learned_once(
    nats_url: str, retrieval: RealRetrieval, scripted_upstream: ScriptedUpstream
) -> None:
    scripted_upstream.replies = [UpstreamError(404, "model not found")]
    workers = WorkerStack(nats_url, retrieval.address)
    settings = IngestSettings(
        **workers.common(), llm_base_url=scripted_upstream.base_url, extraction_model="m"
    )
    broker = make_broker(nats_url, client_name="test-publisher")
    await broker.connect()
    try:
        await workers.start(INGEST, settings)
        event = turn()
        await publish_event(broker, event)
        await eventually(lambda: dead_letter_count(nats_url, "ingest"), what="the dead letter")

        status, listed = await run_cli("dlq", "list", "--json", "--nats", nats_url)
        assert status == 0
        [letter] = [json.loads(line) for line in listed.splitlines()]
        assert letter["worker"] == "ingest"
        assert letter["tenant"] == "acme"
        assert letter["event_id"] == event.event_id
        assert "model not found" in letter["reason"]

        scripted_upstream.replies = [RuleBasedBrain()]  # the operator fixed the model
        nc = await nats.connect(nats_url)
        try:
            [stale] = await list_dead_letters(nc.jetstream())
            # inside the duplicate window of the original: replayed under a replay id
            status, summary = await run_cli(
                "dlq", "replay", "--worker", "ingest", "--nats", nats_url
            )
            assert (status, summary.strip()) == (0, "1 replayed")
            [proposal] = await eventually(
                lambda: published(nats_url, FactProposed), what="the facts of the replay"
            )
            assert proposal.facts == ["User loves pizza"]
            # a second replay of the same letter (another operator, a stale list) is dropped
            assert await replay_dead_letter(nc.jetstream(), stale) is (
                ReplayOutcome.ALREADY_REPLAYED
            )
        finally:
            await nc.close()
        await eventually(lambda: consumer_settled(nats_url, "ingest"), what="ingest to settle")
        assert await dead_letter_count(nats_url, "ingest") == 0
        assert len(await published(nats_url, FactProposed)) == 1
        assert len(await published(nats_url, TurnPersisted)) == 2  # the original + one replay
    finally:
        await workers.stop_all()
        await broker.stop()


async def store_letter(
    js, worker: str, event: TurnPersisted, reason: str, age: timedelta = timedelta()
) -> int:
    letter = DeadLetter(
        worker=worker,
        subject=event.subject,
        reason=reason,
        deliveries=1,
        original_headers={"Nats-Msg-Id": event.event_id},
        original_body=event.model_dump_json(),
        failed_at=utcnow() - age,
    )
    ack = await js.publish(dlq_subject(worker), letter.model_dump_json().encode())
    return int(ack.seq)


async def test_filters_select_what_is_listed_and_dropped(nats_url: str) -> None:
    await ensure_stream(nats_url)
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        old = await store_letter(js, "ingest", turn("a", 1), "extraction: 404", timedelta(hours=3))
        await store_letter(js, "ingest", turn("b", 2), "retrieval Upsert failed: INVALID_ARGUMENT")
        await store_letter(js, "reconcile", turn("a", 3), "reconcile: boom")
    finally:
        await nc.close()

    async def ids(*flags: str) -> list[int]:
        status, out = await run_cli("dlq", "list", "--json", "--nats", nats_url, *flags)
        assert status == 0
        return [json.loads(line)["id"] for line in out.splitlines()]

    assert len(await ids()) == 3
    assert await ids("--older-than", "1h") == [old]
    assert len(await ids("--newer-than", "10m")) == 2
    assert len(await ids("--tenant", "a")) == 2
    assert len(await ids("--worker", "reconcile")) == 1
    assert len(await ids("--reason", "invalid_argument")) == 1
    assert len(await ids("--subject", TurnPersisted.subject)) == 3
    assert await ids("--id", str(old), "--worker", "ingest") == [old]

    status, _ = await run_cli("dlq", "drop", "--nats", nats_url)
    assert status == 2  # no selector: refused, nothing dropped
    status, out = await run_cli("dlq", "drop", "--dry-run", "--reason", "404", "--nats", nats_url)
    assert status == 0 and "would drop 1 dead letters" in out
    assert len(await ids()) == 3
    status, out = await run_cli("dlq", "drop", "--older-than", "1h", "--nats", nats_url)
    assert (status, out.strip()) == (0, "1 dropped")
    assert old not in await ids()
    status, out = await run_cli("dlq", "drop", "--all", "--nats", nats_url)
    assert (status, out.strip()) == (0, "2 dropped")
    assert await ids() == []
    status, out = await run_cli("dlq", "list", "--nats", nats_url)
    assert (status, out.strip()) == (0, "no dead letters")


async def test_a_replay_after_the_duplicate_window_keeps_the_event_id(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        # A stream that forgets ids after half a second, so the window can pass in a test.
        await js.add_stream(
            StreamConfig(
                name=STREAM_NAME,
                subjects=list(STREAM_SUBJECTS),
                storage=StorageType.FILE,
                duplicate_window=0.5,
            )
        )
        event = turn()
        original = await js.publish(
            event.subject, event.model_dump_json().encode(), headers={"Nats-Msg-Id": event.event_id}
        )
        letter = DeadLetter(
            worker="ingest",
            subject=event.subject,
            reason="boom",
            deliveries=1,
            original_headers={"Nats-Msg-Id": event.event_id, "traceparent": "00-ab-cd-01"},
            original_body=event.model_dump_json(),
        )
        await js.publish(
            dlq_subject("ingest"),
            letter.model_dump_json().encode(),
            headers={"Nats-Msg-Id": f"ingest:{original.seq}"},
        )
        await asyncio.sleep(0.7)
        [stored] = await list_dead_letters(js, DeadLetterFilter(worker="ingest"))
        assert stored.original_seq == original.seq
        assert await replay_dead_letter(js, stored) is ReplayOutcome.REPLAYED
        replayed = await js.get_last_msg(STREAM_NAME, event.subject)
        assert replayed.seq != original.seq
        assert replayed.headers is not None and replayed.data is not None
        assert replayed.headers["Nats-Msg-Id"] == event.event_id
        assert replayed.headers["traceparent"] == "00-ab-cd-01"
        assert replayed.headers["Engram-Replay-Of"] == str(stored.id)
        assert TurnPersisted.model_validate_json(replayed.data) == event
        assert await list_dead_letters(js) == []
    finally:
        await nc.close()
