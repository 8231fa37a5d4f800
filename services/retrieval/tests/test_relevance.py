"""Relevance scorers: the cross-encoder path on a tiny ONNX model built here, and the
calibrated similarity fallback on the real embedder."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest

from engram_retrieval.embedder import Embedder
from engram_retrieval.ranking import sigmoid
from engram_retrieval.relevance import (
    CalibratedSimilarityScorer,
    CrossEncoderScorer,
    PoolSignals,
)

if TYPE_CHECKING:  # the fixture's type; conftest is not importable at run time
    from .conftest import TinyReranker


def test_cross_encoder_scores_are_sigmoid_of_pair_logits(tiny_reranker: TinyReranker) -> None:
    scorer = CrossEncoderScorer(tiny_reranker.path, batch_size=2)
    texts = ["dog sat", "the cat sat the mat", "cat"]
    # second segment = text tokens + the final [SEP] (id 3), e.g. dog 6 + sat 7 + 3 = 16
    expected_logits = np.array([16, 4 + 5 + 7 + 4 + 8 + 3, 5 + 3]) * 0.1 - 1.0
    assert expected_logits.tolist() == pytest.approx([tiny_reranker.logit(t) for t in texts])
    logits = scorer.logits("the cat", texts)
    np.testing.assert_allclose(logits, expected_logits, rtol=1e-6)
    scores = scorer.score("the cat", texts, PoolSignals(np.zeros(3)))
    np.testing.assert_allclose(scores, sigmoid(expected_logits), rtol=1e-6)
    assert scorer.score("the cat", [], PoolSignals(np.zeros(0))).shape == (0,)


def test_cross_encoder_ignores_the_query_segment(tiny_reranker: TinyReranker) -> None:
    scorer = CrossEncoderScorer(tiny_reranker.path)
    short = scorer.logits("cat", ["dog"])
    long = scorer.logits("the cat sat on the mat the cat", ["dog"])
    np.testing.assert_allclose(short, long)


def test_calibrated_similarity_constants() -> None:
    scorer = CalibratedSimilarityScorer(fusion="chain")
    assert (scorer.slope, scorer.midpoint) == (14.0, 0.30)
    # sigmoid(14 * (cos - 0.3)): 0.5 at the midpoint, 1/(1+e^0.49) at 0.335, ...
    np.testing.assert_allclose(
        scorer.score("q", ["a", "b", "c"], PoolSignals(np.array([0.30, 0.335, 0.247]))),
        [0.5, 0.620106, 0.322567],
        atol=1e-6,
    )


def test_calibrated_similarity_fuses_bm25_when_given() -> None:
    assert CalibratedSimilarityScorer().lexical_weight == 0.5
    scorer = CalibratedSimilarityScorer(lexical_weight=0.3, fusion="chain")
    # fused similarity [.48, .40, .32] (see test_ranking), then sigmoid(14 * (x - .3))
    scores = scorer.score(
        "q", ["a", "b", "c"], PoolSignals(np.array([0.6, 0.4, 0.2]), [None, 5.0, 10.0])
    )
    np.testing.assert_allclose(scores, sigmoid(14.0 * (np.array([0.48, 0.40, 0.32]) - 0.3)))
    np.testing.assert_allclose(scores, [0.925532, 0.802184, 0.569546], atol=1e-6)
    cosine_only = CalibratedSimilarityScorer(lexical_weight=0.0, fusion="chain")
    np.testing.assert_allclose(
        cosine_only.score(
            "q", ["a", "b", "c"], PoolSignals(np.array([0.6, 0.4, 0.2]), [None, 5.0, 10.0])
        ),
        sigmoid(14.0 * (np.array([0.6, 0.4, 0.2]) - 0.3)),
    )


def test_calibrated_similarity_separates_related_from_unrelated(embedder: Embedder) -> None:
    scorer = CalibratedSimilarityScorer()
    queries = ["What is my dog's name?", "Where do I live?", "what food am I allergic to"]
    answers = [
        "My dog is called Biscuit.",
        "I moved to Lisbon last year.",
        "I have a severe peanut allergy.",
    ]
    q, a = embedder.embed(queries), embedder.embed(answers)
    related = scorer.score("", answers, PoolSignals((q * a).sum(axis=1)))
    unrelated = scorer.score("", answers, PoolSignals((q * np.roll(a, 1, axis=0)).sum(axis=1)))
    # Well above the recall threshold (0.35) and clear of every unrelated pair. Not
    # tighter: "Where do I live?" / "I moved to Lisbon last year." is the weakest pair,
    # a cosine of 0.32-0.34 that the quantized kernels of one CPU and another give
    # differently (0.58-0.62 here).
    assert related.min() > 0.5
    assert unrelated.max() < 0.25
    assert related.min() - unrelated.max() > 0.3


def test_calibrated_similarity_composes_every_signal_in_order() -> None:
    from engram_retrieval.ranking import (
        context_smoothed,
        fused_similarity,
        late_fused_similarity,
        window_boosted,
    )

    dense = np.array([0.6, 0.4, 0.2, 0.3])
    sparse = [None, 5.0, 10.0, None]
    late = [0.5, 0.9, None, 0.7]
    adjacency = (np.array([-1, 0, -1, -1]), np.array([1, -1, -1, -1]))
    in_window = np.array([False, False, True, False])
    scorer = CalibratedSimilarityScorer(
        lexical_weight=0.3, late_weight=0.6, context_weight=0.2, date_weight=0.4, fusion="chain"
    )
    x = fused_similarity(dense, sparse, 0.3)
    x = late_fused_similarity(x, late, 0.6)
    x = context_smoothed(x, *adjacency, 0.2)
    x = window_boosted(x, in_window, 0.4)
    signals = PoolSignals(dense, sparse, late, adjacency, in_window)
    np.testing.assert_allclose(
        scorer.score("q", ["a", "b", "c", "d"], signals), sigmoid(14.0 * (x - 0.3))
    )
    # each signal moved the ranking: without them the order is the cosine's
    plain = scorer.score("q", ["a", "b", "c", "d"], PoolSignals(dense))
    assert np.argsort(-plain).tolist() == [0, 1, 3, 2]
    assert np.argsort(-scorer.score("q", list("abcd"), signals)).tolist() != [0, 1, 3, 2]
    # the defaults are the tuned ones (docs/benchmarks.md)
    default = CalibratedSimilarityScorer()
    assert (default.late_weight, default.context_weight, default.date_weight) == (0.85, 0.2, 0.2)


def test_the_linear_fusion_orders_and_the_calibrated_similarity_decides() -> None:
    from engram_retrieval.ranking import FusionWeights, linear_fusion

    scorer = CalibratedSimilarityScorer()
    assert scorer.fusion == "linear"
    dense = np.array([0.30, 0.335, 0.247])
    signals = PoolSignals(dense)
    # what the threshold decides on: the chain's calibrated similarity, as before
    chain = CalibratedSimilarityScorer(fusion="chain")
    np.testing.assert_allclose(
        scorer.score("q", list("abc"), signals), chain.score("q", list("abc"), signals)
    )
    assert chain.order("q", list("abc"), signals) is None
    order = scorer.order("q", list("abc"), signals)
    assert order is not None
    np.testing.assert_allclose(order, sigmoid(14.0 * (linear_fusion(dense, FusionWeights()) - 0.3)))
    # the best cosine keeps its calibrated value, the worst its own
    np.testing.assert_allclose(order[[1, 2]], [0.620106, 0.322567], atol=1e-6)
    assert np.argsort(-order).tolist() == [1, 0, 2]


def test_the_linear_fusion_leaves_out_a_signal_whose_weight_is_zero() -> None:
    dense = np.array([0.6, 0.5, 0.4])
    late = [0.1, 0.9, 0.2]
    signals = PoolSignals(dense, late=late)
    with_late = CalibratedSimilarityScorer().order("q", list("abc"), signals)
    assert with_late is not None and int(np.argmax(with_late)) == 1  # MaxSim lifts it
    no_late = CalibratedSimilarityScorer(late_weight=0.0).order("q", list("abc"), signals)
    assert no_late is not None and np.argsort(-no_late).tolist() == [0, 1, 2]


def test_an_unknown_fusion_is_refused() -> None:
    with pytest.raises(ValueError, match="fusion"):
        CalibratedSimilarityScorer(fusion="sum")  # type: ignore[arg-type]
