"""``engram migrate scopes``: bring a store written before conversations belonged to users
in line with the per-user scopes (docs/architecture.md, "Scopes").

What needs no migration (the read rule): turns, facts and profile entries always carried
their user, and every search and list now filters on the exact user, so they are already
recalled for their user only.

What this command fixes, per tenant, idempotently (a second run changes nothing):

- **Summaries** were one per conversation, whoever spoke in it. Search now attaches only
  the summary with the id of (user, conversation), so an old one is never shown. A
  conversation one user had alone keeps its summary, re-keyed to that user's id; one
  that several users shared gets its mixed summary deleted and each user's current facts
  replayed (``memory.changed``, cause ``migrate``), from which the summarize worker writes
  each user their own.
- **Episodes** covering turns of several users are deleted and the turns of each user of
  that conversation replayed, from which the summarize worker builds per-user episodes.

Every change is announced on ``engram.memory.changed.v1``, so the Markdown mirror follows.
Run it with the stack up (NATS, retrieval and the workers).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TextIO

from faststream.nats import NatsBroker

from engram_cli.cli_common import (
    CliSettings,
    CommandError,
    add_data_dir_flag,
    add_nats_flag,
    add_retrieval_flag,
    cli_settings,
    connect_announcer,
)
from engram_cli.memory.reembed import mirror_tenants
from engram_core import lifecycle
from engram_core.bus import publish_event
from engram_core.events import MemoryChanged
from engram_core.memory import MemoryFilter, MemoryRecord
from engram_core.memory_port import MemoryPort, RetrievalError
from engram_core.memory_writes import Change, apply
from engram_core.retrieval_client import RetrievalClient

CAUSE = "migrate"
#: Turns one replayed turn event lets the summarize worker cover (5 windows of 20).
TURNS_PER_EPISODE_TRIGGER = 100


@dataclass
class MigrationReport:
    tenant: str
    summaries_rekeyed: int = 0
    summaries_rebuilt: int = 0
    episodes_rebuilt: int = 0
    replayed: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.summaries_rekeyed or self.summaries_rebuilt or self.episodes_rebuilt)


class ScopeMigration:
    def __init__(
        self,
        memories: MemoryPort,
        tenant: str,
        announce: Callable[[MemoryChanged], Awaitable[None]],
    ) -> None:
        self.memories = memories
        self.tenant = tenant
        self.announce = announce
        self.report = MigrationReport(tenant)
        self._replayed: set[str] = set()

    async def _publish(self, events: list[MemoryChanged]) -> None:
        for event in events:
            await self.announce(event)

    async def _speakers(self, conversation: str) -> set[str]:
        """Every user with turns or facts in a conversation (of any user)."""
        scope = MemoryFilter(conversation_id=conversation, kinds=("turn", "fact"))
        return {m.user_id async for m in self.memories.iter_list(self.tenant, scope)}

    async def run(self) -> MigrationReport:
        summaries = await self.memories.list_all(
            self.tenant, MemoryFilter(kinds=("summary",), include_superseded=True)
        )
        for summary in summaries:
            await self._summary(summary)
        episodes = await self.memories.list_all(
            self.tenant, MemoryFilter(kinds=("episode",), include_superseded=True)
        )
        for episode in episodes:
            await self._episode(episode)
        return self.report

    async def _summary(self, summary: MemoryRecord) -> None:
        expected = lifecycle.summary_memory_id(
            self.tenant, summary.user_id, summary.conversation_id
        )
        if summary.id == expected:
            return
        speakers = await self._speakers(summary.conversation_id)
        await self._delete(summary)
        if speakers <= {summary.user_id}:
            rekeyed = summary.model_copy(update={"id": expected, "updated_at": None})
            await self._publish(
                await apply(self.memories, self.tenant, [Change(rekeyed, "created", CAUSE)])
            )
            self.report.summaries_rekeyed += 1
            return
        for user in sorted(speakers):
            await self._replay(user, summary.conversation_id, "fact", every=1)
        self.report.summaries_rebuilt += 1

    async def _episode(self, episode: MemoryRecord) -> None:
        turns = await self.memories.get(self.tenant, episode.source_turn_ids)
        users = {t.user_id for t in turns.values()} | {episode.user_id}
        if len(users) <= 1:
            return
        await self._delete(episode)
        for user in sorted(users):
            await self._replay(
                user, episode.conversation_id, "turn", every=TURNS_PER_EPISODE_TRIGGER
            )
        self.report.episodes_rebuilt += 1

    async def _delete(self, memory: MemoryRecord) -> None:
        await self.memories.delete(self.tenant, [memory.id])
        await self._publish([lifecycle.change(self.tenant, memory, "deleted", cause=CAUSE)])

    async def _replay(self, user: str, conversation: str, kind: str, *, every: int) -> None:
        """Announce a user's current memories of one kind again, oldest first (one in
        ``every``, the newest of each group), for the summarize worker to rebuild from."""
        key = f"{user}\x1f{conversation}\x1f{kind}"
        if key in self._replayed:
            return
        self._replayed.add(key)
        scope = MemoryFilter(
            user_id=user,
            conversation_id=conversation,
            kinds=("fact",) if kind == "fact" else ("turn",),
        )
        oldest_first = list(reversed(await self.memories.list_all(self.tenant, scope)))
        groups = math.ceil(len(oldest_first) / every)
        chosen = [oldest_first[min((g + 1) * every, len(oldest_first)) - 1] for g in range(groups)]
        await self._publish(
            [lifecycle.change(self.tenant, m, "created", cause=CAUSE) for m in chosen]
        )
        self.report.replayed += len(chosen)


async def migrate_tenant(settings: CliSettings, tenant: str, broker: NatsBroker) -> MigrationReport:
    client = RetrievalClient(settings.retrieval_address, timeout_s=30.0)
    try:
        if not await client.is_serving(timeout_s=5.0):
            raise CommandError(f"retrieval at {settings.retrieval_address} is not serving")

        async def announce(event: MemoryChanged) -> None:
            await publish_event(broker, event, retry_s=settings.retry_policy.publish_retry_s)

        return await ScopeMigration(MemoryPort(client), tenant, announce).run()
    except RetrievalError as exc:
        raise CommandError(str(exc)) from None
    finally:
        await client.close()


async def migrate(settings: CliSettings, tenants: list[str]) -> list[MigrationReport]:
    broker = await connect_announcer(
        settings.nats_url,
        "migrate scopes",
        replicas=settings.stream_replicas,
        duplicate_window_s=settings.retry_policy.duplicate_window_s,
    )
    try:
        return [await migrate_tenant(settings, tenant, broker) for tenant in tenants]
    finally:
        await broker.stop()


def add_migrate_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    parser = commands.add_parser(
        "migrate",
        help="bring a store written by an earlier version in line (scopes: per-user summaries)",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    parser.add_argument("what", choices=("scopes",), help="scopes: per-user conversations")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--tenant", default="default")
    which.add_argument("--all-tenants", action="store_true", help="every tenant the mirror knows")
    add_data_dir_flag(parser)
    add_retrieval_flag(parser)
    add_nats_flag(parser)
    parser.set_defaults(func=handler)


def migrate_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    settings = cli_settings(args)
    try:
        tenants = mirror_tenants(settings) if args.all_tenants else [args.tenant]
        reports = asyncio.run(migrate(settings, tenants))
    except CommandError as exc:
        print(f"engram migrate: {exc}", file=sys.stderr)
        return 2
    for report in reports:
        if not report.changed:
            print(f"tenant {report.tenant!r}: nothing to migrate", file=out)
            continue
        print(
            f"tenant {report.tenant!r}: summaries re-keyed {report.summaries_rekeyed}, "
            f"rebuilt {report.summaries_rebuilt}; episodes rebuilt {report.episodes_rebuilt}; "
            f"{report.replayed} memories replayed for the summarize worker",
            file=out,
        )
    return 0
