"""The mirror's git repository: init, batched commits, and what changed since the last one.

Every git call runs as an asyncio subprocess, so the event loop never waits on git.
The process ignores the user's and the system's git configuration (a global
``commit.gpgsign`` or hook path must not break a service) and commits under its own
identity; people committing in the same repository keep theirs.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

from engram_core.logging import get_logger

log = get_logger(__name__)

AUTHOR_NAME = "Engram Mirror"
AUTHOR_EMAIL = "mirror@engram.invalid"
BRANCH = "main"

README = """\
# Engram memory mirror

Every memory Engram holds, as one Markdown file with YAML front matter, written by
the file-mirror worker (`engram-mirror`) and committed here in batches.

    <tenant>/@<user>/<conversation>/turns/{user,assistant}/<time>__<id>.md
    <tenant>/@<user>/<conversation>/{facts,profile,episodes}/<time>__<id>.md
    <tenant>/@<user>/<conversation>/summaries/summary.md
    <tenant>/@<user>/<conversation>/deleted/...   superseded, deleted and evicted memories
    <tenant>/<conversation>/...   memories with no user (global: the whole tenant's)

A conversation belongs to a user: a file added under @<user>/ is that user's.
Edit a file's text or front matter, add a file, or delete one: the mirror turns the
change into an `engram.memory.edited.v1` event and the index follows. Files under
`deleted/` are history and are not watched. `engram rebuild` re-creates the index
from this tree. See docs/mirror.md in the Engram repository.
"""

GITIGNORE = """\
# the mirror's (and editors') temporary files
.*
!.gitignore
*~
*.swp
"""


class GitError(RuntimeError):
    """A git command failed; the message carries its stderr."""


def _git_env() -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        # Inherited from a hook or a wrapper, these would point git somewhere else.
        if key not in {"GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY"}
    }
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_AUTHOR_NAME=AUTHOR_NAME,
        GIT_AUTHOR_EMAIL=AUTHOR_EMAIL,
        GIT_COMMITTER_NAME=AUTHOR_NAME,
        GIT_COMMITTER_EMAIL=AUTHOR_EMAIL,
        # Paths are file names, never globs (encoded ids may contain '%', '[', ...).
        GIT_LITERAL_PATHSPECS="1",
        GIT_TERMINAL_PROMPT="0",
        LC_ALL="C",
    )
    return env


class GitRepo:
    def __init__(self, root: Path, *, git: str | None = None) -> None:
        self.root = root
        found = git or shutil.which("git")
        if found is None:
            raise GitError("git is not installed (the file mirror keeps its history in git)")
        self.git = found
        self._env = _git_env()

    async def run(
        self, *args: str, stdin: bytes | None = None, ok_codes: Sequence[int] = (0,)
    ) -> tuple[int, bytes]:
        """Run ``git <args>`` in the mirror root; returns (exit code, stdout)."""
        process = await asyncio.create_subprocess_exec(
            self.git,
            "-c",
            "commit.gpgsign=false",
            "-c",
            "core.hooksPath=/dev/null",
            "-c",
            "core.quotepath=off",
            *args,
            cwd=self.root,
            env=self._env,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await process.communicate(stdin)
        code = process.returncode if process.returncode is not None else -1
        if code not in ok_codes:
            message = err.decode("utf-8", "replace").strip() or f"exit code {code}"
            raise GitError(f"git {args[0]} failed: {message}")
        return code, out

    async def ensure(self) -> bool:
        """Make the root a repository with a first commit; True if it was created now."""
        self.root.mkdir(parents=True, exist_ok=True)
        if (self.root / ".git").exists():
            return False
        await self.run("init", "-q", "-b", BRANCH)
        (self.root / "README.md").write_text(README, encoding="utf-8")
        (self.root / ".gitignore").write_text(GITIGNORE, encoding="utf-8")
        # Whatever was already there (a copied mirror, say) is part of the first commit.
        await self.run("add", "-A")
        await self.run("commit", "-q", "--no-verify", "-m", "mirror: initialise")
        log.info("mirror.git_initialised", root=str(self.root))
        return True

    async def dirty_paths(self) -> list[str]:
        """Files that differ from HEAD: modified, deleted, untracked (and staged)."""
        _, out = await self.run(
            "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames"
        )
        paths = []
        for entry in out.split(b"\0"):
            if len(entry) > 3:
                paths.append(entry[3:].decode("utf-8", "surrogateescape"))
        return paths

    async def stage(self, present: Iterable[str], absent: Iterable[str]) -> None:
        """Stage exactly these paths: the present ones' content, the absent ones' removal."""
        present, absent = sorted(set(present)), sorted(set(absent))
        if present:
            await self.run(
                "add",
                "-A",
                "--pathspec-from-file=-",
                "--pathspec-file-nul",
                stdin=_nul_joined(present),
            )
        if absent:
            await self.run(
                "rm",
                "-q",
                "--cached",
                "--ignore-unmatch",
                "--pathspec-from-file=-",
                "--pathspec-file-nul",
                stdin=_nul_joined(absent),
            )

    async def commit_staged(self, message: str) -> str | None:
        """Commit what is staged; None (and no commit) when nothing is."""
        code, _ = await self.run("diff", "--cached", "--quiet", ok_codes=(0, 1))
        if code == 0:
            return None
        await self.run("commit", "-q", "--no-verify", "-F", "-", stdin=message.encode("utf-8"))
        _, out = await self.run("rev-parse", "HEAD")
        return out.decode().strip()

    async def show_head(self, rel_path: str) -> str | None:
        """The committed content of a file, or None when HEAD does not have it."""
        code, out = await self.run("show", f"HEAD:{rel_path}", ok_codes=(0, 128))
        return out.decode("utf-8", "replace") if code == 0 else None


def _nul_joined(paths: Sequence[str]) -> bytes:
    return b"".join(path.encode("utf-8", "surrogateescape") + b"\0" for path in paths)
