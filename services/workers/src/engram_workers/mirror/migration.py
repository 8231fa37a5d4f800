"""The mirror's layout migration: conversations belong to users.

Before conversations belonged to users, every memory lived under
``<tenant>/<conversation>/``, whoever said it. Now a user's memory lives under
``<tenant>/@<user>/<conversation>/`` and only memories with no user stay at the old
level. At start-up the mirror moves every file there whose front matter names a user
(live files and tombstones under ``deleted/``) to its place in the new layout, as it is
(a rename: the bytes do not change), and commits all the moves as one commit. A tree
that holds no such file is left alone, so a second start moves nothing; once a tree is
in the new layout a marker in ``.git/`` spares later starts the scan.

Nothing is moved through a symlink (:mod:`engram_workers.mirror.no_follow`): a file
whose new place lies in a symlinked folder is left in place and reported.

Crash safety: the moves are journaled like any other write of the mirror, so a crash
between the moves and the commit leaves the mirror's own uncommitted changes, which
the next start commits, never edits to publish. Files that do not parse stay where
they are (the watcher reports them when they change).
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from engram_core.logging import get_logger
from engram_core.mirror_format import (
    MirrorFormatError,
    classify,
    content_sha256,
    live_path,
    memory_files,
    parse,
    tombstone_path,
)
from engram_workers.mirror.git import GitError, GitRepo
from engram_workers.mirror.no_follow import UnsafePath, move_file, read_file
from engram_workers.mirror.tree import PendingChanges

log = get_logger(__name__)

SUBJECT = "mirror: conversations belong to users (layout migration)"
#: In ``.git/``: this tree has been checked (and moved) into the user layout.
MARKER_NAME = "engram-mirror-layout"
#: Moves listed in the commit message body, at most.
MAX_LISTED = 200


@dataclass(frozen=True)
class Move:
    source: str
    target: str


@dataclass
class MigrationPlan:
    moves: list[Move]
    #: legacy files whose target already holds another content: left where they are
    conflicts: list[Move]


def plan_migration(root: Path) -> MigrationPlan:
    """Every file at the no-user level whose front matter names a user, and where the
    new layout puts it (blocking: run it in a thread)."""
    plan = MigrationPlan(moves=[], conflicts=[])
    targets: set[str] = set()
    for rel in memory_files(root):
        target = _new_place(root, rel)
        if target is None:
            continue
        move = Move(rel, target)
        try:
            existing = read_file(root, target)
        except UnsafePath:  # a symlinked @user folder, say: never moved into
            plan.conflicts.append(move)
            continue
        taken = existing is not None and existing != (root / rel).read_bytes()
        if taken or target in targets:
            plan.conflicts.append(move)
        else:
            plan.moves.append(move)
            targets.add(target)
    return plan


def _new_place(root: Path, rel: str) -> str | None:
    info = classify(rel)
    if info is None or info.scope_depth != 2 or not _may_name_a_user(root / rel):
        return None
    try:
        parsed = parse((root / rel).read_text(encoding="utf-8"), info)
    except (MirrorFormatError, UnicodeDecodeError, OSError):
        return None
    if not parsed.record.user_id:
        return None
    place = tombstone_path if info.deleted else live_path
    return str(place(parsed.tenant, parsed.record))


def _may_name_a_user(path: Path) -> bool:
    """False when the front matter's ``user_id`` line is absent or empty: most files of
    a tree with no users, skipped without parsing their YAML (best effort; a file that
    passes is parsed)."""
    try:
        with path.open("r", encoding="utf-8", errors="replace") as handle:
            if handle.readline().strip() != "---":
                return False
            for line in handle:
                if line.strip() in ("---", "..."):
                    return False
                if line.startswith("user_id:"):
                    return line[len("user_id:") :].strip() not in ("", "''", '""')
    except OSError:
        return False
    return False


def move_files(root: Path, moves: list[Move]) -> None:
    """Rename each file into place and drop the directories left empty (blocking)."""
    for move in moves:
        move_file(root, move.source, move.target)
        _remove_empty_parents(root, PurePosixPath(move.source).parent)


def _remove_empty_parents(root: Path, directory: PurePosixPath) -> None:
    # Up to (not including) the tenant's directory.
    while len(directory.parts) > 1:
        with suppress(OSError):  # not empty (or already gone): stop there
            (root / directory).rmdir()
        if (root / directory).exists():
            return
        directory = directory.parent


async def migrate_layout(root: Path, git: GitRepo, pending: PendingChanges) -> dict[str, str]:
    """Move a tree written before users had folders into the new layout, in one commit.

    Returns ``{old path: new path}`` of the files moved (empty when there was nothing
    to do), so start-up can follow the files it already knew about.
    """
    marker = root / ".git" / MARKER_NAME
    if marker.is_file():
        return {}
    plan = await asyncio.to_thread(plan_migration, root)
    for conflict in plan.conflicts:
        log.warning(
            "mirror.migration_conflict",
            path=conflict.source,
            target=conflict.target,
            hint="another file already holds this memory in the new layout, or a folder on "
            "the way is a symlink (never followed); left in place",
        )
    if not plan.moves:
        _mark_done(marker, plan)
        return {}
    for move in plan.moves:
        sha = content_sha256((root / move.source).read_bytes())
        pending.stage_only(move.target, sha)
        pending.stage_only(move.source, None)
    await asyncio.to_thread(move_files, root, plan.moves)
    batch = pending.take()
    try:
        await git.stage([m.target for m in plan.moves], [m.source for m in plan.moves])
        commit = await git.commit_staged(migration_message(plan.moves))
    except GitError as exc:
        # The moves are done and journaled: they go into the next commit instead.
        pending.give_back(batch)
        log.error("mirror.commit_failed", stage="layout migration", error=str(exc))
        commit = None
    else:
        _mark_done(marker, plan)
    log.info(
        "mirror.layout_migrated",
        files=len(plan.moves),
        commit=commit[:12] if commit else None,
        left_in_place=len(plan.conflicts),
    )
    return {move.source: move.target for move in plan.moves}


def _mark_done(marker: Path, plan: MigrationPlan) -> None:
    """Remember that this tree is in the user layout, so later starts skip the scan;
    a tree with files left in place is looked at again (and they are logged again)."""
    if not plan.conflicts:
        marker.write_text("users\n", encoding="utf-8")


def migration_message(moves: list[Move]) -> str:
    lines = [f"moved {move.source} -> {move.target}" for move in moves[:MAX_LISTED]]
    if len(moves) > MAX_LISTED:
        lines.append(f"... and {len(moves) - MAX_LISTED} more")
    body = "\n".join(lines)
    return (
        f"{SUBJECT}\n\n{len(moves)} files of users' conversations moved under @<user>/\n\n{body}\n"
    )
