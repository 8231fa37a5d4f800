"""Pure parts of the worker runtime: settings, backoff, error classification, ids."""

from __future__ import annotations

import grpc
import pytest
from grpc.aio import AioRpcError, Metadata
from pydantic import ValidationError

from engram_core.events import TurnPersisted
from engram_core.memory_port import classify
from engram_core.settings import ConfigError, load_settings
from engram_workers.ingest import IngestSettings, turn_memory, turn_memory_id
from engram_workers.runtime import WorkerSettings, describe_validation_error, retry_delay


def test_worker_defaults() -> None:
    settings = WorkerSettings()
    assert settings.max_deliver == 5
    assert settings.retry_backoff_s == (1.0, 5.0, 30.0, 120.0)
    assert settings.health_port == 0
    assert IngestSettings().health_port == 8201


@pytest.mark.parametrize(
    ("raw", "parsed"), [("0.5, 2,10", (0.5, 2.0, 10.0)), ("[1, 3]", (1.0, 3.0)), ("7", (7.0,))]
)
def test_backoff_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str, parsed: tuple[float, ...]
) -> None:
    monkeypatch.setenv("ENGRAM_RETRY_BACKOFF_S", raw)
    assert load_settings(IngestSettings).retry_backoff_s == parsed


@pytest.mark.parametrize("raw", ["-1", "", "a,b"])
def test_bad_backoff_fails_fast_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, raw: str
) -> None:
    monkeypatch.setenv("ENGRAM_RETRY_BACKOFF_S", raw)
    with pytest.raises(ConfigError, match="ENGRAM_RETRY_BACKOFF_S"):
        load_settings(IngestSettings)


def test_retry_delay_follows_the_schedule_then_repeats_the_last() -> None:
    schedule = (1.0, 5.0, 30.0)
    assert [retry_delay(schedule, n) for n in range(1, 6)] == [1.0, 5.0, 30.0, 30.0, 30.0]


def rpc_error(code: grpc.StatusCode) -> AioRpcError:
    return AioRpcError(code, Metadata(), Metadata(), details="boom")


@pytest.mark.parametrize(
    ("code", "retryable", "http_status"),
    [
        (grpc.StatusCode.UNAVAILABLE, True, 503),
        (grpc.StatusCode.DEADLINE_EXCEEDED, True, 503),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, True, 503),
        (grpc.StatusCode.INVALID_ARGUMENT, False, 400),
        (grpc.StatusCode.NOT_FOUND, False, 404),
        (grpc.StatusCode.ALREADY_EXISTS, False, 409),
        (grpc.StatusCode.PERMISSION_DENIED, False, 503),
        (grpc.StatusCode.UNIMPLEMENTED, False, 503),
    ],
)
def test_rpc_failures_are_classified_once(
    code: grpc.StatusCode, retryable: bool, http_status: int
) -> None:
    failure = classify("Upsert", rpc_error(code))
    assert (failure.retryable, failure.http_status) == (retryable, http_status)
    assert str(failure) == f"retrieval Upsert failed: {code.name}: boom"


def test_validation_errors_are_described_without_the_input() -> None:
    with pytest.raises(ValidationError) as caught:
        TurnPersisted.model_validate({"tenant": "t", "turn_id": "1", "role": "bot", "text": 5})
    description = describe_validation_error(caught.value)
    assert "role: Input should be 'user' or 'assistant'" in description
    assert "text: Input should be a valid string" in description
    assert "bot" not in description


def test_turn_memory_id_is_stable_and_unambiguous() -> None:
    assert turn_memory_id("t", "c", "1") == turn_memory_id("t", "c", "1")
    assert turn_memory_id("t", "c", "1") != turn_memory_id("t", "c", "2")
    assert turn_memory_id("t", "a.b", "c") != turn_memory_id("t", "a", "b.c")
    assert turn_memory_id("t1", "c", "1") != turn_memory_id("t2", "c", "1")


def test_a_turn_keeps_its_position_in_the_conversation() -> None:
    event = TurnPersisted(
        tenant="t", conversation_id="c", turn_id="u7", role="user", text="hi", turn_index=6
    )
    memory = turn_memory(event)
    assert (memory.turn_index, memory.role, memory.metadata["turn_id"]) == (6, "user", "u7")
    # events from before the field existed still parse, as position unknown
    legacy = TurnPersisted.model_validate_json(
        '{"tenant": "t", "turn_id": "u1", "role": "user", "text": "hi"}'
    )
    assert turn_memory(legacy).turn_index == 0
    with pytest.raises(ValidationError):
        TurnPersisted(tenant="t", turn_id="u", role="user", text="x", turn_index=-1)
