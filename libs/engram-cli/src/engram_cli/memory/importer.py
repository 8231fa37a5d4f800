"""``engram import FILE``: conversation history into memory, resumably.

Formats (``--format auto`` tells them apart by content):

- **openai**: records ``{"messages": [...], "conversation_id"?, "user_id"?, "created_at"?}``
  where ``messages`` is a Chat Completions message list (``content`` a string or an
  array of parts; a message may carry its own ``created_at``). The file is either JSON
  (one record, or a list of records) or JSONL (one record per line).
- **locomo**: the LoCoMo benchmark's JSON (``engram_cli.bench.locomo.dataset``); each sample
  is a conversation named by its ``sample_id``, turns dated by their session.

Two ways in:

- ``--via http`` (default): ``POST /v1/memories/add`` on the gateway, so extraction and
  reconcile learn from what the user said. Only user messages are sent (that is what
  the write path mines for facts); one request per run of up to 100 user messages
  that share a timestamp.
- ``--via grpc``: retrieval's ``Upsert``, every user/assistant message as a ``turn``
  memory (bulk history: indexed and searchable, no LLM involved).

The whole file is parsed and validated before anything is sent, so bad input changes
nothing. Work is cut into units (one request each); a state file under
``<data_dir>/imports/`` records each unit once it was accepted, and a re-run skips
them. Ids are deterministic besides (gRPC: ``source_id`` from the record's content and
the message's position; HTTP: ``X-Request-Id`` from the unit's content, which fixes
the event and turn ids), so sending a unit twice stores it once.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TextIO

from faststream.nats import NatsBroker
from pydantic import ValidationError

from engram_cli.cli_common import (
    CliSettings,
    CommandError,
    DoneLog,
    add_data_dir_flag,
    add_gateway_flags,
    add_nats_flag,
    add_retrieval_flag,
    cli_settings,
    connect_announcer,
)
from engram_cli.console import ProgressCallback
from engram_cli.records import new_memory
from engram_client import AsyncEngramClient, EngramError, EventTimeout, GatewayUnreachable
from engram_core import lifecycle
from engram_core.bus import publish_event
from engram_core.events import MemoryChanged, MemoryChangeOp
from engram_core.memory import UpsertStatus
from engram_core.memory_port import MemoryPort, RetrievalError
from engram_core.retrieval_client import RetrievalClient
from engram_core.timestamps import storable_utc

Via = Literal["http", "grpc"]
#: ``POST /v1/memories/add`` takes at most 100 texts.
HTTP_UNIT = 100
#: How long an HTTP import waits to tell whether its texts are being learned from.
LEARNING_WAIT_S = 5.0
#: Memories per Upsert call.
GRPC_UNIT = 256
ROLES = ("user", "assistant", "system", "tool", "developer", "function")
STATE_VERSION = 1


class ImportFormatError(CommandError):
    """The input is not what it should be; the message names the line or record."""


@dataclass(frozen=True)
class Message:
    role: str
    text: str
    index: int  # position in the record's message list
    created_at: datetime | None = None
    source_id: str = ""
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Conversation:
    where: str  # "line 3", "record 2", "sample conv-26"
    conversation_id: str
    user_id: str
    messages: tuple[Message, ...]


@dataclass(frozen=True)
class Unit:
    """One request's worth of work; ``key`` identifies it across runs."""

    key: str
    where: str
    conversation: Conversation
    messages: tuple[Message, ...]
    created_at: datetime | None = None


# --- reading ---------------------------------------------------------------------------------


def detect_and_parse(
    path: Path, fmt: str = "auto", *, user: str = "", conversation: str = "default"
) -> tuple[str, list[Conversation]]:
    """(format name, conversations) or :class:`ImportFormatError`."""
    try:
        raw = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise CommandError(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise ImportFormatError(f"{path}: not UTF-8 text ({exc})") from None
    if not raw.strip():
        raise ImportFormatError(f"{path}: the file is empty")
    document: Any = None
    try:
        document = json.loads(raw)
        whole_json = True
    except json.JSONDecodeError as exc:
        whole_json = False
        if raw.lstrip().startswith("["):  # meant as one JSON document, not JSONL
            raise ImportFormatError(
                f"{path}:{exc.lineno}: not JSON ({exc.msg} at column {exc.colno})"
            ) from None

    if fmt == "locomo" or (fmt == "auto" and whole_json and _looks_like_locomo(document)):
        if not whole_json:
            raise ImportFormatError(f"{path}: LoCoMo files are one JSON document; this is not JSON")
        return "locomo", _from_locomo(path, document, user)
    if fmt not in ("auto", "openai"):
        raise CommandError(f"unknown format {fmt!r} (auto, openai, locomo)")

    if whole_json:
        if isinstance(document, dict):
            items = [("record 1", document)]
        elif isinstance(document, list):
            items = [(f"record {i + 1}", item) for i, item in enumerate(document)]
        else:
            raise ImportFormatError(
                f"{path}: unknown format: expected an object with messages, a list of them, "
                "or a LoCoMo file"
            )
        if not items:
            raise ImportFormatError(f"{path}: the list holds no records")
        if fmt == "auto" and not _looks_like_openai(items[0][1]):
            raise ImportFormatError(
                f"{path}: unknown format: {items[0][0]} has no 'messages' (expected OpenAI "
                'message lists {"messages": [...]} or a LoCoMo file; see docs/cli.md)'
            )
    else:
        items = []
        for number, line in enumerate(raw.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                items.append((f"line {number}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ImportFormatError(
                    f"{path}:{number}: not JSON ({exc.msg} at column {exc.colno}); expected one "
                    "record per line (JSONL) or one JSON document"
                ) from None
        if fmt == "auto" and not _looks_like_openai(items[0][1]):
            raise ImportFormatError(
                f"{path}: unknown format: {items[0][0]} has no 'messages' (see docs/cli.md)"
            )
    conversations = [
        _openai_record(path, where, item, user=user, conversation=conversation)
        for where, item in items
    ]
    return "openai", conversations


def _looks_like_locomo(document: Any) -> bool:
    return (
        isinstance(document, list)
        and bool(document)
        and isinstance(document[0], dict)
        and "conversation" in document[0]
    )


def _looks_like_openai(item: Any) -> bool:
    return isinstance(item, dict) and "messages" in item


def _from_locomo(path: Path, document: Any, user: str) -> list[Conversation]:
    from engram_cli.bench.locomo.dataset import LocomoFormatError, parse_samples

    try:
        samples = parse_samples(document)
    except LocomoFormatError as exc:
        raise ImportFormatError(f"{path}: {exc}") from None
    conversations = []
    for sample in samples:
        speaker_a = sample.speakers[0]
        messages = tuple(
            Message(
                # both speakers are people; the first one plays the user (as in the benchmark)
                role="user" if turn.speaker == speaker_a else "assistant",
                text=turn.memory_text,
                index=i,
                created_at=turn.created_at,
                source_id=turn.dia_id,
                metadata={"speaker": turn.speaker, "session": str(turn.session)},
            )
            for i, turn in enumerate(sample.turns)
        )
        conversations.append(
            Conversation(f"sample {sample.sample_id}", sample.sample_id, user, messages)
        )
    return conversations


def _conversation_problem(value: str) -> str | None:
    if not 1 <= len(value) <= 200:
        return "must be 1-200 characters"
    if any(ch in value for ch in "/\\") or any(ord(ch) < 32 or ord(ch) == 127 for ch in value):
        return "must not contain '/', '\\' or control characters"
    if value.startswith("."):
        return "must not start with '.'"
    return None


def _time(value: Any, where: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ImportFormatError(f"{where}: expected an ISO 8601 string")
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ImportFormatError(f"{where}: not an ISO 8601 time: {value!r}") from None
    if parsed.tzinfo is None:
        raise ImportFormatError(f"{where}: {value!r} has no time zone")
    try:
        storable_utc(parsed)
    except ValueError as exc:
        raise ImportFormatError(f"{where}: {value!r} is {exc}") from None
    return parsed


def _content_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""  # an assistant message with tool calls only
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise ImportFormatError(f"{where}.content[{i}]: expected a content part object")
            if part["type"] == "text":
                if not isinstance(part.get("text"), str):
                    raise ImportFormatError(f"{where}.content[{i}].text: expected a string")
                parts.append(part["text"])
        return "\n".join(parts)
    raise ImportFormatError(f"{where}.content: expected a string or a list of content parts")


def _openai_record(
    path: Path, where: str, item: Any, *, user: str, conversation: str
) -> Conversation:
    at = f"{path}: {where}"
    if not isinstance(item, dict):
        raise ImportFormatError(f"{at}: expected an object with 'messages'")
    unknown = set(item) - {"messages", "conversation_id", "user_id", "created_at", "metadata"}
    if unknown:
        raise ImportFormatError(f"{at}: unknown field(s) {', '.join(sorted(unknown))}")
    messages = item.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ImportFormatError(f"{at}: 'messages' must be a non-empty list")
    conversation_id = item.get("conversation_id", conversation)
    if not isinstance(conversation_id, str):
        raise ImportFormatError(f"{at}: conversation_id must be a string")
    if (problem := _conversation_problem(conversation_id)) is not None:
        raise ImportFormatError(f"{at}: conversation_id {problem}")
    user_id = item.get("user_id", user)
    if not isinstance(user_id, str) or len(user_id) > 200:
        raise ImportFormatError(f"{at}: user_id must be a string of at most 200 characters")
    record_at = _time(item.get("created_at"), f"{at}: created_at")
    # The record's content names its messages: stable across runs, distinct across records.
    fingerprint = hashlib.sha256(
        json.dumps([conversation_id, user_id, messages], sort_keys=True).encode()
    ).hexdigest()[:16]
    parsed = []
    for i, message in enumerate(messages):
        m_at = f"{at}: messages[{i}]"
        if not isinstance(message, dict):
            raise ImportFormatError(f"{m_at}: expected an object with role and content")
        role = message.get("role")
        if role not in ROLES:
            raise ImportFormatError(
                f"{m_at}.role: expected one of {', '.join(ROLES)}, got {role!r}"
            )
        if "content" not in message:
            raise ImportFormatError(f"{m_at}: missing 'content'")
        text = _content_text(message["content"], m_at)
        created_at = _time(message.get("created_at"), f"{m_at}.created_at") or record_at
        parsed.append(
            Message(
                role=role,
                text=text,
                index=i,
                created_at=created_at,
                source_id=f"import:{fingerprint}:{i}",
            )
        )
    return Conversation(where, conversation_id, user_id, tuple(parsed))


# --- planning --------------------------------------------------------------------------------


def plan_units(conversations: list[Conversation], via: Via) -> list[Unit]:
    """Cut the work into requests. HTTP: runs of user messages that share a timestamp (the
    endpoint takes one ``created_at``), at most 100. gRPC: user/assistant turns, 256 a unit."""
    units: list[Unit] = []
    for conversation in conversations:
        if via == "http":
            wanted = [m for m in conversation.messages if m.role == "user" and m.text.strip()]
            runs: list[list[Message]] = []
            for message in wanted:
                if (
                    runs
                    and runs[-1][-1].created_at == message.created_at
                    and len(runs[-1]) < HTTP_UNIT
                ):
                    runs[-1].append(message)
                else:
                    runs.append([message])
        else:
            wanted = [
                m
                for m in conversation.messages
                if m.role in ("user", "assistant") and m.text.strip()
            ]
            runs = [wanted[i : i + GRPC_UNIT] for i in range(0, len(wanted), GRPC_UNIT)]
        for run in runs:
            key = hashlib.sha256(
                json.dumps(
                    [
                        via,
                        conversation.conversation_id,
                        conversation.user_id,
                        [
                            [m.role, m.text, m.source_id, m.created_at and m.created_at.isoformat()]
                            for m in run
                        ],
                    ]
                ).encode()
            ).hexdigest()
            first, last = run[0].index, run[-1].index
            units.append(
                Unit(
                    key=key,
                    where=f"{conversation.where}, messages {first}-{last}",
                    conversation=conversation,
                    messages=tuple(run),
                    created_at=run[0].created_at,
                )
            )
    return units


def skipped_counts(conversations: list[Conversation], units: list[Unit]) -> int:
    total = sum(len(c.messages) for c in conversations)
    return total - sum(len(u.messages) for u in units)


# --- the state file --------------------------------------------------------------------------


class ImportState(DoneLog):
    """The import's :class:`DoneLog`: one line per unit accepted."""

    def __init__(self, path: Path) -> None:
        super().__init__(path, {"engram_import_state": STATE_VERSION})

    def record_unit(self, unit: Unit) -> None:
        self.record(unit.key, messages=len(unit.messages))


def state_path(settings: CliSettings, source: Path, via: Via, destination: str) -> Path:
    """One state file per (input file, path in, destination) under the data dir."""
    digest = hashlib.sha256(
        json.dumps([str(source.resolve()), via, destination]).encode()
    ).hexdigest()[:16]
    return settings.data_dir / "imports" / f"{source.name}.{digest}.state.jsonl"


# --- sending ---------------------------------------------------------------------------------


class Sender:
    async def check(self) -> None:
        """Fail fast, before anything is sent, when a dependency is not there."""
        return None

    async def send(self, unit: Unit) -> dict[str, int]:
        raise NotImplementedError

    async def close(self) -> None:
        return None


class HttpSender(Sender):
    """Each unit through ``POST /v1/memories/add`` with the Python client."""

    def __init__(self, settings: CliSettings, model: str) -> None:
        self.base = settings.gateway_url.rstrip("/")
        self.model = model
        self.event_ids: list[str] = []
        key = settings.api_key.get_secret_value() if settings.api_key else None
        self.engram = AsyncEngramClient(self.base, key, timeout_s=60.0)

    async def send(self, unit: Unit) -> dict[str, int]:
        # The request id fixes the event (and turn) ids: a re-sent unit is de-duplicated.
        engram = self.engram.with_headers({"X-Request-Id": f"import-{unit.key[:40]}"})
        try:
            accepted = await engram.add(
                [m.text for m in unit.messages],
                user=unit.conversation.user_id,
                conversation=unit.conversation.conversation_id,
                created_at=unit.created_at,
                model=self.model,
            )
        except GatewayUnreachable as exc:
            raise CommandError(f"gateway at {self.base} unreachable: {exc.message}") from None
        except EngramError as exc:
            refusal = f"{exc.status} {exc.code or exc.type}: {exc.message}"
            raise CommandError(f"{unit.where}: the gateway refused it: {refusal}") from None
        except ValidationError as exc:  # what the API's own model refuses, before any call
            raise CommandError(f"{unit.where}: the gateway would refuse it: {exc}") from None
        self.event_ids += accepted.event_ids
        return {"accepted": len(accepted.event_ids)}

    async def learning_status(self, wait_s: float) -> dict[str, Any] | None:
        """The status of the first text accepted (``GET /v1/events/{id}``), waiting up to
        ``wait_s`` for it to leave ``pending``; None when nothing was accepted."""
        if not self.event_ids:
            return None
        try:
            (status,) = await self.engram.wait(self.event_ids[:1], timeout_s=wait_s, poll_s=0.2)
        except EventTimeout as pending:
            (status,) = pending.events
        except EngramError:
            return {}
        return status.model_dump(mode="json")

    async def close(self) -> None:
        await self.engram.aclose()


class GrpcSender(Sender):
    """Bulk turns through retrieval's Upsert (ids derived by retrieval, so a re-import is a
    no-op), each written memory announced on ``engram.memory.changed.v1`` (cause
    ``import``) so the mirror keeps it (and summarize and evict see it): every write path
    ends in the mirror. Without NATS the import refuses to start."""

    def __init__(self, settings: CliSettings, tenant: str) -> None:
        self.tenant = tenant
        self.nats_url = settings.nats_url
        self.replicas = settings.stream_replicas
        self.retry = settings.retry_policy
        self.client = RetrievalClient(settings.retrieval_address, timeout_s=30.0)
        self.memories = MemoryPort(self.client)
        self.broker: NatsBroker | None = None

    async def check(self) -> None:
        if not await self.client.is_serving(timeout_s=5.0):
            raise CommandError(f"retrieval at {self.client.address} is not serving")
        self.broker = await connect_announcer(
            self.nats_url,
            "import --via grpc",
            replicas=self.replicas,
            duplicate_window_s=self.retry.duplicate_window_s,
        )

    async def send(self, unit: Unit) -> dict[str, int]:
        records = [
            new_memory(
                self.tenant,
                kind="turn",
                role=m.role,
                text=m.text,
                user_id=unit.conversation.user_id,
                conversation_id=unit.conversation.conversation_id,
                source_id=m.source_id,
                turn_index=m.index,
                created_at=m.created_at,
                metadata={**m.metadata, "created_by": "import"},
            )
            for m in unit.messages
        ]
        try:
            stored = await self.memories.upsert(self.tenant, records)
        except RetrievalError as exc:
            raise CommandError(f"{unit.where}: {exc}") from None
        counts: dict[str, int] = {}
        for written in stored:
            counts[written.status.value] = counts.get(written.status.value, 0) + 1
            # Unchanged ones too: an import made before imports were mirrored is
            # mirrored when run again (the same state is the same event id).
            op: MemoryChangeOp = "updated" if written.status is UpsertStatus.UPDATED else "created"
            await self._announce(lifecycle.change(self.tenant, written.record, op, cause="import"))
        return counts

    async def _announce(self, event: MemoryChanged) -> None:
        assert self.broker is not None, "check() connects first"
        try:
            await publish_event(self.broker, event, retry_s=self.retry.publish_retry_s)
        except Exception as exc:
            raise CommandError(
                f"NATS did not accept the announcement of {event.memory.id} "
                f"({type(exc).__name__}); re-run to resume"
            ) from None

    async def close(self) -> None:
        if self.broker is not None:
            await self.broker.stop()
        await self.client.close()


@dataclass
class ImportResult:
    fmt: str
    units: int = 0
    skipped_units: int = 0  # done in an earlier run
    sent_messages: int = 0
    not_sendable: int = 0  # roles or empty texts this path does not take
    counts: dict[str, int] = field(default_factory=dict)
    state_file: Path | None = None
    #: What became of the first accepted text (HTTP imports): learned, or skipped and why.
    learning: dict[str, Any] | None = None


async def run_import(
    source: Path,
    settings: CliSettings,
    *,
    via: Via = "http",
    fmt: str = "auto",
    tenant: str = "default",
    user: str = "",
    conversation: str = "default",
    model: str = "",
    state_file: Path | None = None,
    limit_units: int | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> ImportResult:
    """Import ``source``; ``limit_units`` stops after that many units (tests, dry runs)."""
    name, conversations = detect_and_parse(source, fmt, user=user, conversation=conversation)
    units = plan_units(conversations, via)
    destination = (
        settings.gateway_url if via == "http" else f"{settings.retrieval_address}/{tenant}"
    )
    path = state_file or state_path(settings, source, via, destination)
    state = ImportState(path)
    result = ImportResult(name, units=len(units), state_file=path)
    result.not_sendable = skipped_counts(conversations, units)
    todo = [u for u in units if u.key not in state.done]
    result.skipped_units = len(units) - len(todo)
    total = sum(len(u.messages) for u in todo)
    sender: Sender
    sender = HttpSender(settings, model) if via == "http" else GrpcSender(settings, tenant)
    done = 0
    try:
        if todo:
            await sender.check()
        if on_progress:
            on_progress(0, total)
        for n, unit in enumerate(todo):
            if limit_units is not None and n >= limit_units:
                break
            counts = await sender.send(unit)
            state.record_unit(unit)
            for key, value in counts.items():
                result.counts[key] = result.counts.get(key, 0) + value
            done += len(unit.messages)
            result.sent_messages = done
            if on_progress:
                on_progress(done, total)
        if isinstance(sender, HttpSender):
            result.learning = await sender.learning_status(LEARNING_WAIT_S)
    finally:
        state.close()
        await sender.close()
    return result


# --- the command -----------------------------------------------------------------------------


def add_import_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    parser = commands.add_parser(
        "import",
        help="import conversations (OpenAI message lists or LoCoMo) into memory",
        description=(
            "Import conversation history. FILE holds OpenAI-format records "
            '{"messages": [...], "conversation_id"?, "user_id"?, "created_at"?} as JSON (one '
            "or a list) or JSONL, or a LoCoMo file (detected). Resumable: a state file under "
            "<data_dir>/imports/ records what was sent; a re-run skips it."
        ),
    )
    parser.add_argument("file", type=Path, metavar="FILE")
    parser.add_argument(
        "--via",
        choices=("http", "grpc"),
        default="http",
        help="http: POST /v1/memories/add on the gateway (extraction + reconcile learn from "
        "user messages; default); grpc: retrieval Upsert of every turn (bulk history)",
    )
    parser.add_argument("--format", choices=("auto", "openai", "locomo"), default="auto")
    parser.add_argument("--tenant", default="default", help="grpc only (http: the key decides)")
    parser.add_argument("--user", default="", help="user_id for records that name none")
    parser.add_argument(
        "--conversation", default="default", help="conversation_id for records that name none"
    )
    parser.add_argument(
        "--model",
        default="",
        help="http: the model extraction uses, unless the workers name one "
        "(default: $ENGRAM_LLM_MODEL; with neither, no facts are extracted)",
    )
    parser.add_argument("--state-file", type=Path, help="where to record progress")
    add_data_dir_flag(parser)
    add_gateway_flags(parser)
    add_retrieval_flag(parser)
    add_nats_flag(parser)
    parser.set_defaults(func=handler)


def import_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    settings = cli_settings(args)

    try:
        with ProgressCallback("import") as bar:
            result = asyncio.run(
                run_import(
                    args.file,
                    settings,
                    via=args.via,
                    fmt=args.format,
                    tenant=args.tenant,
                    user=args.user,
                    conversation=args.conversation,
                    model=args.model or settings.llm_model,
                    state_file=args.state_file,
                    on_progress=bar,
                )
            )
    except CommandError as exc:
        print(f"engram import: {exc}", file=sys.stderr)
        if not isinstance(exc, ImportFormatError):
            print("engram import: what was sent is recorded; re-run to resume", file=sys.stderr)
        return 2
    counts = ", ".join(f"{k} {v}" for k, v in sorted(result.counts.items())) or "nothing new"
    print(
        f"imported {result.sent_messages} messages from {args.file} ({result.fmt}, via "
        f"{args.via}) in {result.units - result.skipped_units} requests: {counts}",
        file=out,
    )
    if result.skipped_units:
        print(
            f"skipped {result.skipped_units} requests already sent (state: {result.state_file})",
            file=out,
        )
    if result.not_sendable:
        what = "non-user or empty" if args.via == "http" else "system/tool or empty"
        print(f"not sent: {result.not_sendable} {what} messages", file=out)
    learning = result.learning or {}
    if learning.get("status") == "skipped":
        print(
            f"engram import: warning: the texts were stored but nothing was learned from "
            f"them: {learning.get('reason') or 'skipped'}",
            file=sys.stderr,
        )
    elif learning.get("status") == "pending":
        print(
            "facts are still being learned in the background; follow one with "
            f"GET /v1/events/{learning.get('id')}",
            file=out,
        )
    return 0
