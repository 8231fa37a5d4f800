"""The blocking client: :class:`EngramClient`."""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import TypeVar

import httpx2

from engram_client import calls
from engram_client.calls import IfMatch, Memory
from engram_client.connection import DEFAULT_BASE_URL, Connection
from engram_client.errors import EventTimeout, GatewayUnreachable
from engram_core.api_models import (
    Accepted,
    DeletedMemory,
    EventOut,
    ListQuery,
    MemoryHistory,
    MemoryList,
    MemoryOut,
    SearchResult,
)
from engram_core.memory import MemoryKindName

T = TypeVar("T")


class EngramClient:
    """Engram's memory API, blocking. Thread-safe; close it (or use ``with``) when done.

    ``base_url``: the gateway (``http://127.0.0.1:8100``; a trailing ``/v1`` is fine).
    ``api_key``: the tenant's key (sent as ``Authorization: Bearer``), if the gateway
    has keys. Errors are :class:`~engram_client.errors.EngramError` subclasses.
    """

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        api_key: str | None = None,
        *,
        timeout_s: float = 30.0,
        headers: Mapping[str, str] | None = None,
        transport: httpx2.BaseTransport | None = None,
    ) -> None:
        self._connection = Connection(base_url, api_key, headers)
        self._http = httpx2.Client(
            base_url=self._connection.base_url,
            headers=self._connection.headers,
            timeout=timeout_s,
            transport=transport,
        )
        self._extra_headers: dict[str, str] = {}

    @classmethod
    def over(cls, http: httpx2.Client) -> EngramClient:
        """A client that sends through ``http`` as it is configured (its base URL, headers,
        transport: e.g. the gateway's own app in-process); the caller keeps owning it."""
        client = object.__new__(cls)
        client._connection = Connection(str(http.base_url), None, None)
        client._http, client._extra_headers = http, {}
        return client

    def with_headers(self, headers: Mapping[str, str]) -> EngramClient:
        """A client sharing this one's connections that also sends ``headers`` (e.g. a
        caller's own ``Authorization``); closing it closes this one too."""
        other = object.__new__(EngramClient)
        other._connection, other._http = self._connection, self._http
        other._extra_headers = {**self._extra_headers, **headers}
        return other

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EngramClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _send(self, call: calls.Call[T]) -> T:
        try:
            response = self._http.request(
                call.method,
                call.path,
                params=call.params,
                json=call.json,
                headers={**self._extra_headers, **call.headers},
            )
        except httpx2.TransportError as exc:
            raise GatewayUnreachable(self._connection.unreachable(exc), status=0) from exc
        return call.read(response)

    # --- memories ----------------------------------------------------------------

    def create(
        self,
        text: str,
        *,
        user: str = "",
        conversation: str | None = None,
        tags: Sequence[str] = (),
        created_at: datetime | None = None,
    ) -> Memory:
        """Store one fact verbatim (searchable at once). When its scope already holds
        it, the existing memory comes back with ``duplicate_of`` set."""
        return self._send(
            calls.create(
                text, user=user, conversation=conversation, tags=tags, created_at=created_at
            )
        )

    def get(self, memory_id: str) -> Memory:
        return self._send(calls.get(memory_id))

    def list_page(
        self,
        *,
        user: str | None = None,
        conversation: str | None = None,
        kinds: Sequence[MemoryKindName] = (),
        tags: Sequence[str] = (),
        include_superseded: bool = False,
        created_after: datetime | str | None = None,
        created_before: datetime | str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> MemoryList:
        """One page, newest first; ``cursor``: the previous page's ``next_cursor``."""
        query = calls.list_query(
            user=user,
            conversation=conversation,
            kinds=kinds,
            tags=tags,
            include_superseded=include_superseded,
            created_after=created_after,
            created_before=created_before,
            limit=limit,
            cursor=cursor,
        )
        return self._send(calls.list_page(query))

    def list(
        self,
        *,
        user: str | None = None,
        conversation: str | None = None,
        kinds: Sequence[MemoryKindName] = (),
        tags: Sequence[str] = (),
        include_superseded: bool = False,
        created_after: datetime | str | None = None,
        created_before: datetime | str | None = None,
        page_size: int = 100,
    ) -> Iterator[MemoryOut]:
        """Every memory that matches, newest first, fetched a page at a time as the
        iteration goes (each page asked with the same filters and the last cursor)."""
        query: ListQuery | None = calls.list_query(
            user=user,
            conversation=conversation,
            kinds=kinds,
            tags=tags,
            include_superseded=include_superseded,
            created_after=created_after,
            created_before=created_before,
            limit=page_size,
        )
        while query is not None:
            page = self._send(calls.list_page(query))
            yield from page.data
            query = calls.next_page(query, page)

    def patch(
        self,
        memory_id: str,
        *,
        text: str | None = None,
        tags: Sequence[str] | None = None,
        if_match: IfMatch = None,
    ) -> Memory:
        """Edit text and/or tags (the previous version is kept as history). With
        ``if_match``, only if the memory is still that version, else
        :class:`~engram_client.errors.PreconditionFailed`."""
        return self._send(calls.patch(memory_id, text=text, tags=tags, if_match=if_match))

    def delete(self, memory_id: str, *, if_match: IfMatch = None) -> DeletedMemory:
        """Delete a memory and its history (``if_match`` as for :meth:`patch`)."""
        return self._send(calls.delete(memory_id, if_match=if_match))

    def history(self, memory_id: str) -> MemoryHistory:
        """The versions a memory replaced, oldest first."""
        return self._send(calls.history(memory_id))

    def search(
        self,
        query: str,
        *,
        user: str = "",
        conversation: str = "default",
        top_k: int | None = None,
        recency_weight: float | None = None,
        score_threshold: float | None = None,
        mmr_lambda: float | None = None,
        kinds: Sequence[MemoryKindName] = (),
        include_superseded: bool = False,
    ) -> SearchResult:
        """What a chat of ``user`` in ``conversation`` would recall (no LLM)."""
        return self._send(
            calls.search(
                query,
                user=user,
                conversation=conversation,
                top_k=top_k,
                recency_weight=recency_weight,
                score_threshold=score_threshold,
                mmr_lambda=mmr_lambda,
                kinds=kinds,
                include_superseded=include_superseded,
            )
        )

    # --- learning from text ------------------------------------------------------

    def add(
        self,
        text: str | Sequence[str],
        *,
        user: str = "",
        conversation: str | None = None,
        created_at: datetime | None = None,
        model: str = "",
    ) -> Accepted:
        """Learn from text as from a chat (extraction, then reconcile), asynchronously:
        the answer names the events to follow (:meth:`event`, :meth:`wait`)."""
        return self._send(
            calls.add(
                text, user=user, conversation=conversation, created_at=created_at, model=model
            )
        )

    def event(self, event_id: str) -> EventOut:
        return self._send(calls.event(event_id))

    def wait(
        self, event_ids: Sequence[str], *, timeout_s: float = 60.0, poll_s: float = 0.5
    ) -> builtins.list[EventOut]:
        """The events' statuses once none is pending (``applied``, or ``skipped`` with a
        reason); :class:`~engram_client.errors.EventTimeout` if one still is after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            events = [self.event(e) for e in event_ids]
            if calls.settled(events):
                return events
            if time.monotonic() >= deadline:
                raise EventTimeout(calls.still_pending(events, timeout_s), events)
            time.sleep(poll_s)

    def add_and_wait(
        self,
        text: str | Sequence[str],
        *,
        user: str = "",
        conversation: str | None = None,
        created_at: datetime | None = None,
        model: str = "",
        timeout_s: float = 60.0,
    ) -> builtins.list[EventOut]:
        """:meth:`add`, then :meth:`wait` until what it learned is searchable."""
        accepted = self.add(
            text, user=user, conversation=conversation, created_at=created_at, model=model
        )
        return self.wait(accepted.event_ids, timeout_s=timeout_s)
