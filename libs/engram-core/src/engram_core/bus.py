"""JetStream plumbing shared by the gateway (publisher) and every worker (consumers).

The stream is declared here once. Every process checks it at startup: a missing
stream is created; one with fewer replicas than ``ENGRAM_STREAM_REPLICAS`` or a
shorter duplicate window than the retry policy needs is upgraded in place (JetStream
edits both on a live stream; more replicas or a longer window are kept); a
conflicting one (other subjects, storage or retention) stops the process with a clear
error instead of silently running against the wrong stream. FastStream's own stream
declaration is never used: it would quietly merge subjects into whatever exists.

The key-value buckets (event status, locks) get the same replicas, and an existing
bucket with fewer is upgraded in place the same way.

Every publish waits for JetStream's acknowledgement and, when it does not come for a
reason that says "try again" (no stream leader during an election, a node restart,
a timeout), is retried with the same ``Nats-Msg-Id`` for ``ENGRAM_PUBLISH_RETRY_S``:
a copy that did land is dropped by the stream's de-duplication.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TypeVar

from faststream.nats import NatsBroker, PubAck, StorageType, StreamConfig
from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, ConsumerInfo, KeyValueConfig, RetentionPolicy
from nats.js.errors import APIError, NotFoundError
from nats.js.kv import KeyValue

from engram_core import metrics, semconv
from engram_core.events import STREAM_NAME, STREAM_SUBJECTS, Event, MemoryChanged
from engram_core.logging import get_logger
from engram_core.messaging_telemetry import NatsTracingMiddleware
from engram_core.nats_admin import CONNECT_TIMEOUT_S, admin_connection
from engram_core.retry import PUBLISH_TIMEOUT_S, RetryPolicy, retry_transient
from engram_core.settings import parse_nats_urls

__all__ = ["PUBLISH_TIMEOUT_S", "StreamConfigConflict", "ensure_stream", "publish_event"]

T = TypeVar("T")
DEFAULT_DUPLICATE_WINDOW_S = RetryPolicy().duplicate_window_s

log = get_logger(__name__)


class StreamConfigConflict(RuntimeError):
    """The ENGRAM stream exists with a configuration Engram did not declare."""


def stream_config(
    replicas: int = 1, duplicate_window_s: float = DEFAULT_DUPLICATE_WINDOW_S
) -> StreamConfig:
    return StreamConfig(
        name=STREAM_NAME,
        subjects=list(STREAM_SUBJECTS),
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        num_replicas=replicas,
        duplicate_window=duplicate_window_s,
    )


def nats_servers(url: str) -> list[str]:
    """The server URLs of ``ENGRAM_NATS_URL`` (:func:`engram_core.settings.parse_nats_urls`)."""
    return parse_nats_urls(url)


async def _more_replicas(js: JetStreamContext, config: StreamConfig, replicas: int) -> None:
    """Raise a stream's replica count in place (R1 → R3 on a cluster)."""
    try:
        await js.update_stream(replace(config, num_replicas=replicas))
    except APIError as exc:
        raise StreamConfigConflict(
            f"JetStream stream {config.name!r} has {config.num_replicas or 1} replica(s) and "
            f"cannot be raised to {replicas} here ({exc.description or exc}). Replicas above 1 "
            "need a NATS cluster with at least that many JetStream servers; on one server "
            "set ENGRAM_STREAM_REPLICAS=1. docs/deploy.md: moving to a NATS cluster."
        ) from None
    log.info("stream.replicas_raised", stream=config.name, replicas=replicas)


async def open_bucket(
    js: JetStreamContext, bucket: str, *, ttl_s: float, replicas: int = 1
) -> KeyValue:
    """The key-value ``bucket``: created when absent (one value per key, file storage,
    entries expire after ``ttl_s``, ``replicas`` copies), raised to ``replicas`` when it
    has fewer. Processes racing to create it all succeed (an identical create is a no-op).
    """
    try:
        info = await js.stream_info(f"KV_{bucket}")
    except NotFoundError:
        return await js.create_key_value(
            KeyValueConfig(
                bucket=bucket, history=1, ttl=ttl_s, storage=StorageType.FILE, replicas=replicas
            )
        )
    if (info.config.num_replicas or 1) < replicas:
        await _more_replicas(js, info.config, replicas)
    return await js.key_value(bucket)


@asynccontextmanager
async def key_value_bucket(
    nats_url: str, bucket: str, *, ttl_s: float, replicas: int = 1
) -> AsyncIterator[tuple[Client, KeyValue]]:
    """A connection (reconnecting forever) and the key-value ``bucket``
    (:func:`open_bucket`); closed on exit. While NATS, or the node that holds the
    bucket, cannot answer, it waits (retrying with backoff, a line per attempt):
    a process starts, not ready, and gets its bucket when the cluster can serve it."""
    nc = await until_reachable(f"NATS for bucket {bucket}", lambda: connect_for_service(nats_url))
    try:
        kv = await until_reachable(
            f"bucket {bucket}",
            lambda: open_bucket(
                nc.jetstream(timeout=CONNECT_TIMEOUT_S), bucket, ttl_s=ttl_s, replicas=replicas
            ),
        )
        yield nc, kv
    finally:
        await nc.close()


async def until_reachable(what: str, call: Callable[[], Awaitable[T]]) -> T:
    """``await call()``, retried with backoff (up to 5 s) for as long as it fails with
    an error that says "try again"; any other error is raised."""

    def report(exc: BaseException, pause: float) -> None:
        log.warning(
            "nats.waiting",
            waiting_for=what,
            error=f"{type(exc).__name__}: {exc}",
            delay_s=round(pause, 2),
        )

    return await retry_transient(call, budget_s=None, on_retry=report, max_delay_s=5.0)


async def connect_for_service(nats_url: str) -> Client:
    """A long-lived connection: every URL of the list, reconnecting forever (a node
    restart of any length), the first connect bounded per attempt so a caller retrying
    start-up (see :func:`engram_core.retry.retry_transient`) sees each failure."""

    async def quiet(_: Exception) -> None:  # reconnects are reported by readiness
        return None

    nc = Client()
    await nc.connect(
        servers=nats_servers(nats_url),
        connect_timeout=CONNECT_TIMEOUT_S,
        allow_reconnect=False,
        max_reconnect_attempts=1,
        reconnect_time_wait=0.2,  # type: ignore[arg-type]  # annotated int, slept as a float
        error_cb=quiet,
    )
    # Connected: from now on, keep reconnecting whatever the outage.
    nc.options["allow_reconnect"] = True
    nc.options["max_reconnect_attempts"] = -1
    nc.options["reconnect_time_wait"] = 1.0
    return nc


def _stream_problems(have: StreamConfig, wanted: StreamConfig) -> list[str]:
    problems = []
    if sorted(have.subjects or []) != sorted(wanted.subjects or []):
        problems.append(f"subjects {have.subjects} != {wanted.subjects}")
    if have.storage != wanted.storage:
        problems.append(f"storage {have.storage} != {wanted.storage}")
    # Work-queue or interest retention would let one worker's ack delete another's message.
    if (have.retention or RetentionPolicy.LIMITS) != RetentionPolicy.LIMITS:
        problems.append(f"retention {have.retention} != {RetentionPolicy.LIMITS}")
    return problems


async def ensure_stream(
    nats_url: str, replicas: int = 1, duplicate_window_s: float = DEFAULT_DUPLICATE_WINDOW_S
) -> None:
    """Create the stream if missing, raise its replicas and duplicate window to what
    this process needs, and fail loudly if it exists with a different shape.

    Idempotent: safe to call from every process at every start. A process configured
    with fewer replicas or a shorter window than the stream has never lowers them.
    """
    wanted = stream_config(replicas, duplicate_window_s)
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
        if (info.config.duplicate_window or 0) < duplicate_window_s:
            # Shorter than ours and a re-published event could be stored (and handled) twice.
            await js.update_stream(replace(info.config, duplicate_window=duplicate_window_s))
            log.info("stream.duplicate_window_raised", duplicate_window_s=duplicate_window_s)
            info = await js.stream_info(STREAM_NAME)
        if (info.config.num_replicas or 1) < replicas:
            await _more_replicas(js, info.config, replicas)


async def ensure_consumer(nats_url: str, config: ConsumerConfig) -> ConsumerInfo:
    """Create a durable consumer on the stream, or update the editable fields of an existing one.

    Binding alone (what nats-py does when the durable already exists) would keep the
    settings of whichever process created it first, so a changed ``max_deliver`` or
    ``ack_wait`` would never take effect.
    """
    async with admin_connection(nats_url) as nc:
        # Without an explicit action the server creates or updates (nats-server >= 2.10).
        return await nc.jetstream().add_consumer(STREAM_NAME, config=config)


FASTSTREAM_LOGGER = "faststream.nats"


class ExpectedFetchNoise(logging.Filter):
    """What FastStream logs about an idle pull consumer, which is no news.

    An idle ``fetch`` whose pull request expires can raise asyncio's ``TimeoutError``
    from nats-py instead of nats' own; FastStream's pull loop lets it escape, logs
    "Task-N raised an exception, retrying..." at ERROR with the traceback, and restarts
    the loop, which is all that needs to happen: dropped. Its "callback for Task-N is
    being executed..." line at every stop is INFO noise: kept at DEBUG only.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "is being executed" in message:
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        exc = record.exc_info[1] if record.exc_info else None
        return not ("raised an exception" in message and isinstance(exc, TimeoutError))


def make_broker(
    nats_url: str,
    *,
    client_name: str,
    graceful_timeout: float | None = None,
    apply_types: bool = True,
) -> NatsBroker:
    """A FastStream NATS broker with trace context propagation on publish/consume
    (:class:`~engram_core.messaging_telemetry.NatsTracingMiddleware`).

    ``graceful_timeout``: on stop, wait up to this long for in-flight handlers to finish
    (consumers set it; a publisher-only process does not need it).

    ``apply_types=False``: subscribers get no dependency injection (the worker runtime
    hands its handler the message itself; resolving one ``Context`` argument cost a
    task group and a thread-pool round trip per message).

    FastStream's own logger would print coloured text to stdout; a plain stdlib logger
    sends its lines through the process's structlog formatter instead. Its per-message
    "Received"/"Processed" lines go to DEBUG: handlers log their own outcome, and its
    expected idle noise is filtered (:class:`ExpectedFetchNoise`).
    """
    faststream_logger = logging.getLogger(FASTSTREAM_LOGGER)
    if not any(isinstance(f, ExpectedFetchNoise) for f in faststream_logger.filters):
        faststream_logger.addFilter(ExpectedFetchNoise())
    return NatsBroker(
        nats_servers(nats_url),
        name=client_name,
        middlewares=[NatsTracingMiddleware],
        graceful_timeout=graceful_timeout,
        # A long-running service must survive a NATS restart of any length: keep
        # reconnecting (readiness reports the outage meanwhile) instead of giving up.
        max_reconnect_attempts=-1,
        logger=faststream_logger,
        log_level=logging.DEBUG,
        apply_types=apply_types,
    )


async def publish_with_retries(
    broker: NatsBroker,
    body: object,
    *,
    subject: str,
    msg_id: str,
    headers: Mapping[str, str] | None = None,
    retry_s: float = 0.0,
) -> PubAck:
    """Publish to the stream and wait for its ack; a failure that says "try again" is
    retried with the same ``Nats-Msg-Id`` for ``retry_s`` (then the last error is raised).
    """

    async def once() -> PubAck:
        ack: PubAck = await broker.publish(
            body,
            subject=subject,
            headers={**(headers or {}), "Nats-Msg-Id": msg_id},
            stream=STREAM_NAME,
            timeout=PUBLISH_TIMEOUT_S,
        )
        return ack

    def report(exc: BaseException, pause: float) -> None:
        log.warning(
            "publish.retry",
            subject=subject,
            msg_id=msg_id,
            error=f"{type(exc).__name__}: {exc}",
            delay_s=round(pause, 2),
        )

    return await retry_transient(once, budget_s=retry_s, on_retry=report)


class ChangeSubjects:
    """Whether a memory change may go on its own subject (``…changed.v1.<kind>.<op>``).

    A consumer declared before subjects per kind filters on the bare
    ``engram.memory.changed.v1`` only, and JetStream never delivers it a message it
    skipped while its filter did not match, not even once the filter is updated. So
    while any consumer of the stream still filters that way (an older worker still
    running during a rolling upgrade, or a consumer of someone's own), changes go on the
    bare subject, which every consumer, old or new, takes (new ones keep it in their
    filter). What the stream's consumers say is read again every ``recheck_s``; until
    it could be read, the bare subject is used."""

    def __init__(self, recheck_s: float = 10.0) -> None:
        self.recheck_s = recheck_s
        self.bare_only = True
        self._read_at: float | None = None

    def forget(self) -> None:
        """Read the consumers again at the next publish."""
        self._read_at = None

    async def subject(self, broker: NatsBroker, event: Event) -> str:
        own = event.published_subject
        if own == event.subject:
            return own
        now = time.monotonic()
        if self._read_at is None or now - self._read_at >= self.recheck_s:
            # One read at a time: publishes meanwhile go by what is known.
            first = self._read_at is None
            previous, self._read_at = self._read_at, now
            try:
                js = broker.connection.jetstream(timeout=PUBLISH_TIMEOUT_S)
                consumers = await js.consumers_info(STREAM_NAME)
            except Exception as exc:  # NATS away: the publish itself will say so
                self._read_at = previous
                log.debug("change_subjects.unread", error=f"{type(exc).__name__}: {exc}")
            else:
                bare_only = [c.name for c in consumers if _bare_only(c.config, event.subject)]
                if first or bool(bare_only) != self.bare_only:
                    log.info(
                        "change_subjects.read",
                        subjects="bare" if bare_only else "per kind",
                        consumers_on_the_bare_subject_only=bare_only,
                    )
                self.bare_only = bool(bare_only)
        return event.subject if self.bare_only else own


def consumer_filters(config: ConsumerConfig) -> list[str]:
    """The subjects a consumer filters on, whichever of the two fields holds them
    (``filter_subjects`` for several, ``filter_subject`` for one; none: all)."""
    return list(
        config.filter_subjects or ([config.filter_subject] if config.filter_subject else [])
    )


def _bare_only(config: ConsumerConfig, subject: str) -> bool:
    filters = consumer_filters(config)
    return subject in filters and not any(f.startswith(f"{subject}.") for f in filters)


#: This process's view of the stream's consumers, for :func:`publish_event`.
change_subjects = ChangeSubjects()


async def publish_event(
    broker: NatsBroker,
    event: Event,
    *,
    headers: Mapping[str, str] | None = None,
    retry_s: float = 0.0,
) -> PubAck:
    """Publish and wait for the JetStream ack ("persisted" means acknowledged),
    retrying for ``retry_s`` (``ENGRAM_PUBLISH_RETRY_S``) what says "try again".

    An acknowledged :class:`MemoryChanged` counts in ``engram.memories.changed`` (by the
    memory's kind and the op): counted where changes are announced, so every producer
    (workers and the gateway's memory API) is covered once, whoever consumes them.
    """
    ack = await publish_with_retries(
        broker,
        event.model_dump(mode="json"),
        subject=await change_subjects.subject(broker, event),
        msg_id=event.event_id,
        headers=headers,
        retry_s=retry_s,
    )
    if isinstance(event, MemoryChanged) and not getattr(ack, "duplicate", False):
        metrics.memories_changed.add(
            1, {semconv.ENGRAM_MEMORY_KIND: event.memory.kind, semconv.ENGRAM_MEMORY_OP: event.op}
        )
    return ack
