"""The per-request memory controls: read from the body (``memory_*``) or headers
(``X-Engram-Memory-*``), validated, and removed before the request goes upstream.

Precedence, per control: request body, then header, then the operator's default
(``ENGRAM_GATEWAY_MEMORY_*``), then the retrieval service's own default. The body wins
because it is the most specific: an SDK call's ``extra_body`` overrides a header an
HTTP client or proxy set for every request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

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
}


def _conversation_id(value: str) -> str:
    # It names a directory in the Markdown mirror: no separators, dot-files or controls.
    if any(ch in value for ch in "/\\") or any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        raise ValueError("must not contain '/', '\\' or control characters")
    if value.startswith("."):
        raise ValueError("must not start with '.'")
    return value


ConversationId = Annotated[
    str, Field(min_length=1, max_length=200), AfterValidator(_conversation_id)
]


class MemoryControls(BaseModel):
    """The memory knobs of one request. ``None``: not set (a default applies)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    memory: bool | None = None
    memory_id: ConversationId | None = None
    memory_top_k: int | None = Field(default=None, ge=1, le=100)
    memory_recency_weight: float | None = Field(default=None, ge=0, le=1)
    memory_score_threshold: float | None = Field(default=None, ge=0, le=1)
    memory_mmr_lambda: float | None = Field(default=None, ge=0, le=1)
    # False: search only this conversation (and the tenant's global bucket), not the
    # user's other conversations.
    memory_cross_session: bool | None = None

    def with_defaults(self, settings: GatewaySettings) -> MemoryControls:
        return self.model_copy(
            update={
                "memory": settings.gateway_memory_enabled if self.memory is None else self.memory,
                "memory_top_k": _first(self.memory_top_k, settings.gateway_memory_top_k),
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
        if name == "memory_top_k":
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
