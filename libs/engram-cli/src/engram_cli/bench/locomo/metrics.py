"""Retrieval metrics for LoCoMo-style evidence, as pure functions (no I/O).

A ranking is a list of hits, best first; each hit is the set of turn ids (``dia_id``s)
it stands for: one for a turn, its source turns for a fact or an episode. A question's
evidence is a set of turn ids.

- Recall@k as in the LoCoMo paper: the fraction of the evidence found in the top k.
- Hit@k: 1 when any evidence turn is in the top k.
- NDCG@k with binary relevance: a hit is relevant when it brings evidence not already
  brought by a better-ranked hit (so a turn found twice is not counted twice);
  ``IDCG = Σ_{i ≤ min(|evidence|, k)} 1 / log2(i + 1)``.

Session-level scores (``session_recall@k``), as published LoCoMo retrieval figures are:
the ranking read as a ranking of sessions, each session placed where its best turn is,
and the question's evidence as the sessions that hold it.

Evidence ids in the data are sometimes malformed; :func:`parse_evidence` recovers what
it can (``'D8:6; D9:17'`` → two ids, ``'D:11:26'`` → ``D11:26``, ``'D30:05'`` →
``D30:5``) and counts the rest.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

Ranking = Sequence[Collection[str]]

_SEPARATORS = re.compile(r"[;,\s]+")
_DIA_ID = re.compile(r"[Dd]:?(\d+):(\d+)")


@dataclass(frozen=True)
class ParsedEvidence:
    ids: tuple[str, ...]  # canonical ``D<session>:<turn>``, first occurrence order
    recovered: int = 0  # ids that needed repair (split, stray colon, leading zero)
    unusable: int = 0  # pieces that are no turn id at all


def normalize_dia_id(raw: str) -> str | None:
    """``D<session>:<turn>`` with plain integers, or None when ``raw`` is no turn id."""
    match = _DIA_ID.fullmatch(raw.strip())
    if match is None:
        return None
    return f"D{int(match.group(1))}:{int(match.group(2))}"


def parse_evidence(raw: Iterable[object]) -> ParsedEvidence:
    """Canonical turn ids from a question's evidence list, counting repairs and losses."""
    ids: dict[str, None] = {}
    recovered = unusable = 0
    for entry in raw:
        if not isinstance(entry, str):
            unusable += 1
            continue
        pieces = [p for p in _SEPARATORS.split(entry) if p]
        if not pieces:
            unusable += 1
            continue
        for piece in pieces:
            canonical = normalize_dia_id(piece)
            if canonical is None:
                unusable += 1
                continue
            if canonical != entry:
                recovered += 1
            ids.setdefault(canonical)
    return ParsedEvidence(tuple(ids), recovered, unusable)


def turns_of_hit(
    kind: str,
    source_id: str,
    source_turn_ids: Sequence[str],
    turn_of_point: Mapping[str, str],
) -> frozenset[str]:
    """The turn ids a hit stands for: a turn its ``source_id``; a fact or an episode its
    ``source_turn_ids``, mapped from turn memory ids to ``dia_id``s through
    ``turn_of_point`` (an id that is no known turn memory is taken as a turn id)."""
    if kind == "turn":
        return frozenset([source_id]) if source_id else frozenset()
    turns = {turn_of_point.get(t, t) for t in source_turn_ids if t}
    if not turns and source_id:
        turns.add(turn_of_point.get(source_id, source_id))
    return frozenset(turns)


def _found(ranking: Ranking, relevant: Collection[str], k: int) -> set[str]:
    found: set[str] = set()
    for turns in ranking[:k]:
        found.update(t for t in turns if t in relevant)
    return found


def recall_at_k(ranking: Ranking, relevant: Collection[str], k: int) -> float:
    if not relevant:
        raise ValueError("recall of a question without evidence is undefined")
    return len(_found(ranking, relevant, k)) / len(set(relevant))


def hit_at_k(ranking: Ranking, relevant: Collection[str], k: int) -> float:
    return 1.0 if _found(ranking, relevant, k) else 0.0


def ndcg_at_k(ranking: Ranking, relevant: Collection[str], k: int) -> float:
    relevant = set(relevant)
    if not relevant:
        raise ValueError("NDCG of a question without evidence is undefined")
    credited: set[str] = set()
    dcg = 0.0
    for rank, turns in enumerate(ranking[:k], start=1):
        new = (set(turns) & relevant) - credited
        if new:
            credited |= new
            dcg += 1.0 / math.log2(rank + 1)
    ideal = sum(1.0 / math.log2(rank + 1) for rank in range(1, min(len(relevant), k) + 1))
    return dcg / ideal


def session_of(dia_id: str) -> str:
    """``D3:14`` → ``S3`` (an id that is no turn id stands for itself)."""
    match = _DIA_ID.fullmatch(dia_id)
    return f"S{int(match.group(1))}" if match else dia_id


def session_ranking(ranking: Ranking) -> list[frozenset[str]]:
    """The sessions in the order their first turn appears in ``ranking``."""
    seen: set[str] = set()
    sessions: list[frozenset[str]] = []
    for turns in ranking:
        new = sorted({session_of(t) for t in turns} - seen)
        seen.update(new)
        sessions += [frozenset([s]) for s in new]
    return sessions


def score_question(
    ranking: Ranking, relevant: Collection[str], ks: Sequence[int]
) -> dict[str, float]:
    """``recall@k``, ``hit@k``, ``ndcg@k`` and ``session_recall@k`` for every k."""
    scores: dict[str, float] = {}
    sessions = session_ranking(ranking)
    relevant_sessions = {session_of(t) for t in relevant}
    for k in ks:
        scores[f"recall@{k}"] = recall_at_k(ranking, relevant, k)
        scores[f"hit@{k}"] = hit_at_k(ranking, relevant, k)
        scores[f"ndcg@{k}"] = ndcg_at_k(ranking, relevant, k)
        scores[f"session_recall@{k}"] = recall_at_k(sessions, relevant_sessions, k)
    return scores


def mean_scores(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per-metric mean over questions (macro average, as in the LoCoMo paper)."""
    if not rows:
        return {}
    return {key: sum(row[key] for row in rows) / len(rows) for key in rows[0]}
