"""The workers' one LLM policy (:class:`engram_workers.llm.AskLlm`) and the prompts it
asks with, against a fake client: which model, and what each failure becomes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest
from pydantic import BaseModel

from engram_core.retry import is_transient
from engram_testing.fake_llm import FakeAsk
from engram_workers import prompts
from engram_workers.extraction import Extraction, extract
from engram_workers.llm import (
    Answered,
    AskLlm,
    FellBack,
    LlmClient,
    LlmOutputError,
    LlmRequestError,
    LlmUnavailable,
    choose_model,
)
from engram_workers.runtime import DependencyUnavailable, PermanentError

M = TypeVar("M", bound=BaseModel)


class FakeClient(LlmClient):
    """Stands in for :class:`LlmClient` (no HTTP client): answers or raises, and records
    the calls."""

    def __init__(self, default_model: str = "", outcome: object = None) -> None:
        self.default_model = default_model
        self.outcome = outcome
        self.calls: list[dict[str, Any]] = []

    async def structured(
        self,
        *,
        task: str,
        model: str,
        instructions: str,
        payload: dict[str, Any],
        schema: type[M],
    ) -> M:
        self.calls.append(
            {
                "task": task,
                "model": model,
                "instructions": instructions,
                "payload": payload,
                "schema": schema,
            }
        )
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return schema.model_validate(self.outcome or {"decisions": []})


def reconcile_input() -> prompts.ReconcileInput:
    return prompts.ReconcileInput(
        existing=[prompts.ExistingMemory(id=1, text="User loves pizza")],
        new_facts=["User hates pizza"],
    )


def ask_with(client: FakeClient, **policy: Any) -> AskLlm:
    return AskLlm(client, **policy)


@pytest.mark.parametrize(
    ("task_model", "default", "chat", "chosen"),
    [
        ("task-model", "house-model", ["chat-model"], "task-model"),
        ("", "house-model", ["chat-model"], "house-model"),  # configured beats inferred
        ("", "", ["", "chat-model", "older"], "chat-model"),  # the first chat model known
        ("", "", [], ""),
    ],
)
def test_the_model_is_the_tasks_then_the_workers_then_the_chats(
    task_model: str, default: str, chat: list[str], chosen: str
) -> None:
    assert choose_model(task_model, default, chat) == chosen


async def test_an_answer_comes_back_with_the_model_that_gave_it() -> None:
    client = FakeClient("house-model", {"decisions": [{"fact": 0, "event": "ADD"}]})
    answer = await ask_with(client, chat_models=("chat-model",))(
        prompts.RECONCILE, reconcile_input()
    )
    assert isinstance(answer, Answered)
    assert answer.model == "house-model"
    assert answer.output.decisions[0].event == "ADD"
    [call] = client.calls
    assert call["task"] == "reconcile" and call["schema"] is prompts.ReconcileOutput
    assert call["payload"]["new_facts"] == ["User hates pizza"]
    assert call["instructions"] == prompts.RECONCILE.instructions


async def test_no_model_known_falls_back_and_names_the_settings() -> None:
    client = FakeClient()
    answer = await ask_with(client)(prompts.RECONCILE, reconcile_input())
    assert isinstance(answer, FellBack) and answer.kind == "no_model"
    assert "ENGRAM_LLM_MODEL" in answer.reason and "ENGRAM_RECONCILE_MODEL" in answer.reason
    assert client.calls == []


async def test_an_unusable_answer_falls_back() -> None:
    client = FakeClient("m", LlmOutputError("reconcile: invalid output after retries: x"))
    answer = await ask_with(client)(prompts.RECONCILE, reconcile_input())
    assert isinstance(answer, FellBack) and answer.kind == "unusable"
    assert answer.model == "m" and "invalid output" in answer.reason


async def test_an_unavailable_model_is_retried_by_time_until_the_last_chance() -> None:
    client = FakeClient("m", LlmUnavailable("reconcile: 503"))
    with pytest.raises(DependencyUnavailable) as raised:
        await ask_with(client)(prompts.RECONCILE, reconcile_input())
    assert is_transient(raised.value)  # the runtime retries it until the retry horizon
    answer = await ask_with(client, last_chance=True)(prompts.RECONCILE, reconcile_input())
    assert isinstance(answer, FellBack) and answer.kind == "unavailable"
    assert "until the retry horizon" in answer.reason


async def test_a_refused_request_is_a_dead_letter_to_replay_once_fixed() -> None:
    client = FakeClient("typo-model", LlmRequestError("reconcile: upstream 404: no such model"))
    for last_chance in (False, True):
        with pytest.raises(PermanentError, match="engram dlq replay"):
            await ask_with(client, last_chance=last_chance)(prompts.RECONCILE, reconcile_input())


def test_every_task_renders_its_instructions() -> None:
    assert prompts.EXTRACT_FACTS.render() == prompts.EXTRACT_FACTS.instructions
    assert "at most 321 characters" in prompts.SUMMARIZE.render(max_chars=321)
    episode = prompts.EPISODE.render(first_turn=3, last_turn=9, max_chars=500)
    assert "turns\n3 to 9" in episode and '{"summary"' in episode
    names = [t.name for t in (prompts.EXTRACT_FACTS, prompts.RECONCILE, prompts.SUMMARIZE)]
    assert names == ["extract_facts", "reconcile", "summarize"]


async def test_extraction_cleans_the_answer_and_passes_a_fallback_on() -> None:
    ask = FakeAsk({"extract_facts": {"facts": ["  User loves pizza ", "user loves pizza"]}})
    when = datetime(2026, 5, 1, tzinfo=UTC)
    result = await extract(ask, message="I love pizza", date=when, context=["user: hi"])
    assert result == Extraction(["User loves pizza"], [], "fake-model")
    [question] = ask.asked
    assert question.payload == prompts.ExtractInput(
        message="I love pizza", date=when.isoformat(), recent_context=["user: hi"]
    )
    fallback = FellBack("no_model", "no model configured for extract_facts")
    assert (
        await extract(FakeAsk({"extract_facts": fallback}), message="x", date=when, context=[])
        is fallback
    )
