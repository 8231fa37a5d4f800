"""What a chat client says about a request outside the memory controls.

Open WebUI (with ``ENABLE_FORWARD_USER_INFO_HEADERS``) names its chat in
``X-OpenWebUI-Chat-Id``: each of its chats becomes an Engram conversation of its own,
instead of every chat of a user sharing ``default``. Two kinds of request are not a
person talking, and memory leaves them alone (no recall, nothing recorded):

- a *temporary chat*, which the person asked not to be kept (Open WebUI names it
  ``temporary:<socket id>``, older versions ``local:<socket id>``: both are in
  ``ENGRAM_GATEWAY_TEMPORARY_CHAT_PREFIXES`` by default);
- a *background task* the client runs with the chat's history pasted into one user
  message (Open WebUI's titles, tags, follow-up suggestions and search queries: a
  ``### Task:`` prompt around ``<chat_history>``). Recording it would store the history
  again as a turn and extract its facts a second time, and recall would inject memory
  into a title prompt. Open WebUI's document and web-search prompt also starts with
  ``### Task:`` but carries no chat history: that is the person asking, and remembered.

A memory control the request sets itself (``memory``, ``memory_id``, body or header)
wins over all of this: the hints only fill what the caller left unset.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Mapping

from pydantic import TypeAdapter, ValidationError

from engram_gateway.controls import ConversationId, MemoryControls
from engram_gateway.errors import bad_request
from engram_gateway.settings import GatewaySettings

_CONVERSATION_ID: TypeAdapter[str] = TypeAdapter(ConversationId)


class Bypass(enum.StrEnum):
    """Why memory left a request alone although the request did not say."""

    TEMPORARY_CHAT = "temporary-chat"
    CLIENT_TASK = "client-task"


@functools.lru_cache(maxsize=8)
def _pattern(expression: str) -> re.Pattern[str]:
    return re.compile(expression)


def header_conversation(headers: Mapping[str, str], header: str) -> str | None:
    """The conversation the client's header names, validated as ``memory_id`` is (a
    bad value is a 400 naming the header); ``None`` when there is none."""
    raw = headers.get(header) if header else None
    if raw is None or not raw.strip():
        return None
    try:
        return _CONVERSATION_ID.validate_python(raw.strip())
    except ValidationError as exc:
        raise bad_request(
            f"Invalid value for {header}: {exc.errors()[0]['msg']}",
            param=header,
            code="invalid_memory_control",
        ) from None


def apply_client_hints(
    controls: MemoryControls,
    headers: Mapping[str, str],
    query: str,
    settings: GatewaySettings,
) -> tuple[MemoryControls, Bypass | None]:
    """``controls`` (as the request set them, before the operator's defaults) with the
    client's conversation filled in, or memory off for a temporary chat or a
    background task; and why memory was turned off, if it was."""
    from_header = None
    if controls.memory_id is None:
        from_header = header_conversation(headers, settings.gateway_conversation_header)
        if from_header is not None:
            controls = controls.model_copy(update={"memory_id": from_header})
    if controls.memory is not None:
        return controls, None
    if from_header is not None and from_header.startswith(settings.temporary_chat_prefixes):
        return controls.model_copy(update={"memory": False}), Bypass.TEMPORARY_CHAT
    expression = settings.gateway_task_prompt_pattern
    if expression and query and _pattern(expression).search(query):
        return controls.model_copy(update={"memory": False}), Bypass.CLIENT_TASK
    return controls, None
