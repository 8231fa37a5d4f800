"""The shared retry policy (engram_core.retry): what says "try again", how long it is
retried, and the duplicate window derived from the same settings."""

from __future__ import annotations

import errno

import grpc
import nats.errors
import nats.js.errors
import pytest
from grpc.aio import AioRpcError, Metadata

from engram_core.retry import RetryPolicy, TransientError, is_transient, retry_transient
from engram_core.settings import ConfigError, EngramSettings, load_settings


def rpc_error(code: grpc.StatusCode) -> AioRpcError:
    return AioRpcError(code, Metadata(), Metadata(), details="x")


def chained(outer: Exception, inner: Exception, *, explicit: bool) -> Exception:
    try:
        try:
            raise inner
        except Exception as exc:
            if explicit:
                raise outer from exc
            raise outer  # noqa: B904 - an error raised while handling another
    except Exception as caught:
        return caught


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (rpc_error(grpc.StatusCode.UNAVAILABLE), True),
        (rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED), True),
        (rpc_error(grpc.StatusCode.RESOURCE_EXHAUSTED), True),
        (rpc_error(grpc.StatusCode.INTERNAL), False),
        (rpc_error(grpc.StatusCode.INVALID_ARGUMENT), False),
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), True),
        (TimeoutError(), True),
        (nats.errors.TimeoutError(), True),
        (nats.errors.NoServersError(), True),
        (nats.js.errors.NoStreamResponseError(), True),
        (nats.js.errors.APIError(code=503, description="JetStream unavailable"), True),
        (nats.js.errors.APIError(code=400, description="bad request"), False),
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OSError(errno.EACCES, "Permission denied"), False),
        (TransientError("llm 503"), True),
        (KeyError("bug"), False),
        (chained(RuntimeError("wrapped"), TimeoutError(), explicit=True), True),
        (chained(KeyError("bug in a handler"), TimeoutError(), explicit=False), False),
    ],
)
def test_what_says_try_again(error: Exception, transient: bool) -> None:
    assert is_transient(error) is transient


def test_the_horizon_decides_when_a_transient_failure_is_final() -> None:
    policy = RetryPolicy(backoff_s=(1.0, 5.0), horizon_s=60.0)
    assert not policy.gives_up(age_s=0.0, attempt=1)
    assert not policy.gives_up(age_s=55.0, attempt=9)  # the next one at 60 s: still in
    assert policy.gives_up(age_s=55.1, attempt=9)


def test_deliveries_without_an_answer_are_told_from_retries() -> None:
    policy = RetryPolicy(backoff_s=(1.0, 5.0, 30.0))
    # every delivery answered with a retry: the 4th comes at 36 s at the earliest
    assert policy.deliveries_without_outcome(age_s=36.0, attempt=4) == 0
    assert policy.deliveries_without_outcome(age_s=500.0, attempt=4) == 0
    # a 4th delivery at 10 s: at least one earlier one ended without an answer
    assert policy.deliveries_without_outcome(age_s=10.0, attempt=4) == 1
    assert policy.deliveries_without_outcome(age_s=0.5, attempt=4) == 3


def test_the_duplicate_window_covers_publish_retries_and_one_pass_of_redeliveries() -> None:
    default = EngramSettings().retry_policy
    assert default.backoff_s == (1.0, 5.0, 30.0, 120.0)
    assert default.horizon_s == 6 * 3600
    assert default.publish_retry_s == 15.0
    assert default.duplicate_window_s == 15.0 + 5.0 + 156.0
    # never below JetStream's own default
    assert RetryPolicy(backoff_s=(1.0,), publish_retry_s=1.0).duplicate_window_s == 120.0
    longer = EngramSettings(publish_retry_s=60, retry_backoff_s=(10, 600))
    assert longer.retry_policy.duplicate_window_s == 60 + 5 + 610


def test_a_duplicate_window_shorter_than_the_retries_fails_fast(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ENGRAM_DUPLICATE_WINDOW_S", "60")
    with pytest.raises(ConfigError, match=r"ENGRAM_DUPLICATE_WINDOW_S \(60s\) must cover"):
        load_settings(EngramSettings)
    monkeypatch.setenv("ENGRAM_DUPLICATE_WINDOW_S", "3600")
    assert load_settings(EngramSettings).retry_policy.duplicate_window_s == 3600


@pytest.mark.parametrize("raw", ["-1", "", "a,b"])
def test_bad_retry_settings_fail_fast_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv("ENGRAM_RETRY_BACKOFF_S", raw)
    with pytest.raises(ConfigError, match="ENGRAM_RETRY_BACKOFF_S"):
        load_settings(EngramSettings)


async def test_retry_transient_retries_what_says_try_again_within_the_budget() -> None:
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise nats.js.errors.NoStreamResponseError()
        return "ok"

    assert await retry_transient(flaky, budget_s=5.0, first_delay_s=0.01) == "ok"
    assert len(calls) == 3


async def test_retry_transient_raises_other_errors_at_once_and_gives_up_after_the_budget() -> None:
    calls: list[int] = []

    async def broken() -> None:
        calls.append(1)
        raise ValueError("not a try again")

    with pytest.raises(ValueError):
        await retry_transient(broken, budget_s=5.0)
    assert len(calls) == 1

    async def down() -> None:
        calls.append(1)
        raise ConnectionRefusedError()

    with pytest.raises(ConnectionRefusedError):
        await retry_transient(down, budget_s=0.2, first_delay_s=0.05, max_delay_s=0.05)
    assert 3 <= len(calls) <= 8
