"""ranking.py against hand-computed numbers."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from engram_core.memory import ScopeName
from engram_retrieval.ranking import (
    Candidate,
    Outcome,
    RankingParams,
    adjacent_turns,
    context_smoothed,
    fused_similarity,
    late_fused_similarity,
    lexical_relevance,
    merge_identical,
    merge_pools,
    minmax,
    mmr_select,
    pools_complete,
    rank,
    recency,
    sigmoid,
    threshold_mask,
    total_score,
)

NOW = datetime(2025, 1, 31, tzinfo=UTC)


def cand(
    id_: str,
    vector: list[float],
    age_days: float = 0.0,
    scope: ScopeName = "conversation",
    dense: float = 0.5,
) -> Candidate:
    return Candidate(
        id=id_,
        scope=scope,
        dense=dense,
        vector=np.array(vector),
        created_at=NOW - timedelta(days=age_days),
    )


def test_sigmoid_values_and_stability() -> None:
    assert sigmoid(0.0) == pytest.approx(0.5)
    assert sigmoid(math.log(3)) == pytest.approx(0.75)
    out = sigmoid(np.array([-1000.0, 1000.0]))
    assert out.tolist() == [0.0, 1.0]


def test_recency_is_exp_of_age_over_half_life() -> None:
    ages = [NOW, NOW - timedelta(days=30), NOW - timedelta(days=15), NOW + timedelta(days=2)]
    assert recency(ages, NOW, 30.0) == pytest.approx([1.0, 0.367879441, 0.606530660, 1.0])


def test_total_is_weighted_mix() -> None:
    # (1 - 0.2) * 0.8 + 0.2 * 0.5 = 0.74 ; 0.8 * 0.3 + 0.2 * 1.0 = 0.44
    assert total_score(np.array([0.8, 0.3]), np.array([0.5, 1.0]), 0.2) == pytest.approx(
        [0.74, 0.44]
    )


def test_threshold_keeps_equal_and_above() -> None:
    assert threshold_mask(np.array([0.34, 0.35, 0.9]), 0.35).tolist() == [False, True, True]


def test_mmr_prefers_diverse_item_over_near_duplicate() -> None:
    # A total 0.9 [1, 0]; B total 0.85 [0.96, 0.28] (cos(A,B) = 0.96); C total 0.6 [0, 1].
    # pick 1: 0.7*0.9 = 0.63 (A) > 0.595 (B) > 0.42 (C)
    # pick 2: B = 0.595 - 0.3*0.96 = 0.307 ; C = 0.42 - 0.3*0 = 0.42  -> C
    # pick 3: B = 0.595 - 0.3*max(0.96, 0.28) = 0.307
    totals = np.array([0.9, 0.85, 0.6])
    vectors = np.array([[1.0, 0.0], [0.96, 0.28], [0.0, 1.0]])
    picked = mmr_select(totals, vectors, 0.7, 3)
    assert [i for i, _ in picked] == [0, 2, 1]
    assert [m for _, m in picked] == pytest.approx([0.63, 0.42, 0.307])


def test_mmr_with_lambda_one_is_plain_total_order() -> None:
    picked = mmr_select(
        np.array([0.9, 0.85, 0.6]), np.array([[1.0, 0.0], [0.96, 0.28], [0.0, 1.0]]), 1.0, 2
    )
    assert [index for index, _ in picked] == [0, 1]
    assert [score for _, score in picked] == pytest.approx([0.9, 0.85])


def test_mmr_picks_what_the_greedy_definition_picks() -> None:
    """Each step takes the candidate with the best ``λ·total - (1 - λ)·max cosine to the
    picks so far`` (the lower index on a tie), with that objective: written out plainly
    here, it must agree exactly with the vectorised steps, ties and duplicates included."""

    def greedy(
        totals: np.ndarray, vectors: np.ndarray, lam: float, k: int
    ) -> list[tuple[int, float]]:
        unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        picks: list[tuple[int, float]] = []
        for _ in range(min(k, len(totals))):
            best, best_value = -1, -np.inf
            for i in range(len(totals)):
                if any(i == p for p, _ in picks):
                    continue
                penalty = max([0.0] + [float(unit[i] @ unit[p]) for p, _ in picks])
                value = lam * totals[i] - (1.0 - lam) * penalty
                if value > best_value:
                    best, best_value = i, value
            picks.append((best, best_value))
        return picks

    rng = np.random.default_rng(11)
    for trial in range(300):
        n, k = int(rng.integers(1, 40)), int(rng.integers(1, 20))
        totals = rng.random(n)
        if trial % 3 == 0:
            totals = np.round(totals, 1)  # equal totals
        vectors = rng.normal(size=(n, 8))
        if trial % 4 == 0:
            vectors[: n // 2] = vectors[0]  # near duplicates
        lam = float(rng.choice([0.0, 0.5, 0.9, 1.0]))
        got = mmr_select(totals, vectors, lam, k)
        want = greedy(totals, vectors, lam, k)
        assert [i for i, _ in got] == [i for i, _ in want]
        assert [v for _, v in got] == pytest.approx([v for _, v in want], abs=1e-9)


def test_merge_pools_dedupes_first_scope_wins() -> None:
    a, b = cand("a", [1, 0]), cand("b", [0, 1], scope="user")
    a_again = cand("a", [1, 0], scope="global")
    merged = merge_pools([[a], [b, a_again]])
    assert [(c.id, c.scope) for c in merged] == [("a", "conversation"), ("b", "user")]


def test_pool_size_is_top_k_times_multiplier_but_tells_small_stores_apart() -> None:
    assert RankingParams(top_k=5).pool_size == 25
    assert RankingParams(top_k=1, candidate_multiplier=3).pool_size == 6  # small_store_size 5 + 1
    a, b, c = (cand(id_, [1, 0]) for id_ in "abc")
    assert pools_complete([[a, b], []], [3, 3]) and not pools_complete([[a, b, c]], [3])


def test_rank_full_pipeline_numbers() -> None:
    params = RankingParams(
        top_k=2, recency_weight=0.2, score_threshold=0.35, mmr_lambda=0.7, small_store_size=0
    )
    cands = [
        cand("old", [1.0, 0.0], age_days=30),  # rel 0.8: total 0.64 + 0.2*e^-1 = 0.713576
        cand("new", [0.0, 1.0], age_days=0),  # rel 0.8: total 0.64 + 0.2 = 0.84
        cand("weak", [0.6, 0.8], age_days=0),  # rel 0.2: below threshold
    ]
    result = rank(cands, [0.8, 0.8, 0.2], params, NOW, complete=True)
    assert result.outcome is Outcome.RANKED
    assert result.considered == 3
    assert [h.candidate.id for h in result.hits] == ["new", "old"]
    new, old = result.hits
    assert new.total == pytest.approx(0.84)
    assert new.mmr == pytest.approx(0.7 * 0.84)
    assert old.recency == pytest.approx(math.exp(-1))
    assert old.total == pytest.approx(0.713576, abs=1e-6)
    assert old.mmr == pytest.approx(0.7 * 0.713576, abs=1e-6)  # orthogonal to "new"


def test_small_store_returns_all_newest_first_even_below_threshold() -> None:
    params = RankingParams()
    cands = [
        cand("a", [1, 0], age_days=3),
        cand("b", [0, 1], age_days=1),
        cand("c", [1, 1], age_days=2),
    ]
    result = rank(cands, [0.1, 0.0, 0.9], params, NOW, complete=True)
    assert result.outcome is Outcome.SMALL_STORE
    assert [h.candidate.id for h in result.hits] == ["b", "c", "a"]
    assert result.hits[0].relevance == 0.0  # scores still reported


def test_small_store_needs_complete_pools() -> None:
    cands = [cand("a", [1, 0]), cand("b", [0, 1])]
    result = rank(cands, [0.9, 0.1], RankingParams(), NOW, complete=False)
    assert result.outcome is Outcome.RANKED
    assert [h.candidate.id for h in result.hits] == ["a"]


def test_nothing_relevant_and_empty() -> None:
    cands = [cand(str(i), [1, i]) for i in range(6)]
    result = rank(cands, [0.1] * 6, RankingParams(), NOW, complete=True)
    assert result.outcome is Outcome.NOTHING_RELEVANT
    assert result.hits == [] and result.considered == 6
    assert rank([], [], RankingParams(), NOW, complete=True).outcome is Outcome.EMPTY


def test_rank_rejects_mismatched_relevance() -> None:
    with pytest.raises(ValueError):
        rank([cand("a", [1, 0])], [0.5, 0.5], RankingParams(), NOW, complete=True)


def test_lexical_relevance_is_bm25_over_the_best() -> None:
    assert lexical_relevance([4.0, None, 1.0, 2.0]).tolist() == [1.0, 0.0, 0.25, 0.5]
    assert lexical_relevance([None, None]).tolist() == [0.0, 0.0]
    assert lexical_relevance([]).tolist() == []


def test_minmax_spreads_values_and_is_none_when_flat() -> None:
    spread = minmax(np.array([2.0, 4.0, 3.0]))
    assert spread is not None
    np.testing.assert_allclose(spread, [0.0, 1.0, 0.5])
    assert minmax(np.array([0.4, 0.4])) is None
    assert minmax(np.zeros(0)) is None


def test_fused_similarity_hand_computed() -> None:
    # d = minmax(cos) = [1, .5, 0]; s = minmax([0, 5, 10]) = [0, .5, 1] (missing BM25 = 0)
    # f = .7 d + .3 s = [.7, .5, .3]; back onto [lo, hi] = [.2, .6]: .2 + .4 f
    fused = fused_similarity([0.6, 0.4, 0.2], [None, 5.0, 10.0], 0.3)
    np.testing.assert_allclose(fused, [0.48, 0.40, 0.32])
    # w = 1: BM25 order on the cosine range; w = 0: the cosine itself
    np.testing.assert_allclose(
        fused_similarity([0.6, 0.4, 0.2], [None, 5.0, 10.0], 1.0), [0.2, 0.4, 0.6]
    )
    np.testing.assert_allclose(
        fused_similarity([0.6, 0.4, 0.2], [None, 5.0, 10.0], 0.0), [0.6, 0.4, 0.2]
    )


def test_fused_similarity_keeps_the_cosine_when_a_signal_is_flat() -> None:
    np.testing.assert_allclose(fused_similarity([0.6, 0.2], [None, None], 0.3), [0.6, 0.2])
    np.testing.assert_allclose(fused_similarity([0.6, 0.2], [3.0, 3.0], 0.3), [0.6, 0.2])
    np.testing.assert_allclose(fused_similarity([0.5], [7.0], 0.3), [0.5])
    np.testing.assert_allclose(fused_similarity([0.5, 0.5], [1.0, 7.0], 0.3), [0.5, 0.5])
    with pytest.raises(ValueError):
        fused_similarity([0.5, 0.4], [1.0], 0.3)


def test_fused_similarity_stays_within_the_pool_cosine_range() -> None:
    rng = np.random.default_rng(7)
    cos = rng.uniform(-0.2, 0.9, 40)
    bm25 = [None if x < 0.3 else float(x * 20) for x in rng.uniform(0, 1, 40)]
    fused = fused_similarity(cos, bm25, 0.3)
    assert fused.min() >= cos.min() - 1e-12 and fused.max() <= cos.max() + 1e-12


def test_ties_go_to_the_smaller_id_whatever_the_store_order() -> None:
    params = RankingParams(top_k=3, recency_weight=0.0, score_threshold=0.0, mmr_lambda=1.0)
    pool = [cand("c", [1, 0]), cand("a", [0, 1]), cand("b", [1, 1])]
    for order in (pool, pool[::-1]):
        result = rank(order, [0.5] * 3, params, NOW, complete=False)
        assert [h.candidate.id for h in result.hits] == ["a", "b", "c"]


def test_late_fused_similarity_hand_computed() -> None:
    # fused 0.6/0.4/0.2 → f = 1, 0.5, 0; MaxSim 0.5/0.9/0.7 → l = 0, 1, 0.5
    # w = 0.75: x = 0.25 f + 0.75 l = 0.25, 0.875, 0.375 → 0.2 + 0.4 x
    blended = late_fused_similarity([0.6, 0.4, 0.2], [0.5, 0.9, 0.7], 0.75)
    np.testing.assert_allclose(blended, [0.3, 0.55, 0.35])
    # the MaxSim winner outranks the fused winner; the range stays the pool's
    assert blended.argmax() == 1 and blended.max() <= 0.6 and blended.min() >= 0.2


def test_late_fused_similarity_without_signal_keeps_the_fused_score() -> None:
    np.testing.assert_allclose(late_fused_similarity([0.6, 0.2], [None, None], 0.8), [0.6, 0.2])
    np.testing.assert_allclose(late_fused_similarity([0.6, 0.2], [0.4, 0.4], 0.8), [0.6, 0.2])
    np.testing.assert_allclose(late_fused_similarity([0.6, 0.2], [0.1, 0.9], 0.0), [0.6, 0.2])
    # a candidate without token vectors counts as the pool's lowest MaxSim
    np.testing.assert_allclose(
        late_fused_similarity([0.6, 0.4, 0.2], [None, 0.9, 0.5], 1.0), [0.2, 0.6, 0.2]
    )
    with pytest.raises(ValueError, match="one late score per candidate"):
        late_fused_similarity([0.6, 0.2], [0.5], 0.5)


def test_adjacent_turns_are_found_within_the_pool_and_conversation() -> None:
    keys = [("c1", 4), ("c1", 5), None, ("c2", 6), ("c1", 7), ("c1", 6)]
    before, after = adjacent_turns(keys)
    assert before.tolist() == [-1, 0, -1, -1, 5, 1]  # c2's turn 6 has no c2 neighbours
    assert after.tolist() == [1, 5, -1, -1, -1, 4]


def test_context_smoothed_hand_computed() -> None:
    # s = 0.6 / 0.2 / 0.4 / 0.3 → n = 1 / 0 / 0.5 / 0.25; turn 1 sits between 0 and 2
    before = np.array([-1, 0, -1, -1])
    after = np.array([1, 2, -1, -1])
    smoothed = context_smoothed([0.6, 0.2, 0.4, 0.3], before, after, 0.25)
    # n' = (n + 0.25·m) / 1.25 with m = 0, 1, 0, 0 → 0.8, 0.2, 0.4, 0.2 → 0.2 + 0.4 n'
    np.testing.assert_allclose(smoothed, [0.52, 0.28, 0.36, 0.28])
    # the neighbour of the best match now ties the third-best candidate it used to trail
    assert smoothed[1] == pytest.approx(smoothed[3])
    np.testing.assert_allclose(context_smoothed([0.6, 0.2], before[:2], after[:2], 0.0), [0.6, 0.2])
    np.testing.assert_allclose(context_smoothed([0.5, 0.5], before[:2], after[:2], 0.3), [0.5, 0.5])


# --- what a person relies on: one statement once, corrections lose, facts first ----------


def said(
    id_: str,
    text: str,
    vector: list[float],
    *,
    kind: str = "turn",
    owner: tuple[str, str] = ("alice", "default"),
    sources: tuple[str, ...] = (),
    corrected: bool = False,
    age_days: float = 0.0,
) -> Candidate:
    return Candidate(
        id=id_,
        scope="conversation",
        dense=0.5,
        vector=np.array(vector),
        created_at=NOW - timedelta(days=age_days),
        text=text,
        kind=kind,
        owner=owner,
        source_ids=sources,
        corrected=corrected,
    )


def test_identical_texts_of_one_conversation_are_merged_and_other_owners_kept() -> None:
    pool = [
        said("a", "Where do I like to hike?", [1, 0]),
        said("b", "  where do I like  to hike? ", [1, 0]),  # the same, said again
        said("c", "Where do I like to hike?", [1, 0], owner=("bob", "default")),
        said("d", "Where do I like to hike?", [1, 0], kind="fact"),
    ]
    assert [c.id for c in merge_identical(pool)] == ["a", "c", "d"]


def test_a_corrected_turn_stops_competing_with_the_fact_that_replaced_it() -> None:
    # relevance as the issue saw it: the old turn 0.96, the current fact 0.92
    old_turn = said("t1", "My wife's name is Anne.", [1, 0], corrected=True, age_days=1)
    new_turn = said("t2", "Actually my wife's name is Jane.", [0.9, 0.44])
    fact = said("f2", "User's wife's name is Jane", [0.6, 0.8], kind="fact", sources=("t2",))
    params = RankingParams(top_k=3, score_threshold=0.35, mmr_lambda=0.9, small_store_size=0)
    result = rank([old_turn, new_turn, fact], [0.96, 0.95, 0.92], params, NOW, complete=True)
    order = [h.candidate.id for h in result.hits]
    # the fact first (before the turn it came from), the corrected turn last at half weight
    assert order == ["f2", "t2", "t1"]
    assert result.hits[-1].relevance == pytest.approx(0.48)
    # below twice the threshold, a corrected turn is not recalled at all
    faint = rank([old_turn, fact], [0.6, 0.92], params, NOW, complete=True)
    assert [h.candidate.id for h in faint.hits] == ["f2"]


def test_small_store_lists_corrected_turns_last_and_facts_before_their_turns() -> None:
    pool = [
        said("t1", "My wife's name is Anne.", [1, 0], corrected=True),
        said("t2", "Actually, Jane.", [0, 1], age_days=0.5),
        said("f2", "User's wife's name is Jane", [1, 1], kind="fact", sources=("t2",), age_days=1),
    ]
    result = rank(pool, [0.1, 0.1, 0.1], RankingParams(), NOW, complete=True)
    assert result.outcome is Outcome.SMALL_STORE
    assert [h.candidate.id for h in result.hits] == ["f2", "t2", "t1"]


def test_a_fact_nearly_as_relevant_as_the_best_turn_is_listed_first() -> None:
    question = said("q", "What is my wife's name?", [1, 0])  # a question asked before
    fact = said("f", "User's wife's name is Jane", [0, 1], kind="fact")
    far_fact = said("g", "User loves pizza", [1, 1], kind="fact")
    params = RankingParams(top_k=3, score_threshold=0.3, mmr_lambda=1.0, small_store_size=0)
    result = rank([question, fact, far_fact], [0.97, 0.87, 0.4], params, NOW, complete=True)
    # the fact within 0.15 of the best hit leads; the barely relevant one stays in place
    assert [h.candidate.id for h in result.hits] == ["f", "q", "g"]


def test_the_pool_grows_with_top_k_only_up_to_its_cap() -> None:
    """A search's cost grows with its candidate pools; a token budget asks for 25 hits, so
    the pools stop at max_pool instead of 5 x top_k (never below top_k)."""
    assert RankingParams(top_k=5, candidate_multiplier=5, max_pool=50).pool_size == 25
    assert RankingParams(top_k=25, candidate_multiplier=5, max_pool=50).pool_size == 50
    assert RankingParams(top_k=80, candidate_multiplier=5, max_pool=50).pool_size == 80
    assert RankingParams(top_k=1, candidate_multiplier=1, small_store_size=5).pool_size == 6


# --- the linear fusion -------------------------------------------------------------------


def test_reciprocal_ranks_give_equal_values_the_same_rank() -> None:
    from engram_retrieval.ranking import reciprocal_ranks

    ranks = reciprocal_ranks(np.array([0.5, 0.0, 0.0, 0.9, 0.5]))
    np.testing.assert_allclose(ranks, [10 / 11, 10 / 13, 10 / 13, 1.0, 10 / 11])


def test_speakers_are_named_as_whole_words_in_any_case() -> None:
    from engram_retrieval.ranking import speakers_named

    named = speakers_named("What did caroline tell Al's sister?", ["Caroline", "Al", "Mel", ""])
    assert named.tolist() == [1.0, 1.0, 0.0, 0.0]
    assert speakers_named("Is it also true?", ["Al"]).tolist() == [0.0]


def test_session_strength_is_the_mean_of_a_session_s_two_best() -> None:
    from engram_retrieval.ranking import session_strength

    base = np.array([0.9, 0.1, 0.5, 0.3, 0.4])
    sessions = ["a", "a", "a", "b", None]
    # not a turn (no session): 0, the signal is about a conversation
    np.testing.assert_allclose(session_strength(base, sessions), [0.7, 0.7, 0.7, 0.3, 0.0])


def test_session_strength_is_bit_for_bit_numpy_s_mean() -> None:
    # computed without np.mean per session (issue 30): a ranking must not move by an ulp
    from engram_retrieval.ranking import session_strength

    rng = np.random.default_rng(30)
    for _ in range(200):
        base = rng.random(40) * rng.choice([1e-3, 1.0, 1e3])
        sessions = [None if n == 0 else int(n) for n in rng.integers(0, 8, size=40)]
        by_session: dict[int, list[float]] = {}
        for value, session in zip(base, sessions, strict=True):
            if session is not None:
                by_session.setdefault(session, []).append(float(value))
        expected = [
            0.0 if s is None else float(np.mean(sorted(by_session[s], reverse=True)[:2]))
            for s in sessions
        ]
        assert session_strength(base, sessions).tolist() == expected


def test_linear_fusion_stays_on_the_pool_s_cosine_range() -> None:
    from engram_retrieval.ranking import FusionWeights, linear_fusion

    dense = np.array([0.62, 0.40, 0.21, 0.33])
    fused = linear_fusion(
        dense, FusionWeights(), sparse=[None, 3.0, 8.0, 1.0], late=[0.4, 0.8, None, 0.5]
    )
    # the signals disagree about the best: it ranks first without the best cosine
    assert fused.min() >= 0.21 and fused.max() < 0.62
    agreeing = linear_fusion(
        dense, FusionWeights(), sparse=[9.0, 3.0, 0.5, 1.0], late=[0.9, 0.4, None, 0.5]
    )
    assert agreeing.max() == pytest.approx(0.62) and agreeing.min() == pytest.approx(0.21)
    flat = linear_fusion(np.array([0.5, 0.5]), FusionWeights(dense_rank=0.0, dense=0.0))
    np.testing.assert_allclose(flat, [0.5, 0.5])  # nothing to order by: the cosine


def test_a_memory_more_similar_by_any_signal_never_ranks_lower() -> None:
    from engram_retrieval.ranking import FusionWeights, linear_fusion

    for field in FusionWeights.__dataclass_fields__:
        assert getattr(FusionWeights(), field) >= 0.0, field
    # two memories equal in everything but the cosine: the closer one ranks first
    fused = linear_fusion(np.array([0.5, 0.6]), FusionWeights(), sparse=[2.0, 2.0])
    assert fused[1] > fused[0]


def test_the_query_naming_the_speaker_lifts_that_speaker_s_turn() -> None:
    from engram_retrieval.ranking import FusionWeights, linear_fusion

    dense = np.array([0.50, 0.49, 0.30])
    plain = linear_fusion(dense, FusionWeights())
    assert plain[0] > plain[1]
    named = linear_fusion(dense, FusionWeights(), speaker_named=np.array([0.0, 1.0, 0.0]))
    assert named[1] > named[0]


def test_a_turn_beside_a_strong_match_of_its_session_is_lifted() -> None:
    from engram_retrieval.ranking import FusionWeights, linear_fusion

    # c and d are equally similar; d was said the same day as a, the best match
    dense = np.array([0.70, 0.20, 0.45, 0.45])
    sessions = [
        ("conv", "2024-05-01"),
        ("conv", "2024-04-01"),
        ("conv", "2024-03-01"),
        ("conv", "2024-05-01"),
    ]
    fused = linear_fusion(dense, FusionWeights(), sessions=sessions)
    assert fused[3] > fused[2]


def test_a_turn_between_two_matching_turns_outranks_one_beside_a_single_match() -> None:
    from engram_retrieval.ranking import FusionWeights, adjacent_turns, linear_fusion

    # turns 1 and 5 are equally similar: 1 sits between the question (0) and the reply
    # (2) that both match, 5 only after a match (4); a turn of another conversation (9)
    # is no one's neighbour
    keys = [("c", 0), ("c", 1), ("c", 2), ("c", 4), ("c", 5), ("x", 9)]
    dense = np.array([0.60, 0.40, 0.60, 0.60, 0.40, 0.20])
    fused = linear_fusion(dense, FusionWeights(), adjacency=adjacent_turns(keys))
    assert fused[1] > fused[4]
    # and one match beside still lifts a turn over an equal one with none
    alone = linear_fusion(
        np.array([0.60, 0.40, 0.40]),
        FusionWeights(),
        adjacency=adjacent_turns([("c", 0), ("c", 1), ("c", 7)]),
    )
    assert alone[1] > alone[2]


def test_a_turn_two_away_from_a_match_is_lifted_less_than_a_neighbour() -> None:
    from engram_retrieval.ranking import FusionWeights, adjacent_turns, linear_fusion

    # the match is turn 0; turn 2 is two after it, turn 1 right after, turn 9 far away:
    # all three equally similar otherwise
    keys = [("c", 0), ("c", 1), ("c", 2), ("c", 9)]
    dense = np.array([0.60, 0.30, 0.30, 0.30])
    assert adjacent_turns(keys, distance=2)[1].tolist() == [2, -1, -1, -1]
    fused = linear_fusion(
        dense,
        FusionWeights(),
        adjacency=adjacent_turns(keys),
        two_away=adjacent_turns(keys, distance=2),
    )
    assert fused[1] > fused[2] > fused[3]
    # without the signal, two away is as far as any other turn
    flat = linear_fusion(dense, FusionWeights(), adjacency=adjacent_turns(keys))
    assert flat[2] == pytest.approx(flat[3])


def test_mmr_picks_the_same_without_the_candidates_it_cannot_reach() -> None:
    from engram_retrieval.ranking import mmr_reachable, mmr_select

    rng = np.random.default_rng(7)
    for _ in range(200):
        n, k = int(rng.integers(2, 60)), int(rng.integers(1, 30))
        totals = rng.random(n)
        vectors = rng.normal(size=(n, 8))
        lam = float(rng.choice([0.5, 0.7, 0.9, 1.0]))
        full = [i for i, _ in mmr_select(totals, vectors, lam, k)]
        mask = mmr_reachable(totals, lam, k)
        where = np.flatnonzero(mask)
        pruned = [int(where[j]) for j, _ in mmr_select(totals[mask], vectors[mask], lam, k)]
        assert pruned == full
    # a clear gap leaves the far candidates out
    assert mmr_reachable(np.array([0.9, 0.85, 0.2, 0.1]), 0.9, 2).tolist() == [
        True,
        True,
        False,
        False,
    ]


def test_an_order_ranks_the_candidates_that_pass_but_never_decides_which_pass() -> None:
    now = datetime(2025, 6, 1, tzinfo=UTC)
    candidates = [
        Candidate(
            id=f"m{i}",
            scope="conversation",
            dense=0.5,
            sparse=None,
            vector=np.eye(4)[i],
            created_at=now,
            text=f"t{i}",
            payload=None,
        )
        for i in range(4)
    ]
    relevance = np.array([0.9, 0.6, 0.5, 0.2])
    order = np.array([0.5, 0.6, 0.9, 0.95])  # would put m3 first, but m3 is not relevant
    params = RankingParams(top_k=4, score_threshold=0.35, recency_weight=0.0, mmr_lambda=1.0)
    result = rank(candidates, relevance, params, now, complete=False, order=order)
    assert [h.candidate.id for h in result.hits] == ["m2", "m1", "m0"]
    assert [h.relevance for h in result.hits] == [0.5, 0.6, 0.9]
