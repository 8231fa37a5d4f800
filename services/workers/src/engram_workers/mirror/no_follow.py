"""File access under the mirror root that never follows a symlink nor opens anything but
a regular file.

The tree is edited by people, so any name in it may be a symlink (to a file or folder
outside the root, to a FIFO) or a special file. Every path is walked one component at a
time from a descriptor of the root (``O_NOFOLLOW``, ``dir_fd``), so a symlinked tenant
or ``@user`` folder is refused instead of written through, and a file is opened only
after ``lstat`` says it is regular, non-blocking, and checked again with ``fstat`` on
the open descriptor (it may have been swapped in between): a FIFO never blocks a
reader. What is refused raises :class:`UnsafePath` (a ``ValueError``: the memory.changed
handler dead-letters it at once instead of retrying); a missing path is ``None`` /
``False``, as before.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path, PurePosixPath
from typing import Literal

__all__ = [
    "UnsafePath",
    "UnsafeReason",
    "is_regular",
    "move_file",
    "read_file",
    "remove_file",
    "write_file",
]

UnsafeReason = Literal["symlink", "special_file"]

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
DIR_MODE = 0o755


class UnsafePath(ValueError):
    """A path under the mirror root that the mirror does not follow or open."""

    def __init__(self, rel: str, reason: UnsafeReason, component: str) -> None:
        what = "a symlink" if reason == "symlink" else "not a regular file or folder"
        super().__init__(f"{component!r} in {rel!r} is {what}: the mirror does not follow it")
        self.rel = rel
        self.reason: UnsafeReason = reason
        self.component = component


def _parts(rel: str) -> tuple[str, ...]:
    parts = PurePosixPath(rel).parts
    if not parts or PurePosixPath(rel).is_absolute() or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"path escapes the mirror root: {rel!r}")
    return parts


def _refusal(dir_fd: int, name: str, rel: str, component: str) -> UnsafePath | None:
    """Why ``name`` (in ``dir_fd``) may not be entered, or None when it simply is not a
    folder (a file where a folder was expected: treated as absent)."""
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(mode):
        return UnsafePath(rel, "symlink", component)
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        return UnsafePath(rel, "special_file", component)
    return None


@contextmanager
def _directory(root: Path, rel: str, *, create: bool) -> Iterator[int | None]:
    """A descriptor of ``rel``'s folder reached without following a link (None when a
    folder on the way is missing and ``create`` is false)."""
    parts = _parts(rel)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for depth, name in enumerate(parts[:-1]):
            component = "/".join(parts[: depth + 1])
            try:
                next_fd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    yield None
                    return
                with suppress(FileExistsError):  # made meanwhile: opened (and checked) next
                    os.mkdir(name, DIR_MODE, dir_fd=fd)
                next_fd = _open_dir_or_refuse(fd, name, rel, component)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                refusal = _refusal(fd, name, rel, component)
                if refusal is not None:
                    raise refusal from None
                if not create:
                    yield None
                    return
                raise
            os.close(fd)
            fd = next_fd
        yield fd
    finally:
        os.close(fd)


def _open_dir_or_refuse(dir_fd: int, name: str, rel: str, component: str) -> int:
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        refusal = _refusal(dir_fd, name, rel, component)
        if refusal is not None:
            raise refusal from exc
        raise


def _read_in(dir_fd: int, name: str, rel: str) -> bytes | None:
    try:
        mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None
    if stat.S_ISDIR(mode):
        return None
    if stat.S_ISLNK(mode):
        raise UnsafePath(rel, "symlink", rel)
    if not stat.S_ISREG(mode):
        raise UnsafePath(rel, "special_file", rel)
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # became a symlink since the lstat
            raise UnsafePath(rel, "symlink", rel) from None
        raise
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):  # swapped since the lstat
            raise UnsafePath(rel, "special_file", rel)
        return handle.read()


def read_file(root: Path, rel: str) -> bytes | None:
    """The bytes of the regular file ``rel``; None when it (or a folder on the way) does
    not exist or is a folder. Raises :class:`UnsafePath` for a symlink or special file
    anywhere on the path."""
    with _directory(root, rel, create=False) as dir_fd:
        if dir_fd is None:
            return None
        return _read_in(dir_fd, _parts(rel)[-1], rel)


def is_regular(root: Path, rel: str) -> bool:
    """Whether ``rel`` is a regular file reached without following a link."""
    try:
        with _directory(root, rel, create=False) as dir_fd:
            if dir_fd is None:
                return False
            mode = os.stat(_parts(rel)[-1], dir_fd=dir_fd, follow_symlinks=False).st_mode
    except (OSError, ValueError):  # UnsafePath is a ValueError
        return False
    return stat.S_ISREG(mode)


def write_file(root: Path, rel: str, data: bytes, mode: int) -> bool:
    """Write ``data`` atomically (temp file, fsync, rename) unless the file already holds
    exactly this; True when it was written. Missing folders are created; a symlinked
    folder on the way raises :class:`UnsafePath`. A symlink or special file at ``rel``
    itself is replaced by the regular file (a rename never follows it)."""
    name = _parts(rel)[-1]
    with _directory(root, rel, create=True) as dir_fd:
        assert dir_fd is not None  # create=True makes every folder
        with suppress(UnsafePath):
            if _read_in(dir_fd, name, rel) == data:
                return False
        # A dot-name: the watcher, git and `engram rebuild` all ignore it.
        tmp = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(tmp, _CREATE_FLAGS, mode, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fchmod(handle.fileno(), mode)
                os.fsync(handle.fileno())
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
    return True


def remove_file(root: Path, rel: str) -> bool:
    """Remove ``rel`` (a link there is removed, never followed); True if it was there."""
    with _directory(root, rel, create=False) as dir_fd:
        if dir_fd is None:
            return False
        try:
            os.unlink(_parts(rel)[-1], dir_fd=dir_fd)
        except (FileNotFoundError, IsADirectoryError):
            return False
    return True


def move_file(root: Path, source: str, target: str) -> None:
    """Rename ``source`` to ``target`` (replacing it), creating ``target``'s folders;
    :class:`UnsafePath` when a folder on either path is a symlink or ``source`` is not a
    regular file."""
    with _directory(root, source, create=False) as source_dir:
        if source_dir is None:
            raise FileNotFoundError(source)
        name = _parts(source)[-1]
        if not stat.S_ISREG(os.stat(name, dir_fd=source_dir, follow_symlinks=False).st_mode):
            raise UnsafePath(source, "special_file", source)
        with _directory(root, target, create=True) as target_dir:
            assert target_dir is not None  # create=True makes every folder
            os.replace(name, _parts(target)[-1], src_dir_fd=source_dir, dst_dir_fd=target_dir)
