"""The stream check and consumer declaration in engram_core.bus, against a real server."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import pytest
from nats.js.api import ConsumerConfig, StorageType, StreamConfig

from engram_core.bus import (
    StreamConfigConflict,
    change_subjects,
    ensure_consumer,
    ensure_stream,
    key_value_bucket,
    publish_event,
)
from engram_core.events import STREAM_NAME, MemoryChanged, MemoryChangeOp
from engram_core.memory import MemoryKindName, MemoryRecord
from engram_core.retry import RetryPolicy
from engram_testing.worker_stack import quick_settings
from engram_workers.evict import EVICT, EvictSettings
from engram_workers.mirror.app import MIRROR, MirrorSettings
from engram_workers.runtime import Worker
from engram_workers.summarize.app import SUMMARIZE, SummarizeSettings

pytestmark = pytest.mark.integration


async def stream_config(nats_url: str) -> StreamConfig:
    nc = await nats.connect(nats_url)
    try:
        return (await nc.jetstream().stream_info(STREAM_NAME)).config
    finally:
        await nc.close()


async def add_stream(nats_url: str, **config: Any) -> None:
    nc = await nats.connect(nats_url)
    try:
        await nc.jetstream().add_stream(StreamConfig(name=STREAM_NAME, **config))
    finally:
        await nc.close()


async def test_ensure_stream_creates_the_stream_and_is_idempotent(nats_url: str) -> None:
    await ensure_stream(nats_url)
    await ensure_stream(nats_url)
    config = await stream_config(nats_url)
    assert config.subjects == ["engram.>"]
    assert config.storage == StorageType.FILE
    # derived from the retry policy: publish retries + timeout + one pass of redeliveries
    assert config.duplicate_window == RetryPolicy().duplicate_window_s == 15 + 5 + 156


async def test_a_short_duplicate_window_is_raised_in_place_and_a_longer_one_kept(
    nats_url: str,
) -> None:
    await add_stream(nats_url, subjects=["engram.>"], duplicate_window=120.0)
    await ensure_stream(nats_url, duplicate_window_s=300.0)
    assert (await stream_config(nats_url)).duplicate_window == 300.0
    await ensure_stream(nats_url, duplicate_window_s=200.0)  # an older process: no lowering
    assert (await stream_config(nats_url)).duplicate_window == 300.0


async def test_more_replicas_than_one_server_can_hold_is_refused_saying_how(
    nats_url: str,
) -> None:
    await ensure_stream(nats_url)
    with pytest.raises(StreamConfigConflict, match="need a NATS cluster") as caught:
        await ensure_stream(nats_url, replicas=3)
    assert "ENGRAM_STREAM_REPLICAS=1" in str(caught.value)
    async with key_value_bucket(nats_url, "ENGRAM_PROBE", ttl_s=60) as (_, kv):
        assert (await kv.status()).bucket == "ENGRAM_PROBE"
    with pytest.raises(StreamConfigConflict, match="KV_ENGRAM_PROBE"):
        async with key_value_bucket(nats_url, "ENGRAM_PROBE", ttl_s=60, replicas=3):
            pass


@pytest.mark.parametrize(
    ("existing", "problem"),
    [
        ({"subjects": ["other.>"]}, "subjects"),
        ({"subjects": ["engram.>"], "storage": StorageType.MEMORY}, "storage"),
    ],
)
async def test_ensure_stream_refuses_a_conflicting_stream(
    nats_url: str, existing: dict[str, object], problem: str
) -> None:
    await add_stream(nats_url, **existing)
    with pytest.raises(StreamConfigConflict, match=problem):
        await ensure_stream(nats_url)


async def test_worker_start_fails_loudly_on_a_conflicting_stream(nats_url: str, ingest) -> None:
    await add_stream(nats_url, subjects=["other.>"])
    with pytest.raises(StreamConfigConflict):
        await ingest.start()


async def test_ensure_consumer_updates_an_existing_consumer(nats_url: str) -> None:
    await ensure_stream(nats_url)

    def config(max_deliver: int) -> ConsumerConfig:
        return ConsumerConfig(
            name="probe",
            durable_name="probe",
            filter_subject="engram.turn.persisted.v1",
            ack_wait=30.0,
            max_deliver=max_deliver,
        )

    assert (await ensure_consumer(nats_url, config(3))).config.max_deliver == 3
    assert (await ensure_consumer(nats_url, config(7))).config.max_deliver == 7


async def test_a_worker_started_without_nats_waits_not_ready_then_consumes(
    nats_server, ingest, eventually
) -> None:
    """No exit, no restart by hand: alive and not ready until NATS can serve it."""
    await asyncio.to_thread(nats_server.stop)
    worker = ingest.worker()
    stop = asyncio.Event()
    serving = asyncio.create_task(worker.serve(stop))
    try:
        await asyncio.sleep(1.5)
        assert not serving.done()
        assert not worker.consuming
        await asyncio.to_thread(nats_server.start)  # same port, same store
        await eventually(lambda: worker.consuming, 20, what="the worker to consume")
        assert (await worker.readiness())["nats"]
    finally:
        stop.set()
        await asyncio.wait_for(serving, 20)


async def test_a_stop_while_waiting_for_nats_ends_the_wait(nats_server, ingest) -> None:
    await asyncio.to_thread(nats_server.stop)
    stop = asyncio.Event()
    serving = asyncio.create_task(ingest.worker().serve(stop))
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.wait_for(serving, 10)  # returns: nothing hangs on the unreachable server


async def test_workers_are_delivered_only_the_memory_changes_they_act_on(
    nats_url: str, publisher
) -> None:
    """Summarize and evict ignore most changes (a summary rewrite, a profile entry):
    their consumers filter on the subjects of the changes they act on, so those are
    never delivered; the mirror takes every change. A change published before
    subjects per kind (on the bare subject) still reaches every one of them, and a
    consumer declared before is updated in place."""
    await ensure_stream(nats_url)

    def change(kind: MemoryKindName, op: MemoryChangeOp) -> MemoryChanged:
        memory = MemoryRecord(id=f"{kind}-{op}", kind=kind, text=f"a {kind}", user_id="u1")
        return MemoryChanged(tenant="t1", user_id="u1", op=op, memory=memory)

    # before the upgrade: evict's consumer on the bare subject, a change waiting there
    await ensure_consumer(
        nats_url,
        ConsumerConfig(
            name="evict", durable_name="evict", filter_subject=MemoryChanged.subject, ack_wait=30
        ),
    )
    from_before = change("fact", "deleted")
    await publisher.publish(
        from_before.model_dump(mode="json"),
        subject=MemoryChanged.subject,
        headers={"Nats-Msg-Id": from_before.event_id},
        stream=STREAM_NAME,
    )
    common = quick_settings(nats_url)
    configs = [
        Worker(SUMMARIZE, SummarizeSettings(**common)).consumer_config(),
        Worker(EVICT, EvictSettings(**common)).consumer_config(),
        Worker(MIRROR, MirrorSettings(**common)).consumer_config(),
    ]
    for config in configs:
        await ensure_consumer(nats_url, config)

    published: list[tuple[MemoryKindName, MemoryChangeOp]] = [
        ("turn", "created"),
        ("fact", "created"),
        ("fact", "superseded"),
        ("summary", "created"),
        ("summary", "superseded"),
        ("profile", "created"),
        ("episode", "created"),
        ("turn", "evicted"),
    ]
    for kind, op in published:
        await publish_event(publisher, change(kind, op))

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        pending = {
            name: (await js.consumer_info(STREAM_NAME, name)).num_pending
            for name in ("summarize", "evict", "mirror")
        }
    finally:
        await nc.close()
    assert pending == {
        # turn and fact created, the fact superseded; the change waiting from before
        "summarize": 3 + 1,
        # a turn, a fact, an episode created (each may take a conversation over its limit)
        "evict": 3 + 1,
        "mirror": 8 + 1,
    }


async def test_while_a_consumer_filters_on_the_bare_subject_only_changes_go_there(
    nats_url: str, publisher
) -> None:
    """A rolling upgrade: an older mirror still consumes ``engram.memory.changed.v1``
    only, and JetStream would never deliver it what it skipped. Changes go on the bare
    subject (which new consumers take too) until no consumer filters that way."""
    await ensure_stream(nats_url)
    await ensure_consumer(
        nats_url,
        ConsumerConfig(
            name="mirror", durable_name="mirror", filter_subject=MemoryChanged.subject, ack_wait=30
        ),
    )
    memory = MemoryRecord(id="f1", kind="fact", text="User has a cat named Miso.")

    async def stored_subject() -> str:
        event = MemoryChanged(tenant="t1", op="created", memory=memory)
        ack = await publish_event(publisher, event)
        nc = await nats.connect(nats_url)
        try:
            return (await nc.jetstream().get_msg(STREAM_NAME, ack.seq)).subject or ""
        finally:
            await nc.close()

    assert await stored_subject() == "engram.memory.changed.v1"
    # the new mirror starts: its consumer takes the bare subject and every kind's
    worker = Worker(MIRROR, MirrorSettings(**quick_settings(nats_url)))
    await ensure_consumer(nats_url, worker.consumer_config())
    assert await stored_subject() == "engram.memory.changed.v1"  # until read again
    change_subjects.forget()
    assert await stored_subject() == "engram.memory.changed.v1.fact.created"
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().consumer_info(STREAM_NAME, "mirror")
    finally:
        await nc.close()
    assert info.num_pending == 3  # every one of them reaches the mirror
