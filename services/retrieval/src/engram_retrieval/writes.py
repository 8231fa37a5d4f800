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
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from opentelemetry import trace

from engram_core import semconv
from engram_core.logging import get_logger
from engram_core.memory import MemoryRecord, UpsertStatus
from engram_retrieval.embedder import SentenceEncoder
from engram_retrieval.encode_queue import EncodeQueue
from engram_retrieval.lexical import LexicalEncoder
from engram_retrieval.payload import build_payload, index_key, parse_ts
from engram_retrieval.store import MemoryStore, StoredPoint

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
    ) -> None:
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


def _same(stored: dict[str, Any], fresh: dict[str, Any]) -> bool:
    return (
        stored.get("content_hash") == fresh["content_hash"]
        and stored.get("embedding_model") == fresh["embedding_model"]
    )
