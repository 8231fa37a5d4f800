"""BM25 sparse vectors for the lexical candidate source (hybrid search).

Uses ``qdrant_edge.Bm25`` (English tokenizer, stemming, stopwords; k=1.2, b=0.75):
documents get term-frequency weights, queries weight 1 per unique term, and the
collection's sparse vector applies IDF at query time (``Modifier.Idf``), so the score
is BM25 whichever store (edge or server) holds the points.
"""

from __future__ import annotations

from dataclasses import dataclass

from qdrant_edge import Bm25

SPARSE_VECTOR = "bm25"
LEXICAL_MODEL_ID = "qdrant-bm25-en"


@dataclass(frozen=True)
class SparseVec:
    indices: tuple[int, ...]
    values: tuple[float, ...]

    def __bool__(self) -> bool:
        return bool(self.indices)


class LexicalEncoder:
    """Text → BM25 sparse vector. Cheap (no model); safe to call from any thread."""

    def __init__(self) -> None:
        self._bm25 = Bm25()

    def document(self, text: str) -> SparseVec:
        vec = self._bm25.embed_document(text)
        return SparseVec(tuple(vec.indices), tuple(vec.values))

    def query(self, text: str) -> SparseVec:
        vec = self._bm25.embed_query(text)
        return SparseVec(tuple(vec.indices), tuple(vec.values))


def with_context(document: SparseVec, context: SparseVec, weight: float) -> SparseVec:
    """``document`` plus ``weight`` times ``context``, term by term: a turn's BM25 document
    that also holds, more or less strongly, the words of the turn it follows."""
    if weight <= 0.0 or not context:
        return document
    merged = dict(zip(document.indices, document.values, strict=True))
    for index, value in zip(context.indices, context.values, strict=True):
        merged[index] = merged.get(index, 0.0) + weight * value
    return SparseVec(tuple(merged), tuple(merged.values()))
