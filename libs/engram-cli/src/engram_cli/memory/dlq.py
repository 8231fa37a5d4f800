"""``engram dlq list | replay | drop``: the dead letters of every worker, for operators.

Talks to NATS directly (``ENGRAM_NATS_URL`` or ``--nats``), across tenants; the
gateway's ``GET /v1/admin/dead-letters`` is the per-tenant, read-only view. Filters:
``--worker``, ``--subject`` (the original subject), ``--reason`` (substring),
``--older-than`` / ``--newer-than`` (``90s``, ``15m``, ``2h``, ``3d``), ``--tenant``,
``--id`` (repeatable). ``replay`` re-publishes each original message with its original
event id and deletes the letter (idempotent: see :mod:`engram_core.dead_letters`);
``drop`` deletes letters and needs a filter, an id or ``--all``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TextIO

import nats.errors
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from engram_cli.cli_common import CommandError, add_nats_flag, cli_settings
from engram_core.dead_letters import (
    DeadLetterFilter,
    ReplayOutcome,
    StoredDeadLetter,
    drop_dead_letter,
    get_dead_letter,
    list_dead_letters,
    replay_dead_letter,
)
from engram_core.events import utcnow
from engram_core.nats_admin import admin_connection
from engram_core.settings import parse_nats_urls

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """``90``, ``90s``, ``15m``, ``2h``, ``3d``."""
    match = _DURATION.match(text.lower())
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration such as 90s, 15m, 2h, 3d")
    return timedelta(seconds=float(match.group(1)) * _UNIT_S[match.group(2)])


def add_dlq_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    parser = commands.add_parser(
        "dlq",
        help="list, replay or drop the workers' dead letters",
        description="Dead letters on the ENGRAM stream (engram.dlq.<worker>), every tenant.",
    )
    actions = parser.add_subparsers(dest="dlq_action", required=True, metavar="ACTION")
    for name, text in (
        ("list", "show dead letters (oldest first)"),
        ("replay", "re-publish the original messages to their workers, then delete the letters"),
        ("drop", "delete dead letters for good"),
    ):
        action = actions.add_parser(name, help=text, description=text)
        _add_filters(action)
        if name == "list":
            action.add_argument("--json", action="store_true", help="one JSON object per line")
            action.add_argument("--limit", type=int, help="show at most this many")
        else:
            action.add_argument(
                "--dry-run", action="store_true", help="show what would be done, do nothing"
            )
        if name == "drop":
            action.add_argument("--all", action="store_true", help="drop every dead letter")
        action.set_defaults(func=handler)


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--worker", help="only this worker's letters (ingest, reconcile, ...)")
    parser.add_argument(
        "--subject",
        help="only letters of messages on this subject, or of this event "
        "(engram.memory.changed.v1: every memory change)",
    )
    parser.add_argument("--reason", help="only letters whose reason contains this (any case)")
    parser.add_argument("--older-than", type=parse_duration, metavar="AGE")
    parser.add_argument("--newer-than", type=parse_duration, metavar="AGE")
    parser.add_argument("--tenant", help="only letters of this tenant")
    parser.add_argument(
        "--id", type=int, action="append", dest="ids", metavar="ID", help="a letter id (repeat)"
    )
    add_nats_flag(parser)


def letter_filter(args: argparse.Namespace) -> DeadLetterFilter:
    return DeadLetterFilter(
        worker=args.worker,
        subject=args.subject,
        reason=args.reason,
        older_than=args.older_than,
        newer_than=args.newer_than,
        tenant=args.tenant,
    )


def _has_selector(args: argparse.Namespace) -> bool:
    return bool(args.ids) or letter_filter(args) != DeadLetterFilter()


async def select_letters(nats_url: str, args: argparse.Namespace) -> list[StoredDeadLetter]:
    flt = letter_filter(args)
    async with admin_connection(nats_url) as nc:
        js = nc.jetstream(timeout=10.0)
        if not args.ids:
            return await list_dead_letters(js, flt, limit=getattr(args, "limit", None))
        now = utcnow()
        found = []
        for letter_id in dict.fromkeys(args.ids):
            stored = await get_dead_letter(js, letter_id)
            if stored is None:
                raise CommandError(f"no dead letter {letter_id}")
            if flt.matches(stored, now):
                found.append(stored)
        return found


def letter_json(stored: StoredDeadLetter) -> dict[str, Any]:
    letter = stored.letter
    return {
        "id": stored.id,
        "worker": letter.worker,
        "subject": letter.subject,
        "reason": letter.reason,
        "deliveries": letter.deliveries,
        "failed_at": letter.failed_at.isoformat(),
        "tenant": stored.tenant,
        "conversation_id": stored.conversation_id,
        "event_id": stored.event_id,
    }


def _age(stored: StoredDeadLetter) -> str:
    seconds = int(stored.age(utcnow()).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def print_letters(letters: list[StoredDeadLetter], console: Console) -> None:
    if not letters:
        console.print("no dead letters")
        return
    table = Table(show_lines=False)
    for column in ("id", "worker", "age", "tries", "tenant", "conversation", "reason"):
        table.add_column(column, overflow="fold")
    for stored in letters:
        table.add_row(
            str(stored.id),
            stored.worker,
            _age(stored),
            str(stored.letter.deliveries),
            stored.tenant or "?",
            stored.conversation_id or "",
            stored.letter.reason,
        )
    console.print(table)
    by_worker = Counter(stored.worker for stored in letters)
    console.print(", ".join(f"{worker}: {n}" for worker, n in sorted(by_worker.items())))


async def apply(
    nats_url: str,
    letters: list[StoredDeadLetter],
    action: str,
    console: Console,
    *,
    retry_s: float = 0.0,
) -> Counter[str]:
    """Replay or drop ``letters`` with a progress bar; outcomes by name."""
    outcomes: Counter[str] = Counter()
    columns = (
        TextColumn(f"{action:<6}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    async with admin_connection(nats_url) as nc:
        js = nc.jetstream(timeout=10.0)
        with Progress(*columns, console=console, transient=False) as bar:
            task = bar.add_task(action, total=len(letters))
            for stored in letters:
                if action == "replay":
                    outcome = await replay_dead_letter(js, stored, retry_s=retry_s)
                    outcomes[str(outcome)] += 1
                else:
                    outcomes["dropped" if await drop_dead_letter(js, stored.id) else "gone"] += 1
                bar.advance(task)
    return outcomes


def _summary(outcomes: Counter[str]) -> str:
    labels = {
        ReplayOutcome.REPLAYED.value: "replayed",
        ReplayOutcome.ALREADY_REPLAYED.value: "already replayed (dropped as duplicates)",
        "dropped": "dropped",
        "gone": "already gone",
    }
    return ", ".join(f"{n} {labels.get(name, name)}" for name, n in sorted(outcomes.items()))


def dlq_command(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out if out is not None else sys.stdout
    console = Console(file=err if err is not None else sys.stderr)
    settings = cli_settings(args)  # --nats overrides ENGRAM_NATS_URL
    nats_url = settings.nats_url
    try:
        parse_nats_urls(nats_url)
        if args.dlq_action == "drop" and not (args.all or _has_selector(args)):
            raise CommandError("drop needs a filter, --id or --all")
        letters = asyncio.run(select_letters(nats_url, args))
        if args.dlq_action == "list":
            if args.json:
                for stored in letters:
                    print(json.dumps(letter_json(stored)), file=out)
            else:
                print_letters(letters, Console(file=out, width=200))
            return 0
        if args.dry_run or not letters:
            print_letters(letters, Console(file=out, width=200))
            print(f"would {args.dlq_action} {len(letters)} dead letters", file=out)
            return 0
        outcomes = asyncio.run(
            apply(
                nats_url,
                letters,
                args.dlq_action,
                console,
                retry_s=settings.retry_policy.publish_retry_s,
            )
        )
        print(_summary(outcomes), file=out)
        return 0
    except (CommandError, ValueError) as exc:
        print(f"engram dlq: {exc}", file=sys.stderr)
        return 2
    except (OSError, TimeoutError, nats.errors.Error) as exc:
        print(f"engram dlq: NATS at {nats_url} unreachable ({type(exc).__name__})", file=sys.stderr)
        return 2
