"""Batches in the worker runtime: one fetch brings many messages, a batch hook does their
work together, and every message is still settled on its own.

What is checked against a real nats-server: a batch hook sees the pending messages in
one call; a poison message (and a malformed one) in a batch fails alone while its
batch-mates are acknowledged once; the messages of one conversation are handled in
stream order; an ingest process killed with SIGKILL in the middle of a batch loses no
turn and announces none twice (with the real retrieval service). Ingest's and evict's
batch hooks on the port in memory: ``test_ingest_batches.py``.
"""

from __future__ import annotations

import asyncio
import random
import signal
import socket
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import nats
import pytest

from engram_cli.stack.nats_server import free_port
from engram_core.bus import ensure_stream, publish_event
from engram_core.events import STREAM_NAME, MemoryChanged, TurnPersisted
from engram_core.memory import MemoryFilter
from engram_core.memory_port import MemoryPort
from engram_testing.worker_stack import (
    WorkerStack,
    consumer_settled,
    dead_letter_count,
    dead_letters,
    published,
    quick_settings,
)
from engram_workers.ingest import INGEST, IngestSettings
from engram_workers.runtime import (
    BatchItem,
    Delivery,
    Outcome,
    WorkerSettings,
    WorkerSpec,
    outcome_of,
)

from .test_ingest_process import ready, worker_env

pytestmark = pytest.mark.integration

PROBE = "batchprobe"
ENTRY_POINT = Path(sys.executable).parent / "engram-ingest"


def turn(text: str, conversation: str = "c1", turn_id: str | None = None) -> TurnPersisted:
    return TurnPersisted(
        tenant="acme",
        user_id="u1",
        conversation_id=conversation,
        turn_id=turn_id or text,
        role="assistant",  # no extraction: the tests count writes
        text=text,
    )


async def publish_all(publisher, nats_url: str, events: Sequence[TurnPersisted]) -> None:
    await ensure_stream(nats_url)
    for event in events:
        await publish_event(publisher, event)


class Probe:
    """A worker on ``engram.turn.persisted.v1`` that records what it was handed."""

    def __init__(self, poison: str = "") -> None:
        self.poison = poison
        self.batches: list[list[str]] = []
        self.handled: list[TurnPersisted] = []

    async def handle(self, event: TurnPersisted, delivery: Delivery) -> None:
        await asyncio.sleep(random.uniform(0, 0.02))  # finish out of order if let
        if event.text == self.poison:
            raise RuntimeError("poison")
        self.handled.append(event)

    async def handle_batch(self, items: Sequence[BatchItem]) -> list[Outcome]:
        self.batches.append([item.event.text for item in items])
        return [await outcome_of(self.handle(item.event, item.delivery)) for item in items]

    def spec(self, *, batch_hook: bool) -> WorkerSpec:
        return WorkerSpec(
            name=PROBE,
            event=TurnPersisted,
            handle=self.handle,
            handle_batch=self.handle_batch if batch_hook else None,
            uses_retrieval=False,
        )


def probe_settings(nats_url: str, **overrides: object) -> WorkerSettings:
    return WorkerSettings(**{**quick_settings(nats_url), **overrides})


async def test_one_fetch_hands_the_hook_every_pending_message(
    nats_url: str, publisher, eventually
) -> None:
    events = [turn(f"turn {i}") for i in range(10)]
    await publish_all(publisher, nats_url, events)
    probe = Probe()
    stack = WorkerStack(nats_url)
    try:
        await stack.start(probe.spec(batch_hook=True), probe_settings(nats_url, batch_size=16))
        await eventually(lambda: consumer_settled(nats_url, PROBE), what="every ack")
    finally:
        await stack.stop_all()
    assert probe.batches == [[e.text for e in events]]


async def test_a_poison_message_fails_alone_and_its_batch_mates_are_acked_once(
    nats_url: str, publisher, eventually
) -> None:
    events = [turn(f"turn {i}", conversation=f"c{i % 2}") for i in range(6)]
    poison = events[2].text
    await publish_all(publisher, nats_url, events)
    await publisher.publish(b"{not json", subject=TurnPersisted.subject, stream=STREAM_NAME)
    probe = Probe(poison=poison)
    stack = WorkerStack(nats_url)
    try:
        await stack.start(
            probe.spec(batch_hook=True),
            probe_settings(nats_url, batch_size=16, max_deliver=3),
        )
        letters = await eventually(
            lambda: _at_least(dead_letters(nats_url, PROBE), 2), what="two dead letters"
        )
        await eventually(lambda: consumer_settled(nats_url, PROBE), what="every answer")
    finally:
        await stack.stop_all()
    assert Counter(e.text for e in probe.handled) == {e.text: 1 for e in events if e.text != poison}
    by_reason = sorted(letter.reason.split(":")[0] for letter in letters)
    assert by_reason == ["gave up after 3 deliveries", "malformed event"]
    # the poison came back alone: its redeliveries are batches of one
    assert probe.batches[0] == [e.text for e in events]
    assert probe.batches[1:] == [[poison], [poison]]


async def test_the_messages_of_a_conversation_are_handled_in_stream_order(
    nats_url: str, publisher, eventually
) -> None:
    events = [turn(f"{conv} {i}", conversation=conv) for i in range(8) for conv in "abc"]
    await publish_all(publisher, nats_url, events)
    probe = Probe()
    stack = WorkerStack(nats_url)
    try:
        await stack.start(
            probe.spec(batch_hook=False),
            probe_settings(nats_url, batch_size=64, worker_concurrency=8),
        )
        await eventually(lambda: consumer_settled(nats_url, PROBE), what="every ack")
    finally:
        await stack.stop_all()
    for conv in "abc":
        expected = [e.text for e in events if e.conversation_id == conv]
        assert [e.text for e in probe.handled if e.conversation_id == conv] == expected


async def _at_least(letters_coro, count: int):
    letters = await letters_coro
    return letters if len(letters) >= count else None


# --- ingest, killed -------------------------------------------------------------------------


async def test_a_worker_killed_in_the_middle_of_a_batch_loses_and_repeats_nothing(
    workers, publisher, nats_url: str, retrieval, tmp_path: Path, eventually
) -> None:
    """The process stores the batch's turns, then hangs on the extraction model (a
    socket that never answers) with every message of the batch unacknowledged: SIGKILL.
    The next worker gets the batch after ack_wait: every turn stored once, every
    announcement once."""
    events = [
        turn(f"turn {i}", conversation=f"c{i % 4}").model_copy(update={"role": "user"})
        for i in range(12)
    ]
    await publish_all(publisher, nats_url, events)
    silent_model = socket.socket()
    silent_model.bind(("127.0.0.1", 0))
    silent_model.listen(64)
    port = free_port()
    env = worker_env(nats_url, retrieval.address, tmp_path, port)
    env.update(
        ENGRAM_ACK_WAIT_S="2",
        ENGRAM_BATCH_SIZE="16",
        ENGRAM_BATCH_MAX_WAIT_MS="500",  # the whole backlog in one batch, even under load
        ENGRAM_LLM_BASE_URL=f"http://127.0.0.1:{silent_model.getsockname()[1]}/v1",
        ENGRAM_LLM_MODEL="silent",
    )
    process = await asyncio.create_subprocess_exec(
        str(ENTRY_POINT),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await eventually(lambda: asyncio.to_thread(ready, port), 30, "/readyz")

        async def mid_batch() -> bool:
            info = await _consumer(nats_url, "ingest")
            announced = await published(nats_url, MemoryChanged)
            # the batch's turns stored and the first announced, its messages all held
            return info.num_ack_pending >= 2 and len(announced) >= 1

        await eventually(mid_batch, 30, "a batch stored, none of it acknowledged")
        process.send_signal(signal.SIGKILL)
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        silent_model.close()
    await workers.start(
        INGEST,
        IngestSettings(
            **{**workers.common(), "ack_wait_s": 2.0}, extraction_enabled=False, batch_size=16
        ),
    )
    await eventually(lambda: consumer_settled(nats_url, "ingest"), 30, "the batch acknowledged")
    stored = [m.text for m in await _turns(retrieval)]
    assert sorted(stored) == sorted(e.text for e in events)
    changes = await published(nats_url, MemoryChanged)
    assert Counter(c.memory.text for c in changes) == {e.text: 1 for e in events}
    assert await dead_letter_count(nats_url, "ingest") == 0


async def _consumer(nats_url: str, durable: str):
    nc = await nats.connect(nats_url)
    try:
        return await nc.jetstream().consumer_info(STREAM_NAME, durable)
    finally:
        await nc.close()


async def _turns(retrieval) -> list:
    memories = MemoryPort(retrieval.client)
    page = await memories.list_page("acme", MemoryFilter(kinds=("turn",)), page_size=100)
    return page.records
