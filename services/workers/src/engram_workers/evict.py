"""Evict worker: keeps each conversation under ``max_entries`` memories.

Consumes ``engram.memory.changed.v1`` (durable consumer ``evict``). Every ``created``
change in a conversation triggers a check: retrieval ``Count`` of the memories subject
to eviction — turns, facts (superseded ones included: they still take space) and
episodes. Summaries and profile entries are exempt and not counted. Above the limit,
the excess is removed in this order, oldest first within each class:

1. raw turns;
2. superseded facts;
3. episodes, except the newest one (it anchors episode numbering, see summarize);
4. current facts.

Each victim is announced with ``MemoryChanged(op="evicted", memory=<state before
removal>, cause="evict")`` *before* it is deleted, with an event id derived from the
memory, so a crash between the two re-selects the same victims, re-publishes the same
(de-duplicated) events and deletes them then: the mirror never misses a tombstone.
The whole check holds a per-conversation lock, so two replicas never evict for the
same conversation at once (no double eviction, no count that is stale by the time the
deletes land).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import grpc
from pydantic import Field

from engram_core.events import MemoryChanged, deterministic_event_id
from engram_core.logging import get_logger
from engram_core.memory_record import record_from_pb
from engram_core.proto import kind_name, pb
from engram_workers.locks import KeyLocks, LockSettingsMixin, LockTimeout
from engram_workers.runtime import (
    Delivery,
    RetryableError,
    Worker,
    WorkerSettings,
    WorkerSpec,
    rpc_failure,
    run_worker,
)

log = get_logger(__name__)

T = TypeVar("T")

#: The kinds that count towards ``max_entries`` (summary and profile are exempt).
COUNTED_KINDS = (pb.MEMORY_KIND_TURN, pb.MEMORY_KIND_FACT, pb.MEMORY_KIND_EPISODE)
LIST_PAGE = 500  # the service's cap
DELETE_BATCH = 1000  # the service's cap


class EvictSettings(WorkerSettings, LockSettingsMixin):
    health_port: int = Field(
        default=8204, ge=0, le=65535, description="Port of /healthz and /readyz; 0 disables."
    )
    max_entries: int = Field(
        default=500,
        ge=1,
        le=1_000_000,
        description="Most turns + facts (superseded included) + episodes one conversation keeps.",
    )


@asynccontextmanager
async def open_resources(worker: Worker[Any]) -> AsyncIterator[KeyLocks]:
    settings: EvictSettings = worker.settings  # type: ignore[assignment]
    async with KeyLocks.from_settings(settings, settings.nats_url) as locks:
        yield locks


async def _rpc(call: str, awaitable: Awaitable[T]) -> T:
    try:
        return await awaitable
    except grpc.aio.AioRpcError as exc:
        raise rpc_failure(f"retrieval {call}", exc) from exc


def _age_key(memory: pb.Memory) -> tuple[int, int, int, str]:
    return (memory.created_at.seconds, memory.created_at.nanos, memory.turn_index, memory.id)


def eviction_order(
    turns: Sequence[pb.Memory], facts: Sequence[pb.Memory], episodes: Sequence[pb.Memory]
) -> list[pb.Memory]:
    """Every evictable memory, first to go first (pure; the rules in one place)."""
    oldest_first = sorted(turns, key=_age_key)
    facts = sorted(facts, key=_age_key)
    oldest_first += [f for f in facts if f.superseded_by]
    # The newest episode stays: summarize numbers the next window after it.
    oldest_first += sorted(episodes, key=_age_key)[:-1]
    oldest_first += [f for f in facts if not f.superseded_by]
    return oldest_first


async def _list_all(
    delivery: Delivery, tenant: str, conversation: str, kind: int
) -> list[pb.Memory]:
    memories: list[pb.Memory] = []
    token = ""
    while True:
        page = await _rpc(
            "List",
            delivery.retrieval.list(
                pb.ListRequest(
                    tenant=tenant,
                    filter=pb.MemoryFilter(
                        conversation_id=conversation, kinds=[kind], include_superseded=True
                    ),
                    page_size=LIST_PAGE,
                    page_token=token,
                )
            ),
        )
        memories.extend(page.memories)
        token = page.next_page_token
        if not token:
            return memories


async def choose_victims(
    delivery: Delivery, tenant: str, conversation: str, excess: int, by_kind: dict[str, int]
) -> list[pb.Memory]:
    """The ``excess`` memories to evict. Lists a class only when the ones before it
    cannot cover the excess (turns usually can)."""

    async def listed(kind: int, name: str) -> list[pb.Memory]:
        if not by_kind.get(name):
            return []
        return await _list_all(delivery, tenant, conversation, kind)

    turns = await listed(pb.MEMORY_KIND_TURN, "turn")
    if len(turns) >= excess:
        return eviction_order(turns, [], [])[:excess]
    facts = await listed(pb.MEMORY_KIND_FACT, "fact")
    episodes = await listed(pb.MEMORY_KIND_EPISODE, "episode")
    return eviction_order(turns, facts, episodes)[:excess]


def evicted_event(event: MemoryChanged, memory: pb.Memory) -> MemoryChanged:
    # The memory's last write is part of the id: a memory re-created after its eviction
    # (a re-sent turn) is announced again when it is evicted again.
    version = f"{memory.updated_at.seconds}.{memory.updated_at.nanos}"
    return MemoryChanged(
        event_id=deterministic_event_id("evict", event.tenant, memory.id, version),
        tenant=event.tenant,
        user_id=memory.user_id,
        conversation_id=event.conversation_id,
        op="evicted",
        memory=record_from_pb(memory),
        cause="evict",
    )


async def evict(event: MemoryChanged, delivery: Delivery) -> None:
    if event.op != "created":
        return
    settings: EvictSettings = delivery.worker.settings  # type: ignore[assignment]
    locks: KeyLocks = delivery.resources
    tenant, conversation = event.tenant, event.conversation_id
    try:
        async with locks.hold("evict", tenant, conversation):
            await _enforce_limit(delivery, tenant, conversation, settings.max_entries, event)
    except LockTimeout as exc:
        raise RetryableError(f"evict lock: {exc}") from exc


async def _enforce_limit(
    delivery: Delivery, tenant: str, conversation: str, max_entries: int, event: MemoryChanged
) -> None:
    counted = await _rpc(
        "Count",
        delivery.retrieval.count(
            pb.CountRequest(
                tenant=tenant,
                filter=pb.MemoryFilter(
                    conversation_id=conversation, kinds=COUNTED_KINDS, include_superseded=True
                ),
            )
        ),
    )
    excess = counted.count - max_entries
    if excess <= 0:
        return
    victims = await choose_victims(delivery, tenant, conversation, excess, dict(counted.by_kind))
    for victim in victims:
        await delivery.worker.publish(evicted_event(event, victim))
    deleted = 0
    ids = [v.id for v in victims]
    for start in range(0, len(ids), DELETE_BATCH):
        reply = await _rpc(
            "Delete",
            delivery.retrieval.delete(
                pb.DeleteRequest(tenant=tenant, ids=ids[start : start + DELETE_BATCH])
            ),
        )
        deleted += len(reply.deleted_ids)
    kinds: dict[str, int] = {}
    for victim in victims:
        name = "superseded fact" if victim.superseded_by else kind_name(victim.kind)
        kinds[name] = kinds.get(name, 0) + 1
    log.info(
        "conversation.evicted",
        counted=counted.count,
        max_entries=max_entries,
        evicted=len(victims),
        deleted=deleted,
        kinds=kinds,
    )


EVICT = WorkerSpec(name="evict", event=MemoryChanged, handle=evict, resources=open_resources)


def main() -> None:
    run_worker(EVICT, EvictSettings)


if __name__ == "__main__":
    main()
