"""The runtime every Engram worker shares, so that a worker is one handler and one spec.

A worker is described by a :class:`WorkerSpec` (its name, the event it consumes and an
async handler) and configured by a subclass of :class:`WorkerSettings`. The runtime
owns everything else:

- the JetStream stream check and a durable **pull** consumer named after the worker
  (every replica binds the same consumer, so running more copies shares the load);
- explicit acknowledgement: ack on success; a retryable failure is nacked with a delay
  from ``retry_backoff_s`` chosen by the delivery count; after ``max_deliver``
  deliveries, or at once for a malformed payload or a :class:`PermanentError`, the
  message is published to ``engram.dlq.<worker>`` as a :class:`DeadLetter` and then
  terminated, so nothing is redelivered forever nor dropped silently;
- per-message log context (``event_id``, ``tenant``, ``conversation_id``; trace ids
  come from the consumer span that continues the publisher's trace);
- metrics: events processed/redelivered/dead-lettered by worker and subject, and the
  consumer's pending count (``engram.consumer.pending``, refreshed every
  ``metrics_refresh_s`` and on every scrape);
- the retrieval gRPC client, a ``/healthz`` + ``/readyz`` + ``/metrics`` endpoint, and a clean
  SIGTERM/SIGINT shutdown (stop fetching, let in-flight handlers finish, drain the
  connection, close clients, flush spans).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager, suppress
from dataclasses import dataclass
from typing import Annotated, Any, Generic, TypeVar

import structlog
from faststream import FastStream
from faststream.middlewares import AckPolicy
from faststream.nats import JStream, PubAck, PullSub
from faststream.nats.annotations import NatsMessage
from nats.js.api import AckPolicy as ConsumerAckPolicy
from nats.js.api import ConsumerConfig, DeliverPolicy
from opentelemetry import trace
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Status, StatusCode
from pydantic import Field, ValidationError, field_validator
from pydantic_settings import NoDecode

from engram_core import metrics, semconv
from engram_core.bus import (
    PUBLISH_TIMEOUT_S,
    ensure_consumer,
    ensure_stream,
    make_broker,
    publish_event,
)
from engram_core.events import STREAM_NAME, DeadLetter, Event, dlq_subject
from engram_core.logging import get_logger
from engram_core.memory_port import MemoryPort, RetrievalError
from engram_core.observability import setup_observability
from engram_core.retrieval_client import RetrievalClient
from engram_core.settings import EngramSettings, load_settings
from engram_core.telemetry import instrument_grpc_client
from engram_workers.health import HealthServer

__all__ = [
    "Delivery",
    "PermanentError",
    "RetryableError",
    "Worker",
    "WorkerSettings",
    "WorkerSpec",
    "describe_validation_error",
    "retry_delay",
    "run_worker",
]

log = get_logger(__name__)

E = TypeVar("E", bound=Event)

#: The server-side MaxDeliver is this much above ours. The runtime dead-letters at
#: ``max_deliver``; the margin only matters when a delivery ended without any answer
#: (crash, ack_wait expired): the next delivery is then dead-lettered before the
#: handler runs, instead of the server giving up on the message silently.
SERVER_MAX_DELIVER_MARGIN = 2

#: Workers alive in this process (tests run several), for the pending gauge's callback.
_live_workers: weakref.WeakSet[Worker[Any]] = weakref.WeakSet()


def _observe_pending(_: CallbackOptions) -> list[Observation]:
    return [
        Observation(worker.pending, {semconv.ENGRAM_WORKER: worker.spec.name})
        for worker in list(_live_workers)
        if worker.pending is not None
    ]


metrics.meter.create_observable_gauge(
    semconv.METRIC_CONSUMER_PENDING,
    callbacks=[_observe_pending],
    unit="{message}",
    description="Messages on the worker's subject not yet delivered to its durable consumer "
    "(JetStream num_pending).",
)


class WorkerSettings(EngramSettings):
    """Variables every worker understands (each worker subclasses it)."""

    max_deliver: int = Field(
        default=5,
        ge=1,
        le=100,
        description="Deliveries of one message before it goes to the dead-letter subject.",
    )
    retry_backoff_s: Annotated[tuple[float, ...], NoDecode] = Field(
        default=(1.0, 5.0, 30.0, 120.0),
        description="Redelivery delay after the 1st, 2nd, ... failure, comma-separated "
        "seconds; the last value repeats.",
    )
    ack_wait_s: float = Field(
        default=60.0,
        gt=0,
        description="Redeliver a message not acknowledged within this time. A running "
        "handler keeps its message alive, so this only bounds a crashed one.",
    )
    worker_concurrency: int = Field(
        default=4, ge=1, le=256, description="Messages handled at once by this process."
    )
    fetch_timeout_s: float = Field(
        default=5.0, gt=0, description="How long one pull request waits for messages."
    )
    health_host: str = Field(
        default="127.0.0.1",
        description="Bind address of the health endpoint (0.0.0.0 in a pod, for the kubelet).",
    )
    health_port: int = Field(
        default=0, ge=0, le=65535, description="Port of /healthz and /readyz; 0 disables."
    )
    metrics_refresh_s: float = Field(
        default=15.0,
        gt=0,
        description="How often the consumer's pending count (engram.consumer.pending) is "
        "read from JetStream; a /metrics scrape also refreshes it.",
    )
    shutdown_grace_s: float = Field(
        default=20.0,
        ge=0,
        description="On SIGTERM, wait this long for in-flight messages before closing.",
    )

    @field_validator("retry_backoff_s", mode="before")
    @classmethod
    def _split_backoff(cls, value: object) -> object:
        if isinstance(value, str):
            text = value.strip()
            return json.loads(text) if text.startswith("[") else text.split(",")
        return value

    @field_validator("retry_backoff_s")
    @classmethod
    def _check_backoff(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if not value:
            raise ValueError("needs at least one delay")
        if any(delay < 0 for delay in value):
            raise ValueError("delays must be >= 0")
        return value


class RetryableError(Exception):
    """A transient failure: the message is redelivered after the backoff delay."""


class PermanentError(Exception):
    """Retrying cannot help: the message goes to the dead-letter subject at once."""


def retry_delay(backoff: Sequence[float], attempt: int) -> float:
    """Delay before redelivering after failed delivery number ``attempt`` (1-based)."""
    return backoff[min(max(attempt, 1), len(backoff)) - 1]


def describe_validation_error(exc: ValidationError) -> str:
    """Field locations and messages only: the input may be user text and is never logged."""
    parts = []
    for error in exc.errors(include_url=False, include_context=False, include_input=False):
        location = ".".join(str(part) for part in error["loc"]) or "body"
        parts.append(f"{location}: {error['msg']}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Delivery:
    """One delivery of one message, as its handler sees it."""

    worker: Worker[Any]
    subject: str
    attempt: int  # 1 on the first delivery
    headers: Mapping[str, str]

    @property
    def retrieval(self) -> RetrievalClient:
        return self.worker.retrieval

    @property
    def memories(self) -> MemoryPort:
        """The retrieval port: memories in domain types; failures raise RetrievalError,
        which the runtime retries or dead-letters by its ``retryable`` flag."""
        return self.worker.memories

    @property
    def resources(self) -> Any:
        """What the spec's ``resources`` factory yielded (LLM client, locks, ...)."""
        return self.worker.resources


@dataclass(frozen=True)
class WorkerSpec(Generic[E]):
    """What makes a worker itself; the runtime provides the rest.

    ``handle`` returns normally to acknowledge, raises :class:`PermanentError` to
    dead-letter at once, and raises anything else to be retried (bounded by
    ``max_deliver``). It must be idempotent: a message can be delivered more than once.
    """

    name: str  # durable consumer, dead-letter subject engram.dlq.<name>, service engram-<name>
    event: type[E]
    handle: Callable[[E, Delivery], Awaitable[None]]
    uses_retrieval: bool = True
    #: Opened at startup (after NATS and retrieval), closed after the consumer stopped;
    #: what it yields is ``Delivery.resources``.
    resources: Callable[[Worker[Any]], AbstractAsyncContextManager[Any]] | None = None

    @property
    def service_name(self) -> str:
        return f"engram-{self.name}"


class Worker(Generic[E]):
    """One worker process: a FastStream app around one durable pull consumer.

    Build it inside the event loop; :meth:`serve` runs it until a stop event.
    """

    def __init__(self, spec: WorkerSpec[E], settings: WorkerSettings) -> None:
        self.spec = spec
        self.settings = settings
        self.dlq_subject = dlq_subject(spec.name)
        # Patches channel construction, so it must precede the retrieval channel.
        instrument_grpc_client()
        self.broker = make_broker(
            settings.nats_url,
            client_name=spec.service_name,
            graceful_timeout=settings.shutdown_grace_s,
        )
        self._retrieval: RetrievalClient | None = None
        self._memories: MemoryPort | None = None
        self._resources_stack = AsyncExitStack()
        self.resources: Any = None
        self._consuming = False
        #: The durable consumer's num_pending at the last refresh (None: not read yet).
        self.pending: int | None = None
        self._pending_task: asyncio.Task[None] | None = None
        self.health = (
            HealthServer(
                settings.health_host, settings.health_port, self.readiness, self.metrics_text
            )
            if settings.health_port
            else None
        )
        self._subscribe()
        self.app = FastStream(
            self.broker,
            logger=None,
            on_startup=[self._on_startup],
            after_startup=[self._after_startup],
            on_shutdown=[self._on_shutdown],
            after_shutdown=[self._after_shutdown],
        )

    # -- what handlers use ---------------------------------------------------------

    @property
    def retrieval(self) -> RetrievalClient:
        if self._retrieval is None:
            raise RuntimeError(f"worker {self.spec.name!r} has no retrieval client")
        return self._retrieval

    @property
    def memories(self) -> MemoryPort:
        if self._memories is None:
            raise RuntimeError(f"worker {self.spec.name!r} has no retrieval client")
        return self._memories

    async def publish(self, event: Event) -> PubAck:
        """Publish a follow-up event; it continues the current trace."""
        return await publish_event(self.broker, event)

    # -- lifecycle -----------------------------------------------------------------

    def consumer_config(self) -> ConsumerConfig:
        return ConsumerConfig(
            name=self.spec.name,
            durable_name=self.spec.name,
            description=f"Engram {self.spec.name} worker",
            filter_subject=self.spec.event.subject,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=ConsumerAckPolicy.EXPLICIT,
            ack_wait=self.settings.ack_wait_s,
            max_deliver=self.settings.max_deliver + SERVER_MAX_DELIVER_MARGIN,
        )

    async def serve(self, stop: asyncio.Event) -> None:
        """Start, consume until ``stop`` is set, then shut down (also after a failed start)."""
        try:
            await self.app.start()
            await stop.wait()
            log.info("worker.stopping", worker=self.spec.name)
        finally:
            await self.app.stop()
            log.info("worker.stopped", worker=self.spec.name)

    @property
    def consuming(self) -> bool:
        return self._consuming

    async def readiness(self) -> dict[str, bool]:
        checks = {
            "consuming": self._consuming,
            "nats": await self.broker.ping(timeout=1.0),
        }
        if self.spec.uses_retrieval:
            client = self._retrieval
            # A probe every few seconds is not a trace anyone wants to read.
            with suppress_instrumentation():
                serving = client is not None and await client.is_serving(timeout_s=1.0)
            checks["retrieval"] = serving
        return checks

    async def refresh_pending(self) -> None:
        """Read the consumer's pending count from JetStream (lag, for the gauge)."""
        try:
            info = await self.broker.connection.jetstream().consumer_info(
                STREAM_NAME, self.spec.name, timeout=1.0
            )
        except Exception as exc:  # NATS away: keep the last value, readiness tells the rest
            log.debug("consumer.pending_unavailable", error=f"{type(exc).__name__}: {exc}")
            return
        self.pending = info.num_pending

    async def metrics_text(self) -> tuple[bytes, str]:
        """The ``/metrics`` body: this process's metrics, with a fresh pending count."""
        if self._consuming:
            with suppress_instrumentation():
                await self.refresh_pending()
        return metrics.prometheus_exposition()

    async def _refresh_pending_forever(self) -> None:
        while True:
            with suppress_instrumentation():
                await self.refresh_pending()
            await asyncio.sleep(self.settings.metrics_refresh_s)

    async def _on_startup(self) -> None:
        # Alive (and saying why it is not ready) while waiting on NATS and the stream.
        if self.health is not None:
            await self.health.start()
        await ensure_stream(self.settings.nats_url, self.settings.stream_replicas)
        info = await ensure_consumer(self.settings.nats_url, self.consumer_config())
        if self.spec.uses_retrieval:
            self._retrieval = RetrievalClient(self.settings.retrieval_address)
            self._memories = MemoryPort(self._retrieval)
        if self.spec.resources is not None:
            self.resources = await self._resources_stack.enter_async_context(
                self.spec.resources(self)
            )
        log.info(
            "worker.consumer_ready",
            worker=self.spec.name,
            subject=self.spec.event.subject,
            pending=info.num_pending,
            max_deliver=self.settings.max_deliver,
            retry_backoff_s=list(self.settings.retry_backoff_s),
        )

    async def _after_startup(self) -> None:
        self._consuming = True
        _live_workers.add(self)
        self._pending_task = asyncio.create_task(self._refresh_pending_forever())
        log.info(
            "worker.started", worker=self.spec.name, concurrency=self.settings.worker_concurrency
        )

    async def _on_shutdown(self) -> None:
        self._consuming = False
        _live_workers.discard(self)
        if self._pending_task is not None:
            self._pending_task.cancel()
            with suppress(asyncio.CancelledError):
                await self._pending_task
            self._pending_task = None

    async def _after_shutdown(self) -> None:
        # The broker has stopped (in-flight handlers done, connection drained).
        await self._resources_stack.aclose()
        self.resources = None
        if self._retrieval is not None:
            await self._retrieval.close()
            self._retrieval = None
            self._memories = None
        if self.health is not None:
            await self.health.stop()

    # -- consuming -----------------------------------------------------------------

    def _subscribe(self) -> None:
        concurrency = self.settings.worker_concurrency
        subscriber = self.broker.subscriber(
            self.spec.event.subject,
            # Declared and checked by ensure_stream, never by FastStream (it would merge subjects).
            stream=JStream(STREAM_NAME, declare=False),
            durable=self.spec.name,
            config=self.consumer_config(),
            pull_sub=PullSub(batch_size=concurrency, timeout=self.settings.fetch_timeout_s),
            max_workers=concurrency if concurrency > 1 else None,
            ack_policy=AckPolicy.MANUAL,
            title=f"{self.spec.name}:{self.spec.event.subject}",
        )
        subscriber(self._on_message)

    async def _on_message(self, message: NatsMessage) -> None:
        meta = message.raw_message.metadata
        attempt = meta.num_delivered or 1
        span = trace.get_current_span()
        span.set_attributes(
            {semconv.ENGRAM_WORKER: self.spec.name, semconv.ENGRAM_DELIVERY: attempt}
        )
        if attempt > 1:
            metrics.events_redelivered.add(1, self._metric_attributes(message))
        with structlog.contextvars.bound_contextvars(
            worker=self.spec.name, attempt=attempt, stream_seq=meta.sequence.stream
        ):
            try:
                event = self.spec.event.model_validate_json(message.body)
            except ValidationError as exc:
                await self._dead_letter(
                    message, attempt, f"malformed event: {describe_validation_error(exc)}"
                )
                return
            span.set_attributes(
                {semconv.ENGRAM_EVENT_ID: event.event_id, semconv.ENGRAM_TENANT: event.tenant}
            )
            with structlog.contextvars.bound_contextvars(
                event_id=event.event_id,
                tenant=event.tenant,
                conversation_id=event.conversation_id,
            ):
                await self._handle(message, event, attempt)

    async def _handle(self, message: NatsMessage, event: E, attempt: int) -> None:
        if attempt > self.settings.max_deliver:
            await self._dead_letter(
                message,
                attempt,
                f"no outcome after {attempt - 1} deliveries (handler crashed or exceeded ack_wait)",
            )
            return
        delivery = Delivery(
            worker=self,
            subject=message.raw_message.subject,
            attempt=attempt,
            headers=message.headers,
        )
        started = time.perf_counter()
        try:
            async with self._keep_in_progress(message):
                await self.spec.handle(event, delivery)
        except PermanentError as exc:
            await self._dead_letter(message, attempt, str(exc))
            return
        except RetrievalError as exc:
            if not exc.retryable:  # a request retrieval refuses will be refused again
                await self._dead_letter(message, attempt, str(exc))
                return
            await self._retry_or_dead_letter(message, attempt, RetryableError(str(exc)))
            return
        except Exception as exc:
            await self._retry_or_dead_letter(message, attempt, exc)
            return
        await message.ack()
        metrics.events_processed.add(1, self._metric_attributes(message))
        log.debug("message.acked", duration_ms=round((time.perf_counter() - started) * 1e3, 1))

    async def _retry_or_dead_letter(
        self, message: NatsMessage, attempt: int, exc: Exception
    ) -> None:
        reason = str(exc) if isinstance(exc, RetryableError) else f"{type(exc).__name__}: {exc}"
        if attempt >= self.settings.max_deliver:
            await self._dead_letter(
                message, attempt, f"gave up after {attempt} deliveries: {reason}"
            )
            return
        delay = retry_delay(self.settings.retry_backoff_s, attempt)
        trace.get_current_span().set_status(Status(StatusCode.ERROR, reason))
        log.warning(
            "message.retry_scheduled",
            reason=reason,
            delay_s=delay,
            max_deliver=self.settings.max_deliver,
            # A bug, not a flaky dependency: keep the traceback.
            exc_info=not isinstance(exc, RetryableError),
        )
        await message.nack(delay=delay)

    async def _dead_letter(self, message: NatsMessage, attempt: int, reason: str) -> None:
        raw = message.raw_message
        letter = DeadLetter(
            worker=self.spec.name,
            subject=raw.subject,
            reason=reason,
            deliveries=attempt,
            original_headers=dict(raw.headers or {}),
            original_body=message.body.decode("utf-8", errors="replace"),
        )
        trace.get_current_span().set_status(Status(StatusCode.ERROR, reason))
        try:
            await self.broker.publish(
                letter.model_dump(mode="json"),
                subject=self.dlq_subject,
                # The same message dead-lettered twice (a lost term) is stored once.
                headers={"Nats-Msg-Id": f"{self.spec.name}:{raw.metadata.sequence.stream}"},
                stream=STREAM_NAME,
                timeout=PUBLISH_TIMEOUT_S,
            )
        except Exception:
            # Not acknowledged, so not lost: it comes back and is dead-lettered then.
            log.exception("message.dead_letter_failed", reason=reason)
            await message.nack(delay=retry_delay(self.settings.retry_backoff_s, attempt))
            return
        await message.reject()  # term: never redelivered
        metrics.events_dead_lettered.add(1, self._metric_attributes(message))
        log.error("message.dead_lettered", reason=reason, dlq_subject=self.dlq_subject)

    def _metric_attributes(self, message: NatsMessage) -> dict[str, str]:
        return {
            semconv.ENGRAM_WORKER: self.spec.name,
            semconv.MESSAGING_DESTINATION_NAME: message.raw_message.subject,
        }

    @asynccontextmanager
    async def _keep_in_progress(self, message: NatsMessage) -> AsyncIterator[None]:
        """Tell the server the message is still being worked on, so ack_wait never
        expires under a slow but live handler and hands it to another replica."""

        async def beat() -> None:
            interval = self.settings.ack_wait_s / 3
            while True:
                await asyncio.sleep(interval)
                try:
                    await message.in_progress()
                except Exception as exc:  # the connection is gone; ack_wait takes over
                    log.debug("message.in_progress_failed", error=str(exc))
                    return

        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            task.cancel()
            with suppress(asyncio.CancelledError):
                await task


async def _serve_until_signalled(spec: WorkerSpec[Any], settings: WorkerSettings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await Worker(spec, settings).serve(stop)


def run_worker(spec: WorkerSpec[Any], settings_cls: type[WorkerSettings]) -> None:
    """A worker's ``main``: settings, logging, tracing, then serve until SIGTERM/SIGINT."""
    settings = load_settings(settings_cls)
    telemetry = setup_observability(spec.service_name, settings)
    try:
        asyncio.run(_serve_until_signalled(spec, settings))
    except Exception as exc:
        # Start-up failures (NATS unreachable, StreamConfigConflict, ...) end the process
        # non-zero with the reason on one log line; the supervisor decides what next.
        log.error(
            "worker.failed", worker=spec.name, error=f"{type(exc).__name__}: {exc}", exc_info=True
        )
        raise SystemExit(1) from None
    finally:
        telemetry.shutdown()
