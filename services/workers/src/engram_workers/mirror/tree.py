"""The mirror's files: atomic, idempotent writes; which memory is where; what is ours.

``MirrorTree`` is the only code that writes under the mirror root. It remembers the
hash of the content it accounted for at each path (what it wrote itself, or a human
change it already published), so the watcher can tell its own writes from a
person's. ``PendingChanges`` collects what the next git commit will contain and
journals it, so after a crash the mirror can tell its own uncommitted writes from
edits that happened while it was down.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TextIO

from engram_core.logging import get_logger
from engram_core.mirror_format import classify, content_sha256, memory_files, under_deleted
from engram_workers.mirror.no_follow import read_file, remove_file, write_file

log = get_logger(__name__)

#: "The mirror removed this file" in ``MirrorTree.known``.
ABSENT = None
FILE_MODE = 0o644


class MirrorTree:
    """Files under the root, the id ↔ path index, and the content the mirror knows of.

    All mutations happen under :attr:`lock` (the event handler and the watcher share
    it); file I/O runs in a worker thread.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lock = asyncio.Lock()
        #: rel path -> sha256 of the content the mirror accounted for (None: removed it).
        self.known: dict[str, str | None] = {}
        self.path_by_id: dict[str, str] = {}
        self.id_by_path: dict[str, str] = {}

    def abs(self, rel: str) -> Path:
        # Components are encoded, so this cannot happen; refuse rather than trust it.
        parts = PurePosixPath(rel).parts
        if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
            raise ValueError(f"path escapes the mirror root: {rel!r}")
        return self.root / rel

    def is_known(self, rel: str, sha: str | None) -> bool:
        return rel in self.known and self.known[rel] == sha

    def track(self, rel: str, memory_id: str) -> None:
        """``memory_id``'s file is now ``rel``."""
        old_id = self.id_by_path.get(rel)
        if old_id is not None and old_id != memory_id and self.path_by_id.get(old_id) == rel:
            del self.path_by_id[old_id]
        self.id_by_path[rel] = memory_id
        self.path_by_id[memory_id] = rel

    def untrack(self, rel: str) -> None:
        memory_id = self.id_by_path.pop(rel, None)
        if memory_id is not None and self.path_by_id.get(memory_id) == rel:
            del self.path_by_id[memory_id]

    async def write(self, rel: str, content: str) -> tuple[bool, str]:
        """Write atomically unless the file already holds exactly this; (changed, sha).
        Raises :class:`~engram_workers.mirror.no_follow.UnsafePath` when a folder on the
        way is a symlink (nothing is written outside the root)."""
        data = content.encode("utf-8")
        sha = content_sha256(data)
        # Before the rename: the watcher must never see these bytes as a stranger's.
        previous = self.known.get(rel, ABSENT)
        self.known[rel] = sha
        try:
            changed = await asyncio.to_thread(write_file, self.root, rel, data, FILE_MODE)
        except BaseException:
            self.known[rel] = previous
            raise
        return changed, sha

    async def remove(self, rel: str) -> bool:
        """Remove a file the mirror moved elsewhere; True if it was there."""
        self.known[rel] = ABSENT
        self.untrack(rel)
        return await asyncio.to_thread(remove_file, self.root, rel)

    async def read(self, rel: str) -> bytes | None:
        """The file's bytes, None when absent; raises ``UnsafePath`` for a symlink or a
        special file on the way (never followed, never opened: a FIFO cannot block)."""
        return await asyncio.to_thread(read_file, self.root, rel)

    def scan(self) -> int:
        """Index every memory file by id (blocking: run it in a thread at start-up).

        Canonical names carry the id; for other files (``summary.md``, hand-made
        names) the id is read from the front matter.
        """
        count = 0
        for rel in memory_files(self.root):
            info = classify(rel)
            if info is None:
                continue
            memory_id = info.id_from_name
            if memory_id is None:
                memory_id = _front_matter_id(self.root, rel)
            if memory_id is None:
                continue
            # Live files win over tombstones of the same id.
            current = self.path_by_id.get(memory_id)
            if current is not None and not under_deleted(current) and under_deleted(rel):
                self.id_by_path[rel] = memory_id
                continue
            self.track(rel, memory_id)
            count += 1
        return count


def _front_matter_id(root: Path, rel: str) -> str | None:
    """The id of a non-canonically named file, from its front matter (best effort)."""
    try:
        data = read_file(root, rel)
    except (OSError, ValueError):  # ValueError: UnsafePath
        return None
    if data is None:
        return None
    lines = data.decode("utf-8", errors="replace").splitlines()
    if not lines or lines[0].strip() != "---":
        return None
    for line in lines[1:]:
        if line.strip() in ("---", "..."):
            return None
        if line.startswith("id:"):
            value = line[3:].strip().strip("'\"")
            return value or None
    return None


# --- the next commit -------------------------------------------------------------------


@dataclass
class Batch:
    """What one commit will contain."""

    paths: dict[str, str | None] = field(default_factory=dict)  # rel -> sha (None: removed)
    counts: Counter[tuple[str, str]] = field(default_factory=Counter)  # (op, kind) -> n
    lines: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.paths)


class PendingChanges:
    """Changes not yet committed, journaled to ``.git/engram-mirror-journal.jsonl``.

    The journal lists (path, sha) of every change the mirror made or already
    published; at start-up a file that differs from HEAD but matches its journal
    entry was the mirror's own doing, anything else is a human edit to pick up.
    """

    def __init__(self, journal: Path) -> None:
        self.journal_path = journal
        self.batch = Batch()
        self._journal: TextIO | None = None

    def load_journal(self) -> dict[str, str | None]:
        entries: dict[str, str | None] = {}
        try:
            lines = self.journal_path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return entries
        for line in lines:
            try:
                entry = json.loads(line)
                entries[str(entry["path"])] = entry["sha"]
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line after a crash
        return entries

    def record(self, rel: str, sha: str | None, op: str, kind: str) -> None:
        self.batch.paths[rel] = sha
        self.batch.counts[(op, kind)] += 1
        self.batch.lines.append(f"{op} {kind} {rel}")
        self._append({"path": rel, "sha": sha})

    def stage_only(self, rel: str, sha: str | None) -> None:
        """A journaled change from before a restart: commit it, count nothing."""
        self.batch.paths[rel] = sha
        self._append({"path": rel, "sha": sha})

    def take(self) -> Batch:
        batch, self.batch = self.batch, Batch()
        return batch

    def give_back(self, batch: Batch) -> None:
        """A failed commit: its changes go into the next one (newer entries win)."""
        batch.paths.update(self.batch.paths)
        batch.counts.update(self.batch.counts)
        batch.lines.extend(self.batch.lines)
        self.batch = batch

    def committed(self) -> None:
        """Rewrite the journal with only what is still pending."""
        self.close()
        tmp = self.journal_path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as handle:
            for rel, sha in self.batch.paths.items():
                handle.write(json.dumps({"path": rel, "sha": sha}) + "\n")
        os.replace(tmp, self.journal_path)

    def _append(self, entry: dict[str, str | None]) -> None:
        if self._journal is None:
            self._journal = self.journal_path.open("a", encoding="utf-8")
        self._journal.write(json.dumps(entry) + "\n")
        self._journal.flush()

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None
