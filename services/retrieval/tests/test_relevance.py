"""Relevance scorers: the cross-encoder path on a tiny ONNX model built here, and the
calibrated similarity fallback on the real embedder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from engram_retrieval.embedder import Embedder
from engram_retrieval.ranking import sigmoid
from engram_retrieval.relevance import CalibratedSimilarityScorer, CrossEncoderScorer

VOCAB = {
    "[PAD]": 0,
    "[UNK]": 1,
    "[CLS]": 2,
    "[SEP]": 3,
    "the": 4,
    "cat": 5,
    "dog": 6,
    "sat": 7,
    "mat": 8,
}
SCALE, BIAS = 0.1, -1.0


def build_tiny_cross_encoder(directory: Path) -> Path:
    """logits[b, 0] = SCALE * sum_s(input_ids * attention_mask * token_type_ids) + BIAS.

    Only the second segment (token type 1) counts, so the scores prove that pairs are
    encoded as pairs with token_type_ids and that padding is masked.
    """
    directory.mkdir(parents=True, exist_ok=True)
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "seq"])
        for name in ("input_ids", "attention_mask", "token_type_ids")
    ]
    output = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1])
    nodes = [
        helper.make_node("Mul", ["input_ids", "attention_mask"], ["masked"]),
        helper.make_node("Mul", ["masked", "token_type_ids"], ["second"]),
        helper.make_node("Cast", ["second"], ["second_f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["second_f", "axes"], ["summed"], keepdims=1),
        helper.make_node("Mul", ["summed", "scale"], ["scaled"]),
        helper.make_node("Add", ["scaled", "bias"], ["logits"]),
    ]
    initializers = [
        helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
        helper.make_tensor("scale", TensorProto.FLOAT, [], [SCALE]),
        helper.make_tensor("bias", TensorProto.FLOAT, [], [BIAS]),
    ]
    graph = helper.make_graph(nodes, "tiny_cross_encoder", inputs, [output], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, directory / "model.onnx")

    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    tokenizer.save(str(directory / "tokenizer.json"))
    return directory


@pytest.fixture
def tiny_reranker(tmp_path: Path) -> Path:
    return build_tiny_cross_encoder(tmp_path / "reranker")


def test_cross_encoder_scores_are_sigmoid_of_pair_logits(tiny_reranker: Path) -> None:
    scorer = CrossEncoderScorer(tiny_reranker, batch_size=2)
    texts = ["dog sat", "the cat sat the mat", "cat"]
    # second segment = text tokens + the final [SEP] (id 3), e.g. dog 6 + sat 7 + 3 = 16
    expected_logits = np.array([16, 4 + 5 + 7 + 4 + 8 + 3, 5 + 3]) * SCALE + BIAS
    logits = scorer.logits("the cat", texts)
    np.testing.assert_allclose(logits, expected_logits, rtol=1e-6)
    scores = scorer.score("the cat", texts, np.zeros(3))
    np.testing.assert_allclose(scores, sigmoid(expected_logits), rtol=1e-6)
    assert scorer.score("the cat", [], np.zeros(0)).shape == (0,)


def test_cross_encoder_ignores_the_query_segment(tiny_reranker: Path) -> None:
    scorer = CrossEncoderScorer(tiny_reranker)
    short = scorer.logits("cat", ["dog"])
    long = scorer.logits("the cat sat on the mat the cat", ["dog"])
    np.testing.assert_allclose(short, long)


def test_calibrated_similarity_constants() -> None:
    scorer = CalibratedSimilarityScorer()
    assert (scorer.slope, scorer.midpoint) == (14.0, 0.30)
    # sigmoid(14 * (cos - 0.3)): 0.5 at the midpoint, 1/(1+e^0.49) at 0.335, ...
    np.testing.assert_allclose(
        scorer.score("q", ["a", "b", "c"], np.array([0.30, 0.335, 0.247])),
        [0.5, 0.620106, 0.322567],
        atol=1e-6,
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
    related = scorer.score("", answers, (q * a).sum(axis=1))
    unrelated = scorer.score("", answers, (q * np.roll(a, 1, axis=0)).sum(axis=1))
    assert related.min() > 0.6
    assert unrelated.max() < 0.25
