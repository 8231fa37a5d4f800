"""Recall for one chat request: search the retrieval service, render what it found as
one system message, and describe the hits for the response.

Retrieval failing never fails the chat: the request goes on without memory and the
response says so (``X-Engram-Memory: unavailable``).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import grpc

from engram_core.logging import get_logger
from engram_core.proto import SCOPE_NAMES, from_timestamp, kind_name, pb
from engram_core.retrieval_client import RetrievalClient
from engram_gateway.controls import MemoryControls

log = get_logger(__name__)

MEMORY_HEADER = "X-Engram-Memory"


class MemoryStatus(enum.StrEnum):
    """The value of the ``X-Engram-Memory`` response header."""

    USED = "used"  # a memory system message was injected
    EMPTY = "empty"  # searched (or nothing to search for): nothing to inject
    UNAVAILABLE = "unavailable"  # retrieval failed; the chat went on without memory
    BYPASSED = "bypassed"  # memory=false: no recall, no turns recorded


@dataclass(frozen=True)
class Recall:
    status: MemoryStatus
    system_message: dict[str, Any] | None = None
    hits: list[dict[str, Any]] = field(default_factory=list)


# --- reading the request -------------------------------------------------------------


def message_text(message: Any) -> str:
    """The text of a chat message: a string content, or the text parts of a content array."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [
            part["text"]
            for part in content
            if isinstance(part, dict)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        ]
        return "\n".join(parts)
    return ""


def latest_user_index(messages: list[Any]) -> int | None:
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, dict) and message.get("role") == "user":
            return index
    return None


def conversation_position(messages: list[Any], index: int | None) -> int:
    """How many user/assistant messages come before ``messages[index]``: the turn's
    position in the conversation as the client's history shows it (0 when unknown).
    Lets retrieval tell which stored turns are neighbours."""
    if index is None:
        return 0
    return sum(
        1
        for message in messages[:index]
        if isinstance(message, dict) and message.get("role") in ("user", "assistant")
    )


def inject(messages: list[Any], index: int, system_message: dict[str, Any]) -> list[Any]:
    """A new list with the memory message placed immediately before ``messages[index]``."""
    return [*messages[:index], system_message, *messages[index:]]


# --- searching -----------------------------------------------------------------------


def search_request(
    *, tenant: str, query: str, user_id: str, controls: MemoryControls
) -> pb.SearchRequest:
    """Only the knobs someone set are sent; retrieval applies its defaults to the rest."""
    request = pb.SearchRequest(
        tenant=tenant, query=query, user_id=user_id, conversation_id=controls.conversation_id
    )
    if controls.memory_top_k is not None:
        request.top_k = controls.memory_top_k
    if controls.memory_recency_weight is not None:
        request.recency_weight = controls.memory_recency_weight
    if controls.memory_score_threshold is not None:
        request.score_threshold = controls.memory_score_threshold
    if controls.memory_mmr_lambda is not None:
        request.mmr_lambda = controls.memory_mmr_lambda
    if controls.memory_cross_session is False:
        # Empty scopes mean retrieval's default (conversation, user, global); naming
        # them leaves out the user's other conversations.
        request.scopes.extend([pb.SCOPE_CONVERSATION, pb.SCOPE_GLOBAL])
    return request


def normalized(text: str) -> str:
    """Whitespace collapsed, case folded: how a hit and a message are compared."""
    return " ".join(text.split()).casefold()


def drop_in_window(response: pb.SearchResponse, messages: Sequence[Any]) -> int:
    """Remove the hits whose text is already a message of the request (the client's
    history is the short-term window: re-injecting it only repeats it). Returns how many
    were dropped."""
    window = {normalized(message_text(m)) for m in messages}
    window.discard("")
    kept = [hit for hit in response.hits if normalized(hit.memory.text) not in window]
    dropped = len(response.hits) - len(kept)
    if dropped:
        del response.hits[:]
        response.hits.extend(kept)
    return dropped


async def recall(
    client: RetrievalClient,
    request: pb.SearchRequest,
    *,
    messages: Sequence[Any] = (),
    now: datetime | None = None,
) -> Recall:
    """Search and render. ``messages``: the request's messages; hits repeating one of
    them are not injected (nor reported in ``memory_hits``)."""
    try:
        response = await client.search(request)
    except grpc.aio.AioRpcError as exc:
        log.warning(
            "memory unavailable, chat goes on without it",
            code=exc.code().name,
            details=exc.details(),
            retrieval=client.address,
        )
        return Recall(MemoryStatus.UNAVAILABLE)
    dropped = drop_in_window(response, messages)
    hits = [hit_json(hit) for hit in response.hits]
    text = render_memory(response, now=now or datetime.now(UTC), in_window=dropped)
    if text is None:
        return Recall(MemoryStatus.EMPTY, hits=hits)
    return Recall(MemoryStatus.USED, {"role": "system", "content": text}, hits)


# --- describing what was found --------------------------------------------------------


def _r(value: float) -> float:
    # Scores travel as float32; six decimals is all the precision they carry.
    return round(float(value), 6)


def _iso(ts: Any) -> str | None:
    value = from_timestamp(ts)
    return value.isoformat().replace("+00:00", "Z") if value else None


def hit_json(hit: pb.SearchHit) -> dict[str, Any]:
    """One entry of ``memory_hits`` in a non-streaming response."""
    memory, scores = hit.memory, hit.scores
    entry: dict[str, Any] = {
        "id": memory.id,
        "text": memory.text,
        "kind": kind_name(memory.kind),
        "score": _r(scores.total),
        "created_at": _iso(memory.created_at),
        "scope": SCOPE_NAMES.get(hit.scope),
        "conversation_id": memory.conversation_id,
        "scores": {
            "dense": _r(scores.dense),
            "sparse": _r(scores.sparse) if scores.HasField("sparse") else None,
            "relevance": _r(scores.relevance),
            "recency": _r(scores.recency),
            "total": _r(scores.total),
            "mmr": _r(scores.mmr),
        },
    }
    if memory.role:
        entry["role"] = memory.role
    return entry


def _day(ts: Any) -> str:
    value = from_timestamp(ts)
    return value.strftime("%Y-%m-%d") if value else "undated"


def _hit_line(number: int, memory: pb.Memory) -> str:
    kind = kind_name(memory.kind)
    if memory.kind == pb.MEMORY_KIND_TURN:
        label = f"{memory.role or 'someone'} said"
    elif memory.kind == pb.MEMORY_KIND_EPISODE and memory.HasField("turn_range"):
        label = f"episode (turns {memory.turn_range.first_turn}-{memory.turn_range.last_turn})"
    else:
        label = kind
    text = " ".join(memory.text.split())
    return f"{number}. [{_day(memory.created_at)}] {label}: {text}"


def _profile_line(memory: pb.Memory) -> str:
    if memory.HasField("profile") and memory.profile.key:
        entry = memory.profile
        prefix = f"{entry.category}/{entry.key}" if entry.category else entry.key
        return f"- {prefix}: {entry.value or memory.text}"
    return f"- {' '.join(memory.text.split())}"


def _hits_heading(response: pb.SearchResponse, in_window: int) -> str:
    if response.outcome != pb.SEARCH_OUTCOME_SMALL_STORE:
        return "Relevant memories (most relevant first):"
    # Few memories in scope: retrieval returned all of them (up to top_k), newest first.
    shown = len(response.hits)
    stored = max(response.candidates_considered, shown + in_window)
    if shown + in_window < stored:
        return f"The {shown} newest of the {stored} stored memories:"
    if in_window:
        return (
            f"All {shown} other stored memories, newest first "
            "(the rest are already in this conversation):"
        )
    return f"All {shown} stored memories, newest first (there are no others):"


def render_memory(response: pb.SearchResponse, *, now: datetime, in_window: int = 0) -> str | None:
    """The injected system message, or None when there is nothing to say.

    Compact and explicit: dated lines the model can weigh, the summary and profile
    attached separately, a small store said to be complete, and "nothing relevant" said
    out loud so the model does not mistake silence for "I never knew". ``in_window``:
    hits left out because the request already holds them.
    """
    has_summary = response.HasField("summary") and bool(response.summary.text.strip())
    profile = [m for m in response.profile if m.text.strip() or m.profile.key]
    hits = list(response.hits)
    nothing_relevant = response.outcome == pb.SEARCH_OUTCOME_NOTHING_RELEVANT
    if not (has_summary or profile or hits or nothing_relevant):
        return None

    lines = [
        "Long-term memory (from earlier conversations with this user, retrieved by Engram). "
        "Use it when it helps; the current conversation takes precedence if they disagree.",
        f"Today is {now.astimezone(UTC).strftime('%Y-%m-%d')}.",
    ]
    if has_summary:
        summary = response.summary
        as_of = _day(summary.updated_at if summary.HasField("updated_at") else summary.created_at)
        lines += ["", f"Conversation summary (as of {as_of}):", summary.text.strip()]
    if profile:
        lines += ["", "About the user:", *(_profile_line(m) for m in profile)]
    if hits:
        lines += [
            "",
            _hits_heading(response, in_window),
            *(_hit_line(i, hit.memory) for i, hit in enumerate(hits, start=1)),
        ]
    elif nothing_relevant:
        lines += ["", "No stored memory is relevant to this message."]
    return "\n".join(lines)
