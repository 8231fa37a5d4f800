"""Trace context across JetStream, with messaging semantic conventions.

FastStream ships an OpenTelemetry middleware, but it puts a zero-length ``create``
span between the producer and the consumer (so a ``process`` span's parent is not the
``publish`` span) and still sets the deprecated ``messaging.operation``. This one is
what the conventions describe for single-message sends:

- ``publish <event subject>`` (PRODUCER) around the JetStream publish, its context injected
  into the message headers as W3C ``traceparent``/``tracestate``;
- ``process <event subject>`` (CONSUMER) around the handler, a child of that publish span,
  current while the handler runs (so its log lines, RPCs and publishes join the trace).

The span name says the event's subject (``engram.memory.changed.v1``, not the kind and
op its subjects add: span names stay few); ``messaging.destination.name`` is the
subject exactly and ``messaging.destination.template`` the event's subject where the
two differ. Both carry ``messaging.system=nats``,
``messaging.operation.type`` (``send``/``process``), ``messaging.operation.name``
(``publish``/``process``) and ``messaging.message.id`` (the ``Nats-Msg-Id`` header:
Engram's ``event_id``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from faststream import BaseMiddleware
from faststream.message import StreamMessage
from faststream.nats.response import NatsPublishCommand
from nats.aio.msg import Msg
from nats.errors import NotJSMessageError
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind

from engram_core import semconv
from engram_core.events import event_subject

MSG_ID_HEADER = "Nats-Msg-Id"

_tracer = trace.get_tracer("engram.messaging")


def _base_attributes(subject: str, message_id: str | None) -> dict[str, Any]:
    attributes: dict[str, Any] = {
        semconv.MESSAGING_SYSTEM: semconv.MESSAGING_SYSTEM_NATS,
        semconv.MESSAGING_DESTINATION_NAME: subject,
    }
    if (template := event_subject(subject)) != subject:
        attributes[semconv.MESSAGING_DESTINATION_TEMPLATE] = template
    if message_id:
        attributes[semconv.MESSAGING_MESSAGE_ID] = message_id
    return attributes


class NatsTracingMiddleware(BaseMiddleware[NatsPublishCommand, Any]):
    """FastStream broker middleware (pass the class in ``middlewares=``)."""

    async def publish_scope(
        self, call_next: Callable[[Any], Awaitable[Any]], cmd: NatsPublishCommand
    ) -> Any:
        subject = cmd.destination
        attributes = _base_attributes(subject, cmd.headers.get(MSG_ID_HEADER))
        attributes[semconv.MESSAGING_OPERATION_TYPE] = semconv.MESSAGING_OPERATION_SEND
        attributes[semconv.MESSAGING_OPERATION_NAME] = "publish"
        with _tracer.start_as_current_span(
            f"publish {event_subject(subject)}", kind=SpanKind.PRODUCER, attributes=attributes
        ):
            # The consumer's span becomes a child of this one, in whatever process.
            propagate.inject(cmd.headers)
            return await call_next(cmd)

    async def consume_scope(
        self, call_next: Callable[[Any], Awaitable[Any]], msg: StreamMessage[Any]
    ) -> Any:
        raw = msg.raw_message
        span = start_process_span(
            getattr(raw, "subject", "") or "", msg.headers or {}, len(msg.body or b""), raw
        )
        with trace.use_span(
            span, end_on_exit=True, record_exception=True, set_status_on_exception=True
        ):
            return await call_next(msg)


def start_process_span(subject: str, headers: Mapping[str, str], body_size: int, raw: Msg) -> Span:
    """The ``process <event subject>`` CONSUMER span of one received message, a child of its
    publisher's span (from the headers), started but not made current: a worker
    handling a batch keeps one per message and ends each when its message is settled."""
    attributes = _base_attributes(subject, headers.get(MSG_ID_HEADER))
    attributes[semconv.MESSAGING_OPERATION_TYPE] = semconv.MESSAGING_OPERATION_PROCESS
    attributes[semconv.MESSAGING_OPERATION_NAME] = "process"
    attributes[semconv.MESSAGING_MESSAGE_BODY_SIZE] = body_size
    try:
        metadata = raw.metadata
    except NotJSMessageError:  # a core NATS message: no consumer, no delivery count
        metadata = None
    if metadata is not None:
        attributes[semconv.MESSAGING_CONSUMER_GROUP_NAME] = metadata.consumer or ""
        attributes[semconv.MESSAGING_DELIVERY_COUNT] = metadata.num_delivered or 1
    return _tracer.start_span(
        f"process {event_subject(subject)}",
        context=propagate.extract(dict(headers)),
        kind=SpanKind.CONSUMER,
        attributes=attributes,
    )
