"""The runtime every Engram worker shares, so that a worker is one handler and one spec.

A worker is described by a :class:`WorkerSpec` (its name, the event it consumes and an
async handler) and configured by a subclass of :class:`WorkerSettings`. The runtime
owns everything else:

- the JetStream stream check and a durable **pull** consumer named after the worker
  (every replica binds the same consumer, so running more copies shares the load),
  fetched in batches: up to ``batch_size`` messages, waiting at most
  ``batch_max_wait_ms`` for a batch to fill once a first message is there. A worker
  with a ``handle_batch`` hook does the work of a batch together (ingest: one Get and
  one Upsert for its turns); the others get one ``handle`` call per message. Either
  way the messages of one conversation are handled one after another in stream order,
  conversations side by side (``worker_concurrency`` at once), and each message is
  settled on its own: a poison message never fails its batch-mates;
- explicit acknowledgement per message: ack on success; a failed delivery is nacked with a delay
  from ``retry_backoff_s`` chosen by the delivery count. What says "try again" (a
  dependency down: :func:`engram_core.retry.is_transient`) is retried by *time*, until
  the message is ``retry_horizon_s`` old; anything else unexpected by *count*, until
  delivery ``max_deliver``; a malformed payload or a :class:`PermanentError` at once.
  Then the message is published to ``engram.dlq.<worker>`` as a :class:`DeadLetter`
  and terminated, so nothing is redelivered forever nor dropped silently;
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
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AsyncExitStack,
    asynccontextmanager,
    contextmanager,
    suppress,
)
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import structlog
from faststream import FastStream
from faststream.nats import PubAck
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy as ConsumerAckPolicy
from nats.js.api import ConsumerConfig, DeliverPolicy
from opentelemetry import trace
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import Span, Status, StatusCode
from pydantic import Field, ValidationError

from engram_core import event_loop, metrics, semconv
from engram_core.bus import (
    ensure_consumer,
    ensure_stream,
    make_broker,
    publish_event,
    publish_with_retries,
    until_reachable,
)
from engram_core.dead_letters import REPLAY_HEADER
from engram_core.events import STREAM_NAME, DeadLetter, Event, dlq_subject, event_subject
from engram_core.logging import get_logger
from engram_core.memory_port import MemoryPort, RetrievalError
from engram_core.messaging_telemetry import start_process_span
from engram_core.observability import setup_observability
from engram_core.retrieval_client import RetrievalClient
from engram_core.retry import RetryPolicy, TransientError, backoff_delay, is_transient
from engram_core.settings import EngramSettings, load_settings
from engram_workers.health import HealthServer

__all__ = [
    "BatchItem",
    "Delivery",
    "DependencyUnavailable",
    "Outcome",
    "PermanentError",
    "RetryableError",
    "Worker",
    "WorkerSettings",
    "WorkerSpec",
    "describe_validation_error",
    "outcome_of",
    "retry_delay",
    "run_worker",
]

log = get_logger(__name__)

E = TypeVar("E", bound=Event)
#: A worker's settings class and what its ``resources`` factory yields.
S = TypeVar("S", bound="WorkerSettings")
R = TypeVar("R")
T = TypeVar("T")

#: What became of one message of a batch: ``None`` (done: acknowledged) or what its
#: handling raised (settled as if ``handle`` had raised it).
Outcome = Exception | None

#: The server never gives up on a message (MaxDeliver unlimited): the runtime decides
#: when retrying ends, by time or by count, and dead-letters instead of dropping.
SERVER_MAX_DELIVER = -1

#: The shortest wait for the rest of a batch (``batch_max_wait_ms`` 0): long enough for
#: the server to answer with what it holds.
MIN_BATCH_WAIT_S = 0.002

#: Workers alive in this process (tests run several), for the pending gauge's callback.
_live_workers: weakref.WeakSet[Worker[Any, Any, Any]] = weakref.WeakSet()


def _observe_pending(_: CallbackOptions) -> list[Observation]:
    return [
        Observation(worker.pending, {semconv.ENGRAM_WORKER: worker.spec.name})
        for worker in list(_live_workers)
        if worker.pending is not None
    ]


def _age_s(message: Msg) -> float:
    """Seconds since the message was stored in the stream."""
    stored = message.metadata.timestamp
    if stored is None:
        return 0.0
    return max(0.0, time.time() - stored.timestamp())


def _observe_dead_letters(_: CallbackOptions) -> list[Observation]:
    return [
        Observation(worker.dead_letters, {semconv.ENGRAM_WORKER: worker.spec.name})
        for worker in list(_live_workers)
        if worker.dead_letters is not None
    ]


metrics.meter.create_observable_gauge(
    semconv.METRIC_CONSUMER_PENDING,
    callbacks=[_observe_pending],
    unit="{message}",
    description="Messages on the worker's subject not yet delivered to its durable consumer "
    "(JetStream num_pending).",
)
metrics.meter.create_observable_gauge(
    semconv.METRIC_DEAD_LETTERS,
    callbacks=[_observe_dead_letters],
    unit="{message}",
    description="Dead letters of the worker stored on engram.dlq.<worker> (every tenant), "
    "until replayed or dropped (engram dlq).",
)


class WorkerSettings(EngramSettings):
    """Variables every worker understands (each worker subclasses it)."""

    max_deliver: int = Field(
        default=5,
        ge=1,
        le=100,
        description="Deliveries of a message failing with an unexpected error (not a "
        "dependency saying 'try again') before it goes to the dead-letter subject; also "
        "the deliveries without any outcome (crashed handler) tolerated.",
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
    batch_size: int = Field(
        default=32,
        ge=1,
        le=1024,
        description="Messages fetched at once; a worker with a batch hook (ingest) does "
        "their work together (one embedding run and one Upsert for a batch of turns).",
    )
    batch_max_wait_ms: float = Field(
        default=50.0,
        ge=0,
        le=10_000,
        description="Once a first message is there, wait at most this long for the rest "
        "of a batch; 0: take what is there at once.",
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


class RetryableError(Exception):
    """A failure that may pass: the message is redelivered after the backoff delay
    (by time when it was raised ``from`` an error that says "try again", else by count)."""


class DependencyUnavailable(RetryableError, TransientError):
    """A dependency said "try again": retried until the retry horizon."""


class PermanentError(Exception):
    """Retrying cannot help: the message goes to the dead-letter subject at once."""


def retry_delay(backoff: Sequence[float], attempt: int) -> float:
    """Delay before redelivering after failed delivery number ``attempt`` (1-based)."""
    return backoff_delay(backoff, attempt)


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.1f}s"


def describe_validation_error(exc: ValidationError) -> str:
    """Field locations and messages only: the input may be user text and is never logged."""
    parts = []
    for error in exc.errors(include_url=False, include_context=False, include_input=False):
        location = ".".join(str(part) for part in error["loc"]) or "body"
        parts.append(f"{location}: {error['msg']}")
    return "; ".join(parts)


@dataclass(frozen=True)
class Delivery(Generic[S, R]):
    """One delivery of one message, as its handler sees it (typed by the worker's
    settings ``S`` and resources ``R``)."""

    worker: Worker[Any, S, R]
    subject: str
    attempt: int  # 1 on the first delivery
    headers: Mapping[str, str]
    #: Seconds since the message was stored in the stream (the retry horizon's clock).
    age_s: float = 0.0

    @property
    def replayed(self) -> bool:
        """The message is a replay of a dead letter (``engram dlq replay``): the work
        the worker gave up on is to be done again, not recognised as done."""
        return REPLAY_HEADER in self.headers

    @property
    def last_chance(self) -> bool:
        """Whether a transient failure now would be final (dead-lettered, not retried):
        the next delivery would come after the retry horizon. Handlers with a fallback
        (reconcile, summarize) use it then instead of failing."""
        return self.worker.retry_policy.gives_up(self.age_s, self.attempt)

    @property
    def memories(self) -> MemoryPort:
        """The retrieval port: memories in domain types; failures raise RetrievalError,
        which the runtime retries or dead-letters by its ``retryable`` flag."""
        return self.worker.memories

    @property
    def settings(self) -> S:
        return self.worker.settings

    @property
    def resources(self) -> R:
        """What the spec's ``resources`` factory yielded (LLM client, locks, ...)."""
        return self.worker.resources


@dataclass(frozen=True)
class BatchItem(Generic[E, S, R]):
    """One valid message of a fetched batch, as a batch hook sees it."""

    event: E
    delivery: Delivery[S, R]
    message: Msg
    #: Its ``process <subject>`` span (a child of the publisher's), ended when settled.
    span: Span

    @property
    def conversation(self) -> tuple[str, str, str]:
        """What the runtime keeps in order: (tenant, user_id, conversation_id)."""
        return (self.event.tenant, self.event.user_id, self.event.conversation_id)


@dataclass(frozen=True)
class WorkerSpec(Generic[E, S, R]):
    """What makes a worker itself; the runtime provides the rest.

    ``handle`` returns normally to acknowledge, raises :class:`PermanentError` to
    dead-letter at once, and raises anything else to be retried (until the retry horizon
    for what says "try again", else ``max_deliver`` deliveries). It must be idempotent:
    a message can be delivered more than once.
    """

    name: str  # durable consumer, dead-letter subject engram.dlq.<name>, service engram-<name>
    event: type[E]
    handle: Callable[[E, Delivery[S, R]], Awaitable[None]]
    uses_retrieval: bool = True
    #: Opened at startup (after NATS and retrieval), closed after the consumer stopped;
    #: what it yields is ``Delivery.resources``.
    resources: Callable[[Worker[E, S, R]], AbstractAsyncContextManager[R]] | None = None
    #: Readiness checks of the open resources (a stuck mirror watcher, say), added to
    #: ``/readyz`` beside NATS and retrieval.
    readiness: Callable[[R], Mapping[str, bool]] | None = None
    #: The work of a fetched batch done together (one RPC for many messages): one
    #: :data:`Outcome` per item, in order, each settled as ``handle``'s would be, so a
    #: poison message fails alone. None: ``handle`` per message (:meth:`Worker.each`).
    handle_batch: Callable[[Sequence[BatchItem[E, S, R]]], Awaitable[Sequence[Outcome]]] | None = (
        None
    )
    #: The subjects its consumer filters on; empty: every subject of ``event``. A worker
    #: that ignores most memory changes names those it acts on
    #: (:meth:`MemoryChanged.subjects_where`), so the rest are never delivered to it.
    subjects: tuple[str, ...] = ()

    @property
    def service_name(self) -> str:
        return f"engram-{self.name}"

    @property
    def filter_subjects(self) -> tuple[str, ...]:
        return self.subjects or self.event.consumed_subjects()


#: Opens the memories a worker reads and writes, for as long as it runs.
MemoryPortFactory = Callable[["WorkerSettings"], AbstractAsyncContextManager[MemoryPort]]


class SharedConnection:
    """One NATS connection for every worker of a process (``engram-workers``, ``engram up
    --light``). Each worker keeps its own durable consumer, pull subscription, retries
    and lifecycle, so delivery is that of a process per worker; they share the broker
    (its connection, publisher and tracing middleware). Opened by the first worker ready
    to consume; drained by :func:`~engram_workers.all_in_one.serve_together` after every
    worker stopped."""

    def __init__(self, nats_url: str, *, client_name: str, graceful_timeout: float) -> None:
        self.broker = make_broker(
            nats_url,
            client_name=client_name,
            graceful_timeout=graceful_timeout,
            apply_types=False,
        )
        self._lock = asyncio.Lock()
        self._open = False

    async def open(self) -> None:
        async with self._lock:
            if not self._open:
                await self.broker.start()
                self._open = True

    async def close(self) -> None:
        async with self._lock:
            if self._open:
                self._open = False
                await self.broker.stop()


@asynccontextmanager
async def retrieval_port(settings: WorkerSettings) -> AsyncIterator[MemoryPort]:
    """The retrieval service's memories over gRPC (the channel closed on the way out)."""
    client = RetrievalClient(settings.retrieval_address, keepalive_s=settings.grpc_keepalive_s)
    try:
        yield MemoryPort(client)
    finally:
        await client.close()


class Worker(Generic[E, S, R]):
    """One worker process: a FastStream app around one durable pull consumer.

    Build it inside the event loop; :meth:`serve` runs it until a stop event.
    """

    def __init__(
        self,
        spec: WorkerSpec[E, S, R],
        settings: S,
        *,
        memory_port: MemoryPortFactory = retrieval_port,
        connection: SharedConnection | None = None,
    ) -> None:
        """``memory_port``: where memories come from, the retrieval service unless a
        caller (a test) hands in another port. ``connection``: the NATS connection of
        the process's workers together (None: the worker opens its own)."""
        self.spec = spec
        self.settings = settings
        self._memory_port = memory_port
        self.retry_policy: RetryPolicy = settings.retry_policy
        self.dlq_subject = dlq_subject(spec.name)
        self.connection = connection
        self.broker = (
            connection.broker
            if connection is not None
            else make_broker(
                settings.nats_url,
                client_name=spec.service_name,
                graceful_timeout=settings.shutdown_grace_s,
                apply_types=False,
            )
        )
        self._memories: MemoryPort | None = None
        self._resources_stack = AsyncExitStack()
        self._resources: R | None = None
        self._consuming = False
        #: The durable consumer's num_pending at the last refresh (None: not read yet).
        self.pending: int | None = None
        #: Dead letters stored on this worker's dead-letter subject at the last refresh.
        self.dead_letters: int | None = None
        self._pending_task: asyncio.Task[None] | None = None
        #: Messages fetched and not settled yet, with when they came (for the heartbeat).
        self._in_flight: dict[int, tuple[Msg, float]] = {}
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._consume_task: asyncio.Task[None] | None = None
        self._subscription: JetStreamContext.PullSubscription | None = None
        self.health = (
            HealthServer(
                settings.health_host, settings.health_port, self.readiness, self.metrics_text
            )
            if settings.health_port
            else None
        )
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
    def resources(self) -> R:
        """What the spec's ``resources`` factory yielded; there while the worker runs."""
        if self._resources is None:
            raise RuntimeError(f"worker {self.spec.name!r} has no resources open")
        return self._resources

    @property
    def memories(self) -> MemoryPort:
        if self._memories is None:
            raise RuntimeError(f"worker {self.spec.name!r} has no retrieval client")
        return self._memories

    async def publish(self, event: Event) -> PubAck:
        """Publish a follow-up event (retried for ``publish_retry_s`` with the same
        ``Nats-Msg-Id``); it continues the current trace."""
        return await publish_event(self.broker, event, retry_s=self.retry_policy.publish_retry_s)

    # -- lifecycle -----------------------------------------------------------------

    def consumer_config(self) -> ConsumerConfig:
        subjects = self.spec.filter_subjects
        return ConsumerConfig(
            name=self.spec.name,
            durable_name=self.spec.name,
            description=f"Engram {self.spec.name} worker",
            # One subject as filter_subject: a consumer declared before subjects per
            # kind is updated in place either way (nats-server >= 2.10).
            filter_subject=subjects[0] if len(subjects) == 1 else None,
            filter_subjects=list(subjects) if len(subjects) > 1 else None,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=ConsumerAckPolicy.EXPLICIT,
            ack_wait=self.settings.ack_wait_s,
            max_deliver=SERVER_MAX_DELIVER,
        )

    async def serve(self, stop: asyncio.Event) -> None:
        """Start, consume until ``stop`` is set, then shut down (also after a failed start).
        A stop while start-up still waits for NATS ends the wait."""
        starting = asyncio.create_task(self._start())
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if starting.done():
                starting.result()  # a failed start-up raises here
                await stopping
            log.info("worker.stopping", worker=self.spec.name)
        finally:
            for task in (starting, stopping):
                task.cancel()
                with suppress(asyncio.CancelledError):
                    await task
            await self._stop()
            log.info("worker.stopped", worker=self.spec.name)

    async def _start(self) -> None:
        """The app's start: its start-up hooks around the broker's start (a shared
        connection is opened once, by the first worker to get there)."""
        if self.connection is None:
            await self.app.start()
            return
        await self._on_startup()
        await self.connection.open()
        await self._after_startup()

    async def _stop(self) -> None:
        """The app's stop: its shutdown hooks around the broker's stop (a shared
        connection is drained by its owner once every worker stopped)."""
        if self.connection is None:
            await self.app.stop()
            return
        await self._on_shutdown()
        await self._after_shutdown()

    @property
    def consuming(self) -> bool:
        return self._consuming

    async def readiness(self) -> dict[str, bool]:
        checks = {
            "consuming": self._consuming,
            "nats": await self.broker.ping(timeout=1.0),
        }
        if self.spec.uses_retrieval:
            memories = self._memories
            # A probe every few seconds is not a trace anyone wants to read.
            with suppress_instrumentation():
                serving = memories is not None and await memories.is_serving(timeout_s=1.0)
            checks["retrieval"] = serving
        if self.spec.readiness is not None and self._resources is not None:
            checks.update(self.spec.readiness(self._resources))
        return checks

    async def refresh_pending(self) -> None:
        """Read the consumer's pending count and the dead-letter depth from JetStream
        (lag and dead letters, for the gauges)."""
        js = self.broker.connection.jetstream(timeout=1.0)
        try:
            info = await js.consumer_info(STREAM_NAME, self.spec.name, timeout=1.0)
            stream = await js.stream_info(STREAM_NAME, subjects_filter=self.dlq_subject)
        except Exception as exc:  # NATS away: keep the last value, readiness tells the rest
            log.debug("consumer.pending_unavailable", error=f"{type(exc).__name__}: {exc}")
            return
        self.pending = info.num_pending
        self.dead_letters = sum((stream.state.subjects or {}).values())

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
        # NATS (or the stream's leader) away: wait, not ready, instead of exiting.
        await until_reachable(
            "stream",
            lambda: ensure_stream(
                self.settings.nats_url,
                self.settings.stream_replicas,
                self.retry_policy.duplicate_window_s,
            ),
        )
        info = await until_reachable(
            "consumer", lambda: ensure_consumer(self.settings.nats_url, self.consumer_config())
        )
        if self.spec.uses_retrieval:
            # Closed after the resources (the stack unwinds last in, first out).
            self._memories = await self._resources_stack.enter_async_context(
                self._memory_port(self.settings)
            )
            # Consuming sooner would only nack the first messages and wait out their
            # backoff: a turn said just after start-up would be learned seconds late.
            await self._memories.until_serving()
        if self.spec.resources is not None:
            self._resources = await self._resources_stack.enter_async_context(
                self.spec.resources(self)
            )
        log.info(
            "worker.consumer_ready",
            worker=self.spec.name,
            subjects=list(self.spec.filter_subjects),
            pending=info.num_pending,
            max_deliver=self.settings.max_deliver,
            retry_backoff_s=list(self.retry_policy.backoff_s),
            retry_horizon_s=self.retry_policy.horizon_s,
        )

    async def _after_startup(self) -> None:
        js = self.broker.connection.jetstream()
        subscription = await js.pull_subscribe_bind(durable=self.spec.name, stream=STREAM_NAME)
        self._stopping.clear()
        self._subscription = subscription
        self._consume_task = asyncio.create_task(self._consume_until_stopped(subscription))
        self._consuming = True
        _live_workers.add(self)
        self._pending_task = asyncio.create_task(self._refresh_pending_forever())
        self._heartbeat_task = asyncio.create_task(self._keep_in_progress_forever())
        log.info(
            "worker.started",
            worker=self.spec.name,
            concurrency=self.settings.worker_concurrency,
            batch_size=self.settings.batch_size,
            batch_max_wait_ms=self.settings.batch_max_wait_ms,
            event_loop=event_loop.running_loop_name(),
        )

    async def _on_shutdown(self) -> None:
        self._consuming = False
        _live_workers.discard(self)
        if self._pending_task is not None:
            self._pending_task.cancel()
            with suppress(asyncio.CancelledError):
                await self._pending_task
            self._pending_task = None
        await self._stop_consuming()

    async def _stop_consuming(self) -> None:
        """Stop fetching; the batch being handled gets ``shutdown_grace_s`` to finish
        (its messages not started yet go back at once). What is cut off past the grace
        is not acknowledged: redelivered after ack_wait, never lost."""
        self._stopping.set()
        task, self._consume_task = self._consume_task, None
        if task is None:
            return
        try:
            await asyncio.wait_for(task, timeout=self.settings.shutdown_grace_s)
        except TimeoutError:
            log.warning("worker.shutdown_grace_exceeded", grace_s=self.settings.shutdown_grace_s)
        except Exception:
            log.exception("worker.consumer_failed")
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            # Before the connection drains: a pending pull request would hold it.
            with suppress(Exception):
                await subscription.unsubscribe()

    async def _after_shutdown(self) -> None:
        # The broker has stopped (the batch in hand settled, connection drained).
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            with suppress(asyncio.CancelledError):
                await self._heartbeat_task
            self._heartbeat_task = None
        await self._resources_stack.aclose()
        self._resources = None
        self._memories = None
        if self.health is not None:
            await self.health.stop()

    # -- consuming -----------------------------------------------------------------

    async def _consume_until_stopped(self, subscription: JetStreamContext.PullSubscription) -> None:
        """Fetch a batch, handle it, settle every message of it; again until the stop."""
        stopped = asyncio.create_task(self._stopping.wait())
        try:
            while not self._stopping.is_set():
                fetching = asyncio.create_task(self._fetch(subscription))
                await asyncio.wait({fetching, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if not fetching.done():
                    # Stopping while waiting for messages. One that arrives now is never
                    # acknowledged and comes back after ack_wait: late, not lost.
                    fetching.cancel()
                    with suppress(asyncio.CancelledError):
                        await fetching
                    return
                if not (messages := fetching.result()):
                    continue
                try:
                    await self._handle_batch(messages)
                except Exception:
                    # A bug of the runtime's own: what is unsettled comes back after
                    # ack_wait; consuming goes on.
                    log.exception("consumer.batch_failed", messages=len(messages))
        finally:
            stopped.cancel()

    async def _fetch(self, subscription: JetStreamContext.PullSubscription) -> list[Msg]:
        """Up to ``batch_size`` messages: waits ``fetch_timeout_s`` for the first, then at
        most ``batch_max_wait_ms`` for the batch to fill; [] when none came.

        Two pull requests, not one for the whole batch: a request the server answers
        only in part stays open until it expires, and its late "timed out" status can
        stall nats-py's next multi-message fetch for its whole timeout. A request for
        one message is closed by that message, and the one for the rest expires within
        ``batch_max_wait_ms``."""
        settings = self.settings
        try:
            messages = await subscription.fetch(1, settings.fetch_timeout_s)
        except TimeoutError:  # nothing to do (nats' own TimeoutError is one too)
            return []
        except Exception as exc:  # NATS away: readiness says so; try again shortly
            log.warning("consumer.fetch_failed", error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(1.0)
            return []
        if settings.batch_size > 1:
            wait_s = max(settings.batch_max_wait_ms / 1000, MIN_BATCH_WAIT_S)
            with suppress(Exception):  # what came already is the batch
                messages += await subscription.fetch(settings.batch_size - 1, wait_s)
        return messages

    async def _handle_batch(self, messages: Sequence[Msg]) -> None:
        received = time.monotonic()
        for message in messages:
            # Heartbeats keep the waiting ones as well as the running ones alive.
            self._in_flight[id(message)] = (message, received)
        try:
            items = [item for message in messages if (item := await self._admit(message))]
            if not items:
                return
            if self.spec.handle_batch is None:
                await self.each(items, self._handle_one)
                return
            started = time.perf_counter()
            outcomes = await outcome_list(self.spec.handle_batch(items), len(items))
            for item, outcome in zip(items, outcomes, strict=True):
                with self._scope(item):
                    await self._settle(item, outcome, started)
        finally:
            for message in messages:
                self._in_flight.pop(id(message), None)

    async def each(
        self, items: Sequence[BatchItem[E, S, R]], run: Callable[[BatchItem[E, S, R]], Awaitable[T]]
    ) -> list[T | Exception]:
        """``run`` for every item, what it returned or raised, in item order.

        The items of one conversation run one after another in stream order;
        conversations run side by side, at most ``worker_concurrency`` items at once.
        Each runs in its message's span and log context. Batch hooks use it for the part
        of their work that stays per message.
        """
        results: list[T | Exception] = [RuntimeError("not run")] * len(items)
        conversations: dict[tuple[str, str, str], list[int]] = {}
        for index, item in enumerate(items):
            conversations.setdefault(item.conversation, []).append(index)
        slots = asyncio.Semaphore(self.settings.worker_concurrency)

        async def run_in_order(indexes: list[int]) -> None:
            for index in indexes:
                async with slots:
                    with self._scope(items[index]):
                        try:
                            results[index] = await run(items[index])
                        except Exception as exc:
                            results[index] = exc

        await asyncio.gather(*(run_in_order(indexes) for indexes in conversations.values()))
        return results

    async def _handle_one(self, item: BatchItem[E, S, R]) -> None:
        if self._stopping.is_set():
            # Not started before the stop: straight back to the stream for another replica.
            await item.message.nak()
            self._in_flight.pop(id(item.message), None)
            item.span.end()
            return
        started = time.perf_counter()
        outcome = await outcome_of(self.spec.handle(item.event, item.delivery))
        await self._settle(item, outcome, started)

    @contextmanager
    def _scope(self, item: BatchItem[E, S, R]) -> Iterator[None]:
        """The message's span current and its ids in every log line."""
        meta = item.message.metadata
        event = item.event
        with (
            trace.use_span(item.span, end_on_exit=False),
            structlog.contextvars.bound_contextvars(
                worker=self.spec.name,
                attempt=item.delivery.attempt,
                stream_seq=meta.sequence.stream,
                event_id=event.event_id,
                tenant=event.tenant,
                conversation_id=event.conversation_id,
            ),
        ):
            yield

    async def _admit(self, message: Msg) -> BatchItem[E, S, R] | None:
        """The message as a batch item, or None when it was dead-lettered at once
        (malformed, or too many deliveries without an outcome)."""
        meta = message.metadata
        attempt = meta.num_delivered or 1
        headers = message.headers or {}
        span = start_process_span(message.subject, headers, len(message.data), message)
        span.set_attributes(
            {semconv.ENGRAM_WORKER: self.spec.name, semconv.ENGRAM_DELIVERY: attempt}
        )
        if attempt > 1:
            metrics.events_redelivered.add(1, self._metric_attributes(message))
        with (
            trace.use_span(span, end_on_exit=False),
            structlog.contextvars.bound_contextvars(
                worker=self.spec.name, attempt=attempt, stream_seq=meta.sequence.stream
            ),
        ):
            try:
                event = self.spec.event.model_validate_json(message.data)
            except ValidationError as exc:
                await self._dead_letter(
                    message, attempt, f"malformed event: {describe_validation_error(exc)}"
                )
                self._done(message, span)
                return None
            span.set_attributes(
                {semconv.ENGRAM_EVENT_ID: event.event_id, semconv.ENGRAM_TENANT: event.tenant}
            )
            age_s = _age_s(message)
            lost = self.retry_policy.deliveries_without_outcome(age_s, attempt)
            if lost > self.settings.max_deliver:
                with structlog.contextvars.bound_contextvars(
                    event_id=event.event_id,
                    tenant=event.tenant,
                    conversation_id=event.conversation_id,
                ):
                    await self._dead_letter(
                        message,
                        attempt,
                        f"no outcome for {lost} of {attempt - 1} deliveries "
                        "(handler crashed or exceeded ack_wait)",
                    )
                self._done(message, span)
                return None
        delivery = Delivery(
            worker=self, subject=message.subject, attempt=attempt, headers=headers, age_s=age_s
        )
        return BatchItem(event=event, delivery=delivery, message=message, span=span)

    def _done(self, message: Msg, span: Span) -> None:
        self._in_flight.pop(id(message), None)
        span.end()

    async def _settle(self, item: BatchItem[E, S, R], outcome: Outcome, started: float) -> None:
        """Ack, retry or dead-letter one message by what its handling came to."""
        message, attempt = item.message, item.delivery.attempt
        try:
            if outcome is None:
                await message.ack()
                metrics.events_processed.add(1, self._metric_attributes(message))
                log.debug(
                    "message.acked", duration_ms=round((time.perf_counter() - started) * 1e3, 1)
                )
            elif isinstance(outcome, PermanentError):
                await self._dead_letter(message, attempt, str(outcome))
            elif isinstance(outcome, RetrievalError) and not outcome.retryable:
                # A request retrieval refuses will be refused again.
                await self._dead_letter(message, attempt, str(outcome))
            else:
                # UNAVAILABLE & co. say "try again" (by time); the other failures count.
                await self._retry_or_dead_letter(message, attempt, item.delivery.age_s, outcome)
        finally:
            self._done(message, item.span)

    async def _retry_or_dead_letter(
        self, message: Msg, attempt: int, age_s: float, exc: Exception
    ) -> None:
        expected = isinstance(exc, RetryableError | RetrievalError)
        reason = str(exc) if expected else f"{type(exc).__name__}: {exc}"
        policy = self.retry_policy
        transient = is_transient(exc)
        if transient and policy.gives_up(age_s, attempt):
            await self._dead_letter(
                message,
                attempt,
                f"still failing after {_duration(age_s)} and {attempt} deliveries "
                f"(retry horizon {_duration(policy.horizon_s)}): {reason}",
            )
            return
        if not transient and attempt >= self.settings.max_deliver:
            await self._dead_letter(
                message, attempt, f"gave up after {attempt} deliveries: {reason}"
            )
            return
        delay = policy.delay(attempt)
        trace.get_current_span().set_status(Status(StatusCode.ERROR, reason))
        log.warning(
            "message.retry_scheduled",
            reason=reason,
            delay_s=delay,
            transient=transient,
            # A bug, not a flaky dependency: keep the traceback.
            exc_info=exc if not (transient or expected) else False,
        )
        await message.nak(delay=delay)

    async def _dead_letter(self, message: Msg, attempt: int, reason: str) -> None:
        letter = DeadLetter(
            worker=self.spec.name,
            subject=message.subject,
            reason=reason,
            deliveries=attempt,
            original_headers=dict(message.headers or {}),
            original_body=message.data.decode("utf-8", errors="replace"),
        )
        trace.get_current_span().set_status(Status(StatusCode.ERROR, reason))
        try:
            await publish_with_retries(
                self.broker,
                letter.model_dump(mode="json"),
                subject=self.dlq_subject,
                # The same message dead-lettered twice (a lost term) is stored once.
                msg_id=f"{self.spec.name}:{message.metadata.sequence.stream}",
                retry_s=self.retry_policy.publish_retry_s,
            )
        except Exception:
            # Not acknowledged, so not lost: it comes back and is dead-lettered then.
            log.exception("message.dead_letter_failed", reason=reason)
            await message.nak(delay=self.retry_policy.delay(attempt))
            return
        await message.term()  # never redelivered
        metrics.events_dead_lettered.add(1, self._metric_attributes(message))
        log.error("message.dead_lettered", reason=reason, dlq_subject=self.dlq_subject)

    def _metric_attributes(self, message: Msg) -> dict[str, str]:
        return {
            semconv.ENGRAM_WORKER: self.spec.name,
            # The event's subject, not the kind and op a memory change's subject adds.
            semconv.MESSAGING_DESTINATION_NAME: event_subject(message.subject),
        }

    async def _keep_in_progress_forever(self) -> None:
        """Tell the server that messages still being handled are being worked on, so
        ack_wait never expires under a slow but live handler and hands the message to
        another replica. One task for all of them (a task per message cost more than
        the beat): every ack_wait/3, each message held for at least that long (handled,
        or waiting for its turn in a batch) gets an in-progress, so none goes longer
        than 2/3 of ack_wait without one."""
        interval = self.settings.ack_wait_s / 3
        while True:
            await asyncio.sleep(interval)
            due = time.monotonic() - interval
            for message, started in list(self._in_flight.values()):
                if started > due:
                    continue
                try:
                    await message.in_progress()
                except Exception as exc:  # the connection is gone; ack_wait takes over
                    log.debug("message.in_progress_failed", error=str(exc))


async def outcome_of(awaitable: Awaitable[object]) -> Outcome:
    """``None`` when ``awaitable`` completes, else the exception it raised: how a batch
    hook reports one message's outcome without failing the others."""
    try:
        await awaitable
    except Exception as exc:
        return exc
    return None


async def outcome_list(awaitable: Awaitable[Sequence[Outcome]], count: int) -> Sequence[Outcome]:
    """A batch hook's outcomes; when the hook itself fails (a bug), every message fails
    with it, to be retried and dead-lettered each on its own."""
    try:
        outcomes = await awaitable
    except Exception as exc:
        return [exc] * count
    if len(outcomes) != count:
        failure = RuntimeError(f"batch hook returned {len(outcomes)} outcomes for {count}")
        return [failure] * count
    return outcomes


async def _serve_until_signalled(spec: WorkerSpec[Any, S, Any], settings: S) -> None:
    stop = event_loop.stop_on_signals()
    await Worker(spec, settings).serve(stop)


def run_worker(spec: WorkerSpec[Any, S, Any], settings_cls: type[S]) -> None:
    """A worker's ``main``: settings, logging, tracing, then serve until SIGTERM/SIGINT."""
    settings = load_settings(settings_cls)
    telemetry = setup_observability(spec.service_name, settings)
    try:
        event_loop.run(_serve_until_signalled(spec, settings), settings.event_loop)
    except Exception as exc:
        # Start-up failures (NATS unreachable, StreamConfigConflict, ...) end the process
        # non-zero with the reason on one log line; the supervisor decides what next.
        log.error(
            "worker.failed", worker=spec.name, error=f"{type(exc).__name__}: {exc}", exc_info=True
        )
        raise SystemExit(1) from None
    finally:
        telemetry.shutdown()
