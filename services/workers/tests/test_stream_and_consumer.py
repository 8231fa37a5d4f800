"""The stream check and consumer declaration in engram_core.bus, against a real server."""

from __future__ import annotations

import nats
import pytest
from nats.js.api import ConsumerConfig, StorageType, StreamConfig

from engram_core.bus import StreamConfigConflict, ensure_consumer, ensure_stream
from engram_core.events import DUPLICATE_WINDOW_S, STREAM_NAME

pytestmark = pytest.mark.integration


async def stream_config(nats_url: str) -> StreamConfig:
    nc = await nats.connect(nats_url)
    try:
        return (await nc.jetstream().stream_info(STREAM_NAME)).config
    finally:
        await nc.close()


async def add_stream(nats_url: str, **config: object) -> None:
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
    assert config.duplicate_window == DUPLICATE_WINDOW_S


@pytest.mark.parametrize(
    ("existing", "problem"),
    [
        ({"subjects": ["other.>"]}, "subjects"),
        ({"subjects": ["engram.>"], "storage": StorageType.MEMORY}, "storage"),
        ({"subjects": ["engram.>"], "duplicate_window": 1.0}, "duplicate_window"),
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
