"""What each client method sends and how its answer is read, once for the sync and the
async client (which only move the bytes).

Requests are built with the models the gateway validates with (engram_core.api_models),
so an invalid argument fails here, before any request, with pydantic's message naming
the field; answers are parsed with the response models, so a field the gateway adds or
renames fails the client's tests rather than surfacing as a ``KeyError`` later.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx2
from pydantic import BaseModel, Field

from engram_client.errors import error_from_answer
from engram_core.api_models import (
    Accepted,
    AddMemories,
    CreatedMemory,
    CreateMemory,
    DeletedMemory,
    EventOut,
    ListQuery,
    MemoryHistory,
    MemoryList,
    SearchMemories,
    SearchResult,
    UpdateMemory,
)
from engram_core.memory import MemoryKindName

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class Memory(CreatedMemory):
    """One memory as GET, POST and PATCH answer it, with its ``ETag`` (its version): pass
    the memory, or its etag, as ``if_match`` to change it only if nobody else did."""

    etag: str | None = Field(default=None, exclude=True)


#: What ``if_match`` takes: an ETag as the gateway sent it, ``"*"`` or a :class:`Memory`.
IfMatch = str | Memory | None


@dataclass(frozen=True)
class Call(Generic[T]):
    """One HTTP request and the reading of its answer."""

    method: str
    path: str
    read: Callable[[httpx2.Response], T]
    params: list[tuple[str, str | int | float | bool | None]] = field(default_factory=list)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def check(response: httpx2.Response) -> httpx2.Response:
    """``response`` if it is a success, else its typed :class:`EngramError`."""
    if response.is_success:
        return response
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    raise error_from_answer(response.status_code, body, response.headers)


def _reader(model: type[M]) -> Callable[[httpx2.Response], M]:
    def read(response: httpx2.Response) -> M:
        return model.model_validate(check(response).json())

    return read


def _read_memory(response: httpx2.Response) -> Memory:
    check(response)
    return Memory.model_validate({**response.json(), "etag": response.headers.get("etag")})


def _id(value: str) -> str:
    # quoted whole: an id can never name another path ("../users")
    return quote(value, safe="")


def _if_match(if_match: IfMatch) -> dict[str, str]:
    if if_match is None:
        return {}
    tag = if_match.etag if isinstance(if_match, Memory) else if_match
    if not tag:
        raise ValueError("if_match: this Memory carries no etag (list items do not; get it)")
    return {"If-Match": tag}


def _body(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_none=True)


def create(
    text: str,
    *,
    user: str,
    conversation: str | None,
    tags: Sequence[str],
    created_at: datetime | None,
) -> Call[Memory]:
    body = CreateMemory(
        text=text, user=user, conversation=conversation, tags=list(tags), created_at=created_at
    )
    return Call("POST", "/v1/memories", _read_memory, json=_body(body))


def get(memory_id: str) -> Call[Memory]:
    return Call("GET", f"/v1/memories/{_id(memory_id)}", _read_memory)


def list_page(query: ListQuery) -> Call[MemoryList]:
    params: list[tuple[str, str | int | float | bool | None]] = []
    for name, value in query.model_dump(mode="json", exclude_defaults=True).items():
        for item in value if isinstance(value, list) else [value]:
            params.append((name, str(item).lower() if isinstance(item, bool) else str(item)))
    return Call("GET", "/v1/memories", _reader(MemoryList), params=params)


def list_query(
    *,
    user: str | None,
    conversation: str | None,
    kinds: Sequence[MemoryKindName],
    tags: Sequence[str],
    include_superseded: bool,
    created_after: datetime | str | None,
    created_before: datetime | str | None,
    limit: int,
    cursor: str | None = None,
) -> ListQuery:
    # ListQuery parses an ISO 8601 string as the API would
    return ListQuery.model_validate(
        {
            "user": user,
            "conversation": conversation,
            "kind": list(kinds),
            "tag": list(tags),
            "include_superseded": include_superseded,
            "created_after": created_after,
            "created_before": created_before,
            "limit": limit,
            "cursor": cursor,
        }
    )


def next_page(query: ListQuery, page: MemoryList) -> ListQuery | None:
    """The query of the page after ``page``: the same filters and its cursor."""
    if not page.has_more or not page.next_cursor:
        return None
    return query.model_copy(update={"cursor": page.next_cursor})


def patch(
    memory_id: str, *, text: str | None, tags: Sequence[str] | None, if_match: IfMatch
) -> Call[Memory]:
    body = UpdateMemory(text=text, tags=None if tags is None else list(tags))
    return Call(
        "PATCH",
        f"/v1/memories/{_id(memory_id)}",
        _read_memory,
        json=_body(body),
        headers=_if_match(if_match),
    )


def delete(memory_id: str, *, if_match: IfMatch) -> Call[DeletedMemory]:
    return Call(
        "DELETE",
        f"/v1/memories/{_id(memory_id)}",
        _reader(DeletedMemory),
        headers=_if_match(if_match),
    )


def history(memory_id: str) -> Call[MemoryHistory]:
    return Call("GET", f"/v1/memories/{_id(memory_id)}/history", _reader(MemoryHistory))


def search(
    query: str,
    *,
    user: str,
    conversation: str,
    top_k: int | None,
    recency_weight: float | None,
    score_threshold: float | None,
    mmr_lambda: float | None,
    kinds: Sequence[MemoryKindName],
    include_superseded: bool,
) -> Call[SearchResult]:
    body = SearchMemories(
        query=query,
        user=user,
        conversation=conversation,
        memory_top_k=top_k,
        memory_recency_weight=recency_weight,
        memory_score_threshold=score_threshold,
        memory_mmr_lambda=mmr_lambda,
        kinds=list(kinds),
        include_superseded=include_superseded,
    )
    return Call("POST", "/v1/memories/search", _reader(SearchResult), json=_body(body))


def add(
    text: str | Sequence[str],
    *,
    user: str,
    conversation: str | None,
    created_at: datetime | None,
    model: str,
) -> Call[Accepted]:
    body = AddMemories(
        text=text if isinstance(text, str) else list(text),
        user=user,
        conversation=conversation,
        created_at=created_at,
        model=model,
    )
    return Call("POST", "/v1/memories/add", _reader(Accepted), json=_body(body))


def event(event_id: str) -> Call[EventOut]:
    return Call("GET", f"/v1/events/{_id(event_id)}", _reader(EventOut))


def settled(events: Sequence[EventOut]) -> bool:
    return all(e.status != "pending" for e in events)


def still_pending(events: Sequence[EventOut], timeout_s: float) -> str:
    waiting = ", ".join(f"{e.id} ({e.stage})" for e in events if e.status == "pending")
    return f"still being learned after {timeout_s:g} s: {waiting}"
