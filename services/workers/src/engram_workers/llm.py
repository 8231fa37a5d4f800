"""The workers' LLM client: structured JSON answers from any OpenAI-compatible server.

Every call asks for JSON matching a pydantic schema. ``response_format`` with a
``json_schema`` is sent where the upstream supports it; an upstream that rejects it
(HTTP 400 naming ``response_format``) is remembered and asked again without it. The
reply is parsed tolerantly (code fences, prose around the object) and validated; an
invalid reply is retried with the validation error shown to the model, then
:class:`LlmOutputError` is raised so the caller can take its documented fallback.

Prompts follow one convention that makes them easy to read in traces and to script in
tests: the system message starts with ``engram-task: <task>`` and the user message is
the task's input as one JSON object.

Transient upstream failures (429, 5xx, timeouts, connection errors) raise
:class:`LlmUnavailable`, which workers treat as retryable (nak with backoff).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any, Literal, TypeVar

import openai
from pydantic import BaseModel, Field, SecretStr, ValidationError

from engram_core.genai import LlmCall
from engram_core.logging import get_logger
from engram_core.retry import TransientError

log = get_logger(__name__)

M = TypeVar("M", bound=BaseModel)

TASK_PREFIX = "engram-task:"
JsonMode = Literal["auto", "json_schema", "json_object", "none"]


class LlmSettingsMixin(BaseModel):
    """LLM variables shared by the workers that call a model (mixed into their settings)."""

    llm_base_url: str = Field(default="http://localhost:11434/v1")
    llm_api_key: SecretStr | None = Field(default=None)
    llm_model: str = Field(
        default="", description="Model for worker calls when no better one is known."
    )
    llm_timeout_s: float = Field(default=60.0, gt=0)
    llm_json_mode: JsonMode = Field(
        default="auto",
        description="auto: json_schema, falling back to plain JSON if the upstream rejects it.",
    )
    llm_output_retries: int = Field(
        default=1, ge=0, le=5, description="Re-asks after an unparsable or invalid reply."
    )


class LlmError(Exception):
    """Base of the LLM client's errors."""


class LlmUnavailable(LlmError, TransientError):
    """Transient: rate limited, upstream 5xx, timeout or connection failure."""


class LlmRequestError(LlmError):
    """The upstream refused the request (4xx other than 429)."""


class LlmOutputError(LlmError):
    """The model's reply could not be turned into the schema after all retries."""


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def extract_json(text: str) -> Any:
    """Parse the first JSON object or array in ``text`` (fences and prose tolerated)."""
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    for candidate in candidates:
        candidate = candidate.strip()
        try:
            return json.loads(candidate)
        except json.JSONDecodeError:
            pass
        for opener, closer in (("{", "}"), ("[", "]")):
            start, end = candidate.find(opener), candidate.rfind(closer)
            if 0 <= start < end:
                try:
                    return json.loads(candidate[start : end + 1])
                except json.JSONDecodeError:
                    continue
    raise ValueError("no JSON object found in the reply")


def _strict_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": schema.get("title", "answer"), "schema": schema, "strict": False}


@functools.cache
def _response_schema(schema: type[BaseModel]) -> dict[str, Any]:
    """A task's ``json_schema`` response format, built once per schema (pydantic's JSON
    schema generation costs about half a millisecond a call)."""
    return _strict_schema(schema.model_json_schema())


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
        self._schema_rejected = False

    async def close(self) -> None:
        await self._client.close()

    def model_for(self, *preferred: str) -> str:
        for model in (*preferred, self.default_model):
            if model:
                return model
        raise LlmRequestError("no model configured (set ENGRAM_LLM_MODEL)")

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
        messages: list[dict[str, str]] = [
            {"role": "system", "content": f"{TASK_PREFIX} {task}\n{instructions}"},
            {"role": "user", "content": json.dumps(payload, ensure_ascii=False, default=str)},
        ]
        last_error = ""
        for attempt in range(self.output_retries + 1):
            text = await self._complete(task, model, messages, schema)
            try:
                return schema.model_validate(extract_json(text))
            except (ValueError, ValidationError) as exc:
                last_error = str(exc).splitlines()[0][:300]
                log.warning("llm.output_invalid", task=task, attempt=attempt + 1, error=last_error)
                messages = [
                    *messages,
                    {"role": "assistant", "content": text[:4000]},
                    {
                        "role": "user",
                        "content": (
                            "That reply was not valid JSON for the schema "
                            f"({last_error}). Reply with one JSON object only."
                        ),
                    },
                ]
        raise LlmOutputError(f"{task}: invalid output after retries: {last_error}")

    async def _complete(
        self, task: str, model: str, messages: list[dict[str, str]], schema: type[BaseModel]
    ) -> str:
        extra: dict[str, Any] = {}
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
                    **extra,  # type: ignore[arg-type]
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
                return ""
            return reply.choices[0].message.content or ""


def _error_type(exc: openai.APIError) -> str:
    """The HTTP status when there was an answer, else the kind of failure (error.type)."""
    status = getattr(exc, "status_code", None)
    return str(status) if status else type(exc).__name__
