"""The ranking half of the search pipeline, as pure functions (numpy only, no I/O).

Given candidate pools (one per scope) and a relevance score per candidate:

1. merge the pools, first occurrence of an id wins (pools come in scope order), and
   identical texts of one conversation: the same thing said twice is recalled once;
2. a turn whose statement was corrected (a fact it gave was superseded or deleted) has
   its relevance multiplied by ``corrected_weight``: it stops competing with the fact
   that replaced it;
3. small store: when the pools were not truncated and hold at most
   ``small_store_size`` memories in all, return them all: facts first, then episodes and
   turns, each newest first, corrected turns last (each kind's ``small_store_rank`` in
   :mod:`engram_core.kinds`, pure data like this module);
4. drop candidates whose relevance is below ``score_threshold``;
5. ``recency = exp(-age_days / half_life_days)`` (future timestamps count as age 0);
   ``total = (1 - w) * order + w * recency``, where ``order`` is the relevance unless
   a separate order is given (the linear fusion's: it ranks, the relevance decides);
6. MMR on embedding cosine: repeatedly pick ``argmax λ·total - (1 - λ)·max_sim(selected)``
   until ``top_k`` are selected; equal objectives go to the smaller id;
7. a current fact is listed before the turns it was extracted from, and a current fact
   nearly as relevant as the best hit (within ``fact_margin``) before every turn: what
   holds now is read before what was said.
"""

from __future__ import annotations

import enum
import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from engram_core.kinds import find_kind
from engram_core.memory import ScopeName

SECONDS_PER_DAY = 86_400.0


class Outcome(enum.Enum):
    RANKED = "ranked"
    SMALL_STORE = "small_store"
    NOTHING_RELEVANT = "nothing_relevant"
    EMPTY = "empty"
    OVERVIEW = "overview"  # a question about memory itself (pipeline.py), not ranked here


@dataclass(frozen=True)
class RankingParams:
    top_k: int = 5
    recency_weight: float = 0.02
    score_threshold: float = 0.35
    mmr_lambda: float = 0.9
    half_life_days: float = 30.0
    small_store_size: int = 5
    candidate_multiplier: int = 5
    #: the most candidates per scope and source (never fewer than top_k): a search's
    #: cost grows with its pools, and a token budget asks for many hits
    max_pool: int = 1000
    corrected_weight: float = 0.5
    #: a current fact this close to the best hit's relevance is listed first
    fact_margin: float = 0.15

    @property
    def pool_size(self) -> int:
        """Candidates fetched per scope: ``top_k * multiplier`` up to ``max_pool`` (but at
        least ``top_k``), and always enough to tell a small store (≤ ``small_store_size``
        in all) from a larger one."""
        pool = min(self.top_k * self.candidate_multiplier, max(self.max_pool, self.top_k))
        return max(pool, self.small_store_size + 1)


@dataclass
class Candidate:
    id: str
    scope: ScopeName
    dense: float  # cosine of query and memory embeddings
    vector: npt.ArrayLike  # read (np.asarray) only for the candidates MMR compares
    created_at: datetime
    text: str = ""
    sparse: float | None = None  # BM25 score, when the lexical source found it
    payload: Any = None  # carried through untouched
    kind: str = ""
    #: (user, conversation): identical texts are merged within one owner only
    owner: tuple[str, str] = ("", "")
    #: a fact's source turns (it is listed before them)
    source_ids: tuple[str, ...] = ()
    #: a turn whose statement was later corrected
    corrected: bool = False
    #: a chat message's (conversation, turn index): its neighbours are the adjacent turns
    turn: tuple[str, int] | None = None
    #: a chat message's (conversation, UTC day it was said)
    session: tuple[str, str] | None = None
    #: who said it (``metadata["speaker"]``), "" when unknown
    speaker: str = ""


@dataclass
class ScoredCandidate:
    candidate: Candidate
    relevance: float
    recency: float
    total: float
    mmr: float = 0.0


@dataclass
class RankingResult:
    outcome: Outcome
    hits: list[ScoredCandidate] = field(default_factory=list)
    considered: int = 0


def sigmoid(x: np.ndarray | float) -> np.ndarray:
    """Numerically stable logistic function."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    ex = np.exp(x[~pos])
    out[~pos] = ex / (1.0 + ex)
    return out


def lexical_relevance(sparse: Sequence[float | None]) -> np.ndarray:
    """Relevance from BM25 alone: each score over the best one (missing counts as 0).

    BM25 has no fixed scale, so there is no calibrated map as for cosines; relative to
    the query's best candidate is the honest 0-1 reading (the best match is 1.0).
    """
    scores = np.array([0.0 if s is None else max(0.0, s) for s in sparse], dtype=np.float64)
    best = float(scores.max()) if scores.size else 0.0
    return scores / best if best > 0.0 else np.zeros_like(scores)


def minmax(values: np.ndarray) -> np.ndarray | None:
    """``(v - min) / (max - min)`` over the array; None when every value is equal (no
    information to spread)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return None
    lo, hi = float(values.min()), float(values.max())
    return (values - lo) / (hi - lo) if hi > lo else None


def fused_similarity(
    dense: Sequence[float] | np.ndarray,
    sparse: Sequence[float | None],
    lexical_weight: float,
) -> np.ndarray:
    """Dense cosine and BM25 fused within one candidate pool, in cosine units.

    ``d = minmax(cos)`` and ``s = minmax(bm25)`` over the pool (a candidate the lexical
    source did not return counts as BM25 0), ``f = (1 - w)·d + w·s``, and the result is
    ``f`` mapped back onto the pool's cosine range: ``lo + (hi - lo)·f``. It ranks
    exactly as the min-max weighted sum ``f`` does, and stays on the cosine scale (a
    candidate best on both signals keeps the best cosine; none goes below the worst
    one), so a cosine calibration still applies to it. When either signal is flat
    over the pool (one candidate, no lexical match at all) the cosine is returned
    unchanged.
    """
    cos = np.asarray(dense, dtype=np.float64)
    bm25 = np.array([0.0 if v is None else max(0.0, v) for v in sparse], dtype=np.float64)
    if bm25.shape != cos.shape:
        raise ValueError(f"need one BM25 score per cosine ({cos.shape}), got {bm25.shape}")
    d, s = minmax(cos), minmax(bm25)
    if d is None or s is None or lexical_weight <= 0.0:
        return cos
    lo, hi = float(cos.min()), float(cos.max())
    return lo + (hi - lo) * ((1.0 - lexical_weight) * d + lexical_weight * s)


def late_fused_similarity(
    fused: Sequence[float] | np.ndarray,
    late: Sequence[float | None],
    late_weight: float,
) -> np.ndarray:
    """The fused similarity blended with late interaction (MaxSim), in cosine units.

    ``f = minmax(fused)`` and ``l = minmax(late)`` over the pool (a candidate without
    token vectors counts as the pool's lowest MaxSim), ``x = (1 - w)·f + w·l``, mapped
    back onto the pool's range of ``fused`` like :func:`fused_similarity`, so the cosine
    calibration still applies. When either signal is flat over the pool, or ``w`` is 0,
    ``fused`` is returned unchanged.
    """
    base = np.asarray(fused, dtype=np.float64)
    known = [v for v in late if v is not None]
    if len(late) != base.size:
        raise ValueError(f"need one late score per candidate ({base.size}), got {len(late)}")
    if late_weight <= 0.0 or not known:
        return base
    floor = min(known)
    scores = np.array([floor if v is None else v for v in late], dtype=np.float64)
    f, l_ = minmax(base), minmax(scores)
    if f is None or l_ is None:
        return base
    lo, hi = float(base.min()), float(base.max())
    return lo + (hi - lo) * ((1.0 - late_weight) * f + late_weight * l_)


# linear: every signal in one weighted sum (the default); chain: the fused similarity,
# then MaxSim, neighbours and date windows one after another (the earlier ranking).
Fusion = Literal["linear", "chain"]
FUSIONS: tuple[Fusion, ...] = ("linear", "chain")


@dataclass(frozen=True)
class FusionWeights:
    """Weights of :func:`linear_fusion`, one per signal of the pool (all in [0, 1]).

    Tuned on LoCoMo's development half only (a logistic fit, then coordinate ascent on
    R@10 of the default pipeline; docs/benchmarks.md). Every weight is at least 0, so a
    memory never ranks lower for being more similar by any signal: the relative signals
    (min-max over the pool) carry the size of a difference, the rank signals its order.
    """

    dense: float = 0.0
    lexical: float = 0.26
    late: float = 4.45
    dense_rank: float = 0.35
    lexical_rank: float = 1.04
    late_rank: float = 1.64
    neighbour: float = 3.0
    two_away: float = 1.5
    session: float = 3.85
    speaker: float = 1.77
    date_window: float = 0.51


#: Reciprocal-rank offset of the rank signals: ``k / (k + rank)``, rank 0 the best.
RANK_OFFSET = 10.0


def reciprocal_ranks(values: np.ndarray) -> np.ndarray:
    """``k / (k + rank)`` of each value, rank 0 the largest; equal values share the
    better rank (so the order of the pool never matters), and the best reads 1.0."""
    v = np.asarray(values, dtype=np.float64)
    descending = -np.sort(v)[::-1]
    ranks = np.searchsorted(descending, -v, side="left").astype(np.float64)
    out: np.ndarray = RANK_OFFSET / (RANK_OFFSET + ranks)
    return out


def _spread(values: np.ndarray) -> np.ndarray:
    spread = minmax(values)
    return np.zeros_like(values, dtype=np.float64) if spread is None else spread


def _mean_of_two_best(values: list[float]) -> float:
    """``(a + b) / 2`` of the two largest (one value: itself), as ``np.mean`` computes
    it, without its per-call cost (one call per session of the pool)."""
    top = sorted(values, reverse=True)[:2]
    return (top[0] + top[1]) / 2.0 if len(top) == 2 else top[0]


def session_strength(base: np.ndarray, sessions: Sequence[object | None]) -> np.ndarray:
    """Per candidate, the mean of the two best ``base`` scores of its session (itself
    included; alone in it, its own score); a candidate without a session (not a turn)
    reads 0: the signal is about a conversation, not about the memory itself."""
    best: dict[object, list[float]] = {}
    for value, session in zip(base, sessions, strict=True):
        if session is not None:
            best.setdefault(session, []).append(float(value))
    top2 = {key: _mean_of_two_best(vals) for key, vals in best.items()}
    return np.array(
        [0.0 if s is None else top2[s] for s in sessions],
        dtype=np.float64,
    )


def linear_fusion(
    dense: Sequence[float] | np.ndarray,
    weights: FusionWeights,
    *,
    sparse: Sequence[float | None] | None = None,
    late: Sequence[float | None] | None = None,
    adjacency: tuple[np.ndarray, np.ndarray] | None = None,
    two_away: tuple[np.ndarray, np.ndarray] | None = None,
    sessions: Sequence[object | None] | None = None,
    speaker_named: np.ndarray | None = None,
    in_window: np.ndarray | None = None,
) -> np.ndarray:
    """Every signal of the pool fused by one weighted sum, in cosine units.

    Signals, each in [0, 1] over the pool: min-max of the cosine, BM25 (missing: 0) and
    MaxSim (missing: the pool's lowest), the reciprocal ranks of the three
    (:func:`reciprocal_ranks`), the mean of the two neighbouring turns' (``adjacency``;
    one not in the pool counts 0), the same of the turns two away (``two_away``) and
    the session's strength (:func:`session_strength`) of a base score (``0.15·mean(cos,
    bm25) + 0.85·maxsim`` in min-max units, the fused similarity's weights), whether the
    query
    names the memory's speaker, and whether it was said in the query's date window. A
    signal that is absent (None) leaves its terms out. ``f = Σ wᵢ·signalᵢ`` is mapped
    onto the pool's cosine range like :func:`fused_similarity`: a memory that would be
    best by every signal of the pool at once gets the best cosine, one worst by every
    signal the lowest. So a candidate ranked first by signals that disagree is not
    called as relevant as the best cosine, and the cosine calibration (a threshold's
    "nothing relevant") still applies; a flat ``f`` returns the cosine unchanged.
    """
    cos = np.asarray(dense, dtype=np.float64)
    n = cos.size
    if n == 0:
        return cos
    d = _spread(cos)
    terms: list[tuple[float, np.ndarray]] = [
        (weights.dense, d),
        (weights.dense_rank, reciprocal_ranks(cos)),
    ]
    parts = [d]
    if sparse is not None:
        bm25 = np.array([0.0 if v is None else max(0.0, v) for v in sparse], dtype=np.float64)
        if bm25.shape != cos.shape:
            raise ValueError(f"need one BM25 score per cosine ({cos.shape}), got {bm25.shape}")
        s = _spread(bm25)
        terms += [(weights.lexical, s), (weights.lexical_rank, reciprocal_ranks(bm25))]
        parts.append(s)
    base = np.mean(parts, axis=0)
    if late is not None:
        if len(late) != n:
            raise ValueError(f"need one late score per candidate ({n}), got {len(late)}")
        known = [v for v in late if v is not None]
        if known:
            floor = min(known)
            scores = np.array([floor if v is None else v for v in late], dtype=np.float64)
            lt = _spread(scores)
            terms += [(weights.late, lt), (weights.late_rank, reciprocal_ranks(scores))]
            base = 0.15 * base + 0.85 * lt
    padded = np.append(base, 0.0)  # index -1 reads the 0 appended here
    # both neighbours, not the better one: a turn between a question and a reply that
    # both match is more likely the evidence than one beside a single match
    if adjacency is not None:
        terms.append((weights.neighbour, (padded[adjacency[0]] + padded[adjacency[1]]) / 2.0))
    if two_away is not None:
        terms.append((weights.two_away, (padded[two_away[0]] + padded[two_away[1]]) / 2.0))
    if sessions is not None:
        terms.append((weights.session, session_strength(base, sessions)))
    if speaker_named is not None:
        terms.append((weights.speaker, np.asarray(speaker_named, dtype=np.float64)))
    if in_window is not None:
        terms.append((weights.date_window, np.asarray(in_window, dtype=np.float64)))
    total = np.sum([w * signal for w, signal in terms], axis=0)
    best = sum(w * float(signal.max()) for w, signal in terms)
    worst = sum(w * float(signal.min()) for w, signal in terms)
    if not float(total.max()) > float(total.min()) or not best > worst:
        return cos
    lo, hi = float(cos.min()), float(cos.max())
    fused: np.ndarray = lo + (hi - lo) * (total - worst) / (best - worst)
    return fused


def speakers_named(query: str, speakers: Sequence[str]) -> np.ndarray:
    """1.0 for each memory whose speaker the query names (a whole word, any case; an
    empty speaker never matches): "What did Caroline say about…" favours Caroline's
    turns."""
    lowered = query.casefold()
    found: dict[str, bool] = {}
    out = np.zeros(len(speakers), dtype=np.float64)
    for i, speaker in enumerate(speakers):
        name = speaker.strip().casefold()
        if not name:
            continue
        if name not in found:
            found[name] = re.search(rf"(?<!\w){re.escape(name)}(?!\w)", lowered) is not None
        out[i] = 1.0 if found[name] else 0.0
    return out


def adjacent_turns(
    keys: Sequence[tuple[str, int] | None], distance: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """For each candidate, the position of the candidate that is the turn ``distance``
    before and the one ``distance`` after it in the same conversation (``keys`` =
    (conversation, turn_index), None for non-turns), or -1 when that turn is not in the
    pool."""
    where = {key: i for i, key in enumerate(keys) if key is not None}
    before = np.full(len(keys), -1, dtype=np.int64)
    after = np.full(len(keys), -1, dtype=np.int64)
    for i, key in enumerate(keys):
        if key is not None:
            before[i] = where.get((key[0], key[1] - distance), -1)
            after[i] = where.get((key[0], key[1] + distance), -1)
    return before, after


def context_smoothed(
    scores: Sequence[float] | np.ndarray,
    before: np.ndarray,
    after: np.ndarray,
    context_weight: float,
) -> np.ndarray:
    """Scores raised by the better of a turn's neighbours, in the same units.

    A turn right before or after a strong match is often the other half of the
    exchange (the question it answers, the answer it prompted). With ``n = minmax(s)``
    over the pool and ``m`` = the larger of the two neighbours' ``n`` (0 when neither is
    in the pool), ``n' = (n + c·m) / (1 + c)``, mapped back onto the pool's range of
    ``s``; the best candidate keeps its score only if nothing outranks it. A flat pool
    or ``c = 0`` returns ``s`` unchanged.
    """
    base = np.asarray(scores, dtype=np.float64)
    n = minmax(base)
    if n is None or context_weight <= 0.0:
        return base
    padded = np.append(n, 0.0)  # index -1 reads the 0 appended here
    neighbour = np.maximum(padded[before], padded[after])
    lo, hi = float(base.min()), float(base.max())
    boosted: np.ndarray = lo + (hi - lo) * (n + context_weight * neighbour) / (1.0 + context_weight)
    return boosted


def window_boosted(
    scores: Sequence[float] | np.ndarray, in_window: np.ndarray, weight: float
) -> np.ndarray:
    """Scores raised for candidates said within the query's date window, in the same
    units: ``n' = (n + t·[in window]) / (1 + t)`` over ``n = minmax(s)``, mapped back
    onto the pool's range of ``s``. A flat pool, ``t = 0`` or no candidate in the
    window returns ``s`` unchanged."""
    base = np.asarray(scores, dtype=np.float64)
    n = minmax(base)
    inside = np.asarray(in_window, dtype=np.float64)
    if n is None or weight <= 0.0 or not inside.any():
        return base
    lo, hi = float(base.min()), float(base.max())
    return lo + (hi - lo) * (n + weight * inside) / (1.0 + weight)


def merge_pools(pools: Sequence[Sequence[Candidate]]) -> list[Candidate]:
    """Concatenate scope pools, keeping the first occurrence of each id."""
    seen: set[str] = set()
    merged: list[Candidate] = []
    for pool in pools:
        for candidate in pool:
            if candidate.id not in seen:
                seen.add(candidate.id)
                merged.append(candidate)
    return merged


@functools.lru_cache(maxsize=8192)
def normalized_text(text: str) -> str:
    """Whitespace collapsed, case folded: how two texts are judged identical (memoised:
    the same stored texts come back search after search)."""
    return " ".join(text.split()).casefold()


def merge_identical(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Keep the first candidate of each (owner, kind, text): a statement stored more than
    once in one conversation (said twice, or recorded twice before turn ids were derived
    from content) is recalled once. Candidates without text are never merged."""
    seen: set[tuple[tuple[str, str], str, str]] = set()
    kept: list[Candidate] = []
    for candidate in candidates:
        text = normalized_text(candidate.text)
        key = (candidate.owner, candidate.kind, text)
        if text and key in seen:
            continue
        seen.add(key)
        kept.append(candidate)
    return kept


def demoted(relevance: np.ndarray, candidates: Sequence[Candidate], weight: float) -> np.ndarray:
    """Relevance with each corrected turn's value multiplied by ``weight``."""
    factors = np.array([weight if c.corrected else 1.0 for c in candidates], dtype=np.float64)
    return np.asarray(relevance, dtype=np.float64) * factors


def facts_before_sources(hits: list[ScoredCandidate]) -> list[ScoredCandidate]:
    """Move each fact ahead of the first of its source turns listed before it, so the
    statement distilled from a turn (and current) is read before the raw turn."""
    ordered = list(hits)
    for hit in hits:
        sources = set(hit.candidate.source_ids)
        if not sources:
            continue
        at = ordered.index(hit)
        first_source = next(
            (i for i, h in enumerate(ordered[:at]) if h.candidate.id in sources), None
        )
        if first_source is not None:
            ordered.insert(first_source, ordered.pop(at))
    return ordered


def _listed_first(candidate: Candidate) -> bool:
    policy = find_kind(candidate.kind)
    return policy is not None and policy.listed_first


def facts_first(hits: list[ScoredCandidate], margin: float) -> list[ScoredCandidate]:
    """The facts (and profile entries: the kinds ``listed_first`` in
    :mod:`engram_core.kinds`) whose relevance is within ``margin`` of the best hit's,
    ahead of everything else; both groups keep their order."""
    if not hits:
        return hits
    best = max(h.relevance for h in hits)
    leads = [_listed_first(h.candidate) and h.relevance >= best - margin for h in hits]
    # By position, not `in`: comparing dataclasses field by field made this quadratic
    # (250 comparisons of every field for a 25-hit answer).
    return [h for h, lead in zip(hits, leads, strict=True) if lead] + [
        h for h, lead in zip(hits, leads, strict=True) if not lead
    ]


def pools_complete(pools: Sequence[Sequence[Candidate]], limits: Sequence[int]) -> bool:
    """True when no pool hit its limit (each pool's own), i.e. the pools hold every
    memory in scope."""
    return all(len(pool) < limit for pool, limit in zip(pools, limits, strict=True))


def other_scopes_limit(own_pool: int, pool_size: int, top_k: int, small_store_size: int) -> int:
    """Candidates per source for the scopes searched beside the conversation: what the
    conversation's pool of ``own_pool`` candidates leaves of ``pool_size``, never fewer
    than ``top_k`` (nor too few to tell a small store)."""
    return max(pool_size - own_pool, top_k, small_store_size + 1)


def recency(created_at: Sequence[datetime], now: datetime, half_life_days: float) -> np.ndarray:
    ages = np.array(
        [max(0.0, (now - ts).total_seconds() / SECONDS_PER_DAY) for ts in created_at],
        dtype=np.float64,
    )
    return np.exp(-ages / half_life_days)


def total_score(relevance: np.ndarray, recency_: np.ndarray, weight: float) -> np.ndarray:
    return (1.0 - weight) * np.asarray(relevance, dtype=np.float64) + weight * recency_


def threshold_mask(relevance: np.ndarray, threshold: float) -> np.ndarray:
    return np.asarray(relevance, dtype=np.float64) >= threshold


def cosine_matrix(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = vectors / np.maximum(norms, 1e-12)
    cosines: np.ndarray = unit @ unit.T
    return cosines


def mmr_reachable(totals: np.ndarray, mmr_lambda: float, top_k: int) -> np.ndarray:
    """A mask of the candidates MMR could pick among its first ``top_k``: the others
    need no vector. A pick's objective lies in ``[λ·total - (1 - λ), λ·total]`` (the
    penalty is a largest cosine, floored at 0), so a candidate below ``λ·t_k - (1 - λ)``,
    ``t_k`` the k-th best total, loses to each of the k best at every step."""
    totals = np.asarray(totals, dtype=np.float64)
    if top_k >= totals.size:
        return np.ones(totals.size, dtype=bool)
    kth = float(np.partition(totals, -top_k)[-top_k])
    reachable: np.ndarray = mmr_lambda * totals >= mmr_lambda * kth - (1.0 - mmr_lambda)
    return reachable


def mmr_select(
    totals: np.ndarray, vectors: np.ndarray, mmr_lambda: float, top_k: int
) -> list[tuple[int, float]]:
    """Greedy MMR. Returns (index, objective at selection) in selection order.

    The first pick has no selected neighbour, so its objective is ``λ·total``.
    Ties go to the lower index (the candidate that came first).
    """
    n = len(totals)
    if n == 0 or top_k <= 0:
        return []
    # λ·total, and (1 - λ)·cosine: scaling by a weight ≥ 0 commutes with the running
    # maximum, so each step is one maximum, one subtraction and one argmax.
    relevance = mmr_lambda * np.asarray(totals, dtype=np.float64)
    penalties = (1.0 - mmr_lambda) * cosine_matrix(vectors)
    penalty = np.zeros(n, dtype=np.float64)  # (1 - λ)·the largest cosine to a pick, ≥ 0
    objective = relevance.copy()
    picked: list[tuple[int, float]] = []
    for _ in range(min(top_k, n)):
        best = int(np.argmax(objective))
        picked.append((best, float(objective[best])))
        relevance[best] = -math.inf  # picked: never again
        np.maximum(penalty, penalties[best], out=penalty)
        np.subtract(relevance, penalty, out=objective)
    return picked


def _small_store_class(candidate: Candidate) -> int:
    """Higher comes first in a small store (the kind's ``small_store_rank``)."""
    if candidate.corrected:
        return 0
    policy = find_kind(candidate.kind)
    return policy.small_store_rank if policy is not None else 1


def rank(
    candidates: Sequence[Candidate],
    relevance: Sequence[float] | np.ndarray,
    params: RankingParams,
    now: datetime,
    *,
    complete: bool,
    order: Sequence[float] | np.ndarray | None = None,
) -> RankingResult:
    """Rank merged candidates. ``complete``: the pools held every memory in scope.
    ``order``: a relevance in the same units that ranks the candidates passing the
    threshold (the linear fusion's); the threshold and each hit's reported relevance
    stay ``relevance``'s."""
    n = len(candidates)
    if n == 0:
        return RankingResult(Outcome.EMPTY, considered=0)
    rel = np.asarray(relevance, dtype=np.float64)
    if rel.shape != (n,):
        raise ValueError(f"need one relevance per candidate ({n}), got shape {rel.shape}")
    rel = demoted(rel, candidates, params.corrected_weight)
    ranking = rel
    if order is not None:
        ranking = np.asarray(order, dtype=np.float64)
        if ranking.shape != (n,):
            raise ValueError(f"need one order value per candidate ({n}), got {ranking.shape}")
        ranking = demoted(ranking, candidates, params.corrected_weight)
    rec = recency([c.created_at for c in candidates], now, params.half_life_days)
    tot = total_score(ranking, rec, params.recency_weight)

    def scored(i: int, mmr: float = 0.0) -> ScoredCandidate:
        return ScoredCandidate(candidates[i], float(rel[i]), float(rec[i]), float(tot[i]), mmr)

    if complete and n <= params.small_store_size:
        # Facts first (they say what holds now), then episodes and turns, each newest
        # first; a corrected statement last.
        by_class = sorted(
            range(n),
            key=lambda i: (
                _small_store_class(candidates[i]),
                candidates[i].created_at,
                candidates[i].id,
            ),
            reverse=True,
        )
        hits = facts_before_sources([scored(i) for i in by_class[: params.top_k]])
        return RankingResult(Outcome.SMALL_STORE, hits, considered=n)

    keep = np.flatnonzero(threshold_mask(rel, params.score_threshold))
    if keep.size == 0:
        return RankingResult(Outcome.NOTHING_RELEVANT, considered=n)
    keep = keep[mmr_reachable(tot[keep], params.mmr_lambda, params.top_k)]
    # Equal objectives go to the smaller id, whatever order the store returned them in.
    keep = keep[np.argsort([candidates[int(i)].id for i in keep], kind="stable")]
    # one conversion of the stacked float32 vectors, not one a candidate
    vectors = np.array([np.asarray(candidates[int(i)].vector) for i in keep], dtype=np.float64)
    picked = mmr_select(tot[keep], vectors, params.mmr_lambda, params.top_k)
    hits = facts_before_sources([scored(int(keep[j]), mmr) for j, mmr in picked])
    return RankingResult(Outcome.RANKED, facts_first(hits, params.fact_margin), considered=n)
