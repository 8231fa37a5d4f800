"""The retry settings and the policy read from them (:mod:`engram_core.retry` has the
rest): plain values and arithmetic, without gRPC or NATS, so that every settings class
can include :class:`RetrySettings` and a command that dials neither starts fast."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, Field, field_validator, model_validator
from pydantic_settings import NoDecode

#: The floor of the derived duplicate window (JetStream's own default is 120 s).
MIN_DUPLICATE_WINDOW_S = 120.0
#: How long one publish waits for JetStream's acknowledgement.
PUBLISH_TIMEOUT_S = 5.0


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
