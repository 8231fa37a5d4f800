"""The per-request memory controls: read from the body (``memory_*``) or headers
(``X-Engram-Memory-*``), validated, and removed before the request goes upstream.

Precedence, per control: request body, then header, then the operator's default
(``ENGRAM_GATEWAY_MEMORY_*``), then the retrieval service's own default. The body wins
because it is the most specific: an SDK call's ``extra_body`` overrides a header an
HTTP client or proxy set for every request.

User ids (:data:`UserId`, :func:`chat_user`) are normalised here, once, for every way a
user is named (the chat's ``user`` and user header, the memory API, browsing, MCP):
Unicode NFC and trimmed, so "José" typed as one code point or as ``e`` + a combining
accent is one user. Empty means no user; a value that is blank once trimmed, longer
than 256 characters or holding control characters is refused (400), never guessed at.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
)

from engram_core.api_models import (
    ConversationId,
    Fraction,
    MaxTokens,
    Switch,
    TopK,
    normalize_user_id,
)
from engram_core.memory import DEFAULT_CONVERSATION
from engram_gateway.errors import GatewayError, bad_request
from engram_gateway.settings import GatewaySettings

HEADER_PREFIX = "x-engram-memory"
BODY_PREFIX = "memory_"

#: body field -> header carrying the same control
HEADER_FOR_FIELD: dict[str, str] = {
    "memory": "X-Engram-Memory",
    "memory_id": "X-Engram-Memory-Id",
    "memory_top_k": "X-Engram-Memory-Top-K",
    "memory_max_tokens": "X-Engram-Memory-Max-Tokens",
    "memory_recency_weight": "X-Engram-Memory-Recency-Weight",
    "memory_score_threshold": "X-Engram-Memory-Score-Threshold",
    "memory_mmr_lambda": "X-Engram-Memory-Mmr-Lambda",
    "memory_cross_session": "X-Engram-Memory-Cross-Session",
}
_FIELD_FOR_HEADER = {header.lower(): name for name, header in HEADER_FOR_FIELD.items()}
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_BOOLEANS = ("memory", "memory_cross_session")
_HEADER_TYPES = {
    "memory": "boolean (true/false)",
    "memory_cross_session": "boolean (true/false)",
    "memory_top_k": "integer",
    "memory_max_tokens": "integer",
}
_INTEGERS = ("memory_top_k", "memory_max_tokens")


def _header_text(raw: str) -> str:
    # HTTP servers decode header bytes as latin-1; a client that sent UTF-8 (a person's
    # name, say) means the UTF-8 text.
    try:
        return raw.encode("latin-1").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return raw


def chat_user(body: Mapping[str, Any], headers: Mapping[str, str], user_header: str) -> str:
    """Whose memory a chat is: the body's ``user``, else the configured user header (what
    Open WebUI forwards), else no user; normalised (400 naming the source when invalid)."""
    raw, source = body.get("user") or "", "user"
    if not raw and user_header:
        raw, source = _header_text(headers.get(user_header, "")), user_header
    try:
        return normalize_user_id(str(raw))
    except ValueError as exc:
        raise bad_request(f"Invalid {source}: {exc}.", param=source, code="invalid_user") from None


class MemoryControls(BaseModel):
    """The memory knobs of one request. ``None``: not set (a default applies)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    memory: Switch | None = None
    memory_id: ConversationId | None = None
    memory_top_k: TopK | None = None
    memory_max_tokens: MaxTokens | None = None
    memory_recency_weight: Fraction | None = None
    memory_score_threshold: Fraction | None = None
    memory_mmr_lambda: Fraction | None = None
    # False: search only this conversation (and the tenant's global bucket), not the
    # user's other conversations.
    memory_cross_session: Switch | None = None

    def with_defaults(self, settings: GatewaySettings) -> MemoryControls:
        return self.model_copy(
            update={
                "memory": settings.gateway_memory_enabled if self.memory is None else self.memory,
                "memory_top_k": _first(self.memory_top_k, settings.gateway_memory_top_k),
                "memory_max_tokens": _first(
                    self.memory_max_tokens, settings.gateway_memory_max_tokens
                ),
                "memory_recency_weight": _first(
                    self.memory_recency_weight, settings.gateway_memory_recency_weight
                ),
                "memory_score_threshold": _first(
                    self.memory_score_threshold, settings.gateway_memory_score_threshold
                ),
                "memory_mmr_lambda": _first(
                    self.memory_mmr_lambda, settings.gateway_memory_mmr_lambda
                ),
                "memory_cross_session": _first(
                    self.memory_cross_session, settings.gateway_memory_cross_session
                ),
            }
        )

    @property
    def enabled(self) -> bool:
        return self.memory is not False

    @property
    def conversation_id(self) -> str:
        return self.memory_id or DEFAULT_CONVERSATION


def _first(value: Any, default: Any) -> Any:
    return default if value is None else value


def _from_header(name: str, header: str, raw: str) -> Any:
    """Headers are strings: parse them into the type the body would carry."""
    text = raw.strip()
    try:
        if name in _BOOLEANS:
            if text.lower() in _TRUE:
                return True
            if text.lower() in _FALSE:
                return False
            raise ValueError
        if name in _INTEGERS:
            return int(text)
        if name == "memory_id":
            return text
        return float(text)
    except ValueError:
        expected = _HEADER_TYPES.get(name, "number")
        raise bad_request(
            f"Invalid header {header}: {raw!r} is not a valid {expected}",
            param=header,
            code="invalid_memory_control",
        ) from None


def _validation_message(exc: ValidationError, source: Mapping[str, str]) -> GatewayError:
    error = exc.errors()[0]
    name = str(error["loc"][0]) if error["loc"] else "memory"
    where = source.get(name, name)
    return bad_request(
        f"Invalid value for {where}: {error['msg']}", param=where, code="invalid_memory_control"
    )


def split_memory_controls(
    body: dict[str, Any], headers: Mapping[str, str]
) -> tuple[MemoryControls, dict[str, Any]]:
    """Return the validated controls and the body without them (key order kept).

    Raises a 400 :class:`GatewayError` naming the field or header that is wrong,
    including an unknown ``memory_*`` field or ``X-Engram-Memory-*`` header.
    """
    values: dict[str, Any] = {}
    source: dict[str, str] = {}
    for key, raw in headers.items():
        lowered = key.lower()
        if not lowered.startswith(HEADER_PREFIX):
            continue
        name = _FIELD_FOR_HEADER.get(lowered)
        if name is None:
            raise bad_request(
                f"Unknown memory header {key!r}; known: {', '.join(HEADER_FOR_FIELD.values())}",
                param=key,
                code="unknown_memory_control",
            )
        values[name] = _from_header(name, HEADER_FOR_FIELD[name], raw)
        source[name] = HEADER_FOR_FIELD[name]

    forwarded: dict[str, Any] = {}
    for key, value in body.items():
        if key == "memory" or key.startswith(BODY_PREFIX):
            if key not in MemoryControls.model_fields:
                raise bad_request(
                    f"Unknown memory control {key!r}; known: {', '.join(HEADER_FOR_FIELD)}",
                    param=key,
                    code="unknown_memory_control",
                )
            if value is not None:  # null in the body: not set (a header may still set it)
                values[key] = value
                source[key] = key
        else:
            forwarded[key] = value
    try:
        controls = MemoryControls.model_validate(values)
    except ValidationError as exc:
        raise _validation_message(exc, source) from None
    return controls, forwarded
