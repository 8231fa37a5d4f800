"""JetStream plumbing shared by the gateway (publisher) and every worker (consumers).

The stream is declared here once. Every process checks it at startup: a missing
stream is created, a conflicting one (other subjects, storage or replicas) stops the
process with a clear error instead of silently running against the wrong stream.
"""

from __future__ import annotations

from collections.abc import Mapping

import nats
from faststream.nats import NatsBroker, PubAck, StorageType, StreamConfig
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from nats.js.errors import NotFoundError

from engram_core.events import DUPLICATE_WINDOW_S, STREAM_NAME, STREAM_SUBJECTS, Event

PUBLISH_TIMEOUT_S = 5.0


class StreamConfigConflict(RuntimeError):
    """The ENGRAM stream exists with a configuration Engram did not declare."""


def stream_config(replicas: int = 1) -> StreamConfig:
    return StreamConfig(
        name=STREAM_NAME,
        subjects=list(STREAM_SUBJECTS),
        storage=StorageType.FILE,
        num_replicas=replicas,
        duplicate_window=DUPLICATE_WINDOW_S,
    )


def nats_servers(url: str) -> list[str]:
    return [part.strip() for part in url.split(",") if part.strip()]


async def ensure_stream(nats_url: str, replicas: int = 1) -> None:
    """Create the stream if missing; fail loudly if it exists with a different shape."""
    wanted = stream_config(replicas)
    nc = await nats.connect(servers=nats_servers(nats_url), connect_timeout=5,
                            max_reconnect_attempts=0)
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(STREAM_NAME)
        except NotFoundError:
            await js.add_stream(wanted)
            return
        have = info.config
        problems = []
        if sorted(have.subjects or []) != sorted(wanted.subjects or []):
            problems.append(f"subjects {have.subjects} != {wanted.subjects}")
        if have.storage != wanted.storage:
            problems.append(f"storage {have.storage} != {wanted.storage}")
        if (have.num_replicas or 1) != wanted.num_replicas:
            problems.append(f"replicas {have.num_replicas} != {wanted.num_replicas}")
        if problems:
            raise StreamConfigConflict(
                f"JetStream stream {STREAM_NAME!r} exists with a conflicting configuration: "
                + "; ".join(problems)
            )
    finally:
        await nc.close()


def make_broker(nats_url: str, *, client_name: str) -> NatsBroker:
    """A FastStream NATS broker with OpenTelemetry context propagation on publish/consume."""
    return NatsBroker(
        nats_servers(nats_url),
        name=client_name,
        middlewares=[NatsTelemetryMiddleware()],
    )


async def publish_event(
    broker: NatsBroker, event: Event, *, headers: Mapping[str, str] | None = None
) -> PubAck:
    """Publish and wait for the JetStream ack ("persisted" means acknowledged)."""
    return await broker.publish(
        event.model_dump(mode="json"),
        subject=event.subject,
        headers={**(headers or {}), "Nats-Msg-Id": event.event_id},
        stream=STREAM_NAME,
        timeout=PUBLISH_TIMEOUT_S,
    )
