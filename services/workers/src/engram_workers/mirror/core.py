"""The mirror itself: memory changes → files, files → batched git commits, plus the watcher.

One process writes the tree (single writer): the event handler and the watcher share
one lock, git runs as a subprocess off the event loop, and a message is acknowledged
once its file is written; the commit follows within ``commit_interval_s``. Nothing is
written through a symlink (:mod:`engram_workers.mirror.no_follow`): a change whose
folder is a symlink is reported and refused (dead-lettered), never written outside
the root.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable
from contextlib import suppress
from datetime import datetime
from pathlib import Path

from engram_core.events import Event, MemoryChanged
from engram_core.logging import get_logger
from engram_core.mirror_format import (
    Tombstone,
    classify,
    content_sha256,
    live_path,
    render,
    tombstone_path,
)
from engram_core.settings import DEFAULT_MAX_TEXT_BYTES
from engram_workers.mirror.git import GitError, GitRepo
from engram_workers.mirror.migration import migrate_layout
from engram_workers.mirror.no_follow import UnsafePath, is_regular
from engram_workers.mirror.telemetry import count_skipped
from engram_workers.mirror.tree import Batch, MirrorTree, PendingChanges
from engram_workers.mirror.watcher import EditWatcher

log = get_logger(__name__)

JOURNAL_NAME = "engram-mirror-journal.jsonl"
#: Lines listing the changed files in a commit message body, at most.
MAX_MESSAGE_LINES = 200
_OP_ORDER = (
    "created",
    "updated",
    "superseded",
    "deleted",
    "evicted",
    "hand-created",
    "hand-edited",
    "hand-moved",
    "hand-deleted",
)


class Mirror:
    def __init__(
        self,
        root: Path,
        *,
        commit_interval_s: float = 2.0,
        publish: Callable[[Event], Awaitable[object]] | None = None,
        ready: Callable[[], bool] = lambda: True,
        watch: bool = True,
        watch_debounce_ms: int = 400,
        watch_polling: bool = False,
        watch_poll_ms: int = 300,
        max_file_bytes: int = DEFAULT_MAX_TEXT_BYTES,
        watch_stall_s: float = 60.0,
    ) -> None:
        self.root = root
        self.watch_stall_s = watch_stall_s
        self.commit_interval_s = commit_interval_s
        self.tree = MirrorTree(root)
        self.git = GitRepo(root)
        self.pending = PendingChanges(root / ".git" / JOURNAL_NAME)
        self._ready = ready
        self.watcher = (
            EditWatcher(
                self.tree,
                self.git,
                self.pending,
                publish,
                debounce_ms=watch_debounce_ms,
                force_polling=watch_polling,
                poll_delay_ms=watch_poll_ms,
                max_file_bytes=max_file_bytes,
            )
            if watch and publish is not None
            else None
        )
        self._applied_at: dict[str, datetime] = {}
        self._closing = asyncio.Event()
        self._commit_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        # Resolved once: a relative root must not follow later changes of directory.
        self.root = self.tree.root = self.git.root = self.root.resolve()
        await self.git.ensure()
        self.pending.journal_path = self.root / ".git" / JOURNAL_NAME
        journal = self.pending.load_journal()
        dirty = await self.git.dirty_paths()
        moved = await migrate_layout(self.root, self.git, self.pending)
        journal, dirty = _follow_moves(journal, dirty, moved)
        files = await asyncio.to_thread(self.tree.scan)
        backlog = await asyncio.to_thread(self._recover, journal, dirty)
        self._tasks.append(asyncio.create_task(self._commit_loop(), name="mirror-commits"))
        if self.watcher is not None:
            self._tasks.append(
                asyncio.create_task(self.watcher.run(backlog, self._ready), name="mirror-watch")
            )
        log.info(
            "mirror.started",
            root=str(self.root),
            files=files,
            uncommitted_own=len(self.pending.batch.paths),
            edits_while_down=len(backlog),
            watching=self.watcher is not None,
        )

    def _recover(self, journal: dict[str, str | None], dirty: list[str]) -> list[str]:
        """Sort files that differ from HEAD: the mirror's own uncommitted writes (in the
        journal) are committed next; any other memory file is a human change to publish."""
        backlog = []
        for rel in dirty:
            try:
                sha: str | None = content_sha256((self.root / rel).read_bytes())
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                sha = None
            if rel in journal and journal[rel] == sha:
                self.pending.stage_only(rel, sha)
                self.tree.known[rel] = sha
                continue
            info = classify(rel)
            if info is not None and not info.deleted:
                backlog.append(rel)
        # The journal is rewritten with exactly what is still pending.
        self.pending.committed()
        return backlog

    def readiness(self) -> dict[str, bool]:
        """``watcher``: the hand-edit watcher completed a pass within ``watch_stall_s``
        (absent when not watching)."""
        if self.watcher is None:
            return {}
        return {"watcher": self.watcher.heartbeat.age_s() < self.watch_stall_s}

    async def close(self) -> None:
        """Stop watching, then commit what is left (the last batch is never lost)."""
        self._closing.set()
        if self.watcher is not None:
            self.watcher.stop()
        for task in self._tasks:
            with suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await self.commit_now()
        self.pending.close()

    # -- memory changes → files --------------------------------------------------------

    async def apply(self, event: MemoryChanged) -> str | None:
        """Write (or move) the file of one changed memory; its relative path, or None
        when the event is older than what the mirror already applied for that memory."""
        try:
            return await self._apply(event)
        except UnsafePath as exc:
            self._report_unsafe(exc, event.memory.id)
            raise

    def _report_unsafe(self, exc: UnsafePath, memory_id: str) -> None:
        log.error(
            "mirror.unsafe_path",
            path=exc.rel,
            component=exc.component,
            reason=exc.reason,
            memory_id=memory_id,
            hint="not written or removed (never through a symlink); replace it with a "
            "regular folder, then replay the dead letter (engram dlq replay)",
        )
        count_skipped(exc.reason, "writer")

    async def _apply(self, event: MemoryChanged) -> str | None:
        record, tenant = event.memory, event.tenant
        async with self.tree.lock:
            last = self._applied_at.get(record.id)
            if last is not None and event.occurred_at < last:
                log.info("mirror.stale_event_skipped", memory_id=record.id, op=event.op)
                return None
            tombstone = None
            if event.op in ("deleted", "evicted"):
                tombstone = Tombstone(reason=event.op, at=event.occurred_at, cause=event.cause)
            elif record.superseded_by or event.op == "superseded":
                tombstone = Tombstone(
                    reason="superseded",
                    at=record.valid_to or event.occurred_at,
                    cause=event.cause,
                )
            target = str(tombstone_path(tenant, record) if tombstone else live_path(tenant, record))
            displaced = self.tree.id_by_path.get(target)
            if displaced is not None and displaced != record.id and tombstone is None:
                log.warning(
                    "mirror.file_taken_over", path=target, memory_id=record.id, previous=displaced
                )
            changed, sha = await self.tree.write(target, render(record, tenant, tombstone))
            previous = self.tree.path_by_id.get(record.id)
            moved = False
            if previous is not None and previous != target:
                try:
                    moved = await self.tree.remove(previous)
                except UnsafePath as exc:
                    # Its folder became a symlink: the old file is out of reach, and the
                    # new one is written; nothing to remove through the link.
                    self._report_unsafe(exc, record.id)
                self.pending.stage_only(previous, None)
            self.tree.track(target, record.id)
            self._applied_at[record.id] = event.occurred_at
            op = tombstone.reason if tombstone is not None else event.op
            if changed or moved:
                self.pending.record(target, sha, op, record.kind)
            log.info(
                "mirror.file_written" if changed or moved else "mirror.file_unchanged",
                op=op,
                kind=record.kind,
                memory_id=record.id,
                path=target,
                moved_from=previous if moved else None,
            )
            return target

    # -- files → git -------------------------------------------------------------------

    async def _commit_loop(self) -> None:
        while not self._closing.is_set():
            with suppress(TimeoutError):
                await asyncio.wait_for(self._closing.wait(), timeout=self.commit_interval_s)
            if self._closing.is_set():
                return  # close() makes the last commit
            await self.commit_now()

    async def commit_now(self) -> str | None:
        """Commit every pending change as one commit; its hash, or None if none was made."""
        async with self._commit_lock:
            async with self.tree.lock:
                batch = self.pending.take()
                if not batch:
                    return None
                present = await asyncio.to_thread(_existing, self.root, list(batch.paths))
                absent = [rel for rel in batch.paths if rel not in present]
                try:
                    await self.git.stage(present, absent)
                except GitError as exc:
                    self.pending.give_back(batch)
                    log.error("mirror.commit_failed", stage="add", error=str(exc))
                    return None
            try:
                commit = await self.git.commit_staged(commit_message(batch))
            except GitError as exc:
                self.pending.give_back(batch)
                log.error("mirror.commit_failed", stage="commit", error=str(exc))
                return None
            self.pending.committed()
            if commit is not None:
                log.info(
                    "mirror.committed",
                    commit=commit[:12],
                    files=len(batch.paths),
                    changes={f"{op}:{kind}": n for (op, kind), n in sorted(batch.counts.items())},
                )
            return commit


def _follow_moves(
    journal: dict[str, str | None], dirty: list[str], moved: dict[str, str]
) -> tuple[dict[str, str | None], list[str]]:
    """The journal and the changed files as they were before the layout migration,
    under the paths the migration moved them to (a rename keeps their content)."""
    if not moved:
        return journal, dirty
    return (
        {moved.get(rel, rel): sha for rel, sha in journal.items()},
        [moved.get(rel, rel) for rel in dirty],
    )


def _existing(root: Path, rels: list[str]) -> set[str]:
    # A path beyond a symlink counts as gone: `git add` would refuse it on every commit.
    return {rel for rel in rels if is_regular(root, rel)}


def commit_message(batch: Batch) -> str:
    """``mirror: 2 created (1 fact, 1 turn); 1 superseded (fact)`` and one line per file."""
    by_op: dict[str, dict[str, int]] = defaultdict(dict)
    for (op, kind), count in batch.counts.items():
        by_op[op][kind] = by_op[op].get(kind, 0) + count
    ops = sorted(by_op, key=lambda op: (_OP_ORDER.index(op) if op in _OP_ORDER else 99, op))
    parts = []
    for op in ops:
        kinds = by_op[op]
        total = sum(kinds.values())
        if len(kinds) == 1:
            detail = next(iter(kinds))
        else:
            detail = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
        parts.append(f"{total} {op} ({detail})")
    summary = "; ".join(parts) if parts else "uncommitted changes from before a restart"
    subject = f"mirror: {summary}"
    lines = batch.lines[:MAX_MESSAGE_LINES]
    if len(batch.lines) > MAX_MESSAGE_LINES:
        lines.append(f"... and {len(batch.lines) - MAX_MESSAGE_LINES} more")
    return subject + ("\n\n" + "\n".join(lines) if lines else "") + "\n"
