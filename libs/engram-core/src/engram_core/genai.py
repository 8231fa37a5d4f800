"""One LLM call as OpenTelemetry sees it: a ``chat {model}`` span and the gen_ai metrics.

Used by the gateway (the caller's chat, forwarded upstream) and the workers (extraction,
reconcile, summarize), so every LLM call in a trace and on a dashboard looks the same:

- span ``chat {model}`` (CLIENT) with ``gen_ai.operation.name=chat``,
  ``gen_ai.provider.name``/``gen_ai.system``, ``gen_ai.request.model``,
  ``gen_ai.response.model`` and ``gen_ai.usage.input_tokens``/``output_tokens`` when the
  reply reports usage, ``engram.llm.task``; ``error.type`` and an error status on failure;
- ``gen_ai.client.operation.duration`` (s), ``gen_ai.client.token.usage`` ({token}, by
  ``gen_ai.token.type``) and ``engram.llm.errors`` ({error}, by ``error.type``).

Prompts and replies are never put on spans: they are user data. The model is the
caller's choice on the gateway, so as a metric label it is bounded
(:data:`MODEL_LABEL`: the first :data:`MAX_MODEL_LABELS` names a process sees, then
``_OTHER``); the span keeps the name as sent.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from engram_core import metrics, semconv
from engram_core.labels import BoundedLabel

_tracer = trace.get_tracer("engram.genai")

#: Distinct ``gen_ai.request.model`` label values per process (configured models come
#: first in practice: the workers' and the first chats').
MAX_MODEL_LABELS = 100
MODEL_LABEL = BoundedLabel(MAX_MODEL_LABELS)


class LlmCall:
    """Started on construction; :meth:`end` (or leaving the ``with`` block) finishes it.

    As a context manager the span is current inside the block, and an exception that
    escapes it marks the call failed. :meth:`current` makes it current for a while
    without ending it, for replies that are still streaming when the block is left.
    """

    def __init__(
        self,
        model: str,
        *,
        task: str,
        provider: str = semconv.GEN_AI_PROVIDER_OPENAI,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self._attributes: dict[str, Any] = {
            semconv.GEN_AI_OPERATION_NAME: semconv.GEN_AI_OPERATION_CHAT,
            semconv.GEN_AI_PROVIDER_NAME: provider,
            semconv.GEN_AI_REQUEST_MODEL: model,
            semconv.ENGRAM_LLM_TASK: task,
        }
        self.span: Span = (tracer or _tracer).start_span(
            f"chat {model}",
            kind=SpanKind.CLIENT,
            attributes={**self._attributes, semconv.GEN_AI_SYSTEM: provider},
        )
        self._attributes[semconv.GEN_AI_REQUEST_MODEL] = MODEL_LABEL(model)  # metrics only
        self._started = time.perf_counter()
        self._tokens: dict[str, int] = {}
        self._error: str | None = None
        self._ended = False

    def record_usage(
        self,
        input_tokens: int | None,
        output_tokens: int | None,
        response_model: str | None = None,
    ) -> None:
        if input_tokens is not None:
            self._tokens["input"] = int(input_tokens)
            self.span.set_attribute(semconv.GEN_AI_USAGE_INPUT_TOKENS, int(input_tokens))
        if output_tokens is not None:
            self._tokens["output"] = int(output_tokens)
            self.span.set_attribute(semconv.GEN_AI_USAGE_OUTPUT_TOKENS, int(output_tokens))
        if response_model:
            self.span.set_attribute(semconv.GEN_AI_RESPONSE_MODEL, response_model)

    def record_reply(self, reply: Mapping[str, Any] | None) -> None:
        """Usage and model from a chat-completions reply (or final stream chunk) as JSON."""
        if not isinstance(reply, Mapping):
            return
        usage = reply.get("usage")
        model = reply.get("model")
        usage = usage if isinstance(usage, Mapping) else {}
        self.record_usage(
            _count(usage.get("prompt_tokens")),
            _count(usage.get("completion_tokens")),
            model if isinstance(model, str) else None,
        )

    def fail(self, error_type: str, description: str | None = None) -> None:
        self._error = error_type
        self.span.set_attribute(semconv.ERROR_TYPE, error_type)
        self.span.set_status(Status(StatusCode.ERROR, description or error_type))

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        attributes = dict(self._attributes)
        if self._error is not None:
            attributes[semconv.ERROR_TYPE] = self._error
            metrics.llm_errors.add(1, attributes)
        metrics.llm_duration.record(time.perf_counter() - self._started, attributes)
        for token_type, count in self._tokens.items():
            metrics.llm_tokens.record(
                count, {**self._attributes, semconv.GEN_AI_TOKEN_TYPE: token_type}
            )
        self.span.end()

    @contextmanager
    def current(self) -> Iterator[LlmCall]:
        """Make the span current (so the HTTP client's span nests under it); no end."""
        with trace.use_span(self.span, end_on_exit=False):
            yield self

    def __enter__(self) -> LlmCall:
        self._token = trace.use_span(self.span, end_on_exit=False)
        self._token.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is not None and self._error is None:
            self.fail(type(exc).__name__, str(exc)[:200] or None)
        self._token.__exit__(None, None, None)
        self.end()


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
