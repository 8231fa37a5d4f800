"""``engram reextract``: learn again from user turns that are already stored.

For turns stored while nothing could be learned from them (no model configured, the
model down for longer than the retries, extraction disabled), or after a better model
was configured: every stored user turn in scope is sent to the ingest worker again as a
``turn.persisted`` event marked ``reextract``. Ingest does not store the turn again (it
is already there, with its id and date) but extracts its facts, and reconcile merges
them with what is known (a fact already stored is not stored twice).

Re-importing would not do it: a re-sent turn is recognised as a repeat and dropped.

Resumable: every turn sent is recorded under ``<data_dir>/reextract/``; an interrupted
run continues where it stopped (``--run`` names a fresh run, which sends every turn
again). Event ids derive from (turn, run), so a turn sent twice in one run is
de-duplicated by JetStream.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from engram_cli.cli_common import (
    CliSettings,
    CommandError,
    DoneLog,
    add_data_dir_flag,
    add_nats_flag,
    add_retrieval_flag,
    cli_settings,
    connect_announcer,
)
from engram_cli.console import ProgressCallback
from engram_cli.memory.reembed import mirror_tenants
from engram_core.bus import publish_event
from engram_core.events import TurnPersisted, deterministic_event_id
from engram_core.memory import MemoryFilter, MemoryRecord
from engram_core.memory_port import MemoryPort, RetrievalError
from engram_core.retrieval_client import RetrievalClient


@dataclass
class ReextractResult:
    tenant: str
    turns: int = 0  # user turns in scope
    sent: int = 0
    skipped: int = 0  # sent by an earlier, interrupted run


def reextract_event(tenant: str, turn: MemoryRecord, run: str, model: str) -> TurnPersisted:
    return TurnPersisted(
        event_id=deterministic_event_id(turn.id, "reextract", run),
        tenant=tenant,
        user_id=turn.user_id,
        conversation_id=turn.conversation_id,
        turn_id=turn.metadata.get("turn_id") or turn.id,
        memory_id=turn.id,
        role="user",
        text=turn.text,
        model=model or turn.metadata.get("model", ""),
        source_id=turn.source_id,
        turn_index=turn.turn_index,
        reextract=True,
        followed=False,  # nobody registered it: the workers skip the status store
        **({"created_at": turn.created_at} if turn.created_at else {}),
    )


async def reextract_tenant(
    settings: CliSettings,
    tenant: str,
    *,
    user: str | None,
    conversation: str | None,
    run: str,
    model: str,
    on_progress: Callable[[int, int], None] | None = None,
) -> ReextractResult:
    result = ReextractResult(tenant)
    client = RetrievalClient(settings.retrieval_address, timeout_s=30.0)
    memories = MemoryPort(client)
    scope = MemoryFilter(user_id=user, conversation_id=conversation, kinds=("turn",), role="user")
    key = hashlib.sha256(f"{tenant}\x1f{user}\x1f{conversation}\x1f{run}".encode()).hexdigest()
    log = DoneLog(
        settings.data_dir / "reextract" / f"{key[:16]}.jsonl",
        {"engram_reextract": 1, "tenant": tenant, "run": run},
    )
    broker = None
    try:
        if not await client.is_serving(timeout_s=5.0):
            raise CommandError(f"retrieval at {settings.retrieval_address} is not serving")
        turns = await memories.list_all(tenant, scope)
        result.turns = len(turns)
        todo = [t for t in turns if t.id not in log.done and t.text.strip()]
        result.skipped = result.turns - len(todo)
        if not todo:
            return result
        policy = settings.retry_policy
        broker = await connect_announcer(
            settings.nats_url,
            "reextract",
            replicas=settings.stream_replicas,
            duplicate_window_s=policy.duplicate_window_s,
        )
        for turn in reversed(todo):  # oldest first: facts are reconciled in the order said
            await publish_event(
                broker,
                reextract_event(tenant, turn, run, model),
                retry_s=policy.publish_retry_s,
            )
            log.record(turn.id)
            result.sent += 1
            if on_progress:
                on_progress(result.sent, len(todo))
    except RetrievalError as exc:
        raise CommandError(str(exc)) from None
    finally:
        log.close()
        if broker is not None:
            await broker.stop()
        await client.close()
    return result


def add_reextract_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    parser = commands.add_parser(
        "reextract",
        help="learn facts again from stored user turns (after configuring a model)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--tenant", default="default")
    which.add_argument("--all-tenants", action="store_true", help="every tenant the mirror knows")
    parser.add_argument("--user", help="only this user's turns ('' for no user)")
    parser.add_argument("--conversation", help="only this conversation's turns")
    parser.add_argument(
        "--model", default="", help="model for extraction (default: the worker's configuration)"
    )
    parser.add_argument(
        "--run", default="default", help="a name for this run; a new name sends every turn again"
    )
    add_data_dir_flag(parser)
    add_retrieval_flag(parser)
    add_nats_flag(parser)
    parser.set_defaults(func=handler)


def reextract_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    settings = cli_settings(args)
    if not (args.model or settings.llm_model):
        print(
            "engram reextract: note: no --model and no ENGRAM_LLM_MODEL here; the ingest "
            "worker needs a model of its own (ENGRAM_LLM_MODEL or ENGRAM_EXTRACTION_MODEL), "
            "or the turns are skipped again",
            file=sys.stderr,
        )
    try:
        tenants = mirror_tenants(settings) if args.all_tenants else [args.tenant]
        for tenant in tenants:
            with ProgressCallback(f"reextract {tenant}") as bar:
                result = asyncio.run(
                    reextract_tenant(
                        settings,
                        tenant,
                        user=args.user,
                        conversation=args.conversation,
                        run=args.run,
                        model=args.model,
                        on_progress=bar,
                    )
                )
            print(
                f"tenant {tenant!r}: {result.turns} user turns, sent {result.sent} to be "
                f"learned from, {result.skipped} sent before (run {args.run!r})",
                file=out,
            )
    except CommandError as exc:
        print(f"engram reextract: {exc}", file=sys.stderr)
        return 2
    return 0
