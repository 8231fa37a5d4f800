"""The workers' LLM client and the one policy every task follows.

:class:`LlmClient` asks for JSON matching a pydantic schema. ``response_format`` with a
``json_schema`` is sent where the upstream supports it; an upstream that rejects it
(HTTP 400 naming ``response_format``) is remembered and asked again without it.
``ENGRAM_LLM_REASONING_EFFORT`` and ``ENGRAM_LLM_EXTRA_BODY`` go with every request (to
turn a reasoning model's thinking down or off, per upstream: docs/workers.md, "Local
models"). The reply is read the way local models write it (:mod:`engram_workers.replies`:
reasoning set apart, fences, prose, JSON5-ish syntax) and validated; an unusable reply is
re-asked once with the reason shown to the model.

Prompts follow one convention that makes them easy to read in traces and to script in
tests: the system message starts with ``engram-task: <task>`` and the user message is
the task's input as one JSON object. The tasks themselves (instructions and schemas)
live in :mod:`engram_workers.prompts`.

:class:`AskLlm` is the policy (docs/workers.md, "When the model fails"):

- **model**: the task's own setting (``ENGRAM_EXTRACTION_MODEL`` ...), else
  ``ENGRAM_LLM_MODEL``, else the chat model the user talked to. Configured beats
  inferred: the workers' upstream need not serve the chat's model.
- **no model known** or an **unusable answer** (after the re-ask): the task's fallback.
- **unavailable** (429, 5xx, timeout, connection): retried by the bus, by time, until
  the retry horizon; on the delivery that would be the last, the task's fallback.
- **refused** (any other 4xx: a bad key, an unknown model): a dead letter, since the
  same request will be refused again; replay it once the settings are fixed.

A fallback never loses what the user said: ingest keeps the turn searchable (and
``engram reextract`` learns from it later), reconcile adds the facts, summarize writes
a rule-based summary. Every outcome is counted by task and model (``engram.llm.tasks``;
fallbacks also in ``engram.llm.fallbacks``), which ``engram status`` reads back.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, Protocol, TypeVar

import openai
from openai.types.chat import ChatCompletionMessageParam
from pydantic import BaseModel, Field, SecretStr, field_validator

from engram_core import metrics, semconv
from engram_core.genai import LlmCall
from engram_core.logging import get_logger
from engram_core.retry import TransientError
from engram_workers.replies import ModelReply, UnusableReply, parse_reply
from engram_workers.runtime import DependencyUnavailable, PermanentError

log = get_logger(__name__)

M = TypeVar("M", bound=BaseModel)
In = TypeVar("In", bound=BaseModel)
Out = TypeVar("Out", bound=BaseModel)

TASK_PREFIX = "engram-task:"
JsonMode = Literal["auto", "json_schema", "json_object", "none"]
ReasoningEffort = Literal["", "none", "minimal", "low", "medium", "high"]
#: What the client itself sends; ENGRAM_LLM_EXTRA_BODY may not replace them.
_OWN_FIELDS = frozenset({"model", "messages", "response_format", "temperature", "stream"})


class LlmSettingsMixin(BaseModel):
    """LLM variables shared by the workers that call a model (mixed into their settings)."""

    llm_base_url: str = Field(default="http://localhost:11434/v1")
    llm_api_key: SecretStr | None = Field(default=None)
    llm_model: str = Field(
        default="",
        description="Model for every worker task without a model setting of its own; "
        "empty: the chat model the user talked to.",
    )
    llm_timeout_s: float = Field(default=60.0, gt=0)
    llm_json_mode: JsonMode = Field(
        default="auto",
        description="auto: json_schema, falling back to plain JSON if the upstream rejects it.",
    )
    llm_output_retries: int = Field(
        default=1, ge=0, le=5, description="Re-asks after an unparsable or invalid reply."
    )
    llm_reasoning_effort: ReasoningEffort = Field(
        default="",
        description="Sent as reasoning_effort with every worker task when set: none turns "
        "thinking off on Ollama's /v1 (and gpt-5.1); minimal or low on OpenAI reasoning "
        "models and gpt-oss. Empty: not sent.",
    )
    llm_extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="JSON object merged into every worker task's request body, for an "
        'upstream\'s own switches: {"chat_template_kwargs": {"enable_thinking": false}} '
        "(vLLM, SGLang, llama.cpp with Qwen3), ...",
    )

    @field_validator("llm_extra_body")
    @classmethod
    def _leaves_the_clients_fields_alone(cls, body: dict[str, Any]) -> dict[str, Any]:
        clashing = sorted(_OWN_FIELDS & body.keys())
        if clashing:
            raise ValueError(f"may not set {', '.join(clashing)}: the workers set them")
        return body


class LlmError(Exception):
    """Base of the LLM client's errors."""


class LlmUnavailable(LlmError, TransientError):
    """Transient: rate limited, upstream 5xx, timeout or connection failure."""


class LlmRequestError(LlmError):
    """The upstream refused the request (4xx other than 429)."""


class LlmOutputError(LlmError):
    """The model's reply could not be turned into the schema after all retries."""


def _lenient_json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """``response_format.json_schema`` without strict mode: strict mode refuses the
    optional fields and defaults our schemas use, and the reply is validated anyway."""
    return {"name": schema.get("title", "answer"), "schema": schema, "strict": False}


@functools.cache
def _response_schema(schema: type[BaseModel]) -> dict[str, Any]:
    """A task's ``json_schema`` response format, built once per schema (pydantic's JSON
    schema generation costs about half a millisecond a call)."""
    return _lenient_json_schema(schema.model_json_schema())


class LlmClient:
    def __init__(self, settings: LlmSettingsMixin) -> None:
        key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else "unused"
        self._client = openai.AsyncOpenAI(
            base_url=settings.llm_base_url,
            api_key=key,
            timeout=settings.llm_timeout_s,
            max_retries=0,  # the bus owns retries: nak with backoff, then dead-letter
        )
        self.default_model = settings.llm_model
        self.json_mode: JsonMode = settings.llm_json_mode
        self.output_retries = settings.llm_output_retries
        self.extra_body: dict[str, Any] = dict(settings.llm_extra_body)
        if settings.llm_reasoning_effort:
            self.extra_body["reasoning_effort"] = settings.llm_reasoning_effort
        self._schema_rejected = False

    async def close(self) -> None:
        await self._client.close()

    async def structured(
        self,
        *,
        task: str,
        model: str,
        instructions: str,
        payload: dict[str, Any],
        schema: type[M],
    ) -> M:
        """One task's JSON answer, validated against ``schema``."""
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": f"{TASK_PREFIX} {task}\n{instructions}"},
            {"role": "user", "content": json.dumps(payload, ensure_ascii=False, default=str)},
        ]
        last_error = ""
        for attempt in range(self.output_retries + 1):
            reply = await self._complete(task, model, messages, schema)
            try:
                return parse_reply(reply, schema)
            except UnusableReply as exc:
                last_error = str(exc)
                log.warning("llm.output_invalid", task=task, attempt=attempt + 1, error=last_error)
                messages = [
                    *messages,
                    {"role": "assistant", "content": reply.content[:4000]},
                    {
                        "role": "user",
                        "content": (
                            "That reply was not valid JSON for the schema "
                            f"({last_error}). Reply with one JSON object only: no "
                            "reasoning, no prose, nothing before or after it."
                        ),
                    },
                ]
        raise LlmOutputError(f"{task}: invalid output after retries: {last_error}")

    async def _complete(
        self,
        task: str,
        model: str,
        messages: list[ChatCompletionMessageParam],
        schema: type[BaseModel],
    ) -> ModelReply:
        extra: dict[str, Any] = {"extra_body": self.extra_body} if self.extra_body else {}
        mode = self.json_mode
        if mode == "auto":
            mode = "json_object" if self._schema_rejected else "json_schema"
        if mode == "json_schema":
            extra["response_format"] = {
                "type": "json_schema",
                "json_schema": _response_schema(schema),
            }
        elif mode == "json_object":
            extra["response_format"] = {"type": "json_object"}
        with LlmCall(model, task=task) as call:
            try:
                reply = await self._client.chat.completions.create(
                    model=model,
                    messages=messages,
                    temperature=0,
                    **extra,
                )
            except openai.BadRequestError as exc:
                call.fail("400", "bad request")
                if (
                    self.json_mode == "auto"
                    and not self._schema_rejected
                    and "response_format" in str(exc)
                ):
                    log.info("llm.json_schema_unsupported", model=model)
                    self._schema_rejected = True
                    return await self._complete(task, model, messages, schema)
                raise LlmRequestError(f"{task}: upstream refused the request: {exc}") from exc
            except (
                openai.RateLimitError,
                openai.InternalServerError,
                openai.APITimeoutError,
                openai.APIConnectionError,
            ) as exc:
                call.fail(_error_type(exc))
                raise LlmUnavailable(f"{task}: {type(exc).__name__}: {exc}") from exc
            except openai.APIStatusError as exc:
                call.fail(str(exc.status_code))
                if exc.status_code >= 500:
                    raise LlmUnavailable(f"{task}: upstream {exc.status_code}") from exc
                raise LlmRequestError(f"{task}: upstream {exc.status_code}: {exc}") from exc
            if reply.usage is not None:
                call.record_usage(reply.usage.prompt_tokens, reply.usage.completion_tokens)
            call.record_usage(None, None, reply.model or model)
            if not reply.choices:
                return ModelReply("")
            choice = reply.choices[0]
            thought = getattr(choice.message, "reasoning_content", None) or getattr(
                choice.message, "reasoning", None
            )
            return ModelReply(
                choice.message.content or "",
                reasoning=thought if isinstance(thought, str) else "",
                truncated=choice.finish_reason == "length",
            )


def _error_type(exc: openai.APIError) -> str:
    """The HTTP status when there was an answer, else the kind of failure (error.type)."""
    status = getattr(exc, "status_code", None)
    return str(status) if status else type(exc).__name__


# --- the tasks and the policy ------------------------------------------------------------


@dataclass(frozen=True)
class LlmTask(Generic[In, Out]):
    """One thing the workers ask a model (the instances: :mod:`engram_workers.prompts`)."""

    name: str  # the ``engram-task:`` name
    #: A ``str.format`` template when the task takes parameters (see :meth:`render`).
    instructions: str
    input: type[In]
    output: type[Out]
    #: The variable that picks this task's model, named when no model is known.
    model_setting: str

    def render(self, **params: object) -> str:
        return self.instructions.format(**params) if params else self.instructions


FallbackKind = Literal["no_model", "unusable", "unavailable"]


@dataclass(frozen=True)
class Answered(Generic[Out]):
    output: Out
    model: str


@dataclass(frozen=True)
class FellBack:
    """The task's documented fallback applies; ``reason`` says why (logged, and stored
    where the fallback's result is)."""

    kind: FallbackKind
    reason: str
    model: str = ""


class Ask(Protocol):
    """Ask a task's model; what the planning cores take (tests pass a fake)."""

    async def __call__(
        self, task: LlmTask[In, Out], payload: In, **params: object
    ) -> Answered[Out] | FellBack: ...


def choose_model(task_model: str, default_model: str, chat_models: Iterable[str]) -> str:
    """The task's setting, else ``ENGRAM_LLM_MODEL``, else the first chat model known
    (callers list the newest first); "" when none is known."""
    return next((m for m in (task_model, default_model, *chat_models) if m), "")


@dataclass(frozen=True)
class AskLlm:
    """The policy of the module docstring, for one delivery."""

    llm: LlmClient
    task_model: str = ""
    chat_models: Sequence[str] = ()
    #: The delivery's :attr:`~engram_workers.runtime.Delivery.last_chance`.
    last_chance: bool = False

    async def __call__(
        self, task: LlmTask[In, Out], payload: In, **params: object
    ) -> Answered[Out] | FellBack:
        model = choose_model(self.task_model, self.llm.default_model, self.chat_models)
        if not model:
            return _fell_back(
                task,
                "no_model",
                f"no model configured for {task.name}: set ENGRAM_LLM_MODEL (or "
                f"{task.model_setting}), or send `model` with the chat",
            )
        try:
            output = await self.llm.structured(
                task=task.name,
                model=model,
                instructions=task.render(**params),
                payload=payload.model_dump(),
                schema=task.output,
            )
        except LlmUnavailable as exc:
            if not self.last_chance:
                raise DependencyUnavailable(str(exc)) from exc
            return _fell_back(
                task,
                "unavailable",
                f"the model stayed unavailable until the retry horizon ({model}): {exc}",
                model,
            )
        except LlmOutputError as exc:
            return _fell_back(
                task, "unusable", f"the model's answer was unusable ({model}): {exc}", model
            )
        except LlmRequestError as exc:
            raise PermanentError(
                f"{exc}; fix the model settings, then replay this with `engram dlq replay`"
            ) from exc
        metrics.llm_tasks.add(1, _outcome(task, model, "answered"))
        return Answered(output, model)


def _outcome(task: LlmTask[Any, Any], model: str, outcome: str) -> dict[str, str]:
    return {
        semconv.ENGRAM_LLM_TASK: task.name,
        semconv.GEN_AI_REQUEST_MODEL: model,
        semconv.ENGRAM_LLM_OUTCOME: outcome,
    }


def _fell_back(
    task: LlmTask[Any, Any], kind: FallbackKind, reason: str, model: str = ""
) -> FellBack:
    log.warning("llm.fallback", task=task.name, kind=kind, model=model, reason=reason)
    metrics.llm_fallbacks.add(
        1,
        {
            semconv.ENGRAM_LLM_TASK: task.name,
            semconv.ENGRAM_LLM_FALLBACK: kind,
            semconv.GEN_AI_REQUEST_MODEL: model,
        },
    )
    metrics.llm_tasks.add(1, _outcome(task, model, kind))
    return FellBack(kind, reason, model)
