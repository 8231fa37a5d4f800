"""``engram rebuild``: re-create the index from the file mirror.

Every live memory file is upserted through retrieval's gRPC ``Upsert`` with its
original id, in batches. Superseded facts kept under ``deleted/`` are upserted too,
still superseded (so ``history`` survives a rebuild); tombstones of deleted and
evicted memories are not: those memories were removed on purpose. Retrieval embeds
what it stores, so a rebuild also re-embeds with the current model.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from engram_cli.cli_common import add_data_dir_flag, add_retrieval_flag, cli_settings
from engram_cli.console import ProgressBar
from engram_core.memory import MemoryRecord
from engram_core.memory_port import MemoryPort, RetrievalError
from engram_core.mirror_format import (
    MirrorFormatError,
    classify,
    encode_component,
    memory_files,
    parse,
)
from engram_core.retrieval_client import RetrievalClient

#: Retrieval accepts at most 2048 memories per Upsert.
MAX_BATCH = 2048


def add_rebuild_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    parser = commands.add_parser(
        "rebuild",
        help="re-create the index from the Markdown file mirror",
        description=(
            "Upsert every memory of the file mirror into the index through the retrieval "
            "service, with its original id. Superseded facts under deleted/ are restored "
            "as superseded; deleted and evicted tombstones are not re-indexed."
        ),
    )
    parser.add_argument(
        "--mirror-root",
        type=Path,
        help="the mirror (default: $ENGRAM_MIRROR_ROOT or $ENGRAM_DATA_DIR/mirror)",
    )
    parser.add_argument("--tenant", help="rebuild only this tenant (default: all)")
    add_retrieval_flag(parser)
    add_data_dir_flag(parser)
    parser.add_argument(
        "--batch-size",
        type=int,
        default=256,
        help=f"memories per Upsert call (1..{MAX_BATCH}, default 256)",
    )
    parser.set_defaults(func=handler)


@dataclass
class Plan:
    """What the mirror holds, sorted into what to index and what to leave out."""

    memories: dict[str, tuple[str, MemoryRecord]] = field(default_factory=dict)  # id -> (tenant, r)
    live: int = 0
    superseded: int = 0
    tombstones: Counter[str] = field(default_factory=Counter)  # reason -> skipped files
    malformed: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)
    duplicates: list[str] = field(default_factory=list)


def plan_rebuild(root: Path, tenant: str | None = None) -> Plan:
    """Read the mirror. Live files win over a tombstone of the same id."""
    if not root.is_dir():
        raise FileNotFoundError(root)
    plan = Plan()
    superseded: dict[str, tuple[str, MemoryRecord]] = {}
    tenant_dir = encode_component(tenant) if tenant else None
    for rel in memory_files(root, tenant_dir):
        info = classify(rel)
        if info is None:
            continue
        try:
            parsed = parse((root / rel).read_text(encoding="utf-8"), info)
        except (MirrorFormatError, UnicodeDecodeError, OSError) as exc:
            plan.malformed.append((rel, str(exc)))
            continue
        if tenant is not None and parsed.tenant != tenant:
            continue
        record = parsed.record
        if info.deleted:
            reason = parsed.tombstone.reason if parsed.tombstone else "unknown"
            if reason == "superseded" and record.superseded_by:
                superseded[record.id] = (parsed.tenant, record)
            else:
                plan.tombstones[reason] += 1
            continue
        # (A tombstone moved back into the live tree by hand is live again.)
        if record.id in plan.memories:
            plan.duplicates.append(rel)
            continue
        plan.memories[record.id] = (parsed.tenant, record)
        plan.live += 1
    for memory_id, entry in superseded.items():
        if memory_id not in plan.memories:
            plan.memories[memory_id] = entry
            plan.superseded += 1
    return plan


async def rebuild(
    root: Path,
    address: str,
    *,
    tenant: str | None = None,
    batch_size: int = 256,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    try:
        plan = await asyncio.to_thread(plan_rebuild, root, tenant)
    except FileNotFoundError:
        print(f"engram rebuild: no mirror at {root}", file=err)
        return 2
    for rel, reason in plan.malformed:
        print(f"engram rebuild: skipped {rel}: {reason}", file=err)
    for rel in plan.duplicates:
        print(f"engram rebuild: skipped {rel}: another file has the same id", file=err)

    client = RetrievalClient(address, timeout_s=30.0)
    statuses: Counter[str] = Counter()
    try:
        if not await client.is_serving(timeout_s=5.0):
            print(f"engram rebuild: retrieval at {address} is not serving", file=err)
            return 2
        by_tenant: dict[str, list[MemoryRecord]] = {}
        for memory_tenant, record in plan.memories.values():
            by_tenant.setdefault(memory_tenant, []).append(record)
        progress = ProgressBar("rebuild", len(plan.memories), stream=err)
        memories = MemoryPort(client)
        for memory_tenant in sorted(by_tenant):
            records = by_tenant[memory_tenant]
            for start in range(0, len(records), batch_size):
                # updated_at is the service's to set
                chunk = [
                    r.model_copy(update={"updated_at": None})
                    for r in records[start : start + batch_size]
                ]
                try:
                    stored = await memories.upsert(memory_tenant, chunk)
                except RetrievalError as exc:
                    progress.close()
                    print(f"engram rebuild: tenant {memory_tenant!r}: {exc}", file=err)
                    return 2
                for item in stored:
                    statuses[item.status.name] += 1
                progress.advance(len(chunk))
    finally:
        await client.close()

    skipped = sum(plan.tombstones.values())
    print(
        f"rebuilt {len(plan.memories)} memories from {root}: "
        f"{plan.live} live, {plan.superseded} superseded "
        f"(created {statuses['CREATED']}, updated {statuses['UPDATED']}, "
        f"unchanged {statuses['UNCHANGED']})",
        file=out,
    )
    reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(plan.tombstones.items()))
    print(f"not re-indexed: {skipped} tombstones" + (f" ({reasons})" if reasons else ""), file=out)
    if plan.malformed or plan.duplicates:
        print(
            f"skipped: {len(plan.malformed)} unreadable files, {len(plan.duplicates)} duplicates",
            file=out,
        )
        return 1
    return 0


def run_rebuild(args: argparse.Namespace) -> int:
    settings = cli_settings(args)
    root = settings.mirror
    if not 1 <= args.batch_size <= MAX_BATCH:
        print(f"engram rebuild: --batch-size must be in 1..{MAX_BATCH}", file=sys.stderr)
        return 2
    return asyncio.run(
        rebuild(
            Path(root),
            settings.retrieval_address,
            tenant=args.tenant,
            batch_size=args.batch_size,
        )
    )
