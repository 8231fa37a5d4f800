"""``engram-workers``: every worker (or the ones ``--only`` names) in one process.

For a single machine (``engram up`` runs the workers this way unless told
``--process-per-worker``): one event loop instead of six interpreters, each holding
its own copy of the same libraries. Each worker is still the :class:`Worker` of its own
``WorkerSpec``, with its own durable consumer, settings, retrieval client and resources,
so delivery, acknowledgement, retries and dead letters are exactly those of a process
per worker. The list comes from the worker catalogue (``engram_core.worker_catalog``).

- Settings: each worker's settings class reads the environment as its own process
  would. ``ENGRAM_HEALTH_PORT`` names a single port and is refused here; each worker
  serves ``/healthz``, ``/readyz`` and ``/metrics`` on its catalogue port, or at
  ``--health-port-base`` plus its offset (``engram up``'s ``ENGRAM_HEALTH_PORT_BASE``),
  so ``engram status`` and ``up``'s readiness checks see every worker where they
  always looked. ``/metrics`` on any of them is the whole process's.
- Logs and traces are the process's, service ``engram-workers`` (each line and consumer
  span names its ``worker``); the chart's one process per worker keeps per-worker
  service names.
- One NATS connection (:class:`~engram_workers.runtime.SharedConnection`, client name
  ``engram-workers``) carries every worker's pull subscription and publishes, instead
  of a connection each.
- A worker that fails to start stops the others: the process exits with status 1, as
  ``engram up`` stops when one of its processes dies. SIGTERM/SIGINT stop every worker
  the way each stops alone (in-flight handlers finish, connections drain).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engram_core import event_loop
from engram_core.logging import get_logger
from engram_core.observability import setup_observability
from engram_core.settings import ConfigError, load_settings
from engram_core.worker_catalog import WORKER_CATALOG, WorkerEntry, worker_names
from engram_workers.runtime import SharedConnection, Worker, WorkerSettings, WorkerSpec

log = get_logger(__name__)

SERVICE_NAME = "engram-workers"


@dataclass(frozen=True)
class Selected:
    """One worker to run here: its spec and its settings, loaded."""

    spec: WorkerSpec[Any, Any, Any]
    settings: WorkerSettings


def parse_only(value: str | None) -> tuple[WorkerEntry, ...]:
    """The catalogue's rows named in ``--only a,b`` (all when None), in catalogue order."""
    if value is None:
        return WORKER_CATALOG
    names = {name.strip() for name in value.split(",") if name.strip()}
    unknown = names - set(worker_names())
    if unknown or not names:
        raise ConfigError(
            f"--only: unknown workers {sorted(unknown)} (known: {', '.join(worker_names())})"
            if unknown
            else "--only names no worker"
        )
    return tuple(entry for entry in WORKER_CATALOG if entry.name in names)


def health_port(entry: WorkerEntry, base: int | None) -> int:
    """Where ``entry`` serves its health endpoint: its catalogue port, or ``base`` plus its
    offset from the first worker's; 0 (a base of 0) serves none."""
    if base is None:
        return entry.health_port
    if base == 0:
        return 0
    return base + entry.health_port - WORKER_CATALOG[0].health_port


def load_workers(entries: Sequence[WorkerEntry], health_port_base: int | None) -> list[Selected]:
    """Each worker's spec and settings (imported from its module, read from the
    environment); a clear ConfigError for a setting that cannot apply to several."""
    if health_port_base is not None and not 0 <= health_port_base <= 65535:
        raise ConfigError("--health-port-base must be a port (0 for none)")
    if os.environ.get("ENGRAM_HEALTH_PORT"):
        raise ConfigError(
            "ENGRAM_HEALTH_PORT names one port, and engram-workers serves one per worker: "
            "unset it (each worker's default applies) or pass --health-port-base"
        )
    selected = []
    for entry in entries:
        module = importlib.import_module(entry.module)
        settings_cls: type[WorkerSettings] = getattr(module, entry.settings)
        settings = load_settings(settings_cls, health_port=health_port(entry, health_port_base))
        selected.append(Selected(getattr(module, entry.spec), settings))
    return selected


def shared_connection(selected: Sequence[Selected], client_name: str) -> SharedConnection:
    """The one NATS connection of the workers run together (the workers' settings read
    one environment: one URL; the longest shutdown grace)."""
    urls = {chosen.settings.nats_url for chosen in selected}
    if len(urls) != 1:
        raise ConfigError(f"the workers of one process name several NATS URLs: {sorted(urls)}")
    return SharedConnection(
        urls.pop(),
        client_name=client_name,
        graceful_timeout=max(chosen.settings.shutdown_grace_s for chosen in selected),
    )


async def serve_together(
    workers: Sequence[Worker[Any, Any, Any]],
    stop: asyncio.Event,
    connection: SharedConnection | None = None,
) -> None:
    """Run every worker until ``stop`` is set or one of them fails; then stop them all,
    drain ``connection`` (theirs, when they share one) and raise the first failure."""
    try:
        await _serve_all(workers, stop)
    finally:
        if connection is not None:
            await connection.close()


async def _serve_all(workers: Sequence[Worker[Any, Any, Any]], stop: asyncio.Event) -> None:
    tasks = [
        asyncio.create_task(worker.serve(stop), name=f"worker-{worker.spec.name}")
        for worker in workers
    ]
    log.info(
        "workers.started_in_one_process",
        workers=[worker.spec.name for worker in workers],
        health_ports={worker.spec.name: worker.settings.health_port for worker in workers},
    )
    await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    stop.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    failures = [result for result in results if isinstance(result, BaseException)]
    if failures:
        raise failures[0]


async def _serve_until_signalled(selected: Sequence[Selected]) -> None:
    stop = event_loop.stop_on_signals()
    # Built inside the running loop, as a Worker must be.
    connection = shared_connection(selected, SERVICE_NAME)
    workers = [Worker(chosen.spec, chosen.settings, connection=connection) for chosen in selected]
    await serve_together(workers, stop, connection)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="engram-workers",
        description="Every Engram worker in one process, each its own durable consumer.",
    )
    parser.add_argument(
        "--only",
        metavar="NAMES",
        help=f"comma-separated workers to run (default: all of {', '.join(worker_names())})",
    )
    parser.add_argument(
        "--health-port-base",
        type=int,
        metavar="PORT",
        help="the first worker's health port, the others after it by their catalogue "
        "offset (default: each worker's own, "
        f"{WORKER_CATALOG[0].health_port}-{WORKER_CATALOG[-1].health_port}; 0: none)",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    try:
        selected = load_workers(parse_only(args.only), args.health_port_base)
    except ConfigError as exc:
        sys.exit(f"engram-workers: {exc}")
    settings = selected[0].settings
    telemetry = setup_observability(SERVICE_NAME, settings)
    try:
        event_loop.run(_serve_until_signalled(selected), settings.event_loop)
    except Exception as exc:
        log.error("workers.failed", error=f"{type(exc).__name__}: {exc}", exc_info=True)
        raise SystemExit(1) from None
    finally:
        telemetry.shutdown()


if __name__ == "__main__":
    main()
