"""The packaged MiniLM bi-encoder (real model, loaded once per session)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from engram_retrieval import embedder as embedder_module
from engram_retrieval.embedder import (
    DYNAMIC_INT8_MODEL_ID,
    MODEL_ID,
    Embedder,
    ModelFilesError,
    default_model_files,
    is_content_token,
    quantize_dynamic_int8,
    quantized_cache_path,
)

TEXTS = [
    "The cat sits on the mat.",
    "Caroline: I went to the LGBTQ support group yesterday and it was so powerful.",
    "User loves climbing at Sintra on weekends",
    "what do you know about my friends?",
    "a much longer sentence, with punctuation and several words, that is padded less",
]

# Each question is about the memory at its own index.
QUESTIONS = [
    "What is my dog's name?",
    "Where do I live?",
    "what food am I allergic to",
    "Which instrument do I play?",
    "When is my sister's birthday?",
    "What car do I drive?",
]
MEMORIES = [
    "My dog is called Biscuit.",
    "I moved to Lisbon last year.",
    "I have a severe peanut allergy.",
    "I have played the cello since I was eight.",
    "My sister Anna was born on March 3rd.",
    "The user drives a blue Toyota Corolla.",
]


@pytest.fixture(scope="module")
def packaged_embedder() -> Embedder:
    """The packaged graph as it is (``ENGRAM_EMBED_QUANTIZATION=none``)."""
    return Embedder.default(threads=1, quantization="none")


def test_model_files_come_from_packages() -> None:
    files = default_model_files()
    assert files.model.name == "model.onnx" and files.model.is_file()
    assert files.tokenizer.name == "tokenizer.json" and files.tokenizer.is_file()
    assert files.model_id == MODEL_ID


def test_vectors_are_unit_norm_384d(embedder: Embedder) -> None:
    vectors = embedder.embed(["hello world", "a somewhat longer sentence about the weather"])
    assert vectors.shape == (2, 384) and vectors.dtype == np.float32
    assert np.linalg.norm(vectors, axis=1) == pytest.approx([1.0, 1.0], abs=1e-5)
    assert embedder.dim == 384 and embedder.model_id == DYNAMIC_INT8_MODEL_ID


def test_the_default_embedder_runs_integer_matrix_products() -> None:
    quantized = quantize_dynamic_int8(default_model_files().model)
    ops = {node.op_type for node in onnx.load_from_string(quantized).graph.node}
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= ops
    # the same packaged model always gives the same quantized model (and so vectors)
    assert quantize_dynamic_int8(default_model_files().model) == quantized


def test_quantized_vectors_stay_close_to_the_packaged_graphs(
    embedder: Embedder, packaged_embedder: Embedder
) -> None:
    assert packaged_embedder.model_id == MODEL_ID  # a store notices the change (reembed)
    quantized, packaged = embedder.embed(TEXTS), packaged_embedder.embed(TEXTS)
    assert np.sum(quantized * packaged, axis=1) == pytest.approx([1.0] * len(TEXTS), abs=0.02)
    # and they rank alike: each question finds the same memory first in both. (Not the
    # nearest of TEXTS to each other: unrelated texts sit 0.2 apart, so their order is a
    # coin toss that the integer kernels of one CPU and another decide differently; on
    # a CPU without VNNI one such pair came out tied.)
    asked, held = embedder.embed(QUESTIONS), embedder.embed(MEMORIES)
    asked_packaged, held_packaged = (
        packaged_embedder.embed(QUESTIONS),
        packaged_embedder.embed(MEMORIES),
    )
    found = np.argmax(asked @ held.T, axis=1)
    np.testing.assert_array_equal(found, np.argmax(asked_packaged @ held_packaged.T, axis=1))
    np.testing.assert_array_equal(found, np.arange(len(QUESTIONS)))


def test_a_text_gets_the_same_vector_alone_or_in_any_batch(embedder: Embedder) -> None:
    # activations are quantized per run: only one text per run keeps this exact
    alone = np.stack([embedder.embed_one(text) for text in TEXTS])
    np.testing.assert_array_equal(embedder.embed(TEXTS), alone)
    np.testing.assert_array_equal(embedder.embed(TEXTS[::-1])[::-1], alone)


def test_paraphrase_is_closer_than_unrelated(embedder: Embedder) -> None:
    anchor, paraphrase, unrelated = embedder.embed(
        [
            "The cat sits on the mat.",
            "A cat is sitting on a rug.",
            "Stock markets fell sharply today.",
        ]
    )
    assert float(anchor @ paraphrase) > float(anchor @ unrelated) + 0.3


def test_batch_equals_single(packaged_embedder: Embedder) -> None:
    embedder = packaged_embedder
    texts = ["short", "a much longer sentence that forces the others to be padded", "medium one"]
    batch = embedder.embed(texts)
    single = np.stack([embedder.embed_one(t) for t in texts])
    np.testing.assert_allclose(batch, single, atol=1e-4)


def test_padding_is_dynamic_and_truncation_applies(embedder: Embedder) -> None:
    tokenizer = embedder._tokenizer
    assert len(tokenizer.encode("hi").ids) == 3  # [CLS] hi [SEP], not padded to 128
    assert len(tokenizer.encode("word " * 1000).ids) == embedder.max_length == 256
    assert embedder.embed([]).shape == (0, 384)


def test_token_vectors_keep_content_tokens_only(embedder: Embedder) -> None:
    tokens = embedder.token_vectors("two words")
    assert tokens.shape == (2, 384)  # [CLS] and [SEP] dropped
    assert tokens.dtype == np.float16
    assert np.linalg.norm(tokens.astype(np.float32), axis=1) == pytest.approx([1.0] * 2, abs=1e-3)
    # punctuation pieces match any text's punctuation in MaxSim: dropped too
    assert embedder.token_vectors("two, words!").shape == (2, 384)
    # a text of nothing but punctuation still gets vectors (what the model attended to)
    assert len(embedder.token_vectors("?!")) > 0


def test_is_content_token() -> None:
    assert is_content_token("pizza") and is_content_token("##za") and is_content_token("2023")
    assert not is_content_token(",") and not is_content_token("##!") and not is_content_token("'")


def test_encode_gives_the_same_sentence_vectors_as_embed(embedder: Embedder) -> None:
    texts = ["a short one", "a much longer sentence, with punctuation and several words"]
    encoded = embedder.encode(texts)
    np.testing.assert_allclose(np.stack([e.dense for e in encoded]), embedder.embed(texts))
    # in input order although batches are sorted by length
    assert [len(e.tokens) for e in encoded] == [3, 11]  # 12 pieces, minus the comma


def test_the_service_loads_the_embedder_its_settings_name(tmp_path: Path) -> None:
    from engram_retrieval.server import load_embedder
    from engram_retrieval.settings import RetrievalSettings

    packaged = load_embedder(RetrievalSettings(data_dir=tmp_path, embed_quantization="none"))
    assert isinstance(packaged, Embedder)
    assert (packaged.model_id, packaged.batch_size) == (MODEL_ID, 32)
    quantized = load_embedder(RetrievalSettings(data_dir=tmp_path))
    assert isinstance(quantized, Embedder)
    assert (quantized.model_id, quantized.batch_size) == (DYNAMIC_INT8_MODEL_ID, 1)
    assert [p.name for p in (tmp_path / "models").iterdir()] == [
        quantized_cache_path(default_model_files().model, tmp_path / "models").name
    ]


def test_quantizing_fails_start_up_with_one_line_and_the_way_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    with pytest.raises(ModelFilesError, match=r"garbage\.onnx"):
        quantize_dynamic_int8(garbage)
    # a run-only install without onnx (the quantizer's dependency)
    monkeypatch.setitem(sys.modules, "onnxruntime.quantization", None)
    with pytest.raises(ModelFilesError, match="ENGRAM_EMBED_QUANTIZATION=none"):
        quantize_dynamic_int8(default_model_files().model)


def test_quantizing_logs_none_of_the_quantizers_per_node_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # it logged 36 "Quantization parameters…"/"Ignore MatMul…" info lines on every start
    with caplog.at_level(logging.DEBUG):
        quantize_dynamic_int8(default_model_files().model)
    assert [r.getMessage() for r in caplog.records if "quantization" in r.pathname] == []


def test_the_quantized_model_is_cached_beside_the_data_and_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, embedder: Embedder
) -> None:
    cache = tmp_path / "models"
    first = Embedder.default(threads=1, quantized_cache=cache)
    (cached,) = cache.iterdir()
    assert cached == quantized_cache_path(default_model_files().model, cache)

    def quantize_again(model: Path) -> bytes:
        raise AssertionError("the cached copy should have been used")

    monkeypatch.setattr(embedder_module, "quantize_dynamic_int8", quantize_again)
    second = Embedder.default(threads=1, quantized_cache=cache)
    assert second.model_id == first.model_id == DYNAMIC_INT8_MODEL_ID
    np.testing.assert_array_equal(second.embed(TEXTS), embedder.embed(TEXTS))


def test_an_unwritable_cache_costs_only_the_next_starts_quantizing(tmp_path: Path) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    assert Embedder.default(threads=1, quantized_cache=blocked / "models").dim == 384


def test_a_first_start_loads_its_new_quantized_copy_from_the_cache_file(tmp_path: Path) -> None:
    """A first start serves from the file it just wrote, as every later start does: a
    session made from the bytes held the model twice (about 70 MB more resident)."""
    model = default_model_files().model
    loaded = embedder_module.cached_quantize_dynamic_int8(model, tmp_path / "models")
    assert loaded == quantized_cache_path(model, tmp_path / "models")
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    # no cache to load from: the bytes themselves
    fallback = embedder_module.cached_quantize_dynamic_int8(model, blocked / "models")
    assert isinstance(fallback, bytes) and fallback == Path(loaded).read_bytes()


def test_a_new_cached_copy_replaces_the_copies_older_versions_made(tmp_path: Path) -> None:
    model = default_model_files().model
    cache = tmp_path / "models"
    cache.mkdir()
    source = quantized_cache_path(model, cache).name.partition("-")[0]
    older = cache / f"{source}-ort1.20.0-dynamic-int8.onnx"
    older.write_bytes(b"an older onnxruntime's copy")
    other_model = cache / "0123456789abcdef-ort1.20.0-dynamic-int8.onnx"
    other_model.write_bytes(b"another model's copy")
    loaded = embedder_module.cached_quantize_dynamic_int8(model, cache)
    assert isinstance(loaded, Path)
    assert sorted(p.name for p in cache.iterdir()) == sorted([loaded.name, other_model.name])
