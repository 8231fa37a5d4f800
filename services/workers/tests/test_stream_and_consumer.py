"""The stream check and consumer declaration in engram_core.bus, against a real server."""

from __future__ import annotations

import asyncio
from typing import Any

import nats
import pytest
from nats.js.api import ConsumerConfig, StorageType, StreamConfig

from engram_core.bus import (
    StreamConfigConflict,
    ensure_consumer,
    ensure_stream,
    key_value_bucket,
)
from engram_core.events import STREAM_NAME
from engram_core.retry import RetryPolicy

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
