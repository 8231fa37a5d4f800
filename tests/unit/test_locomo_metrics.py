"""LoCoMo retrieval metrics and evidence parsing, on hand-computed cases."""

from __future__ import annotations

import math

import pytest

from engram_cli.bench.locomo.metrics import (
    ParsedEvidence,
    hit_at_k,
    mean_scores,
    ndcg_at_k,
    normalize_dia_id,
    parse_evidence,
    recall_at_k,
    score_question,
    session_ranking,
    turns_of_hit,
)

# evidence at ranks 2 and 4
RANKING = [{"D1:1"}, {"D1:2"}, {"D1:3"}, {"D2:1"}]
EVIDENCE = {"D1:2", "D2:1"}


def test_recall_is_the_fraction_of_evidence_in_the_top_k() -> None:
    assert recall_at_k(RANKING, EVIDENCE, 1) == 0.0
    assert recall_at_k(RANKING, EVIDENCE, 2) == 0.5
    assert recall_at_k(RANKING, EVIDENCE, 3) == 0.5
    assert recall_at_k(RANKING, EVIDENCE, 4) == 1.0
    assert recall_at_k(RANKING, EVIDENCE, 50) == 1.0  # k beyond the ranking
    assert recall_at_k([], EVIDENCE, 10) == 0.0
    with pytest.raises(ValueError, match="without evidence"):
        recall_at_k(RANKING, set(), 5)


def test_hit_is_any_evidence_in_the_top_k() -> None:
    assert [hit_at_k(RANKING, EVIDENCE, k) for k in (1, 2, 4)] == [0.0, 1.0, 1.0]


def test_ndcg_binary_relevance_by_hand() -> None:
    # ranks 2 and 4 relevant: DCG = 1/log2(3) + 1/log2(5) = 0.63093 + 0.43068
    # ideal: ranks 1 and 2: IDCG = 1 + 1/log2(3) = 1.63093
    assert ndcg_at_k(RANKING, EVIDENCE, 4) == pytest.approx(1.06161 / 1.63093, abs=1e-5)
    assert ndcg_at_k(RANKING, EVIDENCE, 2) == pytest.approx(0.63093 / 1.63093, abs=1e-5)
    assert ndcg_at_k(RANKING, EVIDENCE, 1) == 0.0
    # one evidence turn at rank 1 is perfect; IDCG only counts min(|evidence|, k) ranks
    assert ndcg_at_k(RANKING, {"D1:1"}, 10) == 1.0
    assert ndcg_at_k(RANKING, {"D1:1", "D9:9"}, 1) == 1.0
    assert ndcg_at_k(RANKING, {"D1:3"}, 3) == pytest.approx(1 / math.log2(4))


def test_a_turn_found_twice_counts_once() -> None:
    ranking = [{"D1:2"}, {"D1:2"}, {"D2:1"}]  # e.g. a turn and a fact from it
    assert recall_at_k(ranking, EVIDENCE, 2) == 0.5
    # rank 2 brings nothing new: DCG = 1 + 1/log2(4) = 1.5; IDCG = 1.63093
    assert ndcg_at_k(ranking, EVIDENCE, 3) == pytest.approx(1.5 / 1.63093, abs=1e-5)


def test_a_fact_hit_counts_for_all_its_source_turns() -> None:
    ranking = [{"D7:7"}, {"D1:2", "D2:1"}]
    assert recall_at_k(ranking, EVIDENCE, 1) == 0.0
    assert recall_at_k(ranking, EVIDENCE, 2) == 1.0
    assert ndcg_at_k(ranking, EVIDENCE, 2) == pytest.approx(0.63093 / 1.63093, abs=1e-5)


def test_score_question_and_mean() -> None:
    scores = score_question(RANKING, EVIDENCE, [2, 4])
    assert scores["recall@2"] == 0.5 and scores["hit@2"] == 1.0 and scores["recall@4"] == 1.0
    assert set(scores) == {
        f"{metric}@{k}" for metric in ("recall", "hit", "ndcg", "session_recall") for k in (2, 4)
    }
    other = score_question([{"D5:5"}], {"D1:1"}, [2, 4])
    mean = mean_scores([scores, other])
    assert mean["recall@2"] == 0.25 and mean["recall@4"] == 0.5 and mean["hit@2"] == 0.5
    assert mean_scores([]) == {}


def test_turns_of_hit() -> None:
    turn_of_point = {"uuid-1": "D1:1", "uuid-2": "D1:2"}
    assert turns_of_hit("turn", "D3:4", [], turn_of_point) == {"D3:4"}
    assert turns_of_hit("fact", "", ["uuid-1", "uuid-2"], turn_of_point) == {"D1:1", "D1:2"}
    assert turns_of_hit("episode", "", ["uuid-2", "D9:1"], turn_of_point) == {"D1:2", "D9:1"}
    assert turns_of_hit("fact", "uuid-1", [], turn_of_point) == {"D1:1"}
    assert turns_of_hit("fact", "", [], turn_of_point) == frozenset()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (["D1:3"], ParsedEvidence(("D1:3",))),
        (["D1:3", "D2:10"], ParsedEvidence(("D1:3", "D2:10"))),
        (["D8:6; D9:17"], ParsedEvidence(("D8:6", "D9:17"), recovered=2)),  # two in one
        (["D:11:26"], ParsedEvidence(("D11:26",), recovered=1)),  # stray colon
        (["D30:05"], ParsedEvidence(("D30:5",), recovered=1)),  # leading zero
        (["d2:4 "], ParsedEvidence(("D2:4",), recovered=1)),
        (["D1:3", "D1:03"], ParsedEvidence(("D1:3",), recovered=1)),  # same turn twice
        (["D"], ParsedEvidence((), unusable=1)),
        (["", None, 7, "D1"], ParsedEvidence((), unusable=4)),
        (["D4:2, D", "x"], ParsedEvidence(("D4:2",), recovered=1, unusable=2)),
        ([], ParsedEvidence(())),
    ],
)
def test_parse_evidence(raw: list[object], expected: ParsedEvidence) -> None:
    assert parse_evidence(raw) == expected


def test_normalize_dia_id() -> None:
    assert normalize_dia_id("D12:007") == "D12:7"
    assert normalize_dia_id("D:1:2") == "D1:2"
    assert normalize_dia_id("D1-2") is None
    assert normalize_dia_id("S1:2") is None


def test_session_recall_ranks_sessions_by_their_best_turn() -> None:
    """Published LoCoMo retrieval figures are session-level: a session counts at the rank
    of its first turn in the ranking, once."""
    ranking = [{"D1:1"}, {"D1:2"}, {"D3:4"}, {"D1:3"}, {"D2:1"}]
    assert session_ranking(ranking) == [{"S1"}, {"S3"}, {"S2"}]
    scores = score_question(ranking, {"D1:9", "D2:1"}, [1, 2, 3])
    # the turn D1:9 is not ranked, but its session is, first
    assert (scores["recall@1"], scores["session_recall@1"]) == (0.0, 0.5)
    assert scores["session_recall@2"] == 0.5 and scores["session_recall@3"] == 1.0
    assert scores["recall@3"] == 0.0
