"""RetrievalSettings: defaults, environment names, fail-fast validation."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engram_core.settings import ConfigError, load_settings
from engram_retrieval.settings import RetrievalSettings
from engram_retrieval.store.edge import (
    DEFAULT_POINT_CACHE,
    DEFAULT_SEARCH_THREADS,
    DEFAULT_VECTOR_CACHE,
)
from engram_retrieval.writes import DEFAULT_PREVIOUS_TURN_WEIGHT


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("ENGRAM_"):
            monkeypatch.delenv(name)


def test_defaults() -> None:
    s = RetrievalSettings()
    assert s.retrieval_listen == "127.0.0.1:50051"
    assert s.qdrant_url is None and s.reranker_path is None
    assert (s.search_top_k, s.search_recency_weight, s.search_score_threshold) == (5, 0.02, 0.35)
    assert (s.search_mmr_lambda, s.recency_half_life_days) == (0.9, 30.0)
    assert (s.search_context_weight, s.search_date_weight) == (0.2, 0.2)
    assert (s.small_store_size, s.candidate_multiplier, s.embed_max_length) == (5, 5, 256)
    assert (s.search_lexical_weight, s.search_late_weight) == (0.5, 0.85)
    assert s.edge_store_path == Path(".engram") / "qdrant" / "engram_memories"
    assert s.search_candidates == "hybrid" and s.search_lexical_weight == 0.5
    assert (s.embed_quantization, s.embed_threads) == ("dynamic-int8", 0)
    # the defaults the store and the writer take when built without settings (tests)
    assert s.edge_vector_cache == DEFAULT_VECTOR_CACHE
    assert s.edge_point_cache == DEFAULT_POINT_CACHE
    assert s.edge_search_threads == DEFAULT_SEARCH_THREADS == 1
    assert s.index_previous_turn_weight == DEFAULT_PREVIOUS_TURN_WEIGHT


@pytest.mark.parametrize("value", ["dynamic-int8", "none", " None "])
def test_embed_quantization(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ENGRAM_EMBED_QUANTIZATION", value)
    assert load_settings(RetrievalSettings).embed_quantization == value.strip().lower()


@pytest.mark.parametrize("value", ["hybrid", "dense", "lexical", " Dense "])
def test_search_candidates(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("ENGRAM_SEARCH_CANDIDATES", value)
    assert load_settings(RetrievalSettings).search_candidates == value.strip().lower()


def test_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"")
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setenv("ENGRAM_RETRIEVAL_LISTEN", "0.0.0.0:6000")
    monkeypatch.setenv("ENGRAM_QDRANT_URL", "http://qdrant:6333")
    monkeypatch.setenv("ENGRAM_QDRANT_API_KEY", "secret")
    monkeypatch.setenv("ENGRAM_RERANKER_PATH", str(tmp_path))
    monkeypatch.setenv("ENGRAM_EMBED_THREADS", "2")
    monkeypatch.setenv("ENGRAM_SEARCH_TOP_K", "8")
    s = RetrievalSettings()
    assert s.retrieval_listen == "0.0.0.0:6000"
    assert s.qdrant_url == "http://qdrant:6333"
    assert s.qdrant_api_key is not None and s.qdrant_api_key.get_secret_value() == "secret"
    assert "secret" not in repr(s)
    assert s.reranker_path == tmp_path and s.embed_threads == 2 and s.search_top_k == 8


def test_blank_optional_values_mean_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_QDRANT_URL", "")
    monkeypatch.setenv("ENGRAM_RERANKER_PATH", "")
    s = RetrievalSettings()
    assert s.qdrant_url is None and s.reranker_path is None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("ENGRAM_SEARCH_RECENCY_WEIGHT", "1.5", "less than or equal to 1"),
        ("ENGRAM_SEARCH_SCORE_THRESHOLD", "-0.1", "greater than or equal to 0"),
        ("ENGRAM_SEARCH_MMR_LAMBDA", "2", "less than or equal to 1"),
        ("ENGRAM_SEARCH_TOP_K", "0", "greater than or equal to 1"),
        ("ENGRAM_RECENCY_HALF_LIFE_DAYS", "0", "greater than 0"),
        ("ENGRAM_RETRIEVAL_LISTEN", "nowhere", "must be host:port"),
        ("ENGRAM_QDRANT_URL", "qdrant:6333", "http(s)://"),
        ("ENGRAM_EMBED_MAX_LENGTH", "4096", "less than or equal to 512"),
        ("ENGRAM_SEARCH_CANDIDATES", "sparse", "'hybrid', 'dense' or 'lexical'"),
        ("ENGRAM_EMBED_QUANTIZATION", "int4", "'dynamic-int8' or 'none'"),
        ("ENGRAM_EDGE_VECTOR_CACHE", "-1", "greater than or equal to 0"),
        ("ENGRAM_EDGE_POINT_CACHE", "-1", "greater than or equal to 0"),
        ("ENGRAM_INDEX_PREVIOUS_TURN_WEIGHT", "-0.5", "greater than or equal to 0"),
    ],
)
def test_bad_values_fail_fast_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, message: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as exc:
        load_settings(RetrievalSettings)
    assert name in str(exc.value) and message in str(exc.value)


def test_reranker_path_must_hold_model_and_tokenizer(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "tokenizer.json").write_text("{}")
    monkeypatch.setenv("ENGRAM_RERANKER_PATH", str(tmp_path))
    with pytest.raises(ConfigError, match=r"ENGRAM_RERANKER_PATH: .*lacks model\.onnx"):
        load_settings(RetrievalSettings)
    monkeypatch.setenv("ENGRAM_RERANKER_PATH", str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="is not a directory"):
        load_settings(RetrievalSettings)


def test_qdrant_path_selects_local_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    assert RetrievalSettings().store_kind == "edge"
    monkeypatch.setenv("ENGRAM_QDRANT_PATH", ":memory:")
    assert load_settings(RetrievalSettings).store_kind == "qdrant-local"
    monkeypatch.setenv("ENGRAM_QDRANT_URL", "http://qdrant:6333")
    with pytest.raises(ConfigError, match=r"ENGRAM_QDRANT_PATH: .*not both"):
        load_settings(RetrievalSettings)
