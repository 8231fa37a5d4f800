"""Relevance of a memory to a query, calibrated to 0-1 so one threshold means the same
thing whichever scorer runs.

- :class:`CrossEncoderScorer` — an MS MARCO-style cross-encoder (ONNX) reading
  (query, text) pairs: ``relevance = sigmoid(logit)``.
- :class:`CalibratedSimilarityScorer` — the fallback when no reranker is configured:
  a logistic map of the bi-encoder cosine, ``sigmoid(a * (cos - b))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from engram_retrieval.embedder import create_session, encodings_to_inputs
from engram_retrieval.ranking import (
    FUSIONS,
    Fusion,
    FusionWeights,
    context_smoothed,
    fused_similarity,
    late_fused_similarity,
    linear_fusion,
    sigmoid,
    window_boosted,
)

# Positions of each candidate's previous and next turn in the pool (-1: not there).
Adjacency = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class PoolSignals:
    """What the search knows of each candidate in the pool besides its text."""

    dense: np.ndarray  # cosine of query and memory embeddings
    sparse: Sequence[float | None] | None = None  # BM25, when the lexical source found it
    late: Sequence[float | None] | None = None  # mean MaxSim over the query's tokens
    adjacency: Adjacency | None = None  # where its neighbouring turns are in the pool
    in_window: np.ndarray | None = None  # said within a date window the query names
    sessions: Sequence[object | None] | None = None  # a turn's (conversation, day)
    speaker_named: np.ndarray | None = None  # the query names who said it
    two_away: Adjacency | None = None  # where the turns two before and after it are


class RelevanceScorer(Protocol):
    """Scores candidate texts against a query."""

    name: str
    #: Whether a score runs a model (call it from a worker thread) or is a little numpy
    #: over the pool (call it inline: a thread hop costs more than the score).
    runs_model: bool

    def score(
        self,
        query: str,
        texts: Sequence[str],
        signals: PoolSignals,
    ) -> np.ndarray:
        """Relevance in [0, 1] per text, from the text and/or the pool's signals: what
        the threshold decides on and what a hit reports."""
        ...

    def order(
        self,
        query: str,
        texts: Sequence[str],
        signals: PoolSignals,
    ) -> np.ndarray | None:
        """A relevance in the same units to rank the candidates that pass the threshold
        by, when it differs from :meth:`score` (None: rank by the score)."""
        ...


class CalibratedSimilarityScorer:
    """Bi-encoder cosine mapped to a calibrated relevance: ``sigmoid(a * (cos - b))``.

    all-MiniLM-L6-v2 cosines are not probabilities. Measured with the int8 model on 12
    personal questions against 12 memories (12 answering pairs, 132 non-answering):

    - answering pairs: cosine 0.335-0.660, mean 0.505;
    - non-answering pairs: mean 0.082, 95th percentile 0.247, max 0.384 — the top few
      are topically adjacent ("What is my wife's job?" / "User works as a nurse…").

    ``b = 0.30`` sits between the groups and ``a = 14`` spreads them across the default
    threshold 0.35:

    ==================================  ======  =========
    pair                                cosine  relevance
    ==================================  ======  =========
    weakest answering pair               0.335  0.62
    typical answering pair               0.505  0.95
    95th percentile, non-answering       0.247  0.32
    typical non-answering pair           0.082  0.05
    ==================================  ======  =========

    At threshold 0.35 a memory passes when its cosine is at least
    ``b + ln(0.35/0.65)/a ≈ 0.256``: all 12 answering pairs and 7 of the 132 others
    (all topically adjacent) pass. Telling those apart is the cross-encoder's job;
    configure ``ENGRAM_RERANKER_PATH`` for it.
    """

    name = "calibrated-similarity"
    runs_model = False
    SLOPE = 14.0
    MIDPOINT = 0.30

    # Both tuned on LoCoMo's development half (docs/benchmarks.md).
    LEXICAL_WEIGHT = 0.5
    LATE_WEIGHT = 0.85
    CONTEXT_WEIGHT = 0.2
    DATE_WEIGHT = 0.2

    def __init__(
        self,
        slope: float = SLOPE,
        midpoint: float = MIDPOINT,
        lexical_weight: float = LEXICAL_WEIGHT,
        late_weight: float = LATE_WEIGHT,
        context_weight: float = CONTEXT_WEIGHT,
        date_weight: float = DATE_WEIGHT,
        fusion: Fusion = "linear",
        fusion_weights: FusionWeights | None = None,
    ) -> None:
        if fusion not in FUSIONS:
            raise ValueError(f"fusion must be one of {FUSIONS} (got {fusion!r})")
        self.fusion = fusion
        self.fusion_weights = fusion_weights or FusionWeights()
        self.slope = slope
        self.midpoint = midpoint
        self.lexical_weight = lexical_weight
        self.late_weight = late_weight
        self.context_weight = context_weight
        self.date_weight = date_weight

    def score(
        self,
        query: str,
        texts: Sequence[str],
        signals: PoolSignals,
    ) -> np.ndarray:
        """``sigmoid(a·(x - b))`` where ``x`` is the cosine, or with BM25 scores the
        pool's fused similarity (:func:`~engram_retrieval.ranking.fused_similarity`),
        blended with MaxSim when given
        (:func:`~engram_retrieval.ranking.late_fused_similarity`), then raised by
        strong neighbouring turns (:func:`~engram_retrieval.ranking.context_smoothed`)
        and, when enabled, for memories said in the query's date window
        (:func:`~engram_retrieval.ranking.window_boosted`). Each step stays on the
        pool's cosine range, so the calibration holds. This is what the threshold
        decides on whichever fusion ranks (:meth:`order`)."""
        x = np.asarray(signals.dense, dtype=np.float64)
        if signals.sparse is not None and self.lexical_weight > 0.0:
            x = fused_similarity(x, signals.sparse, self.lexical_weight)
        if signals.late is not None and self.late_weight > 0.0:
            x = late_fused_similarity(x, signals.late, self.late_weight)
        if signals.adjacency is not None and self.context_weight > 0.0:
            x = context_smoothed(x, *signals.adjacency, self.context_weight)
        if signals.in_window is not None and self.date_weight > 0.0:
            x = window_boosted(x, signals.in_window, self.date_weight)
        return sigmoid(self.slope * (x - self.midpoint))

    def order(
        self,
        query: str,
        texts: Sequence[str],
        signals: PoolSignals,
    ) -> np.ndarray | None:
        """With the linear fusion, ``sigmoid(a·(x - b))`` of
        :func:`~engram_retrieval.ranking.linear_fusion`'s ``x``: the order of the
        memories that pass the threshold. The fusion's rank signals order a pool well
        but would lift its weak candidates over a threshold that is calibrated on
        similarity (on the paraphrase set: precision 90.8 → 78.0), so what is relevant
        is decided by :meth:`score` and only the order comes from here."""
        if self.fusion != "linear":
            return None
        return sigmoid(self.slope * (self._linear(signals) - self.midpoint))

    def _linear(self, signals: PoolSignals) -> np.ndarray:
        """:func:`~engram_retrieval.ranking.linear_fusion` of the pool's signals; a signal
        whose chain weight is 0 (``ENGRAM_SEARCH_*_WEIGHT``) is left out, as in the chain."""
        return linear_fusion(
            signals.dense,
            self.fusion_weights,
            sparse=signals.sparse if self.lexical_weight > 0.0 else None,
            late=signals.late if self.late_weight > 0.0 else None,
            adjacency=signals.adjacency if self.context_weight > 0.0 else None,
            two_away=signals.two_away if self.context_weight > 0.0 else None,
            sessions=signals.sessions if self.context_weight > 0.0 else None,
            speaker_named=signals.speaker_named,
            in_window=signals.in_window if self.date_weight > 0.0 else None,
        )


class CrossEncoderScorer:
    """A cross-encoder in ONNX form: ``model.onnx`` + ``tokenizer.json`` in one directory.

    The pair is encoded as ``[CLS] query [SEP] text [SEP]`` with token_type_ids 0/1 (the
    tokenizer's post-processor decides the exact template). The model's logits may be
    ``[batch]``, ``[batch, 1]`` or ``[batch, 2]`` (two-class heads use ``l1 - l0``, the
    logit of the positive class's softmax).
    """

    name = "cross-encoder"
    runs_model = True

    def __init__(
        self,
        directory: Path,
        *,
        max_length: int = 512,
        batch_size: int = 16,
        threads: int = 0,
    ) -> None:
        from tokenizers import Tokenizer

        self.directory = directory
        self.batch_size = batch_size
        tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        padding = tokenizer.padding or {}
        tokenizer.enable_padding(
            pad_id=int(padding.get("pad_id", 0)),
            pad_type_id=int(padding.get("pad_type_id", 0)),
            pad_token=str(padding.get("pad_token", "[PAD]")),
            length=None,
        )
        # longest_first: a long query cannot make the pair untruncatable.
        tokenizer.enable_truncation(max_length=max_length, strategy="longest_first")
        self._tokenizer = tokenizer
        self._session = create_session(directory / "model.onnx", threads=threads)
        self._input_names = {i.name for i in self._session.get_inputs()}
        self._output_name = self._session.get_outputs()[0].name

    def logits(self, query: str, texts: Sequence[str]) -> np.ndarray:
        out = np.empty(len(texts), dtype=np.float64)
        for start in range(0, len(texts), self.batch_size):
            chunk = list(texts[start : start + self.batch_size])
            encodings = self._tokenizer.encode_batch([(query, text) for text in chunk])
            feeds = encodings_to_inputs(encodings, self._input_names)
            (raw,) = self._session.run([self._output_name], feeds)
            out[start : start + len(chunk)] = _pair_logits(np.asarray(raw, dtype=np.float64))
        return out

    def score(
        self,
        query: str,
        texts: Sequence[str],
        signals: PoolSignals,
    ) -> np.ndarray:
        if not texts:
            return np.zeros(0, dtype=np.float64)
        return sigmoid(self.logits(query, texts))

    def order(
        self,
        query: str,
        texts: Sequence[str],
        signals: PoolSignals,
    ) -> np.ndarray | None:
        """The cross-encoder's relevance is its order."""
        return None


def _pair_logits(raw: np.ndarray) -> np.ndarray:
    if raw.ndim == 1:
        return raw
    if raw.ndim == 2 and raw.shape[1] == 1:
        return raw[:, 0]
    if raw.ndim == 2 and raw.shape[1] == 2:
        return raw[:, 1] - raw[:, 0]
    raise ValueError(f"unexpected cross-encoder output shape {raw.shape}")
