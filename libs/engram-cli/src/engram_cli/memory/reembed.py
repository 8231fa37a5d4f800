"""``engram reembed``: after an embedding model change, re-embed every memory in place.

Each memory is read with ``List`` (the port's pages) (all kinds, superseded versions included) and
upserted back unchanged. Retrieval compares the stored ``embedding_model`` and
``embed_hash`` (model id + index text) with its own: a point embedded by another model
is re-embedded and rewritten (``UPDATED``), one already current is left alone
(``UNCHANGED``). Until its batch is rewritten a point keeps its old vector, so the
index stays searchable throughout; re-running is cheap and finishes what an
interrupted run left.

A store written before token vectors existed ranks without late interaction (the
service logs it); re-embedding in place does not change the store's layout. To get a
fresh store, point retrieval at an empty one and run ``engram rebuild``.

Run it while the write path is quiet: a memory edited or deleted in the moment between
its page's ``List`` and ``Upsert`` would be written back as it was listed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engram_cli.cli_common import (
    CliSettings,
    CommandError,
    add_data_dir_flag,
    add_retrieval_flag,
    cli_settings,
)
from engram_cli.console import ProgressCallback
from engram_core.memory import MemoryFilter
from engram_core.memory_port import MemoryPort, RetrievalError
from engram_core.mirror_format import (
    MirrorFormatError,
    classify,
    decode_component,
    memory_files,
    parse,
)
from engram_core.retrieval_client import RetrievalClient

#: List pages are at most 500; Upsert takes up to 2048.
PAGE = 500


@dataclass
class ReembedResult:
    tenant: str
    total: int = 0
    statuses: Counter[str] = field(default_factory=Counter)

    @property
    def reembedded(self) -> int:
        return self.statuses["updated"]

    @property
    def unchanged(self) -> int:
        return self.statuses["unchanged"]


def mirror_tenants(settings: CliSettings) -> list[str]:
    """The tenants the mirror knows (one directory each, whatever its layout below);
    retrieval has no tenant list. A shortened (unreadable) directory name is read from
    the front matter of a file in it."""
    root = settings.mirror
    if not root.is_dir():
        raise CommandError(f"--all-tenants reads the tenants from the mirror; none at {root}")
    tenants = []
    for child in sorted(root.iterdir()):
        if child.is_dir() and not child.name.startswith("."):
            name = decode_component(child.name) or _tenant_in_files(root, child.name)
            if name:
                tenants.append(name)
    return tenants


def _tenant_in_files(root: Path, tenant_dir: str) -> str | None:
    for rel in memory_files(root, tenant_dir):
        try:
            return parse((root / rel).read_text(encoding="utf-8"), classify(rel)).tenant
        except (MirrorFormatError, UnicodeDecodeError, OSError):
            continue
    return None


async def reembed_tenant(
    memories: MemoryPort,
    tenant: str,
    *,
    page_size: int = PAGE,
    on_progress: Callable[[int, int], None] | None = None,
) -> ReembedResult:
    result = ReembedResult(tenant)
    flt = MemoryFilter(include_superseded=True)
    result.total = (await memories.count(tenant, flt)).total
    done = 0
    if on_progress:
        on_progress(0, result.total)
    async for page in memories.iter_pages(tenant, flt, page_size=page_size):
        # Written back as listed; the service sets updated_at and re-embeds what its
        # current model did not embed.
        for stored in await memories.upsert(tenant, page.records):
            result.statuses[stored.status.value] += 1
        done += len(page.records)
        if on_progress:
            on_progress(done, max(done, result.total))
    # (Memories written while this ran were embedded by the current model already.)
    return result


async def reembed(
    settings: CliSettings,
    tenants: list[str],
    *,
    page_size: int = PAGE,
    show_progress: bool = True,
) -> list[ReembedResult]:
    client = RetrievalClient(settings.retrieval_address, timeout_s=60.0)
    memories = MemoryPort(client)
    results = []
    try:
        if not await client.is_serving(timeout_s=5.0):
            raise CommandError(f"retrieval at {settings.retrieval_address} is not serving")
        for tenant in tenants:
            try:
                with ProgressCallback(f"reembed {tenant}") as bar:
                    results.append(
                        await reembed_tenant(
                            memories,
                            tenant,
                            page_size=page_size,
                            on_progress=bar if show_progress else None,
                        )
                    )
            except RetrievalError as exc:
                raise CommandError(f"tenant {tenant!r}: {exc} (re-run to finish)") from None
    finally:
        await client.close()
    return results


def add_reembed_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    parser = commands.add_parser(
        "reembed",
        help="re-embed every memory with the current model, in place, staying searchable",
        description=(
            "List every memory of a tenant and upsert it back unchanged; retrieval re-embeds "
            "the ones its current model did not embed and keeps their old vectors until then. "
            "For a fresh store use `engram rebuild` against an empty one."
        ),
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--tenant", action="append", help="a tenant (repeatable; default: default)")
    which.add_argument(
        "--all-tenants", action="store_true", help="every tenant with a directory in the mirror"
    )
    parser.add_argument("--page-size", type=int, default=PAGE, help=f"1..{PAGE}")
    parser.add_argument("--mirror-root", help="default: $ENGRAM_MIRROR_ROOT or <data_dir>/mirror")
    add_data_dir_flag(parser)
    add_retrieval_flag(parser)
    parser.set_defaults(func=handler)


def reembed_command(args: argparse.Namespace) -> int:
    settings = cli_settings(args)
    try:
        if not 1 <= args.page_size <= PAGE:
            raise CommandError(f"--page-size must be in 1..{PAGE}")
        tenants = mirror_tenants(settings) if args.all_tenants else (args.tenant or ["default"])
        results = asyncio.run(reembed(settings, tenants, page_size=args.page_size))
    except CommandError as exc:
        print(f"engram reembed: {exc}", file=sys.stderr)
        return 2
    for r in results:
        line = (
            f"tenant {r.tenant!r}: {sum(r.statuses.values())} memories, "
            f"re-embedded {r.reembedded}, unchanged {r.unchanged}"
        )
        if r.statuses["created"]:  # deleted between List and Upsert: see docs/cli.md
            line += f", re-created {r.statuses['created']}"
        print(line)
    return 0
