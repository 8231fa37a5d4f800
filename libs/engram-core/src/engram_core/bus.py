"""JetStream plumbing shared by the gateway (publisher) and every worker (consumers).

The stream is declared here once. Every process checks it at startup: a missing
stream is created, a conflicting one (other subjects, storage, replicas, retention or
a duplicate window too short for de-duplication) stops the process with a clear error
instead of silently running against the wrong stream. FastStream's own stream
declaration is never used: it would quietly merge subjects into whatever exists.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import nats
from faststream.nats import NatsBroker, PubAck, StorageType, StreamConfig
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, ConsumerInfo, KeyValueConfig, RetentionPolicy
from nats.js.errors import NotFoundError
from nats.js.kv import KeyValue

from engram_core import metrics, semconv
from engram_core.events import (
    DUPLICATE_WINDOW_S,
    STREAM_NAME,
    STREAM_SUBJECTS,
    Event,
    MemoryChanged,
)
from engram_core.messaging_telemetry import NatsTracingMiddleware
from engram_core.settings import parse_nats_urls

PUBLISH_TIMEOUT_S = 5.0
CONNECT_TIMEOUT_S = 5.0


class StreamConfigConflict(RuntimeError):
    """The ENGRAM stream exists with a configuration Engram did not declare."""


def stream_config(replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=STREAM_NAME,
        subjects=list(STREAM_SUBJECTS),
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        num_replicas=replicas,
        duplicate_window=DUPLICATE_WINDOW_S,
    )


def nats_servers(url: str) -> list[str]:
    """The server URLs of ``ENGRAM_NATS_URL`` (:func:`engram_core.settings.parse_nats_urls`)."""
    return parse_nats_urls(url)


@asynccontextmanager
async def key_value_bucket(
    nats_url: str, bucket: str, *, ttl_s: float
) -> AsyncIterator[tuple[Client, KeyValue]]:
    """A connection and the JetStream key-value ``bucket`` (created when absent, one
    value per key, file storage, entries expire after ``ttl_s``); closed on exit.
    Processes racing to create it all succeed: creating an identical bucket is a no-op.
    """
    nc = await nats.connect(servers=nats_servers(nats_url), max_reconnect_attempts=-1)
    try:
        js = nc.jetstream()
        try:
            kv = await js.key_value(bucket)
        except NotFoundError:
            kv = await js.create_key_value(
                KeyValueConfig(bucket=bucket, history=1, ttl=ttl_s, storage=StorageType.FILE)
            )
        yield nc, kv
    finally:
        await nc.close()


@asynccontextmanager
async def admin_connection(nats_url: str) -> AsyncIterator[Client]:
    """A short-lived connection for declarations and admin commands that fails fast:
    each server of the list is tried (twice) and then the connect gives up.

    nats-py retries an initial connect forever when ``max_reconnect_attempts`` is 0;
    1 makes it drop a server after its second failed attempt.
    """

    async def quiet(_: Exception) -> None:  # the caller reports the outcome
        return None

    nc = await nats.connect(
        servers=nats_servers(nats_url),
        connect_timeout=CONNECT_TIMEOUT_S,
        max_reconnect_attempts=1,
        reconnect_time_wait=0.2,
        allow_reconnect=False,
        error_cb=quiet,
    )
    try:
        yield nc
    finally:
        await nc.close()


def _stream_problems(have: StreamConfig, wanted: StreamConfig) -> list[str]:
    problems = []
    if sorted(have.subjects or []) != sorted(wanted.subjects or []):
        problems.append(f"subjects {have.subjects} != {wanted.subjects}")
    if have.storage != wanted.storage:
        problems.append(f"storage {have.storage} != {wanted.storage}")
    if (have.num_replicas or 1) != wanted.num_replicas:
        problems.append(f"replicas {have.num_replicas} != {wanted.num_replicas}")
    # Work-queue or interest retention would let one worker's ack delete another's message.
    if (have.retention or RetentionPolicy.LIMITS) != RetentionPolicy.LIMITS:
        problems.append(f"retention {have.retention} != {RetentionPolicy.LIMITS}")
    # Shorter than ours and a re-published event could be stored (and handled) twice.
    if (have.duplicate_window or 0) < wanted.duplicate_window:
        problems.append(f"duplicate_window {have.duplicate_window}s < {wanted.duplicate_window}s")
    return problems


async def ensure_stream(nats_url: str, replicas: int = 1) -> None:
    """Create the stream if missing; fail loudly if it exists with a different shape.

    Idempotent: safe to call from every process at every start.
    """
    wanted = stream_config(replicas)
    async with admin_connection(nats_url) as nc:
        js = nc.jetstream()
        try:
            info = await js.stream_info(STREAM_NAME)
        except NotFoundError:
            # Two processes racing here both succeed: creating an identical stream is a no-op.
            await js.add_stream(wanted)
            return
        if problems := _stream_problems(info.config, wanted):
            raise StreamConfigConflict(
                f"JetStream stream {STREAM_NAME!r} exists with a conflicting configuration: "
                + "; ".join(problems)
            )


async def ensure_consumer(nats_url: str, config: ConsumerConfig) -> ConsumerInfo:
    """Create a durable consumer on the stream, or update the editable fields of an existing one.

    Binding alone (what nats-py does when the durable already exists) would keep the
    settings of whichever process created it first, so a changed ``max_deliver`` or
    ``ack_wait`` would never take effect.
    """
    async with admin_connection(nats_url) as nc:
        # Without an explicit action the server creates or updates (nats-server >= 2.10).
        return await nc.jetstream().add_consumer(STREAM_NAME, config=config)


def make_broker(
    nats_url: str, *, client_name: str, graceful_timeout: float | None = None
) -> NatsBroker:
    """A FastStream NATS broker with trace context propagation on publish/consume
    (:class:`~engram_core.messaging_telemetry.NatsTracingMiddleware`).

    ``graceful_timeout``: on stop, wait up to this long for in-flight handlers to finish
    (consumers set it; a publisher-only process does not need it).

    FastStream's own logger would print coloured text to stdout; a plain stdlib logger
    sends its lines through the process's structlog formatter instead. Its per-message
    "Received"/"Processed" lines go to DEBUG: handlers log their own outcome.
    """
    return NatsBroker(
        nats_servers(nats_url),
        name=client_name,
        middlewares=[NatsTracingMiddleware],
        graceful_timeout=graceful_timeout,
        # A long-running service must survive a NATS restart of any length: keep
        # reconnecting (readiness reports the outage meanwhile) instead of giving up.
        max_reconnect_attempts=-1,
        logger=logging.getLogger("faststream.nats"),
        log_level=logging.DEBUG,
    )


async def publish_event(
    broker: NatsBroker, event: Event, *, headers: Mapping[str, str] | None = None
) -> PubAck:
    """Publish and wait for the JetStream ack ("persisted" means acknowledged).

    An acknowledged :class:`MemoryChanged` counts in ``engram.memories.changed`` (by the
    memory's kind and the op): counted where changes are announced, so every producer
    (workers and the gateway's memory API) is covered once, whoever consumes them.
    """
    ack = await broker.publish(
        event.model_dump(mode="json"),
        subject=event.subject,
        headers={**(headers or {}), "Nats-Msg-Id": event.event_id},
        stream=STREAM_NAME,
        timeout=PUBLISH_TIMEOUT_S,
    )
    if isinstance(event, MemoryChanged) and not getattr(ack, "duplicate", False):
        metrics.memories_changed.add(
            1, {semconv.ENGRAM_MEMORY_KIND: event.memory.kind, semconv.ENGRAM_MEMORY_OP: event.op}
        )
    return ack
