"""``python -m engram_cli.stack.node``: retrieval and every worker in one process, the
lightest layout of ``engram up`` (``--light``).

Retrieval is built and served exactly as ``engram-retrieval`` serves it (the same
settings, models, store and gRPC server, which the gateway and the CLI call); the
workers are those of ``engram-workers`` (each its own durable consumer, health port
and settings), except that their memory port calls retrieval's servicer in this process
(:class:`~engram_core.retrieval_client.InProcessRetrievalClient`) instead of over a
channel: the same requests, replies, statuses and spans, without serialising or the
gRPC machinery at either end. What that saves and costs is measured in
docs/benchmarks.md (footprint, overhead).

SIGTERM/SIGINT stop the workers first (in-flight handlers finish) and then retrieval,
so no worker is left calling a closed store. A worker that fails stops the process
(exit 1), as a dead process stops ``engram up``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from engram_core import event_loop
from engram_core.logging import get_logger
from engram_core.memory_port import MemoryPort
from engram_core.observability import setup_observability
from engram_core.retrieval_client import InProcessRetrievalClient
from engram_core.settings import ConfigError, load_settings
from engram_retrieval.embedder import ModelFilesError
from engram_retrieval.remote_embedder import EmbedderRequestError, EmbedderUnavailable
from engram_retrieval.server import StartupError, build_server
from engram_retrieval.settings import RetrievalSettings
from engram_retrieval.store import StoreError
from engram_workers.all_in_one import (
    Selected,
    load_workers,
    parse_only,
    serve_together,
    shared_connection,
)
from engram_workers.runtime import Worker, WorkerSettings

log = get_logger(__name__)

SERVICE_NAME = "engram-node"
_START_FAILURES = (
    ModelFilesError,
    EmbedderRequestError,
    EmbedderUnavailable,
    StartupError,
    StoreError,
)


async def serve_node(retrieval: RetrievalSettings, workers: Sequence[Selected]) -> None:
    running = await build_server(retrieval)
    client = InProcessRetrievalClient(running.servicer)

    @asynccontextmanager
    async def in_process(_: WorkerSettings) -> AsyncIterator[MemoryPort]:
        yield MemoryPort(client)

    log.info(
        "node.serving",
        address=running.address,
        workers=[chosen.spec.name for chosen in workers],
        embedding_model=running.servicer.embedder.model_id,
        event_loop=event_loop.running_loop_name(),
    )
    stop = event_loop.stop_on_signals()
    connection = shared_connection(workers, SERVICE_NAME)
    try:
        await serve_together(
            [
                Worker(chosen.spec, chosen.settings, memory_port=in_process, connection=connection)
                for chosen in workers
            ],
            stop,
            connection,
        )
    finally:
        log.info("node.stopping", grace_s=retrieval.shutdown_grace_s)
        await running.stop()
        running.servicer.embedder.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="engram-node",
        description="Retrieval and every Engram worker in one process (engram up --light).",
    )
    parser.add_argument("--only", metavar="NAMES", help="comma-separated workers to run")
    parser.add_argument(
        "--health-port-base", type=int, metavar="PORT", help="the first worker's health port"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        retrieval = load_settings(RetrievalSettings)
        workers = load_workers(parse_only(args.only), args.health_port_base)
    except ConfigError as exc:
        sys.exit(f"engram-node: {exc}")
    telemetry = setup_observability(SERVICE_NAME, retrieval)
    try:
        event_loop.run(serve_node(retrieval, workers), retrieval.event_loop)
    except _START_FAILURES as exc:
        log.error("node.start_failed", error=str(exc))
        raise SystemExit(1) from None
    except Exception as exc:
        log.error("node.failed", error=f"{type(exc).__name__}: {exc}", exc_info=True)
        raise SystemExit(1) from None
    finally:
        telemetry.shutdown()


if __name__ == "__main__":
    main()
