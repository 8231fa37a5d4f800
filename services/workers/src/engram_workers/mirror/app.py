"""The file-mirror worker: settings, the ``memory.changed`` handler and its wiring.

Consumes ``engram.memory.changed.v1`` (durable consumer ``mirror``) and keeps one
Markdown file per memory under the mirror root, committed to git in batches; the
watcher in the same process publishes human edits as ``engram.memory.edited.v1``.
Run exactly one replica: the tree has a single writer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from pydantic import Field

from engram_core.events import MemoryChanged
from engram_core.worker_catalog import worker_entry
from engram_workers.mirror.core import Mirror
from engram_workers.runtime import (
    Delivery,
    PermanentError,
    Worker,
    WorkerSettings,
    WorkerSpec,
    run_worker,
)

#: Room for a memory file's YAML front matter on top of ENGRAM_MAX_TEXT_BYTES.
MAX_FRONT_MATTER_BYTES = 16 * 1024


class MirrorSettings(WorkerSettings):
    health_port: int = Field(
        default=worker_entry("mirror").health_port,
        ge=0,
        le=65535,
        description="Port of /healthz and /readyz; 0 disables.",
    )
    worker_concurrency: int = Field(
        default=1,
        ge=1,
        le=256,
        description="Messages handled at once. One keeps the changes of a memory in order.",
    )
    mirror_root: Path | None = Field(
        default=None, description="The mirror's git repository (default <data_dir>/mirror)."
    )
    mirror_commit_interval_s: float = Field(
        default=2.0, gt=0, description="Commit pending changes at most this often."
    )
    mirror_watch: bool = Field(
        default=True, description="Watch the tree and publish human edits as memory.edited."
    )
    mirror_watch_polling: bool = Field(
        default=False,
        description="Poll the tree instead of using inotify (network file systems, containers).",
    )
    mirror_watch_debounce_ms: int = Field(
        default=400, ge=1, description="Collect file changes for this long before acting."
    )
    mirror_watch_poll_ms: int = Field(
        default=300, ge=10, description="Polling interval when polling."
    )
    mirror_watch_stall_s: float = Field(
        default=60.0,
        gt=0,
        description="/readyz fails when the hand-edit watcher has not completed a pass for "
        "this long (it passes every few seconds while idle): a stuck watcher shows.",
    )

    @property
    def mirror_path(self) -> Path:
        return self.mirror_root if self.mirror_root is not None else self.data_dir / "mirror"


@asynccontextmanager
async def open_mirror(
    worker: Worker[MemoryChanged, MirrorSettings, Mirror],
) -> AsyncIterator[Mirror]:
    settings = worker.settings
    mirror = Mirror(
        settings.mirror_path,
        commit_interval_s=settings.mirror_commit_interval_s,
        publish=worker.publish,
        ready=lambda: worker.consuming,
        watch=settings.mirror_watch,
        watch_debounce_ms=settings.mirror_watch_debounce_ms,
        watch_polling=settings.mirror_watch_polling,
        watch_poll_ms=settings.mirror_watch_poll_ms,
        # The body plus its front matter: a file larger than a text may be cannot be one.
        max_file_bytes=settings.max_text_bytes + MAX_FRONT_MATTER_BYTES,
        watch_stall_s=settings.mirror_watch_stall_s,
    )
    await mirror.start()
    try:
        yield mirror
    finally:
        await mirror.close()


async def mirror_change(event: MemoryChanged, delivery: Delivery[MirrorSettings, Mirror]) -> None:
    mirror = delivery.resources
    try:
        await mirror.apply(event)
    except ValueError as exc:  # a path that would leave the root: never retried
        raise PermanentError(str(exc)) from exc
    # OSError (disk full, permissions) propagates: retried with backoff, then dead-lettered.


MIRROR = WorkerSpec(
    name="mirror",
    event=MemoryChanged,
    handle=mirror_change,
    uses_retrieval=False,
    resources=open_mirror,
    readiness=Mirror.readiness,
)


def main() -> None:
    run_worker(MIRROR, MirrorSettings)


if __name__ == "__main__":
    main()
