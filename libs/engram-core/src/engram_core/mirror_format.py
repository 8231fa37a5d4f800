"""The file mirror's on-disk format: where a memory's Markdown file lives and what it says.

One memory is one Markdown file: YAML front matter with every field of the memory,
then its text as the body. Shared by the file-mirror worker (which writes and watches
the tree) and ``engram rebuild`` (which reads it back into the index); docs/mirror.md
describes the layout for humans.

```
<root>/<tenant>/<scope>/turns/{user,assistant}/<stamp>__<id>.md
                        facts/ profile/ episodes/  <stamp>__<id>.md
                        summaries/summary.md
                        deleted/<same sub-path>/<stamp>__<id>.md   (tombstones)

<scope> = <conversation>           a memory with no user (``global``: tenant-wide)
        | @<user>/<conversation>   a user's conversation (a conversation belongs to a user)
```

Tenant, user and conversation ids may contain anything, so each is percent-encoded
into a single safe path component (never ``.``/``..``, never a separator). ``@`` is
always escaped by the encoding, so a name starting with ``@`` is a user and never a
conversation.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import PurePosixPath
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from engram_core import front_matter
from engram_core.kinds import KINDS, find_kind, kind_policy
from engram_core.memory import MemoryKindName, MemoryRecord
from engram_core.timestamps import compact_utc, storable_utc

__all__ = [
    "DELETED_DIR",
    "KIND_DIRS",
    "SUMMARY_FILE",
    "USER_MARK",
    "MirrorFile",
    "MirrorFormatError",
    "MirrorPath",
    "Tombstone",
    "classify",
    "content_sha256",
    "decode_component",
    "encode_component",
    "file_stamp",
    "format_time",
    "id_from_name",
    "live_path",
    "memory_files",
    "misplacement",
    "parse",
    "render",
    "scope_dir",
    "tombstone_path",
    "under_deleted",
    "user_component",
]

KIND_DIRS: dict[MemoryKindName, str] = {k.name: k.mirror_dir for k in KINDS}
_KIND_BY_DIR = {directory: kind for kind, directory in KIND_DIRS.items()}
#: Turn roles with a directory of their own; any other role goes to ``turns/other``.
TURN_ROLE_DIRS = ("user", "assistant", "system", "tool")
OTHER_ROLE_DIR = "other"
DELETED_DIR = "deleted"
#: Starts the directory of one user's conversations: ``<tenant>/@<user>/<conversation>/``.
USER_MARK = "@"
SUMMARY_FILE = "summary.md"
FILE_SUFFIX = ".md"
#: Separates the stamp from the id in a file name: ``20260301T123000Z__<uuid>.md``.
NAME_SEPARATOR = "__"
_CANONICAL_NAME = re.compile(
    r"^(?:\d{8}T\d{6}Z|undated)__(?P<id>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.md$"
)

TombstoneReason = Literal["superseded", "deleted", "evicted"]
#: The largest turn position the index stores (``turn_index`` and ``turn_range`` are int64).
MAX_INDEX = 2**63 - 1
#: Profile fields that are scores in 0..1.
PROFILE_SCORES = ("confidence", "importance")


class MirrorFormatError(ValueError):
    """A file is not a valid memory; the message says why (never the file's text)."""


class Tombstone(BaseModel):
    """Why and when a memory left the live tree; front matter key ``tombstone``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    reason: TombstoneReason
    at: datetime
    cause: str = ""


# --- path components -------------------------------------------------------------------

_SAFE_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
#: Longer encodings are cut and suffixed with a hash (file systems cap names at 255 bytes).
MAX_COMPONENT = 120
_HASHED_MARK = "~"


def encode_component(value: str) -> str:
    """One safe, reversible path component for an arbitrary id.

    Letters, digits, ``-``, ``_`` and ``.`` stay; everything else (and a leading dot,
    so ``.``, ``..`` and hidden names cannot occur) becomes ``%XX`` per UTF-8 byte.
    Encodings longer than :data:`MAX_COMPONENT` keep a prefix plus ``~`` and a hash;
    those are not reversible (:func:`decode_component` gives None) and the ids come
    from the front matter instead.
    """
    if not value:
        raise ValueError("an empty id has no path component")
    out: list[str] = []
    for i, char in enumerate(value):
        if char in _SAFE_CHARS and not (i == 0 and char == "."):
            out.append(char)
        else:
            out.extend(f"%{byte:02X}" for byte in char.encode("utf-8"))
    encoded = "".join(out)
    if len(encoded) <= MAX_COMPONENT:
        return encoded
    digest = hashlib.sha256(value.encode("utf-8")).hexdigest()[:16]
    prefix = encoded[: MAX_COMPONENT - len(digest) - 1]
    # Never cut a %XX escape in half.
    cut = prefix.rfind("%")
    if cut >= len(prefix) - 2 and cut != -1:
        prefix = prefix[:cut]
    return f"{prefix}{_HASHED_MARK}{digest}"


def decode_component(name: str) -> str | None:
    """The id an :func:`encode_component` name stands for; None when it is not one."""
    if not name or _HASHED_MARK in name or name.startswith("."):
        return None
    raw = bytearray()
    i = 0
    while i < len(name):
        char = name[i]
        if char == "%":
            hex_part = name[i + 1 : i + 3]
            if len(hex_part) != 2 or not all(c in "0123456789ABCDEFabcdef" for c in hex_part):
                return None
            raw.append(int(hex_part, 16))
            i += 3
        elif char in _SAFE_CHARS:
            raw.extend(char.encode("ascii"))
            i += 1
        else:
            return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


# --- layout ----------------------------------------------------------------------------


def format_time(value: datetime) -> str:
    """UTC ISO 8601 with ``Z``; microseconds only when there are some (lossless)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def file_stamp(record: MemoryRecord) -> str:
    """The sortable prefix of a file name: ``20260301T123000Z`` (``undated`` if unknown)."""
    if record.created_at is None:
        return "undated"
    return compact_utc(record.created_at)


def _has_role(kind: str) -> bool:
    """Whether the kind's files are kept in a folder per role (chat messages)."""
    policy = find_kind(kind)
    return policy is not None and policy.chat_message


def _sub_dirs(record: MemoryRecord) -> tuple[str, ...]:
    directory = kind_policy(record.kind).mirror_dir
    if _has_role(record.kind):
        role = record.role if record.role in TURN_ROLE_DIRS else OTHER_ROLE_DIR
        return (directory, role)
    return (directory,)


def _dated_name(record: MemoryRecord) -> str:
    return f"{file_stamp(record)}{NAME_SEPARATOR}{record.id}{FILE_SUFFIX}"


def user_component(user_id: str) -> str:
    """The directory of one user's conversations: ``@`` + the encoded user id."""
    return USER_MARK + encode_component(user_id)


def scope_dir(tenant: str, user_id: str, conversation_id: str) -> PurePosixPath:
    """The directory of one conversation scope, relative to the root:
    ``<tenant>/<conversation>`` with no user, ``<tenant>/@<user>/<conversation>`` else."""
    if user_id:
        return PurePosixPath(
            encode_component(tenant), user_component(user_id), encode_component(conversation_id)
        )
    return PurePosixPath(encode_component(tenant), encode_component(conversation_id))


def _record_dir(tenant: str, record: MemoryRecord) -> PurePosixPath:
    return scope_dir(tenant, record.user_id, record.conversation_id)


def live_path(tenant: str, record: MemoryRecord) -> PurePosixPath:
    """Where a current memory lives, relative to the mirror root."""
    name = SUMMARY_FILE if kind_policy(record.kind).one_per_conversation else _dated_name(record)
    return _record_dir(tenant, record).joinpath(*_sub_dirs(record), name)


def tombstone_path(tenant: str, record: MemoryRecord) -> PurePosixPath:
    """Where a superseded, deleted or evicted memory is kept, relative to the root."""
    return _record_dir(tenant, record).joinpath(
        DELETED_DIR, *_sub_dirs(record), _dated_name(record)
    )


def _scope_depth(parts: tuple[str, ...]) -> int:
    """How many leading path components name the scope: 3 under ``<tenant>/@<user>/``."""
    return 3 if len(parts) > 1 and parts[1].startswith(USER_MARK) else 2


def under_deleted(rel_path: str | PurePosixPath) -> bool:
    """Whether a path (file or directory) lies under a scope's ``deleted/``."""
    parts = PurePosixPath(rel_path).parts
    depth = _scope_depth(parts)
    return len(parts) > depth and parts[depth] == DELETED_DIR


@dataclass(frozen=True)
class MirrorPath:
    """What a file's place in the tree says about it."""

    path: PurePosixPath
    tenant: str | None  # None when the directory name is not a reversible encoding
    #: "" in ``<tenant>/<conversation>/`` (no user); None when ``@<name>`` is not reversible
    user_id: str | None
    conversation_id: str | None
    deleted: bool  # under the scope's deleted/
    kind: MemoryKindName | None  # from the kind directory, if it is one
    role: str | None  # turns/<role>
    id_from_name: str | None  # the id in a canonical ``<stamp>__<id>.md`` name
    scope_depth: int = 2  # leading components naming the scope (3 with a user level)


def classify(rel_path: str | PurePosixPath) -> MirrorPath | None:
    """A memory file's :class:`MirrorPath`, or None for anything that is not one.

    Not memory files: anything outside ``<tenant>/<conversation>/`` and
    ``<tenant>/@<user>/<conversation>/``, names or directories starting with ``.``
    (``.git``, editors' and the mirror's temp files), and files not ending in ``.md``.
    """
    path = PurePosixPath(rel_path)
    parts = path.parts
    depth = _scope_depth(parts)
    if len(parts) <= depth or path.is_absolute():
        return None
    if any(part.startswith(".") or part in ("", "..") for part in parts):
        return None
    if not parts[-1].endswith(FILE_SUFFIX):
        return None
    rest = list(parts[depth:-1])
    deleted = bool(rest) and rest[0] == DELETED_DIR
    if deleted:
        rest = rest[1:]
    kind = _KIND_BY_DIR.get(rest[0]) if rest else None
    role = None
    if kind is not None and _has_role(kind) and len(rest) >= 2 and rest[1] != OTHER_ROLE_DIR:
        role = rest[1]
    match = _CANONICAL_NAME.match(parts[-1])
    return MirrorPath(
        path=path,
        tenant=decode_component(parts[0]),
        user_id="" if depth == 2 else decode_component(parts[1][len(USER_MARK) :]),
        conversation_id=decode_component(parts[depth - 1]),
        deleted=deleted,
        kind=kind,
        role=role,
        id_from_name=match.group("id") if match else None,
        scope_depth=depth,
    )


def memory_files(root: os.PathLike[str] | str, tenant_dir: str | None = None) -> list[str]:
    """Relative (POSIX) paths of every memory file (see :func:`classify`) under the
    root, or under one tenant's directory of it, sorted; hidden files and directories
    (``.git``, temp files) are skipped, and so is anything that is not a regular file
    reached without a symlink (a symlinked folder is not entered, a symlink, FIFO or
    socket is not listed: the mirror never reads outside its root or blocks on a pipe)."""
    found: list[str] = []
    top = os.path.join(root, tenant_dir) if tenant_dir else root
    if os.path.islink(top):
        return found
    for dirpath, dirnames, filenames in os.walk(top):  # does not follow symlinked folders
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith(".") and not os.path.islink(dirpath + "/" + d)
        )
        rel_dir = PurePosixPath(*os.path.relpath(dirpath, root).split(os.sep))
        if len(rel_dir.parts) < 2 or str(rel_dir) == ".":
            continue
        for name in sorted(filenames):
            rel = (rel_dir / name).as_posix()
            if (
                name.endswith(FILE_SUFFIX)
                and classify(rel) is not None
                and _is_regular(os.path.join(dirpath, name))
            ):
                found.append(rel)
    return found


def _is_regular(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


# --- rendering -------------------------------------------------------------------------


def render(record: MemoryRecord, tenant: str, tombstone: Tombstone | None = None) -> str:
    """The file for one memory. Deterministic: the same memory renders the same bytes."""
    front: dict[str, Any] = {"id": record.id, "kind": record.kind}
    if tombstone is not None:
        front["tombstone"] = {
            "reason": tombstone.reason,
            "at": format_time(tombstone.at),
            "cause": tombstone.cause,
        }
    front |= {
        "role": record.role,
        "tenant": tenant,
        "user_id": record.user_id,
        "conversation_id": record.conversation_id,
        "created_at": _opt_time(record.created_at),
        "updated_at": _opt_time(record.updated_at),
        "source_id": record.source_id,
        "source_turn_ids": list(record.source_turn_ids),
        "tags": list(record.tags),
    }
    if record.turn_index:
        front["turn_index"] = record.turn_index
    if record.valid_from is not None:
        front["valid_from"] = format_time(record.valid_from)
    if record.valid_to is not None:
        front["valid_to"] = format_time(record.valid_to)
    if record.superseded_by:
        front["superseded_by"] = record.superseded_by
    if record.profile is not None:
        front["profile"] = record.profile.model_dump()
    if record.turn_range is not None:
        front["turn_range"] = {
            "first_turn": record.turn_range[0],
            "last_turn": record.turn_range[1],
        }
    if record.metadata:
        front["metadata"] = dict(sorted(record.metadata.items()))
    header = front_matter.dump(front)
    return f"---\n{header}---\n\n{record.text}\n"


def _opt_time(value: datetime | None) -> str | None:
    return format_time(value) if value is not None else None


def content_sha256(content: str | bytes) -> str:
    data = content.encode("utf-8") if isinstance(content, str) else content
    return hashlib.sha256(data).hexdigest()


# --- parsing ---------------------------------------------------------------------------

_STRING_FIELDS = ("role", "user_id", "conversation_id", "source_id", "superseded_by", "tenant")
_TIME_FIELDS = ("created_at", "updated_at", "valid_from", "valid_to")
_KNOWN_KEYS = frozenset(
    {
        "id",
        "kind",
        "tenant",
        "tombstone",
        "turn_index",
        "source_turn_ids",
        "tags",
        "profile",
        "turn_range",
        "metadata",
        *_STRING_FIELDS,
        *_TIME_FIELDS,
    }
)

try:  # the C loader is much faster on a large tree
    _Loader: type[yaml.SafeLoader | yaml.CSafeLoader] = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - libyaml missing
    _Loader = yaml.SafeLoader


@dataclass(frozen=True)
class MirrorFile:
    """A parsed memory file."""

    record: MemoryRecord
    tenant: str
    tombstone: Tombstone | None
    assigned_id: bool  # the file had no id; ``new_id`` gave it one (write it back)


def parse(
    content: str,
    where: MirrorPath | None = None,
    *,
    new_id: Callable[[], str] | None = None,
) -> MirrorFile:
    """Read a memory file. Missing fields come from its place in the tree (``where``):
    tenant, user (under ``@<user>/``), conversation, kind and a turn's role.

    Raises :class:`MirrorFormatError` for anything that is not a valid memory: no
    front matter, invalid YAML, unknown keys, values of the wrong type or out of range
    (a turn position the index cannot store, a profile score outside 0..1), an id that
    is not a UUID, a tenant that contradicts the directory, an empty text.
    """
    front, body = _split(content)
    unknown = sorted(str(key) for key in front if key not in _KNOWN_KEYS)
    if unknown:
        raise MirrorFormatError(f"unknown front matter keys: {', '.join(unknown)}")
    fields: dict[str, Any] = {}
    for name in _STRING_FIELDS:
        value = _scalar_str(front.get(name), name)
        if value is not None:
            fields[name] = value
    for name in _TIME_FIELDS:
        when = _time(front.get(name), name)
        if when is not None:
            fields[name] = when

    tenant = fields.pop("tenant", None)
    if where is not None and where.tenant is not None:
        if tenant is not None and tenant != where.tenant:
            raise MirrorFormatError(
                f"tenant {tenant!r} in the front matter differs from the directory's "
                f"{where.tenant!r}"
            )
        tenant = tenant or where.tenant
    if not tenant:
        raise MirrorFormatError("no tenant (front matter 'tenant' or the directory name)")
    if "conversation_id" not in fields and where is not None and where.conversation_id:
        fields["conversation_id"] = where.conversation_id
    if "user_id" not in fields and where is not None and where.user_id:
        fields["user_id"] = where.user_id  # a file dropped into @<user>/ is that user's

    kind = _scalar_str(front.get("kind"), "kind") or (where.kind if where else None)
    if not kind:
        raise MirrorFormatError("no kind (front matter 'kind' or a kind directory)")
    fields["kind"] = kind
    if "role" not in fields and where is not None and where.role and _has_role(kind):
        fields["role"] = where.role

    raw_id = _scalar_str(front.get("id"), "id")
    assigned = False
    if not raw_id:
        if new_id is None:
            raise MirrorFormatError("no id in the front matter")
        raw_id, assigned = new_id(), True
    try:
        fields["id"] = str(uuid.UUID(raw_id))
    except ValueError:
        raise MirrorFormatError(f"id is not a UUID: {raw_id!r}") from None

    if "turn_index" in front and front["turn_index"] is not None:
        fields["turn_index"] = _index(front["turn_index"], "turn_index")
    for name in ("source_turn_ids", "tags"):
        listed = front.get(name)
        if listed is None:
            continue
        if isinstance(listed, str):
            listed = [listed]
        if not isinstance(listed, list):
            raise MirrorFormatError(f"{name}: should be a list")
        fields[name] = [_scalar_str(item, name) or "" for item in listed]
    if front.get("profile") is not None:
        fields["profile"] = _profile(front["profile"])
    if front.get("turn_range") is not None:
        fields["turn_range"] = _turn_range(front["turn_range"])
    if front.get("metadata") is not None:
        metadata = front["metadata"]
        if not isinstance(metadata, Mapping):
            raise MirrorFormatError("metadata: should be a mapping")
        fields["metadata"] = {
            str(key): _scalar_str(value, f"metadata.{key}") or "" for key, value in metadata.items()
        }
    fields["text"] = body

    try:
        record = MemoryRecord(**fields)
    except ValidationError as exc:
        raise MirrorFormatError(_describe(exc)) from None
    if not record.text.strip() and record.profile is None:
        raise MirrorFormatError("the body (the memory's text) is empty")

    tombstone = None
    if front.get("tombstone") is not None:
        raw = front["tombstone"]
        if not isinstance(raw, Mapping):
            raise MirrorFormatError("tombstone: should be a mapping")
        try:
            tombstone = Tombstone(
                reason=raw.get("reason"),
                at=_time(raw.get("at"), "tombstone.at"),
                cause=_scalar_str(raw.get("cause"), "tombstone.cause") or "",
            )
        except ValidationError as exc:
            raise MirrorFormatError(_describe(exc, prefix="tombstone.")) from None
    return MirrorFile(record=record, tenant=tenant, tombstone=tombstone, assigned_id=assigned)


def misplacement(parsed: MirrorFile, where: MirrorPath) -> str | None:
    """Why a parsed file does not belong where it lies, or None when it does.

    A file's front matter must name the scope of its directories: the tenant, the user
    (none in ``<tenant>/<conversation>/``, that user under ``@<user>/``) and the
    conversation. :func:`parse` fills what the front matter leaves out from the place,
    so this only fails for a file that names another scope than its folder's, or that
    lies under a shortened (unreadable) directory name without stating the id.
    """
    record, parts = parsed.record, where.path.parts
    if encode_component(parsed.tenant) != parts[0]:
        return _differs("tenant", parsed.tenant, parts[0], readable=where.tenant is not None)
    if where.scope_depth == 2 and record.user_id:
        return (
            f"user_id {record.user_id!r}, but the file is in a folder of memories with no "
            f"user; a user's memories belong under {user_component(record.user_id)!r}"
        )
    if where.scope_depth == 3 and (
        not record.user_id or user_component(record.user_id) != parts[1]
    ):
        return _differs("user_id", record.user_id, parts[1], readable=where.user_id is not None)
    conversation_dir = parts[where.scope_depth - 1]
    if encode_component(record.conversation_id) != conversation_dir:
        readable = where.conversation_id is not None
        return _differs("conversation_id", record.conversation_id, conversation_dir, readable)
    return None


def _differs(name: str, value: str, directory: str, readable: bool) -> str:
    message = f"{name} {value!r} differs from the directory {directory!r}"
    if not readable:
        message += (
            f" (a shortened id that cannot be read back from the name: write the {name} "
            "in the front matter)"
        )
    return message


def _split(content: str) -> tuple[dict[str, Any], str]:
    text = content.lstrip("\ufeff").replace("\r\n", "\n")
    if not text.startswith("---\n"):
        raise MirrorFormatError("no front matter (the file must start with a '---' line)")
    lines = text[4:].split("\n")
    for i, line in enumerate(lines):
        if line.rstrip() in ("---", "..."):
            header = "\n".join(lines[:i])
            body = "\n".join(lines[i + 1 :])
            break
    else:
        raise MirrorFormatError("the front matter is not closed by a '---' line")
    try:
        front = yaml.load(header, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 2})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or type(exc).__name__
        raise MirrorFormatError(f"front matter is not valid YAML{where}: {problem}") from None
    if front is None:
        front = {}
    if not isinstance(front, dict):
        raise MirrorFormatError("front matter must be a mapping of keys to values")
    if body.startswith("\n"):
        body = body[1:]
    if body.endswith("\n"):
        body = body[:-1]
    return front, body


def _scalar_str(value: Any, name: str) -> str | None:
    """Strings stay; numbers become strings (``source_id: 12``); None is 'absent'."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        raise MirrorFormatError(f"{name}: should be a string, not a boolean")
    if isinstance(value, (int, float)):
        return str(value)
    raise MirrorFormatError(f"{name}: should be a string")


def _time(value: Any, name: str) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, date):
        parsed = datetime(value.year, value.month, value.day)
    elif isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise MirrorFormatError(f"{name}: not an ISO 8601 time: {value!r}") from None
    else:
        raise MirrorFormatError(f"{name}: should be an ISO 8601 time")
    try:
        return storable_utc(parsed)
    except ValueError as exc:
        raise MirrorFormatError(f"{name}: {exc}") from None


def _turn_range(value: Any) -> tuple[int, int]:
    if isinstance(value, Mapping):
        first, last = value.get("first_turn"), value.get("last_turn")
    elif isinstance(value, list) and len(value) == 2:
        first, last = value
    else:
        raise MirrorFormatError("turn_range: should be {first_turn: N, last_turn: M}")
    first, last = _index(first, "turn_range.first_turn"), _index(last, "turn_range.last_turn")
    if first > last:
        raise MirrorFormatError(f"turn_range: first_turn {first} is after last_turn {last}")
    return (first, last)


def _index(value: Any, name: str) -> int:
    """A turn position: an integer the index can store (int64), never negative; a
    hand-typed ``1e30`` or ``-1`` is the file's error, not a write that fails later."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise MirrorFormatError(f"{name}: should be a whole number, not {_type_name(value)}")
    if not 0 <= value <= MAX_INDEX:
        raise MirrorFormatError(f"{name}: out of range ({value} is not in 0..{MAX_INDEX})")
    return value


def _profile(value: Any) -> Any:
    """The profile mapping, its scores checked here (finite numbers in 0..1, never a
    boolean) so the reason names the field; the model checks the rest."""
    if not isinstance(value, Mapping):
        raise MirrorFormatError("profile: should be a mapping")
    for name in PROFILE_SCORES:
        score = value.get(name)
        if score is None:
            continue
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise MirrorFormatError(f"profile.{name}: should be a number in 0..1")
        if not 0.0 <= score <= 1.0:  # NaN fails this too
            raise MirrorFormatError(f"profile.{name}: out of range ({score} is not in 0..1)")
    return value


def _type_name(value: Any) -> str:
    return "a boolean" if isinstance(value, bool) else f"a {type(value).__name__}"


def _describe(exc: ValidationError, prefix: str = "") -> str:
    """Field locations and messages only: the input may be private text."""
    parts = []
    for error in exc.errors(include_url=False, include_context=False, include_input=False):
        location = ".".join(str(part) for part in error["loc"]) or "front matter"
        parts.append(f"{prefix}{location}: {error['msg']}")
    return "; ".join(parts)


def id_from_name(name: str) -> str | None:
    """The id of a canonical ``<stamp>__<id>.md`` file name, else None."""
    match = _CANONICAL_NAME.match(name)
    return match.group("id") if match else None
