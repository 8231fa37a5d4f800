"""Configuration of the retrieval service (``ENGRAM_*`` variables, validated at start)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator

from engram_core.settings import EngramSettings
from engram_core.urls import without_credentials
from engram_retrieval.ranking import Fusion

RERANKER_FILES = ("model.onnx", "tokenizer.json")
EMBEDDER_FILES = RERANKER_FILES

#: ``dynamic-int8``: the embedder runs a dynamically quantized copy of the packaged
#: model; ``none``: the packaged graph as it is (engram_retrieval.embedder).
EmbedQuantization = Literal["dynamic-int8", "none"]


class RetrievalSettings(EngramSettings):
    """The retrieval service: gRPC listener, vector store, models and ranking defaults."""

    retrieval_listen: str = Field(
        default="127.0.0.1:50051",
        description="host:port the gRPC server binds; port 0 picks a free port.",
    )
    qdrant_url: str | None = Field(
        default=None,
        description="Qdrant server URL. Unset: an embedded on-disk store under <data_dir>/qdrant.",
    )
    qdrant_api_key: SecretStr | None = None
    qdrant_path: str | None = Field(
        default=None,
        description="qdrant-client's local mode instead of the embedded store: a directory, "
        "or ':memory:'. Pure Python and brute force: for tests and comparisons, not for "
        "production. Cannot be combined with qdrant_url.",
    )
    qdrant_collection: str = Field(default="engram_memories", min_length=1, max_length=255)

    reranker_path: Path | None = Field(
        default=None,
        description="Directory with a cross-encoder's model.onnx and tokenizer.json. "
        "Unset: relevance is the calibrated bi-encoder similarity.",
    )
    search_fusion: Fusion = Field(
        default="linear",
        description="Fallback scorer: how the pool's signals are combined. linear: one "
        "weighted sum of every signal (cosine, BM25 and MaxSim with their ranks, "
        "neighbouring turns, the session, a speaker the query names, date windows; "
        "weights tuned on LoCoMo dev, docs/retrieval.md); chain: the earlier ranking "
        "(fused similarity, then MaxSim, neighbours and date windows in turn). A *_WEIGHT "
        "of 0 leaves its signal out of either.",
    )
    search_lexical_weight: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Fallback scorer with hybrid candidates: weight of BM25 against the "
        "cosine in the fused similarity (min-max within the pool); 0: cosine only.",
    )
    search_late_weight: float = Field(
        default=0.85,
        ge=0.0,
        le=1.0,
        description="Fallback scorer: weight of late interaction (MaxSim over the MiniLM "
        "token vectors of the candidates, scored by Qdrant) against the fused similarity; "
        "0: none (nor is the MaxSim query made).",
    )
    search_context_weight: float = Field(
        default=0.2,
        ge=0.0,
        le=1.0,
        description="Fallback scorer: how much a turn is raised by the better of its "
        "neighbouring turns (same conversation, turn_index ± 1) in the candidate pool; "
        "0: not at all.",
    )
    search_date_weight: float = Field(
        default=0.2,
        ge=0.0,
        le=1.0,
        description="Fallback scorer: how much memories said within a date window the "
        "query names ('in May 2023', 'on 3 May, 2023', 'last week') are raised; 0: off. "
        "LoCoMo dev R@10 of the default pipeline: 0 → 75.3, 0.1 → 76.0, 0.2 → 76.5.",
    )
    search_first_person_expansion: bool = Field(
        default=False,
        description="Append a third-person rewrite to first-person queries ('my' → 'the "
        "user's'). Off: it measured no gain (docs/benchmarks.md).",
    )
    search_category_expansion: bool = Field(
        default=True,
        description="To a question about the user, append the common members of a "
        "category it names ('what pets do I have?' → cat, dog, …; 'anything I can't eat?' "
        "→ allergic, vegetarian, …), so a question about a part of one's life recalls the "
        "memories that name its members (docs/retrieval.md, 'Category questions').",
    )
    reranker_max_length: int = Field(default=512, ge=16, le=4096)
    reranker_batch_size: int = Field(default=16, ge=1, le=1024)

    embed_threads: int = Field(
        default=0,
        ge=0,
        le=256,
        description="onnxruntime intra-op threads; 0: automatic (one for the dynamically "
        "quantized embedder, whose runs are too short to split; one per core otherwise, "
        "and for a cross-encoder).",
    )
    embed_quantization: EmbedQuantization = Field(
        default="dynamic-int8",
        description="dynamic-int8: run a dynamically quantized copy of the packaged "
        "embedder (int8 matrix products, about 3x less CPU a text; vectors differ slightly "
        "from the packaged graph's, so a store embedded with the other setting wants "
        "`engram reembed`); none: the packaged graph as it is.",
    )
    embed_batch_size: int = Field(default=32, ge=1, le=1024)
    embed_cache_texts: int = Field(
        default=512,
        ge=0,
        le=100_000,
        description="Vectors of this many recently embedded texts are kept, so a text "
        "embedded again soon (reconcile searches for a fact and then stores it; a retried "
        "Upsert; a repeated question) costs no model run; 0: none.",
    )
    embed_inline_searches: bool = Field(
        default=True,
        description="A search's text is embedded on the event loop when the embedder "
        "runs one text at a time in process (the quantized default): no hop to a thread, "
        "whose way back waits for the GIL behind whatever else the service runs; false: "
        "every model run in a thread. A remote embedder and the packaged graph always "
        "run in a thread.",
    )
    embed_max_length: int = Field(default=256, ge=8, le=512)
    embed_model_path: Path | None = Field(
        default=None,
        description="Directory with a bi-encoder's model.onnx and tokenizer.json (sentence "
        "vector = attention-mask mean of the first output, L2-normalised) instead of the "
        "packaged MiniLM. Unset: the packaged model.",
    )
    embed_url: str | None = Field(
        default=None,
        description="Base URL of an OpenAI-compatible embeddings API (…/v1; POST "
        "<url>/embeddings): sentence vectors come from it, token vectors and BM25 stay "
        "local (docs/retrieval.md, Embedders). Unset: a local ONNX model.",
    )
    embed_model: str = Field(
        default="",
        max_length=200,
        description="The model name sent to ENGRAM_EMBED_URL; required with it.",
    )
    embed_api_key: SecretStr | None = Field(
        default=None, description="Bearer key for ENGRAM_EMBED_URL (unset: none sent)."
    )
    embed_timeout_s: float = Field(
        default=30.0, gt=0.0, le=600.0, description="Timeout of one request to ENGRAM_EMBED_URL."
    )
    embed_retry_s: float = Field(
        default=10.0,
        ge=0.0,
        le=600.0,
        description="How long one embedding call to ENGRAM_EMBED_URL retries a transient "
        "failure (refused connection, timeout, 429, 5xx) before the request fails with "
        "UNAVAILABLE (callers retry that in turn).",
    )

    search_top_k: int = Field(default=5, ge=1, le=100)
    search_recency_weight: float = Field(
        default=0.02,
        ge=0.0,
        le=1.0,
        description="w in total = (1 - w)·relevance + w·recency. Recency can overturn a "
        "relevance gap of at most w / (1 - w): the default 0.02 makes it a tie-breaker "
        "among near-equal relevance (docs/retrieval.md, 'Recency').",
    )
    search_score_threshold: float = Field(default=0.35, ge=0.0, le=1.0)
    search_personal_score_threshold: float = Field(
        default=0.15,
        ge=0.0,
        le=1.0,
        description="Default relevance threshold of a question about the user ('I', "
        "'my', 'we', 'our': 'what pets do I have?'), when the request sets none; other "
        "questions get ENGRAM_SEARCH_SCORE_THRESHOLD. Calibrated on the paraphrase set "
        "(docs/retrieval.md, 'Category questions').",
    )
    search_mmr_lambda: float = Field(
        default=0.9,
        ge=0.0,
        le=1.0,
        description="Default MMR λ (1: no diversity). Tuned on LoCoMo dev: 0.7 → R@10 72.0, "
        "0.9 → 75.4, 1.0 → 75.0 (docs/benchmarks.md).",
    )
    recency_half_life_days: float = Field(
        default=30.0, gt=0.0, description="recency = exp(-age_days / this)."
    )
    small_store_size: int = Field(
        default=5, ge=0, le=100, description="At most this many memories in scope: return all."
    )
    candidate_multiplier: int = Field(
        default=5,
        ge=1,
        le=50,
        description="Candidates fetched per scope and source: top_k * this (late "
        "interaction re-orders a deep pool; docs/benchmarks.md).",
    )
    candidate_pool_max: int = Field(
        default=100,
        ge=1,
        le=5000,
        description="The most candidates fetched per scope and source, never fewer than "
        "top_k: top_k * ENGRAM_CANDIDATE_MULTIPLIER up to this. The gateway's token budget "
        "asks for 25 hits, and a search's cost grows with its pools (docs/retrieval.md, "
        "'Token budget').",
    )
    search_corrected_weight: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        description="Relevance multiplier of a turn whose statement was corrected (a fact it "
        "gave was superseded or deleted): it stops competing with the current fact "
        "(docs/retrieval.md, 'Corrections').",
    )
    search_fact_margin: float = Field(
        default=0.15,
        ge=0.0,
        le=1.0,
        description="A current fact whose relevance is within this of the best hit's is "
        "listed before every turn (what holds now is read before what was said).",
    )
    search_overview_limit: int = Field(
        default=20,
        ge=1,
        le=100,
        description="Facts returned for a question about memory itself ('what do you know "
        "about me?') when the request sets no top_k.",
    )
    retrieval_background_wait_ms: float = Field(
        default=20.0,
        ge=0.0,
        le=10_000.0,
        description="While a call someone waits for is in flight (the gateway marks its "
        "calls interactive), the workers' calls wait at most this long before they start; "
        "0: calls are served in arrival order (docs/retrieval.md, 'Chats first').",
    )
    search_other_scopes_pool: Literal["remainder", "full"] = Field(
        default="remainder",
        description="How many candidates per source the wider scopes (the user's other "
        "conversations, the tenant-wide bucket) are searched for beside the conversation: "
        "remainder = what the conversation's own pool leaves of the pool size, never fewer "
        "than top_k (a new conversation's search gets the whole pool from the others); "
        "full = a whole pool each, as before 2026-11-29 (docs/retrieval.md, 'One pool, the "
        "conversation first').",
    )
    search_candidates: Literal["hybrid", "dense", "lexical"] = Field(
        default="hybrid",
        description="Candidate sources per scope: hybrid (dense + BM25), dense only, or "
        "lexical only (BM25; relevance is then the BM25 score relative to the best "
        "candidate — an ablation for benchmarks, not a production setting).",
    )

    edge_optimize: bool = Field(
        default=True,
        description="Embedded store: build HNSW indexes in the background (a child process "
        "over a copy of the shard, then a switch to it) once edge_index_threshold points "
        "were written.",
    )
    edge_index_threshold: int = Field(
        default=20_000,
        ge=100,
        le=10_000_000,
        description="Embedded store: points a segment holds before it gets an HNSW index; "
        "smaller segments are searched exactly through the payload indexes.",
    )
    index_previous_turn_weight: float = Field(
        default=1.0,
        ge=0.0,
        le=10.0,
        description="Weight of the previous turn's words in a turn's BM25 document (an "
        "answer is found by the words of the question it answers); 0: a turn's own words "
        "only. Applies to turns written from then on (`engram rebuild` re-indexes all).",
    )
    edge_vector_cache: int = Field(
        default=8192,
        ge=0,
        le=1_000_000,
        description="Embedded store: dense vectors of ranked memories kept converted for MMR "
        "(most recently used; float32, 1.5 KB each at 384-d, so 12 MB at the default); a "
        "memory ranked again is not converted out of the store again. 0: none.",
    )
    edge_point_cache: int = Field(
        default=4096,
        ge=0,
        le=1_000_000,
        description="Embedded store: the memories a search read back (payload and vector), "
        "most recently used, about 3 KB each beside the vector: a memory searched again "
        "is not read out of the store again. A write or delete of a memory drops its entry. "
        "0: none.",
    )

    edge_search_threads: int = Field(
        default=1,
        ge=0,
        le=256,
        description="Embedded store: threads the engine searches a query's segments on. 1: "
        "on the calling thread, no hand-off (a chat's Search makes five store queries of "
        "a few hundred microseconds; handing each to a pool cost more CPU than it saved "
        "time on two cores: docs/retrieval.md). 0: the engine's own choice, one per core, "
        "for large stores on machines with cores to spare.",
    )

    shutdown_grace_s: float = Field(default=5.0, ge=0.0, le=300.0)

    @field_validator(
        "qdrant_url",
        "qdrant_api_key",
        "qdrant_path",
        "reranker_path",
        "embed_model_path",
        "embed_url",
        "embed_api_key",
        mode="before",
    )
    @classmethod
    def _blank_is_unset(cls, value: object) -> object:
        return None if isinstance(value, str) and value.strip() == "" else value

    @field_validator(
        "search_candidates",
        "search_other_scopes_pool",
        "search_fusion",
        "embed_quantization",
        mode="before",
    )
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("retrieval_listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValueError(f"must be host:port (got {value!r})")
        return value

    @field_validator("qdrant_url")
    @classmethod
    def _qdrant_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http(s):// URL (got {without_credentials(value)!r})")
        return value

    @field_validator("qdrant_path")
    @classmethod
    def _one_store(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("qdrant_url"):
            raise ValueError("set ENGRAM_QDRANT_URL or ENGRAM_QDRANT_PATH, not both")
        return value

    @field_validator("reranker_path")
    @classmethod
    def _reranker_files(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        if not value.is_dir():
            raise ValueError(f"{value} is not a directory")
        missing = [name for name in RERANKER_FILES if not (value / name).is_file()]
        if missing:
            raise ValueError(f"{value} lacks {', '.join(missing)}")
        return value

    @field_validator("embed_url")
    @classmethod
    def _embed_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"must be an http(s):// URL (got {without_credentials(value)!r})")
        return value.rstrip("/")

    @field_validator("embed_model_path")
    @classmethod
    def _embed_model_files(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        if not value.is_dir():
            raise ValueError(f"{value} is not a directory")
        missing = [name for name in EMBEDDER_FILES if not (value / name).is_file()]
        if missing:
            raise ValueError(f"{value} lacks {', '.join(missing)}")
        return value

    @model_validator(mode="after")
    def _one_embedder(self) -> RetrievalSettings:
        if self.embed_url and self.embed_model_path:
            raise ValueError("set ENGRAM_EMBED_URL or ENGRAM_EMBED_MODEL_PATH, not both")
        if self.embed_url and not self.embed_model.strip():
            raise ValueError("ENGRAM_EMBED_URL needs ENGRAM_EMBED_MODEL (the model to ask for)")
        return self

    @property
    def store_kind(self) -> str:
        """``qdrant`` (server), ``qdrant-local`` (qdrant-client local mode) or ``edge``."""
        if self.qdrant_url:
            return "qdrant"
        return "qdrant-local" if self.qdrant_path else "edge"

    @property
    def edge_store_path(self) -> Path:
        """The embedded store's shard: ``<data_dir>/qdrant/<collection>``."""
        return self.data_dir / "qdrant" / self.qdrant_collection
