"""Evict worker: keeps each conversation under ``max_entries`` memories.

Consumes the ``created`` changes of the counted kinds (durable consumer ``evict``,
subscribed to ``engram.memory.changed.v1.<kind>.created`` of those kinds only). Every
``created`` turn, fact or episode in a user's conversation triggers a check: retrieval ``Count`` of
the memories subject to eviction — turns, facts (superseded ones included: they still
take space) and episodes. Summaries and profile entries are exempt: not counted, and
their changes trigger no check. Above the limit, the excess is removed in this order,
oldest first within each class:

1. raw turns;
2. superseded facts;
3. episodes, except the newest one (it anchors episode numbering, see summarize);
4. current facts.

Which kinds count and this order are the rows' ``eviction`` in :mod:`engram_core.kinds`.

Each victim is announced with ``MemoryChanged(op="evicted", memory=<state before
removal>, cause="evict")`` *before* it is deleted, with an event id derived from the
memory, so a crash between the two re-selects the same victims, re-publishes the same
(de-duplicated) events and deletes them then: the mirror never misses a tombstone.
The whole check holds a lock on the user's conversation, so two replicas never evict for the
same conversation at once (no double eviction, no count that is stale by the time the
deletes land). The lock is taken only when a first count, without it, finds the
conversation over its limit.

A fetched batch is checked once per conversation (:func:`evict_batch`), at its last
change in the batch: the changes before it are counted by that one check.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import UTC, datetime

from pydantic import Field

from engram_core import lifecycle
from engram_core.events import MemoryChanged, MemoryChangeOp
from engram_core.kinds import KINDS, Eviction, kind_names, kind_policy
from engram_core.logging import get_logger
from engram_core.memory import MemoryFilter, MemoryKindName, MemoryRecord
from engram_core.memory_port import MemoryPort
from engram_core.worker_catalog import worker_entry
from engram_workers.locks import KeyLocks, LockSettingsMixin, LockTimeout
from engram_workers.runtime import (
    BatchItem,
    Delivery,
    Outcome,
    RetryableError,
    Worker,
    WorkerSettings,
    WorkerSpec,
    run_worker,
)

log = get_logger(__name__)

#: The kinds that count towards ``max_entries`` (summary and profile are exempt).
COUNTED_KINDS: tuple[MemoryKindName, ...] = kind_names(lambda k: k.eviction is not None)


class EvictSettings(WorkerSettings, LockSettingsMixin):
    health_port: int = Field(
        default=worker_entry("evict").health_port,
        ge=0,
        le=65535,
        description="Port of /healthz and /readyz; 0 disables.",
    )
    max_entries: int = Field(
        default=500,
        ge=1,
        le=1_000_000,
        description="Most turns + facts (superseded included) + episodes one user's "
        "conversation keeps.",
    )


EvictDelivery = Delivery[EvictSettings, KeyLocks]
EvictItem = BatchItem[MemoryChanged, EvictSettings, KeyLocks]


@asynccontextmanager
async def open_resources(
    worker: Worker[MemoryChanged, EvictSettings, KeyLocks],
) -> AsyncIterator[KeyLocks]:
    settings = worker.settings
    async with KeyLocks.from_settings(settings, settings.nats_url) as locks:
        yield locks


_EPOCH = datetime.min.replace(tzinfo=UTC)


def _age_key(memory: MemoryRecord) -> tuple[datetime, int, str]:
    return (memory.created_at or _EPOCH, memory.turn_index, memory.id)


def _eviction(kind: str) -> Eviction | None:
    return kind_policy(kind).eviction


def _rank(memory: MemoryRecord) -> int:
    eviction = _eviction(memory.kind)
    assert eviction is not None, "only evictable kinds are ranked"
    return eviction.rank_of(bool(memory.superseded_by))


def eviction_order(by_kind: Mapping[str, Sequence[MemoryRecord]]) -> list[MemoryRecord]:
    """Every evictable memory of ``by_kind`` (kind -> its memories), first to go first:
    by the kind's eviction rank, oldest first within a rank (pure; the rules in one
    place). Kinds exempt from eviction are left out."""
    ranked: list[MemoryRecord] = []
    for kind, records in by_kind.items():
        eviction = _eviction(kind)
        if eviction is None:
            continue
        oldest_first = sorted(records, key=_age_key)
        # The newest episode stays: summarize numbers the next window after it.
        ranked += oldest_first[:-1] if eviction.keep_newest else oldest_first
    return sorted(ranked, key=lambda m: (_rank(m), *_age_key(m)))


#: Evictable kinds in the order they are listed: by the first rank they evict at.
_LISTING_ORDER: list[tuple[MemoryKindName, Eviction]] = sorted(
    ((k.name, k.eviction) for k in KINDS if k.eviction is not None),
    key=lambda pair: pair[1].first_rank,
)


async def choose_victims(
    memories: MemoryPort, tenant: str, scope: MemoryFilter, excess: int, by_kind: dict[str, int]
) -> list[MemoryRecord]:
    """The ``excess`` memories to evict. Lists a kind only when the memories listed
    before it, at ranks below any it evicts at, cannot cover the excess (turns usually
    can)."""
    pending = [(kind, eviction) for kind, eviction in _LISTING_ORDER if by_kind.get(kind)]
    listed: dict[str, list[MemoryRecord]] = {}
    for position, (kind, _) in enumerate(pending):
        listed[kind] = await memories.list_all(tenant, replace(scope, kinds=(kind,)))
        # what is still unlisted goes at these ranks or later
        later = min((e.first_rank for _, e in pending[position + 1 :]), default=None)
        settled = [m for m in eviction_order(listed) if later is None or _rank(m) < later]
        if len(settled) >= excess:
            return settled[:excess]
    return eviction_order(listed)[:excess]


def evicted_event(tenant: str, memory: MemoryRecord) -> MemoryChanged:
    # The memory's stored state (its last write included) is part of the id: a memory
    # re-created after its eviction is announced again when it is evicted again.
    return lifecycle.change(tenant, memory, "evicted", cause="evict")


def _counted_scope(event: MemoryChanged) -> MemoryFilter:
    return MemoryFilter(
        user_id=event.user_id,
        conversation_id=event.conversation_id,
        kinds=COUNTED_KINDS,
        include_superseded=True,
    )


def _triggers_check(event: MemoryChanged) -> bool:
    return triggers_check(event.memory.kind, event.op)


def triggers_check(kind: str, op: MemoryChangeOp) -> bool:
    """Only a new memory of a counted kind can take a conversation over its limit (the
    consumer is subscribed to those changes only)."""
    return op == "created" and _eviction(kind) is not None


async def evict_batch(items: Sequence[EvictItem]) -> list[Outcome]:
    """The batch hook: one check per conversation, at its last change in the batch. A
    change is published after its memory is stored, so that check counts every memory
    the batch announced; its outcome is the outcome of each change of the conversation
    (a failed check retries them all, and checking again is harmless)."""
    last: dict[tuple[str, str, str], EvictItem] = {}
    for item in items:
        if _triggers_check(item.event):
            last[item.conversation] = item
    checks = list(last.values())
    worker = items[0].delivery.worker
    results = await worker.each(checks, lambda item: evict(item.event, item.delivery))
    outcomes = {item.conversation: result for item, result in zip(checks, results, strict=True)}
    return [outcomes[item.conversation] if _triggers_check(item.event) else None for item in items]


async def evict(event: MemoryChanged, delivery: EvictDelivery) -> None:
    if not _triggers_check(event):
        return
    settings = delivery.settings
    # Counted first without the lock: most changes leave the conversation under its
    # limit, and the lock costs three JetStream round trips. A change is published after
    # its memory is stored, so the count of the last change always sees every memory.
    counted = await delivery.memories.count(event.tenant, _counted_scope(event))
    if counted.total <= settings.max_entries:
        return
    locks = delivery.resources
    try:
        async with locks.hold("evict", event.tenant, event.user_id, event.conversation_id):
            await _enforce_limit(delivery, event, settings.max_entries)
    except LockTimeout as exc:
        raise RetryableError(f"evict lock: {exc}") from exc


async def _enforce_limit(delivery: EvictDelivery, event: MemoryChanged, max_entries: int) -> None:
    tenant, memories = event.tenant, delivery.memories
    scope = _counted_scope(event)
    counted = await memories.count(tenant, scope)
    excess = counted.total - max_entries
    if excess <= 0:
        return
    victims = await choose_victims(memories, tenant, scope, excess, counted.by_kind)
    for victim in victims:
        await delivery.worker.publish(evicted_event(tenant, victim))
    deleted = await memories.delete(tenant, [v.id for v in victims])
    kinds: dict[str, int] = {}
    for victim in victims:
        name = f"superseded {victim.kind}" if victim.superseded_by else victim.kind
        kinds[name] = kinds.get(name, 0) + 1
    log.info(
        "conversation.evicted",
        counted=counted.total,
        max_entries=max_entries,
        evicted=len(victims),
        deleted=len(deleted),
        kinds=kinds,
    )


EVICT = WorkerSpec(
    name="evict",
    event=MemoryChanged,
    handle=evict,
    handle_batch=evict_batch,
    resources=open_resources,
    subjects=MemoryChanged.subjects_where(triggers_check),
)


def main() -> None:
    run_worker(EVICT, EvictSettings)


if __name__ == "__main__":
    main()
