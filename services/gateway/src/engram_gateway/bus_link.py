"""The gateway's link to JetStream: the stream check, the broker's connection, the
event-status bucket and the lock bucket (changes of one memory are serialised across
pods: :mod:`engram_core.memory_ops`), brought up without making start-up depend on them.

The first attempt runs during start-up: a stream with a conflicting configuration
stops the gateway there (exit 3), as bad configuration should. When NATS (or the node
holding the bucket) is unreachable instead, the gateway starts all the same, answers
``/readyz`` with 503 naming what it waits for, and keeps trying in the background with
backoff; chats that need the bus meanwhile get 503, as they would during an outage.
"""

from __future__ import annotations

import asyncio
from contextlib import suppress

from faststream.nats import NatsBroker

from engram_core.bus import ensure_stream, open_bucket
from engram_core.event_status import EVENTS_BUCKET, EVENTS_TTL_S, EventStatusStore
from engram_core.locks import LOCK_BUCKET, KeyLocks
from engram_core.logging import get_logger
from engram_core.retry import is_transient, retry_transient
from engram_gateway.errors import SERVICE_UNAVAILABLE, GatewayError
from engram_gateway.settings import GatewaySettings

log = get_logger(__name__)


class BusLink:
    def __init__(self, settings: GatewaySettings, broker: NatsBroker) -> None:
        self.settings = settings
        self.broker = broker
        self._statuses: EventStatusStore | None = None
        self._locks: KeyLocks | None = None
        self._task: asyncio.Task[None] | None = None
        self._broker_started = False
        #: What the link waits for, while it is not up ("" once it is).
        self.waiting_for = "stream"

    @property
    def ready(self) -> bool:
        return self._statuses is not None and self._locks is not None

    @property
    def statuses(self) -> EventStatusStore:
        if self._statuses is None:
            raise self._unavailable()
        return self._statuses

    @property
    def locks(self) -> KeyLocks:
        if self._locks is None:
            raise self._unavailable()
        return self._locks

    def _unavailable(self) -> GatewayError:
        return GatewayError(
            503,
            f"The event bus is not available yet (waiting for the {self.waiting_for}); "
            "retry later.",
            type=SERVICE_UNAVAILABLE,
            code="event_bus_unavailable",
        )

    async def start(self) -> None:
        """One attempt now (a non-transient failure is raised), then in the background."""
        try:
            await self._bring_up()
        except Exception as exc:
            if not is_transient(exc):
                raise
            log.warning(
                "gateway.bus_unavailable",
                waiting_for=self.waiting_for,
                error=f"{type(exc).__name__}: {exc}",
            )
            self._task = asyncio.create_task(self._keep_trying())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with suppress(asyncio.CancelledError):
                await self._task

    async def _keep_trying(self) -> None:
        def report(exc: BaseException, pause: float) -> None:
            log.info(
                "gateway.bus_retry",
                waiting_for=self.waiting_for,
                error=f"{type(exc).__name__}: {exc}",
                delay_s=round(pause, 2),
            )

        try:
            await retry_transient(self._bring_up, budget_s=None, on_retry=report, max_delay_s=5.0)
        except Exception as exc:  # a conflict appeared meanwhile: say so, stay not ready
            log.error("gateway.bus_failed", error=f"{type(exc).__name__}: {exc}")
            return
        log.info("gateway.bus_ready")

    async def _bring_up(self) -> None:
        settings = self.settings
        self.waiting_for = "stream"
        await ensure_stream(
            settings.nats_url,
            settings.stream_replicas,
            settings.retry_policy.duplicate_window_s,
        )
        if not self._broker_started:
            self.waiting_for = "connection"
            await self.broker.start()
            self._broker_started = True
        self.waiting_for = f"key-value bucket {EVENTS_BUCKET}"
        kv = await open_bucket(
            self.broker.connection.jetstream(timeout=5.0),
            EVENTS_BUCKET,
            ttl_s=EVENTS_TTL_S,
            replicas=settings.stream_replicas,
        )
        self._statuses = EventStatusStore(kv)
        self.waiting_for = f"key-value bucket {LOCK_BUCKET}"
        lock_kv = await open_bucket(
            self.broker.connection.jetstream(timeout=5.0),
            LOCK_BUCKET,
            ttl_s=settings.lock_ttl_s,
            replicas=settings.stream_replicas,
        )
        self._locks = KeyLocks(
            lock_kv,
            self.broker.connection,
            ttl_s=settings.lock_ttl_s,
            wait_s=settings.lock_wait_s,
        )
        self.waiting_for = ""
