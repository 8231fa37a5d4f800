"""Human edits to the mirror → ``engram.memory.edited.v1`` events.

The watcher looks at the *state* of each changed path, not at the raw file-system
events (editors save through temp files and renames): a file whose content the
mirror already accounted for is skipped, so the mirror's own writes never echo back.
A changed or new file is parsed and published as ``upserted``; a removed one as
``deleted``. Files under ``deleted/``, hidden files and directories (``.git``, temp
files) and anything outside ``<tenant>/<conversation>/`` and
``<tenant>/@<user>/<conversation>/`` are ignored. A file that does not parse (a bad
date included), is larger than a memory may be (``ENGRAM_MAX_TEXT_BYTES``), or whose
front matter names another user or conversation than its folder, is reported in the
log once and not published; saving it again fixed is picked up as usual.

Symlinks and special files (FIFOs, sockets) are never followed or opened, wherever they
are on the path (a symlinked tenant or ``@user`` folder included): each is reported
once (``mirror.unsafe_path``) and skipped, so a FIFO cannot block the watcher and a
file outside the root is never published. Every skip counts in
``engram.mirror.files_skipped``; each completed pass of the loop beats a heartbeat
(``engram.mirror.watch.staleness``, and the worker's readiness).
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
import uuid
from collections.abc import Awaitable, Callable, Iterable
from contextlib import suppress
from pathlib import Path

from watchfiles import Change, awatch

from engram_core import ids
from engram_core.events import Event, MemoryEdited, MemoryEditOp
from engram_core.logging import get_logger
from engram_core.memory import MemoryRecord
from engram_core.mirror_format import (
    MirrorFile,
    MirrorFormatError,
    MirrorPath,
    classify,
    content_sha256,
    memory_files,
    misplacement,
    parse,
    render,
    under_deleted,
)
from engram_core.settings import DEFAULT_MAX_TEXT_BYTES
from engram_workers.mirror.git import GitRepo
from engram_workers.mirror.no_follow import UnsafePath, UnsafeReason, is_regular
from engram_workers.mirror.telemetry import SkipReason, count_skipped, watch_heartbeat
from engram_workers.mirror.tree import MirrorTree, PendingChanges

log = get_logger(__name__)

Publish = Callable[[Event], Awaitable[object]]

#: How long to wait before retrying changes that could not be published.
RETRY_AFTER_S = 2.0
#: Time given to the file-system watch to start before the backlog is read.
WATCH_SETUP_S = 0.1


def _new_id() -> str:
    return str(uuid.uuid4())


class EditWatcher:
    def __init__(
        self,
        tree: MirrorTree,
        git: GitRepo,
        pending: PendingChanges,
        publish: Publish,
        *,
        debounce_ms: int = 400,
        step_ms: int = 50,
        force_polling: bool = False,
        poll_delay_ms: int = 300,
        max_file_bytes: int = DEFAULT_MAX_TEXT_BYTES,
    ) -> None:
        self.tree = tree
        self.max_file_bytes = max_file_bytes
        self.git = git
        self.pending = pending
        self.publish = publish
        self.debounce_ms = debounce_ms
        self.step_ms = step_ms
        self.force_polling = force_polling
        self.poll_delay_ms = poll_delay_ms
        self.stop_event = asyncio.Event()
        self._watch_stop = asyncio.Event()
        self._retry: set[str] = set()
        #: memory id -> a refused file (another scope than its folder's) that holds it
        self._misplaced_files: dict[str, str] = {}
        #: paths reported as symlinks or special files (each reported once)
        self._unsafe_reported: set[str] = set()
        self.watching = asyncio.Event()
        #: Beats after every completed pass of the loop (a batch, or an idle tick).
        self.heartbeat = watch_heartbeat()
        # watchfiles logs every batch at INFO; the outcomes are logged here instead.
        logging.getLogger("watchfiles").setLevel(logging.WARNING)

    # -- the loop ----------------------------------------------------------------------

    def stop(self) -> None:
        self.stop_event.set()
        self._watch_stop.set()

    async def run(self, initial: Iterable[str], ready: Callable[[], bool]) -> None:
        """Wait until events can be published, pick up ``initial`` (changes made while
        the mirror was down), then watch until :meth:`stop`."""
        while not ready():
            if self.stop_event.is_set():
                return
            self.heartbeat.beat()
            await asyncio.sleep(0.05)
        backlog = set(initial)
        while not self.stop_event.is_set():
            try:
                await self._watch(backlog)
            except Exception:
                log.exception("mirror.watch_failed", retry_in_s=RETRY_AFTER_S)
                await asyncio.sleep(RETRY_AFTER_S)
            backlog = set()

    async def _watch(self, backlog: set[str]) -> None:
        # Its own event per run: awatch sets it when cancelled, and a failed run must
        # not stop the next one.
        self._watch_stop = asyncio.Event()
        if self.stop_event.is_set():
            return
        changes_stream = awatch(
            self.tree.root,
            watch_filter=self._wanted,
            debounce=self.debounce_ms,
            step=self.step_ms,
            stop_event=self._watch_stop,
            rust_timeout=int(RETRY_AFTER_S * 1000),
            yield_on_timeout=True,
            force_polling=self.force_polling,
            poll_delay_ms=self.poll_delay_ms,
            ignore_permission_denied=True,
        )
        # The first step sets the watch up; the backlog is handled once it runs, so
        # nothing that changes in between is missed.
        next_batch = asyncio.ensure_future(anext(changes_stream))
        try:
            await asyncio.sleep(WATCH_SETUP_S)
            if backlog:
                await self.handle_paths(backlog)
            self.watching.set()
            self.heartbeat.beat()
            while True:
                try:
                    changes = await next_batch
                except StopAsyncIteration:
                    return
                next_batch = asyncio.ensure_future(anext(changes_stream))
                paths = self._paths(changes)
                if not changes:  # a timeout tick: time to retry what failed
                    paths |= self._retry
                    self._retry.clear()
                if paths:
                    await self.handle_paths(paths)
                self.heartbeat.beat()
        finally:
            self.watching.clear()
            if not next_batch.done():
                self._watch_stop.set()
                with suppress(BaseException):
                    await next_batch
            await changes_stream.aclose()

    def _paths(self, changes: set[tuple[Change, str]]) -> set[str]:
        paths: set[str] = set()
        for _, path in changes:
            rel = self._rel(path)
            if rel is None:
                continue
            try:
                mode = os.lstat(path).st_mode
            except OSError:  # gone: a deletion, or a path beyond a symlink
                paths.add(rel)
                continue
            if stat.S_ISLNK(mode):
                self._unsafe(UnsafePath(rel, "symlink", rel))
            elif stat.S_ISDIR(mode):
                # A new directory: files made in it before the watch covered it are
                # otherwise never reported.
                paths.update(self._files_under(rel))
            elif not stat.S_ISREG(mode):
                self._unsafe(UnsafePath(rel, "special_file", rel))
            else:
                paths.add(rel)
        return paths

    def _files_under(self, rel_dir: str) -> list[str]:
        """The memory files in a new folder; its symlinks and special files are reported
        (``memory_files`` leaves them out silently)."""
        top = self.tree.root / rel_dir
        for dirpath, dirnames, filenames in os.walk(top):  # never enters a symlinked folder
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in (*dirnames, *filenames):
                if name.startswith("."):
                    continue
                try:
                    mode = os.lstat(os.path.join(dirpath, name)).st_mode
                except OSError:
                    continue
                if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                    rel = Path(dirpath, name).relative_to(self.tree.root).as_posix()
                    reason: UnsafeReason = "symlink" if stat.S_ISLNK(mode) else "special_file"
                    self._unsafe(UnsafePath(rel, reason, rel))
        return memory_files(self.tree.root, rel_dir)

    def _rel(self, path: str) -> str | None:
        try:
            rel = Path(path).relative_to(self.tree.root)
        except ValueError:
            return None
        return rel.as_posix()

    def _wanted(self, change: Change, path: str) -> bool:
        rel = self._rel(path)
        if rel is None or rel == ".":
            return False
        parts = rel.split("/")
        if any(part.startswith(".") for part in parts):
            return False
        if under_deleted(rel):
            return False
        # Directories pass (see _paths); files only when they are memory files.
        return not parts[-1].endswith(".md") or classify(rel) is not None

    # -- one batch ---------------------------------------------------------------------

    async def handle_paths(self, rels: Iterable[str]) -> list[MemoryEdited]:
        """Publish an event for every path whose content the mirror does not know."""
        published: list[MemoryEdited] = []
        async with self.tree.lock:
            present: list[tuple[str, MirrorPath, bytes, str]] = []
            gone: list[tuple[str, MirrorPath]] = []
            for rel in sorted(set(rels)):
                info = classify(rel)
                if info is None or info.deleted:
                    continue
                try:
                    data = await self.tree.read(rel)
                except UnsafePath as exc:
                    self._unsafe(exc)
                    continue
                finally:
                    self.heartbeat.beat()  # a long batch is progress, not a stuck watcher
                self._unsafe_reported.discard(rel)
                sha = content_sha256(data) if data is not None else None
                if self.tree.is_known(rel, sha):
                    continue
                if data is None:
                    gone.append((rel, info))
                else:
                    present.append((rel, info, data, sha or ""))
            gone_paths = {rel for rel, _ in gone}
            claimed: set[str] = set()
            for rel, info, data, sha in present:
                event = await self._guarded(rel, self._upserted(rel, info, data, sha, gone_paths))
                if event is not None:
                    published.append(event)
                    claimed.add(event.memory.id)
            for rel, info in gone:
                event = await self._guarded(rel, self._deleted(rel, info, claimed))
                if event is not None:
                    published.append(event)
        return published

    async def _guarded(self, rel: str, step: Awaitable[MemoryEdited | None]) -> MemoryEdited | None:
        try:
            return await step
        except Exception as exc:
            # Not marked as known, so it is retried (and, if the process stops first,
            # found again at start-up: the file still differs from git's HEAD).
            log.warning("mirror.edit_not_published", path=rel, error=f"{type(exc).__name__}: {exc}")
            self._retry.add(rel)
            return None

    async def _upserted(
        self, rel: str, info: MirrorPath, data: bytes, sha: str, gone_paths: set[str]
    ) -> MemoryEdited | None:
        if len(data) > self.max_file_bytes:
            self._malformed(
                rel,
                sha,
                f"{len(data)} bytes, larger than a memory may be ({self.max_file_bytes} bytes "
                "with its front matter; ENGRAM_MAX_TEXT_BYTES): not indexed",
                "too_large",
            )
            return None
        try:
            parsed = parse(data.decode("utf-8"), info, new_id=_new_id)
        except UnicodeDecodeError:
            self._malformed(rel, sha, "not UTF-8 text", "not_utf8")
            return None
        except MirrorFormatError as exc:
            self._malformed(rel, sha, str(exc), "malformed")
            return None
        if self._misplaced(rel, sha, parsed, info):
            return None
        record, assigned = parsed.record, parsed.assigned_id
        other = self.tree.path_by_id.get(record.id)
        if (
            other is not None
            and other != rel
            and other not in gone_paths
            and not (classify(other) or info).deleted
            and await self._readable(other)
        ):
            # Another live file already is this memory: the copy becomes a new one.
            log.info("mirror.copy_gets_new_id", path=rel, copy_of=record.id)
            record, assigned = record.model_copy(update={"id": _new_id()}), True
        if assigned:
            _, sha = await self.tree.write(rel, render(record, parsed.tenant))
        previous = self.tree.known.get(rel) or ""
        new_file = rel not in self.tree.id_by_path
        event = _edited(parsed.tenant, record, rel, "upserted", sha, previous)
        await self.publish(event)
        self.tree.known[rel] = sha
        self.tree.track(rel, record.id)
        self.pending.record(rel, sha, "hand-created" if new_file else "hand-edited", record.kind)
        log.info(
            "mirror.edit_published",
            op="upserted",
            path=rel,
            memory_id=record.id,
            kind=record.kind,
            assigned_id=assigned,
        )
        return event

    async def _deleted(self, rel: str, info: MirrorPath, claimed: set[str]) -> MemoryEdited | None:
        memory_id = self.tree.id_by_path.get(rel) or info.id_from_name
        if memory_id is None:
            # Never a memory (a file that did not parse, say): nothing to delete.
            self.tree.known[rel] = None
            return None
        if memory_id in claimed or self._held_by_misplaced_file(memory_id):
            # The same memory showed up under another name in this batch: a move.
            self.tree.known[rel] = None
            if self.tree.id_by_path.get(rel) == memory_id:
                self.tree.id_by_path.pop(rel)
            self.pending.record(rel, None, "hand-moved", info.kind or "memory")
            return None
        if self._removed_a_second_file(rel, info, memory_id):
            return None
        state = await self._last_state(rel, info, memory_id)
        if state is None:
            log.warning("mirror.deleted_file_without_tenant", path=rel, memory_id=memory_id)
            self.tree.known[rel] = None
            return None
        tenant, record = state
        previous = self.tree.known.get(rel) or ""
        event = _edited(tenant, record, rel, "deleted", "", previous)
        await self.publish(event)
        self.tree.known[rel] = None
        self.tree.untrack(rel)
        self.pending.record(rel, None, "hand-deleted", record.kind)
        log.info("mirror.edit_published", op="deleted", path=rel, memory_id=memory_id)
        return event

    async def _last_state(
        self, rel: str, info: MirrorPath, memory_id: str
    ) -> tuple[str, MemoryRecord] | None:
        """The deleted file's last committed content, else what its path says."""
        content = await self.git.show_head(rel)
        if content is not None:
            try:
                parsed = parse(content, info)
            except MirrorFormatError:
                parsed = None
            if parsed is not None and parsed.record.id == memory_id:
                return parsed.tenant, parsed.record
        if info.tenant is None:
            return None
        record = MemoryRecord(
            id=memory_id,
            kind=info.kind or "fact",
            role=info.role or "",
            text="",
            user_id=info.user_id or "",
            conversation_id=info.conversation_id or "default",
        )
        return info.tenant, record

    def _misplaced(self, rel: str, sha: str, parsed: MirrorFile, info: MirrorPath) -> bool:
        """Refuse a file whose front matter names another user or conversation than its
        folder (a memory is never moved to another scope, or given to another user, by
        where a file is dropped). The memory keeps its indexed state; a file of a known
        memory moved there is remembered so its old path's removal is not a deletion."""
        problem = misplacement(parsed, info)
        if problem is None:
            self._misplaced_files.pop(parsed.record.id, None)
            return False
        self._malformed(rel, sha, f"misplaced: {problem}", "misplaced")
        if not parsed.assigned_id:
            self._misplaced_files[parsed.record.id] = rel
        return True

    def _held_by_misplaced_file(self, memory_id: str) -> bool:
        rel = self._misplaced_files.get(memory_id)
        if rel is not None and not is_regular(self.tree.root, rel):
            del self._misplaced_files[memory_id]
            return False
        return rel is not None

    def _removed_a_second_file(self, rel: str, info: MirrorPath, memory_id: str) -> bool:
        """A removed file whose memory another live file still holds (a refused copy
        in another user's folder, say) was not the memory: forget the file, keep the
        memory."""
        holder = next(
            (
                other
                for other, held in self.tree.id_by_path.items()
                if held == memory_id
                and other != rel
                and not under_deleted(other)
                and is_regular(self.tree.root, other)
            ),
            None,
        )
        if holder is None:
            return False
        self.tree.known[rel] = None
        self.tree.untrack(rel)
        self.tree.track(holder, memory_id)
        self.pending.record(rel, None, "hand-deleted", info.kind or "memory")
        log.info("mirror.second_file_removed", path=rel, memory_id=memory_id, kept=holder)
        return True

    async def _readable(self, rel: str) -> bool:
        try:
            return await self.tree.read(rel) is not None
        except UnsafePath:
            return False

    def _malformed(self, rel: str, sha: str, error: str, reason: SkipReason) -> None:
        if self.tree.known.get(rel) != sha:
            log.error(
                "mirror.malformed_file",
                path=rel,
                error=error,
                reason=reason,
                hint="not published; fix the file and save it again",
            )
            count_skipped(reason, "watcher")
        # Remember it, so the same broken content is reported once.
        self.tree.known[rel] = sha
        return None

    def _unsafe(self, exc: UnsafePath) -> None:
        """Report a symlink or special file once; it is never followed or opened."""
        if exc.rel in self._unsafe_reported:
            return
        self._unsafe_reported.add(exc.rel)
        log.error(
            "mirror.unsafe_path",
            path=exc.rel,
            component=exc.component,
            reason=exc.reason,
            hint="not followed, not published; replace it with a regular file or folder",
        )
        count_skipped(exc.reason, "watcher")


def _edited(
    tenant: str, record: MemoryRecord, rel: str, op: MemoryEditOp, sha: str, previous: str
) -> MemoryEdited:
    # The same observation published twice (a crash between publish and bookkeeping)
    # is de-duplicated; A → B → A is three observations, because `previous` differs.
    event_id = ids.event_id("memory.edited", tenant, rel, op, sha, previous)
    return MemoryEdited(
        event_id=event_id,
        tenant=tenant,
        user_id=record.user_id,
        conversation_id=record.conversation_id,
        op=op,
        memory=record,
        path=rel,
    )
