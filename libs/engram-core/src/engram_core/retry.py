"""Retrying what says "try again": one policy for the gateway, every worker and the CLI.

An error is *transient* when the same call can succeed later without anyone changing
anything: a dependency is down or busy (gRPC ``UNAVAILABLE``, ``DEADLINE_EXCEEDED``,
``RESOURCE_EXHAUSTED``; a refused or reset connection; a timeout; NATS without a
server, without a stream leader or timing out; a full disk; an LLM that is down).
:func:`is_transient` decides it, for every caller alike.

The settings (:class:`RetrySettings`, part of every service's settings) are read once
per process into a :class:`RetryPolicy` (both in :mod:`engram_core.retry_policy`,
re-exported here):

- ``ENGRAM_RETRY_BACKOFF_S``: the delays between a worker's deliveries of a failing
  message (the last repeats);
- ``ENGRAM_RETRY_HORIZON_S``: how long a worker keeps retrying a transient failure,
  from the time the message was stored; only then is it dead-lettered;
- ``ENGRAM_PUBLISH_RETRY_S``: how long a publish JetStream did not acknowledge is
  retried, with the same ``Nats-Msg-Id`` (a leader election, a node restart);
- ``ENGRAM_DUPLICATE_WINDOW_S``: the stream's de-duplication window. By default it is
  derived from the two above (a publish's retries plus one pass of the redelivery
  schedule, at least 120 s), so that every re-publish Engram makes in that span is
  recognised; JetStream keeps each message id of the window in memory.
"""

from __future__ import annotations

import asyncio
import errno
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import grpc
import nats.errors
import nats.js.errors

from engram_core.retry_policy import MIN_DUPLICATE_WINDOW_S as MIN_DUPLICATE_WINDOW_S
from engram_core.retry_policy import PUBLISH_TIMEOUT_S as PUBLISH_TIMEOUT_S
from engram_core.retry_policy import RetryPolicy as RetryPolicy
from engram_core.retry_policy import RetrySettings as RetrySettings
from engram_core.retry_policy import backoff_delay as backoff_delay

T = TypeVar("T")

TRANSIENT_GRPC_CODES = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)
_TRANSIENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EAGAIN, errno.EBUSY})
_TRANSIENT_NATS = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.ConnectionDrainingError,
    nats.errors.NoServersError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.FlushTimeoutError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
)


class TransientError(Exception):
    """Raised by Engram code for a failure that says "try again" (e.g. an LLM that
    answered 429/5xx or did not answer)."""


def _is_transient_one(exc: BaseException) -> bool:
    if isinstance(exc, (TransientError, TimeoutError, ConnectionError, *_TRANSIENT_NATS)):
        return True
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code() in TRANSIENT_GRPC_CODES
    if isinstance(code := getattr(exc, "code", None), grpc.StatusCode):
        # an error classified from a gRPC status (engram_core.memory_port.RetrievalError)
        return code in TRANSIENT_GRPC_CODES
    if isinstance(exc, nats.js.errors.APIError):
        # 503: "JetStream system temporarily unavailable" (no quorum, no leader yet).
        return exc.code == 503
    return isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNOS


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc``, or an exception it was raised from (``raise ... from``), says
    "try again". An error raised while handling another is judged on its own."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if _is_transient_one(current):
            return True
        seen.add(id(current))
        current = current.__cause__
    return False


def _pauses(first_delay_s: float, max_delay_s: float) -> Iterator[float]:
    """Delays that double from ``first_delay_s`` up to ``max_delay_s``, with jitter, so
    that processes that lost the same dependency do not come back in lockstep."""
    delay = first_delay_s
    while True:
        yield delay * (0.5 + random.random() / 2)
        delay = min(delay * 2, max_delay_s)


async def retry_transient(
    call: Callable[[], Awaitable[T]],
    *,
    budget_s: float | None,
    on_retry: Callable[[BaseException, float], None] | None = None,
    first_delay_s: float = 0.1,
    max_delay_s: float = 2.0,
) -> T:
    """``await call()`` until it succeeds, fails with an error that is not transient,
    or ``budget_s`` has passed (``None``: no limit); then the last error is raised.
    Delays as :func:`_pauses`.
    """
    deadline = None if budget_s is None else time.monotonic() + budget_s
    pauses = _pauses(first_delay_s, max_delay_s)
    while True:
        try:
            return await call()
        except Exception as exc:
            if not is_transient(exc):
                raise
            pause = next(pauses)
            if deadline is not None and time.monotonic() + pause > deadline:
                raise
            if on_retry is not None:
                on_retry(exc, pause)
            await asyncio.sleep(pause)


def retry_transient_sync(
    call: Callable[[], T],
    *,
    budget_s: float | None,
    on_retry: Callable[[BaseException, float], None] | None = None,
    first_delay_s: float = 0.1,
    max_delay_s: float = 2.0,
) -> T:
    """:func:`retry_transient` for blocking code (a model client run in a worker thread)."""
    deadline = None if budget_s is None else time.monotonic() + budget_s
    pauses = _pauses(first_delay_s, max_delay_s)
    while True:
        try:
            return call()
        except Exception as exc:
            if not is_transient(exc):
                raise
            pause = next(pauses)
            if deadline is not None and time.monotonic() + pause > deadline:
                raise
            if on_retry is not None:
                on_retry(exc, pause)
            time.sleep(pause)
