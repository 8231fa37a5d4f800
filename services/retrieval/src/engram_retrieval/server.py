"""Process wiring: models and store opened at start-up, gRPC server, health, shutdown."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from opentelemetry import trace

from engram_core import event_loop
from engram_core.codec import pb_grpc
from engram_core.logging import get_logger
from engram_core.observability import setup_observability
from engram_core.retrieval_client import SERVICE_NAME, server_keepalive_options
from engram_retrieval.embedder import (
    Embedder,
    SentenceEncoder,
    default_model_files,
    model_files_at,
    return_freed_memory,
)
from engram_retrieval.encode_queue import EncodeQueue
from engram_retrieval.pipeline import SearchPipeline
from engram_retrieval.ranking import RankingParams
from engram_retrieval.relevance import (
    CalibratedSimilarityScorer,
    CrossEncoderScorer,
    RelevanceScorer,
)
from engram_retrieval.remote_embedder import RemoteEmbedder
from engram_retrieval.service import MemoryServicer
from engram_retrieval.settings import RetrievalSettings
from engram_retrieval.store import MemoryStore, open_store

log = get_logger(__name__)

_MAX_MESSAGE = 64 * 1024 * 1024


class StartupError(RuntimeError):
    """The service cannot start (address in use...)."""


def load_embedder(settings: RetrievalSettings) -> SentenceEncoder:
    """The embedder the settings name: the packaged MiniLM, a bi-encoder from
    ENGRAM_EMBED_MODEL_PATH, or ENGRAM_EMBED_URL's model (with local token vectors)."""
    files = (
        model_files_at(settings.embed_model_path)
        if settings.embed_model_path
        else default_model_files()
    )
    local = Embedder(
        files,
        max_length=settings.embed_max_length,
        batch_size=settings.embed_batch_size,
        threads=settings.embed_threads,
        quantization=settings.embed_quantization,
        quantized_cache=settings.data_dir / "models",
    )
    if settings.embed_url is None:
        return local
    api_key = settings.embed_api_key.get_secret_value() if settings.embed_api_key else None
    return RemoteEmbedder(
        settings.embed_url,
        settings.embed_model,
        api_key=api_key,
        timeout_s=settings.embed_timeout_s,
        retry_s=settings.embed_retry_s,
        batch_size=settings.embed_batch_size,
        token_model=local,
    )


def load_scorer(settings: RetrievalSettings) -> RelevanceScorer:
    if settings.reranker_path is None:
        return CalibratedSimilarityScorer(
            lexical_weight=settings.search_lexical_weight,
            late_weight=settings.search_late_weight,
            context_weight=settings.search_context_weight,
            date_weight=settings.search_date_weight,
            fusion=settings.search_fusion,
        )
    return CrossEncoderScorer(
        settings.reranker_path,
        max_length=settings.reranker_max_length,
        batch_size=settings.reranker_batch_size,
        threads=settings.embed_threads,
    )


def ranking_defaults(settings: RetrievalSettings) -> RankingParams:
    return RankingParams(
        top_k=settings.search_top_k,
        recency_weight=settings.search_recency_weight,
        score_threshold=settings.search_score_threshold,
        mmr_lambda=settings.search_mmr_lambda,
        half_life_days=settings.recency_half_life_days,
        small_store_size=settings.small_store_size,
        candidate_multiplier=settings.candidate_multiplier,
        max_pool=settings.candidate_pool_max,
        corrected_weight=settings.search_corrected_weight,
        fact_margin=settings.search_fact_margin,
    )


@dataclass
class RunningServer:
    """A started server; ``address`` is host:port with the port actually bound."""

    server: grpc.aio.Server
    port: int
    address: str
    store: MemoryStore
    health: health.aio.HealthServicer
    servicer: MemoryServicer
    grace_s: float
    #: Memories the start-up check found embedded by another model than the running one.
    other_model_memories: int

    async def stop(self, grace_s: float | None = None) -> None:
        """Report NOT_SERVING, drain in-flight calls for ``grace_s``, close the store."""
        await self.health.enter_graceful_shutdown()
        grace = self.grace_s if grace_s is None else grace_s
        stopping = asyncio.ensure_future(self.server.stop(grace))
        await asyncio.sleep(0)  # new calls are refused from here
        # An open search stream is a call in flight until it ends: it would hold the
        # stop for the whole grace.
        self.servicer.end_search_streams()
        await stopping
        await self.store.close()


async def warn_of_other_models(store: MemoryStore, model_id: str) -> int:
    """Log a warning when memories in the store were embedded by another model than the
    one running (a model or quantization change, docs/retrieval.md): their vectors stay
    searchable but are not what a search compares against, so recall drifts until
    ``engram reembed`` rewrites them. Returns how many there are."""
    try:
        others = await store.count_embedded_by_others(model_id)
    except Exception as exc:  # a check, not a dependency: serving goes on
        log.warning("store.model_check_failed", error=f"{type(exc).__name__}: {exc}")
        return 0
    if others:
        log.warning(
            "store.other_embedding_models",
            memories=others,
            embedding_model=model_id,
            detail="these memories were embedded by another model; run `engram reembed` "
            "to re-embed them (docs/retrieval.md, Models)",
        )
    return others


async def build_server(
    settings: RetrievalSettings,
    *,
    embedder: SentenceEncoder | None = None,
    scorer: RelevanceScorer | None = None,
    tracer: trace.Tracer | None = None,
    clock: Callable[[], datetime] | None = None,
) -> RunningServer:
    """Load models, open the store, start serving on ``settings.retrieval_listen``.

    Port 0 binds a free port (see ``RunningServer.port``). ``embedder``/``scorer`` may
    be passed in to share already-loaded models (tests).
    """
    if embedder is None:
        embedder = await asyncio.to_thread(load_embedder, settings)
    if scorer is None:
        scorer = await asyncio.to_thread(load_scorer, settings)
    return_freed_memory()
    store = await open_store(settings, embedder.dim)
    try:
        # Before the server starts: the scan holds the store (0.2 s at 100k memories),
        # so no request waits on it.
        other_models = await warn_of_other_models(store, embedder.model_id)
        health_servicer = health.aio.HealthServicer()
        for name in (SERVICE_NAME, health.OVERALL_HEALTH):
            await health_servicer.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        pipeline = SearchPipeline(
            store,
            embedder,
            scorer,
            ranking_defaults(settings),
            candidates=settings.search_candidates,
            first_person_expansion=settings.search_first_person_expansion,
            category_expansion=settings.search_category_expansion,
            personal_score_threshold=settings.search_personal_score_threshold,
            overview_limit=settings.search_overview_limit,
            other_scopes_pool=settings.search_other_scopes_pool,
            tracer=tracer,
            clock=clock,
            encoder=EncodeQueue(
                embedder,
                cache_texts=settings.embed_cache_texts,
                inline_searches=settings.embed_inline_searches,
            ),
        )
        servicer = MemoryServicer(
            store,
            embedder,
            pipeline,
            previous_turn_weight=settings.index_previous_turn_weight,
            background_wait_s=settings.retrieval_background_wait_ms / 1e3,
        )
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", _MAX_MESSAGE),
                ("grpc.max_send_message_length", _MAX_MESSAGE),
                *server_keepalive_options(settings.grpc_keepalive_s),
            ]
        )
        pb_grpc.add_MemoryServiceServicer_to_server(servicer, server)
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        try:
            port = server.add_insecure_port(settings.retrieval_listen)
        except RuntimeError as exc:  # grpc reports a failed bind this way
            raise StartupError(f"cannot listen on {settings.retrieval_listen}: {exc}") from exc
        if port == 0:
            raise StartupError(f"cannot listen on {settings.retrieval_listen}")
        await server.start()
    except BaseException:
        await store.close()
        raise
    for name in (SERVICE_NAME, health.OVERALL_HEALTH):
        await health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    host = settings.retrieval_listen.rpartition(":")[0]
    return RunningServer(
        server=server,
        port=port,
        address=f"{host}:{port}",
        store=store,
        health=health_servicer,
        servicer=servicer,
        grace_s=settings.shutdown_grace_s,
        other_model_memories=other_models,
    )


async def serve(settings: RetrievalSettings) -> None:
    """Run the retrieval service until SIGTERM/SIGINT, then shut down gracefully."""
    telemetry = setup_observability("engram-retrieval", settings)
    try:
        running = await build_server(settings)
        log.info(
            "retrieval.listening",
            address=running.address,
            store=settings.store_kind,
            scorer=running.servicer.pipeline.scorer.name,
            embedding_model=running.servicer.embedder.model_id,
            event_loop=event_loop.running_loop_name(),
        )
        stop = event_loop.stop_on_signals()
        await stop.wait()
        log.info("retrieval.stopping", grace_s=settings.shutdown_grace_s)
        await running.stop()
        running.servicer.embedder.close()
        log.info("retrieval.stopped")
    finally:
        telemetry.shutdown()
