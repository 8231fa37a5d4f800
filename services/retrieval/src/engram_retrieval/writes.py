"""Retrieval's write path: memories (domain records, ids assigned) into stored points.

For each record: the stored point with its id (if any) decides the outcome. The same
content and embedding model is ``unchanged`` (nothing written); otherwise the payload is
rebuilt and the vectors are reused while the index key and model are the same, and
computed (in one batch for the whole call) when they are not. ``created_at`` is the
record's, else the stored one's, else now; ``updated_at`` is now. Summaries are never
searched by similarity, so they are not run through the model (a 2,000-character summary
costs eight times a turn, and it is rewritten on every fact): they get a fixed unit
vector instead. Tenancy: every read and write names the tenant; an id another tenant
holds is :class:`~engram_retrieval.store.ForeignIdError` (the servicer: ALREADY_EXISTS).

A turn's BM25 document also holds the words of the turn it follows (its previous
``turn_index`` in the same conversation, said at or before it), weighted by
``previous_turn_weight``: an answer ("Playing video games and watching movies") is
found by the words of the question it answers ("Anything else you enjoy doing?").
Only the lexical index holds them (``context_turn_id`` names that turn); its vectors and
text are its own. A turn deleted or rewritten takes its words out of the document of
the turn after it (:meth:`MemoryWriter.forget`, and on an update of its text), so a
deleted turn's words leave nothing behind.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from opentelemetry import trace

from engram_core import semconv
from engram_core.logging import get_logger
from engram_core.memory import MemoryRecord, UpsertStatus
from engram_retrieval.embedder import SentenceEncoder
from engram_retrieval.encode_queue import EncodeQueue
from engram_retrieval.lexical import LexicalEncoder, with_context
from engram_retrieval.payload import (
    build_payload,
    format_ts,
    index_key,
    parse_ts,
    record_from_payload,
)
from engram_retrieval.store import MemoryStore, PointFilter, StoredPoint

#: Weight of the previous turn's words in a turn's BM25 document (docs/retrieval.md).
DEFAULT_PREVIOUS_TURN_WEIGHT = 1.0

log = get_logger(__name__)


@dataclass(frozen=True)
class Written:
    """The outcome of one record, with the stored timestamps."""

    id: str
    status: UpsertStatus
    created_at: datetime
    updated_at: datetime


class MemoryWriter:
    """Upserts records into the store, embedding only what changed."""

    def __init__(
        self,
        store: MemoryStore,
        embedder: SentenceEncoder,
        encoder: EncodeQueue,
        lexical: LexicalEncoder,
        clock: Callable[[], datetime],
        tracer: trace.Tracer,
        previous_turn_weight: float = DEFAULT_PREVIOUS_TURN_WEIGHT,
    ) -> None:
        if previous_turn_weight < 0:
            raise ValueError(f"previous_turn_weight must be >= 0 (got {previous_turn_weight})")
        self.previous_turn_weight = previous_turn_weight
        self.store = store
        self.model_id = embedder.model_id
        self.encoder = encoder
        self.lexical = lexical
        self.clock = clock
        self.tracer = tracer
        self.unsearched_vector = np.eye(1, embedder.dim, dtype=np.float32)[0]

    async def upsert(self, tenant: str, records: Sequence[MemoryRecord]) -> list[Written]:
        """Write ``records`` (ids assigned) for ``tenant``; one outcome per record, in order."""
        ids = [r.id for r in records]
        existing = {p.id: p for p in await self.store.retrieve(tenant, ids, with_vectors=True)}
        now = self.clock()
        pending: dict[str, StoredPoint] = {}
        to_embed: list[tuple[str, str]] = []
        written: list[Written] = []
        indexed: list[tuple[MemoryRecord, StoredPoint]] = []  # turns this call (re)indexes
        rewritten: dict[str, str | None] = {}  # stored turns with other words: id -> new words
        for record in records:
            previous = pending.get(record.id) or existing.get(record.id)
            created_at = record.created_at
            if created_at is None and previous is not None:
                created_at = parse_ts(previous.created_at)
            payload = build_payload(
                tenant,
                record,
                created_at=created_at or now,
                updated_at=now,
                embedding_model=self.model_id,
            )
            if previous is not None and _same(previous.payload, payload):
                written.append(_written(record.id, UpsertStatus.UNCHANGED, previous.payload))
                continue
            key = index_key(record, parse_ts(payload["created_at"]))
            point = StoredPoint(id=record.id, payload=payload, sparse=self.lexical.document(key))
            if record.kind == "summary":
                point.vector = self.unsearched_vector
            elif previous is not None and _reusable(
                previous, payload, late_interaction=self.store.late_interaction
            ):
                point.vector, point.tokens = previous.vector, previous.tokens
            else:
                to_embed.append((record.id, key))
            pending[record.id] = point
            if record.kind == "turn":
                indexed.append((record, point))
                if previous is not None and _words_changed(previous, record):
                    rewritten[record.id] = record.spoken_text
            status = UpsertStatus.UPDATED if previous else UpsertStatus.CREATED
            written.append(_written(record.id, status, payload))

        if to_embed:
            with self.tracer.start_as_current_span(
                "embed",
                attributes={semconv.ENGRAM_TENANT: tenant, semconv.ENGRAM_TEXTS: len(to_embed)},
            ):
                encoded = await self.encoder.encode([text for _, text in to_embed])
            for (point_id, _), vectors in zip(to_embed, encoded, strict=True):
                pending[point_id].vector = vectors.dense
                pending[point_id].tokens = vectors.tokens
        await self._with_previous_turns(tenant, records, indexed)
        # Followers first: if the write below then fails, the turn keeps its old text and
        # a retry re-indexes them again; in the other order a failed re-index would be
        # lost, the retry finding the new text already stored (unchanged).
        await self._reindex_followers(tenant, rewritten)
        await self.store.upsert(tenant, list(pending.values()))
        log.debug(
            "upsert.applied",
            tenant=tenant,
            created=sum(w.status is UpsertStatus.CREATED for w in written),
            updated=sum(w.status is UpsertStatus.UPDATED for w in written),
            unchanged=sum(w.status is UpsertStatus.UNCHANGED for w in written),
            embedded=len(to_embed),
        )
        return written

    async def forget(self, tenant: str, ids: Sequence[str]) -> list[str]:
        """Delete ``ids`` (the tenant's only); the ids deleted. A deleted turn's words
        leave the BM25 document of the turn that follows it, before the turn itself goes
        (if the delete then fails, its retry finds the follower done; a follower names
        only a turn of its own tenant, so another tenant's id leaves it alone)."""
        await self._reindex_followers(tenant, dict.fromkeys(ids))
        return await self.store.delete(tenant, ids)

    # -- the turn a turn follows ------------------------------------------------------

    async def _with_previous_turns(
        self,
        tenant: str,
        records: Sequence[MemoryRecord],
        indexed: Sequence[tuple[MemoryRecord, StoredPoint]],
    ) -> None:
        """Adds to each indexed turn's BM25 document the words of the turn it follows:
        the newest turn of its conversation one place before it, said at or before it
        (several may hold the place: a client that sends no history numbers every
        question 0), from this batch or else from the store."""
        if not self.previous_turn_weight:
            return
        in_batch: dict[tuple[str, str, int], list[MemoryRecord]] = {}
        for record in records:
            if record.kind == "turn" and record.created_at is not None:
                place = (record.user_id, record.conversation_id, record.turn_index)
                in_batch.setdefault(place, []).append(record)
        for record, point in indexed:
            if record.turn_index <= 0:
                continue
            said = parse_ts(point.payload["created_at"])
            place = (record.user_id, record.conversation_id, record.turn_index - 1)
            said_before = [
                (r.created_at, r)
                for r in in_batch.get(place, ())
                if r.id != record.id and r.created_at is not None and r.created_at <= said
            ]
            if said_before:
                previous: MemoryRecord | None = max(said_before, key=lambda pair: pair[0])[1]
            else:
                previous = await self._stored_previous(tenant, record, said)
            if previous is not None and point.sparse is not None:
                words = self.lexical.document(previous.spoken_text)
                point.sparse = with_context(point.sparse, words, self.previous_turn_weight)
                point.payload["context_turn_id"] = previous.id

    async def _stored_previous(
        self, tenant: str, record: MemoryRecord, said: datetime
    ) -> MemoryRecord | None:
        page = await self.store.list_page(
            PointFilter(
                tenant=tenant,
                user_id=record.user_id,
                conversation_id=record.conversation_id,
                kinds=("turn",),
                turn_index=record.turn_index - 1,
                include_superseded=True,
                created_before=format_ts(said + timedelta(microseconds=1)),
            ),
            1,
        )
        found = [p for p in page.points if p.id != record.id]
        return record_from_payload(found[0].id, found[0].payload) if found else None

    async def _reindex_followers(self, tenant: str, words: dict[str, str | None]) -> None:
        """The turns indexed with the words of turns that were deleted (``None``) or
        rewritten (their new words) are indexed again with what holds now."""
        if not words:
            return
        flt = PointFilter(tenant=tenant, context_turn_ids=tuple(words), include_superseded=True)
        followers: list[StoredPoint] = []
        page = await self.store.list_page(flt, 100)
        followers.extend(page.points)
        while page.next is not None:
            page = await self.store.list_page(flt, 100, page.next)
            followers.extend(page.points)
        if not followers:
            return
        ids = [p.id for p in followers]
        points = await self.store.retrieve(tenant, ids, with_vectors=True)
        for point in points:
            record = record_from_payload(point.id, point.payload)
            said = parse_ts(point.payload["created_at"])
            point.sparse = self.lexical.document(index_key(record, said))
            previous = words.get(str(point.payload.get("context_turn_id")))
            if previous is not None and self.previous_turn_weight:
                context = self.lexical.document(previous)
                point.sparse = with_context(point.sparse, context, self.previous_turn_weight)
            else:
                point.payload["context_turn_id"] = None
        await self.store.upsert(tenant, points)
        log.debug("upsert.followers_reindexed", tenant=tenant, turns=len(points))


def _written(point_id: str, status: UpsertStatus, payload: dict[str, Any]) -> Written:
    return Written(
        point_id, status, parse_ts(payload["created_at"]), parse_ts(payload["updated_at"])
    )


def _reusable(previous: StoredPoint, payload: dict[str, Any], *, late_interaction: bool) -> bool:
    """Whether the stored vectors still fit: same model and index text, token vectors
    present where the store keeps them."""
    return (
        previous.vector is not None
        and (previous.tokens is not None or not late_interaction)
        and previous.payload.get("embed_hash") == payload["embed_hash"]
    )


def _words_changed(stored: StoredPoint, fresh: MemoryRecord) -> bool:
    return record_from_payload(stored.id, stored.payload).spoken_text != fresh.spoken_text


def _same(stored: dict[str, Any], fresh: dict[str, Any]) -> bool:
    return (
        stored.get("content_hash") == fresh["content_hash"]
        and stored.get("embedding_model") == fresh["embedding_model"]
    )
