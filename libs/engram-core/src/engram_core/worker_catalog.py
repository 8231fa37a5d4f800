"""The one list of Engram's workers: name, entry point, health port and image.

Everything else that names the workers is generated from or checked against this list
(``make workers-check``, ``scripts/check_workers.py``): the console scripts in
``services/workers/pyproject.toml``, each worker settings class's default health port,
``engram up``'s workers and health ports, the Dockerfile's targets, the chart's
``values.yaml`` defaults and ``values.schema.json``. Adding a worker is its module and
one row here; docs/architecture.md ("Adding a worker") lists the rest.

Pure data on purpose: client commands (``engram status``) read it and must not import
the workers, FastStream or NATS to do so.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WORKER_CATALOG", "WorkerEntry", "worker_entry", "worker_names"]


@dataclass(frozen=True)
class WorkerEntry:
    """One worker as deployment sees it (what it does is its ``WorkerSpec``)."""

    #: Its durable consumer, dead-letter subject ``engram.dlq.<name>`` and process name.
    name: str
    #: The module holding its ``WorkerSpec`` (``spec``), settings class and ``main``.
    module: str
    spec: str
    settings: str
    #: The default port of ``/healthz``, ``/readyz`` and ``/metrics``
    #: (``ENGRAM_HEALTH_PORT``); ``engram up`` places it at ``health_port_base`` plus its
    #: offset from the first worker's.
    health_port: int
    #: The Dockerfile target and Helm component whose pod runs it. A worker whose image
    #: is another's runs as a second container in that pod (``components.<image>.<name>``).
    image: str

    @property
    def script(self) -> str:
        """Its console script: ``engram-<name>``."""
        return f"engram-{self.name}"

    @property
    def entry_point(self) -> str:
        return f"{self.module}:main"

    @property
    def sidecar(self) -> bool:
        """Runs as a second container in the pod of the first worker with its image."""
        first = next(entry for entry in WORKER_CATALOG if entry.image == self.image)
        return first is not self


#: Every worker, in start order; health ports run on from the first one's.
WORKER_CATALOG: tuple[WorkerEntry, ...] = (
    WorkerEntry("ingest", "engram_workers.ingest", "INGEST", "IngestSettings", 8201, "ingest"),
    WorkerEntry(
        "reconcile", "engram_workers.reconcile", "RECONCILE", "ReconcileSettings", 8202, "reconcile"
    ),
    WorkerEntry(
        "summarize", "engram_workers.summarize", "SUMMARIZE", "SummarizeSettings", 8203, "summarize"
    ),
    WorkerEntry("evict", "engram_workers.evict", "EVICT", "EvictSettings", 8204, "evict"),
    WorkerEntry("mirror", "engram_workers.mirror", "MIRROR", "MirrorSettings", 8205, "file-mirror"),
    WorkerEntry("edits", "engram_workers.edits", "EDITS", "EditsSettings", 8206, "file-mirror"),
)


def worker_names() -> tuple[str, ...]:
    return tuple(entry.name for entry in WORKER_CATALOG)


def worker_entry(name: str) -> WorkerEntry:
    """The catalogue's row for ``name``; a KeyError naming the known workers otherwise."""
    for entry in WORKER_CATALOG:
        if entry.name == name:
            return entry
    raise KeyError(f"no worker {name!r} (known: {', '.join(worker_names())})")
