"""``engram export``: a tenant's memories as JSON lines (retrieval ``List``), or a copy
of its directory in the Markdown mirror (``--mirror``; with ``--user``, only the files
whose front matter names that user)."""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TextIO

from engram_cli.cli_common import (
    CliSettings,
    CommandError,
    add_data_dir_flag,
    add_retrieval_flag,
    cli_settings,
)
from engram_cli.console import ProgressCallback
from engram_core.memory import KIND_NAMES, MemoryFilter, MemoryKindName, MemoryRecord
from engram_core.memory_port import MemoryPort, RetrievalError
from engram_core.mirror_format import (
    MirrorFormatError,
    classify,
    encode_component,
    memory_files,
    parse,
)
from engram_core.retrieval_client import RetrievalClient

PAGE = 500


def memory_line(record: MemoryRecord, tenant: str, embedding_model: str) -> str:
    """One memory as JSON: the mirror's record fields plus ``tenant`` and the model that
    embedded it."""
    return json.dumps(
        {"tenant": tenant, **record.model_dump(mode="json"), "embedding_model": embedding_model},
        ensure_ascii=False,
    )


async def export_jsonl(
    settings: CliSettings,
    tenant: str,
    out: TextIO,
    *,
    kinds: Sequence[MemoryKindName] | None = None,
    include_superseded: bool = False,
    user: str | None = None,
    conversation: str = "",
    on_progress: Callable[[int, int], None] | None = None,
) -> int:
    """Write the memories the filter selects; ``user`` None is every user, ``""`` only
    the memories with no user."""
    client = RetrievalClient(settings.retrieval_address, timeout_s=30.0)
    memories = MemoryPort(client)
    flt = MemoryFilter(
        kinds=tuple(kinds or ()),
        include_superseded=include_superseded,
        conversation_id=conversation or None,
        user_id=user,
    )
    written = 0
    try:
        if not await client.is_serving(timeout_s=5.0):
            raise CommandError(f"retrieval at {settings.retrieval_address} is not serving")
        total = (await memories.count(tenant, flt)).total
        async for page in memories.iter_pages(tenant, flt):
            for record in page.records:
                out.write(memory_line(record, tenant, page.embedding_models[record.id]) + "\n")
            written += len(page.records)
            if on_progress:
                on_progress(written, max(total, written))
    except RetrievalError as exc:
        raise CommandError(str(exc)) from None
    finally:
        await client.close()
    return written


@dataclass
class MirrorCopy:
    files: int  # memory files copied
    unreadable: list[str]  # files whose user could not be read (not copied)


def export_mirror(settings: CliSettings, tenant: str, target: Path, user: str = "") -> MirrorCopy:
    """Copy ``<mirror>/<tenant>/`` (live files and tombstones) to ``target``; with a
    ``user``, only that user's files (by their front matter, so a tree from before
    users had folders is filtered correctly too)."""
    source = settings.mirror / encode_component(tenant)
    if not source.is_dir():
        raise CommandError(f"no mirror for tenant {tenant!r} at {source}")
    if target.exists() and any(target.iterdir()):
        raise CommandError(f"{target} exists and is not empty")
    if not user:
        shutil.copytree(source, target, dirs_exist_ok=True)
        return MirrorCopy(sum(1 for p in target.rglob("*.md") if p.is_file()), [])
    mine, unreadable = _user_files(settings.mirror, source.name, user)
    if not mine:
        raise CommandError(f"no memory files of user {user!r} in tenant {tenant!r} at {source}")
    for rel in mine:
        inside = PurePosixPath(rel).relative_to(source.name)
        (target / inside).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(settings.mirror / rel, target / inside)
    return MirrorCopy(len(mine), unreadable)


def _user_files(root: Path, tenant_dir: str, user: str) -> tuple[list[str], list[str]]:
    mine, unreadable = [], []
    for rel in memory_files(root, tenant_dir):
        try:
            parsed = parse((root / rel).read_text(encoding="utf-8"), classify(rel))
        except (MirrorFormatError, UnicodeDecodeError, OSError):
            unreadable.append(rel)
            continue
        if parsed.record.user_id == user:
            mine.append(rel)
    return mine, unreadable


def add_export_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    parser = commands.add_parser(
        "export",
        help="export a tenant's memories as JSON lines, or copy its mirror directory",
        description=(
            "Write every memory of a tenant (all kinds, newest first) as one JSON object per "
            "line, read through retrieval's List; or, with --mirror DIR, copy the tenant's "
            "directory of the Markdown mirror."
        ),
    )
    parser.add_argument("--tenant", default="default")
    parser.add_argument("-o", "--output", type=Path, help="JSONL file (default: stdout)")
    parser.add_argument(
        "--include-superseded", action="store_true", help="also the superseded versions"
    )
    parser.add_argument(
        "--kind", action="append", choices=sorted(KIND_NAMES), help="only these kinds"
    )
    parser.add_argument(
        "--user",
        default=None,
        help='only this user\'s memories ("": those with no user; with --mirror: their files)',
    )
    parser.add_argument("--conversation", default="", help="only this conversation")
    parser.add_argument(
        "--mirror", type=Path, metavar="DIR", help="copy the tenant's mirror directory to DIR"
    )
    parser.add_argument("--mirror-root", type=Path, help="default: $ENGRAM_MIRROR_ROOT")
    add_data_dir_flag(parser)
    add_retrieval_flag(parser)
    parser.set_defaults(func=handler)


def export_command(args: argparse.Namespace) -> int:
    settings = cli_settings(args)
    try:
        if args.mirror is not None:
            return _export_mirror(settings, args)
        if args.output is None:
            count = asyncio.run(_export(settings, args, sys.stdout, show=False))
        else:
            partial = args.output.with_name(args.output.name + ".partial")
            try:
                with partial.open("w", encoding="utf-8") as handle:
                    count = asyncio.run(_export(settings, args, handle, show=True))
            except BaseException:
                partial.unlink(missing_ok=True)
                raise
            partial.replace(args.output)  # a complete file or none
        where = args.output or "stdout"
        print(f"exported {count} memories of tenant {args.tenant!r} to {where}", file=sys.stderr)
        return 0
    except CommandError as exc:
        print(f"engram export: {exc}", file=sys.stderr)
        return 2


def _export_mirror(settings: CliSettings, args: argparse.Namespace) -> int:
    if args.kind or args.conversation:
        raise CommandError("--kind and --conversation filter JSON lines; --mirror copies files")
    copied = export_mirror(settings, args.tenant, args.mirror, user=args.user or "")
    whose = f"user {args.user!r} of tenant" if args.user else "tenant"
    print(f"copied {copied.files} memory files of {whose} {args.tenant!r} to {args.mirror}")
    for rel in copied.unreadable:
        print(f"engram export: not copied (its user cannot be read): {rel}", file=sys.stderr)
    return 0


async def _export(
    settings: CliSettings, args: argparse.Namespace, out: TextIO, *, show: bool
) -> int:
    with ProgressCallback("export") as bar:
        return await export_jsonl(
            settings,
            args.tenant,
            out,
            kinds=args.kind,
            include_superseded=args.include_superseded,
            user=args.user,
            conversation=args.conversation,
            on_progress=bar if show else None,
        )
