"""Retrying what says "try again": one policy for the gateway, every worker and the CLI.

An error is *transient* when the same call can succeed later without anyone changing
anything: a dependency is down or busy (gRPC ``UNAVAILABLE``, ``DEADLINE_EXCEEDED``,
``RESOURCE_EXHAUSTED``; a refused or reset connection; a timeout; NATS without a
server, without a stream leader or timing out; a full disk; an LLM that is down).
:func:`is_transient` decides it, for every caller alike.

The settings (:class:`RetrySettings`, part of every service's settings) are read once
per process into a :class:`RetryPolicy`:

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
import json
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, TypeVar

import grpc
import nats.errors
import nats.js.errors
from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import NoDecode

T = TypeVar("T")

#: The floor of the derived duplicate window (JetStream's own default is 120 s).
MIN_DUPLICATE_WINDOW_S = 120.0
#: How long one publish waits for JetStream's acknowledgement.
PUBLISH_TIMEOUT_S = 5.0

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


def backoff_delay(schedule: Sequence[float], attempt: int) -> float:
    """The delay after failed attempt number ``attempt`` (1-based); the last repeats."""
    return schedule[min(max(attempt, 1), len(schedule)) - 1]


@dataclass(frozen=True)
class RetryPolicy:
    backoff_s: tuple[float, ...] = (1.0, 5.0, 30.0, 120.0)
    horizon_s: float = 6 * 3600.0
    publish_retry_s: float = 15.0
    #: Set explicitly; ``None``: derived (:attr:`duplicate_window_s`).
    duplicate_window_override_s: float | None = None

    @property
    def redelivery_span_s(self) -> float:
        """One pass of the redelivery schedule: the first delay to the last."""
        return float(sum(self.backoff_s))

    @property
    def required_duplicate_window_s(self) -> float:
        """What the window must cover: a publish's retries and one pass of redeliveries
        (a handler that re-publishes its follow-ups on each delivery)."""
        return self.publish_retry_s + PUBLISH_TIMEOUT_S + self.redelivery_span_s

    @property
    def duplicate_window_s(self) -> float:
        if self.duplicate_window_override_s is not None:
            return self.duplicate_window_override_s
        return max(MIN_DUPLICATE_WINDOW_S, self.required_duplicate_window_s)

    def delay(self, attempt: int) -> float:
        return backoff_delay(self.backoff_s, attempt)

    def deliveries_without_outcome(self, age_s: float, attempt: int) -> int:
        """How many of a message's ``attempt - 1`` earlier deliveries cannot have been
        answered with a retry: each answered one waited its backoff delay, so a message
        this young delivered this often had deliveries end with no answer (a crash, an
        expired ack_wait)."""
        elapsed, answered = 0.0, 1
        while answered < attempt:
            elapsed += self.delay(answered)
            if elapsed > age_s:
                break
            answered += 1
        return attempt - answered

    def gives_up(self, age_s: float, attempt: int) -> bool:
        """Whether a transient failure of a message this old, on this delivery, is
        final: the next delivery would come after the horizon."""
        return age_s + self.delay(attempt) > self.horizon_s


class RetrySettings(BaseModel):
    """The retry variables every Engram process reads (mixed into EngramSettings)."""

    retry_backoff_s: Annotated[tuple[float, ...], NoDecode] = Field(
        default=RetryPolicy.backoff_s,
        description="Delay before a worker's next delivery after the 1st, 2nd, ... failure, "
        "comma-separated seconds; the last value repeats.",
    )
    retry_horizon_s: float = Field(
        default=RetryPolicy.horizon_s,
        ge=0,
        description="A transient failure (a dependency down) is retried until the message "
        "is this old; only then is it dead-lettered.",
    )
    publish_retry_s: float = Field(
        default=RetryPolicy.publish_retry_s,
        ge=0,
        le=600,
        description="Retry a publish JetStream did not acknowledge for this long, with the "
        "same Nats-Msg-Id (leader election, node restart).",
    )
    duplicate_window_s: float | None = Field(
        default=None,
        gt=0,
        description="The stream's de-duplication window; unset: ENGRAM_PUBLISH_RETRY_S plus "
        "the publish timeout (5 s) plus the sum of ENGRAM_RETRY_BACKOFF_S, at least 120 s.",
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

    @model_validator(mode="after")
    def _window_covers_retries(self) -> RetrySettings:
        needed = self.retry_policy.required_duplicate_window_s
        if self.duplicate_window_s is not None and self.duplicate_window_s < needed:
            raise ValueError(
                f"ENGRAM_DUPLICATE_WINDOW_S ({self.duplicate_window_s:g}s) must cover the "
                f"publish retries and one pass of the redelivery schedule ({needed:g}s)"
            )
        return self

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            backoff_s=tuple(self.retry_backoff_s),
            horizon_s=self.retry_horizon_s,
            publish_retry_s=self.publish_retry_s,
            duplicate_window_override_s=self.duplicate_window_s,
        )


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
