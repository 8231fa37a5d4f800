"""The workers' LLM client against the scripted OpenAI-compatible server."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from engram_testing.upstream import ScriptedUpstream, UpstreamError
from engram_workers.llm import (
    LlmClient,
    LlmOutputError,
    LlmSettingsMixin,
    LlmUnavailable,
)
from engram_workers.replies import ModelReply, UnusableReply, parse_reply


class Answer(BaseModel):
    facts: list[str]


def client_for(upstream: ScriptedUpstream, **overrides: object) -> LlmClient:
    settings = {"llm_base_url": upstream.base_url, "llm_timeout_s": 5.0, **overrides}
    return LlmClient(LlmSettingsMixin.model_validate(settings))


async def ask(client: LlmClient) -> Answer:
    return await client.structured(
        task="extract_facts",
        model="m",
        instructions="Extract.",
        payload={"message": "I like tea"},
        schema=Answer,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"facts": ["a"]}', {"facts": ["a"]}),
        ('Sure!\n```json\n{"facts": ["a"]}\n```\nDone.', {"facts": ["a"]}),
        ('Here you go: {"facts": []} hope it helps', {"facts": []}),
    ],
)
def test_tolerant_parser(text: str, expected: dict) -> None:
    assert parse_reply(ModelReply(text), Answer).model_dump() == expected


def test_parser_refuses_prose() -> None:
    with pytest.raises(UnusableReply):
        parse_reply(ModelReply("I could not find any facts."), Answer)


async def test_asks_with_json_schema_and_the_task_convention(scripted_upstream) -> None:
    scripted_upstream.replies = ['{"facts": ["User likes tea"]}']
    client = client_for(scripted_upstream)
    assert (await ask(client)).facts == ["User likes tea"]
    await client.close()
    sent = scripted_upstream.chat_requests()[0]
    assert sent["response_format"]["type"] == "json_schema"
    assert sent["response_format"]["json_schema"]["schema"]["properties"]["facts"]
    assert sent["messages"][0]["content"].startswith("engram-task: extract_facts\n")
    assert json.loads(sent["messages"][1]["content"]) == {"message": "I like tea"}
    assert sent["temperature"] == 0


async def test_invalid_output_is_retried_with_the_error_then_accepted(scripted_upstream) -> None:
    scripted_upstream.replies = ["no idea", '{"facts": ["User likes tea"]}']
    client = client_for(scripted_upstream)
    assert (await ask(client)).facts == ["User likes tea"]
    await client.close()
    retry = scripted_upstream.chat_requests()[1]["messages"]
    assert retry[-2] == {"role": "assistant", "content": "no idea"}
    assert "not valid JSON" in retry[-1]["content"]
    assert "(no JSON value found in the reply)" in retry[-1]["content"]  # the reason
    assert "no reasoning, no prose" in retry[-1]["content"]


async def test_junk_after_retries_raises_output_error(scripted_upstream) -> None:
    scripted_upstream.replies = ['{"facts": "not a list"}']
    client = client_for(scripted_upstream, llm_output_retries=2)
    with pytest.raises(LlmOutputError):
        await ask(client)
    await client.close()
    assert len(scripted_upstream.chat_requests()) == 3


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_transient_upstream_errors_are_unavailable(scripted_upstream, status: int) -> None:
    scripted_upstream.replies = [UpstreamError(status)]
    client = client_for(scripted_upstream)
    with pytest.raises(LlmUnavailable):
        await ask(client)
    await client.close()


async def test_timeout_is_unavailable(scripted_upstream) -> None:
    scripted_upstream.delay_s = 2.0
    scripted_upstream.replies = ['{"facts": []}']
    client = client_for(scripted_upstream, llm_timeout_s=0.3)
    with pytest.raises(LlmUnavailable):
        await ask(client)
    await client.close()


async def test_upstream_without_json_schema_is_asked_again_without_it(scripted_upstream) -> None:
    def reply(body: dict) -> str | UpstreamError:
        if body.get("response_format", {}).get("type") == "json_schema":
            return UpstreamError(400, "response_format json_schema is not supported")
        return '{"facts": ["User likes tea"]}'

    scripted_upstream.replies = [reply]
    client = client_for(scripted_upstream)
    assert (await ask(client)).facts == ["User likes tea"]
    assert (await ask(client)).facts == ["User likes tea"]  # remembered: no second rejection
    await client.close()
    kinds = [r.get("response_format", {}).get("type") for r in scripted_upstream.chat_requests()]
    assert kinds == ["json_schema", "json_object", "json_object"]


async def test_reasoning_effort_and_the_extra_body_go_with_every_task(scripted_upstream) -> None:
    scripted_upstream.replies = ['{"facts": []}']
    extra = {"chat_template_kwargs": {"enable_thinking": False}}
    client = client_for(scripted_upstream, llm_reasoning_effort="none", llm_extra_body=extra)
    await ask(client)
    await client.close()
    sent = scripted_upstream.chat_requests()[0]
    assert sent["reasoning_effort"] == "none"
    assert sent["chat_template_kwargs"] == {"enable_thinking": False}
    assert sent["response_format"]["type"] == "json_schema"  # Ollama: its `format` schema


async def test_nothing_extra_is_sent_by_default(scripted_upstream) -> None:
    scripted_upstream.replies = ['{"facts": []}']
    client = client_for(scripted_upstream)
    await ask(client)
    await client.close()
    sent = scripted_upstream.chat_requests()[0]
    assert "reasoning_effort" not in sent and "chat_template_kwargs" not in sent


@pytest.mark.parametrize(
    ("setting", "value", "error"),
    [
        ("llm_extra_body", {"model": "other"}, "may not set model"),
        ("llm_extra_body", {"messages": []}, "may not set messages"),
        ("llm_reasoning_effort", "off", "llm_reasoning_effort"),
    ],
)
def test_bad_reasoning_settings_fail_at_start(setting: str, value: object, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        LlmSettingsMixin.model_validate({setting: value})


def test_the_extra_body_is_read_as_json_from_the_environment(monkeypatch) -> None:
    from engram_workers.ingest import IngestSettings

    monkeypatch.setenv("ENGRAM_LLM_EXTRA_BODY", '{"think": false}')
    monkeypatch.setenv("ENGRAM_LLM_REASONING_EFFORT", "low")
    settings = IngestSettings()
    assert settings.llm_extra_body == {"think": False}
    assert settings.llm_reasoning_effort == "low"
