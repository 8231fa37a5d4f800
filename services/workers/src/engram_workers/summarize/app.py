"""Summarize worker: the rolling summary of each user's conversation, and its episodes.

Consumes the memory changes it acts on (durable consumer ``summarize``, subscribed to
their subjects ``engram.memory.changed.v1.<kind>.<op>`` only: :func:`job_for`):

- a **fact** ``created`` → fold the new fact (and any other current fact the summary
  does not include yet) into the rolling summary of the user's conversation, which
  Search attaches to its response;
- a **fact** ``superseded``/``deleted`` → take its sentences out of the summary where the
  summary holds them word for word;
- a **turn** ``created`` → when at least ``episode_turns + 1`` turns are not yet covered
  by an episode, compress the oldest ``episode_turns`` of them into one ``episode``.

Changes this worker caused itself (kinds ``summary`` and ``episode``) are not delivered, except
that an episode deleted or evicted makes it forget the boundary it remembered for that
conversation (:class:`EpisodeBoundaries`). Each job holds a lock on the user's
conversation, so two replicas never fold into the same summary at once (no lost update)
nor build the same window twice. A model that is not
configured, answers junk, or stays unavailable until the last delivery gets the
documented rule-based fallback (:mod:`engram_workers.summarize.core`); a refused
request is a dead letter, replayed once the settings are fixed. Nothing is lost.

A batch (:func:`summarize_batch`) folds the new facts of one conversation together and
checks its episode windows once, at its last turn.

Idempotency: the summary lists the fact ids it includes, an episode's id derives from
its turns, and announcements derive from the stored state (:mod:`engram_core.lifecycle`),
so a redelivery re-publishes the same event ids (de-duplicated by JetStream) and a crash
between the write and the publish loses no event.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import partial

from pydantic import Field

from engram_core import lifecycle
from engram_core.events import MemoryChanged, MemoryChangeOp
from engram_core.kinds import kind_names, kind_policy
from engram_core.logging import get_logger
from engram_core.lru import LruCache
from engram_core.memory import MemoryFilter, MemoryKindName, MemoryRecord
from engram_core.memory_writes import Change, apply
from engram_core.worker_catalog import worker_entry
from engram_workers.llm import AskLlm, LlmClient, LlmSettingsMixin
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
from engram_workers.summarize import core

log = get_logger(__name__)

#: Newest episodes read to find the numbering anchor (and re-announce on redelivery).
ANCHOR_PAGE = core.MAX_WINDOWS_PER_EVENT
LIST_PAGE = 100
#: What the rolling summary is made of, and what episodes compress (engram_core.kinds).
FOLDED_KINDS = kind_names(lambda k: k.folded_into_summary)
EPISODE_SOURCE_KINDS = kind_names(lambda k: k.compressed_into_episodes)


class SummarizeSettings(WorkerSettings, LlmSettingsMixin, LockSettingsMixin):
    health_port: int = Field(
        default=worker_entry("summarize").health_port,
        ge=0,
        le=65535,
        description="Port of /healthz and /readyz; 0 disables.",
    )
    summarize_model: str = Field(
        default="",
        description="Model for summaries and episodes (default: ENGRAM_LLM_MODEL, then the "
        "chat model recorded on the source turns).",
    )
    episode_turns: int = Field(
        default=20, ge=2, le=500, description="Turns per episode (the window size N)."
    )
    summary_max_chars: int = Field(
        default=2000, ge=200, le=20000, description="Upper bound of the rolling summary."
    )
    episode_max_chars: int = Field(
        default=1500, ge=200, le=20000, description="Upper bound of one episode's text."
    )


ConversationKey = tuple[str, str, str]  # tenant, user, conversation


class EpisodeBoundaries:
    """Each conversation's episode boundary (the newest episode's ``created_at``; None:
    no episode yet), remembered between turns for the check each turn makes without
    the lock, so a turn costs one ``Count`` and no ``List``.

    A remembered boundary is never newer than the stored one, except after the newest
    episode was deleted (by a person: evict never takes it). An older one is harmless:
    another replica's episode only makes the count higher, and the lock path reads
    afresh. So an entry is dropped when this replica builds an episode or sees one
    deleted, and lives ``ttl_s`` at most (the deletion another replica saw)."""

    def __init__(
        self,
        *,
        size: int = 10_000,
        ttl_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.size = size
        self.ttl_s = ttl_s
        self.clock = clock
        self._entries: LruCache[ConversationKey, tuple[float, datetime | None]] = LruCache(size)

    def get(self, key: ConversationKey) -> tuple[bool, datetime | None]:
        """(whether one is remembered, the boundary)."""
        entry = self._entries.get(key)
        if entry is None:
            return False, None
        stored_at, boundary = entry
        if self.clock() - stored_at > self.ttl_s:
            self._entries.pop(key)
            return False, None
        return True, boundary

    def put(self, key: ConversationKey, boundary: datetime | None) -> None:
        self._entries.put(key, (self.clock(), boundary))

    def drop(self, key: ConversationKey) -> None:
        self._entries.pop(key)


@dataclass
class SummarizeResources:
    llm: LlmClient
    locks: KeyLocks
    boundaries: EpisodeBoundaries = field(default_factory=EpisodeBoundaries)


SummarizeDelivery = Delivery[SummarizeSettings, SummarizeResources]


@asynccontextmanager
async def open_resources(
    worker: Worker[MemoryChanged, SummarizeSettings, SummarizeResources],
) -> AsyncIterator[SummarizeResources]:
    settings = worker.settings
    llm = LlmClient(settings)
    try:
        async with KeyLocks.from_settings(settings, settings.nats_url) as locks:
            yield SummarizeResources(llm=llm, locks=locks)
    finally:
        await llm.close()


# --- the handler -------------------------------------------------------------------------


SummarizeJob = Callable[[MemoryChanged, "SummarizeDelivery"], Awaitable[None]]


def job_for(kind: str, op: MemoryChangeOp) -> SummarizeJob | None:
    """What a change of this kind and op asks of the worker; None: nothing (and its
    consumer is not subscribed to it). Summaries and episodes are our own writes coming
    back; profile entries are recalled on their own and do not feed the summary."""
    policy = kind_policy(kind)
    if policy.folded_into_summary and op == "created":
        return fold_facts
    if policy.folded_into_summary and op in ("superseded", "deleted"):
        return drop_superseded
    if policy.compressed_into_episodes and op == "created":
        return update_episodes
    if kind == "episode" and op in ("deleted", "evicted"):
        return forget_boundary
    return None


async def summarize(event: MemoryChanged, delivery: SummarizeDelivery) -> None:
    job = job_for(event.memory.kind, event.op)
    if job is not None:
        await job(event, delivery)


async def forget_boundary(event: MemoryChanged, delivery: SummarizeDelivery) -> None:
    delivery.resources.boundaries.drop(_conversation(event))


def _conversation(event: MemoryChanged) -> ConversationKey:
    return (event.tenant, event.user_id, event.conversation_id)


@asynccontextmanager
async def _conversation_lock(
    delivery: SummarizeDelivery, job: str, event: MemoryChanged
) -> AsyncIterator[None]:
    resources = delivery.resources
    key = ("summarize", job, event.tenant, event.user_id, event.conversation_id)
    try:
        async with resources.locks.hold(*key):
            yield
    except LockTimeout as exc:
        raise RetryableError(f"{job} lock: {exc}") from exc


def _ask(delivery: SummarizeDelivery, chat_models: Sequence[str]) -> AskLlm:
    return AskLlm(
        delivery.resources.llm,
        task_model=delivery.settings.summarize_model,
        chat_models=chat_models,
        last_chance=delivery.last_chance,
    )


async def _write(
    delivery: SummarizeDelivery, tenant: str, record: MemoryRecord, cause: str
) -> None:
    (announcement,) = await apply(delivery.memories, tenant, [Change(record, "created", cause)])
    await delivery.worker.publish(announcement)


# --- the rolling summary -------------------------------------------------------------------


def _scope(event: MemoryChanged, *kinds: MemoryKindName, current_only: bool = True) -> MemoryFilter:
    return MemoryFilter(
        user_id=event.user_id,
        conversation_id=event.conversation_id,
        kinds=kinds,
        include_superseded=not current_only,
    )


async def fold_facts(event: MemoryChanged, delivery: SummarizeDelivery) -> None:
    await fold_facts_of(event, delivery, [event.memory.id])


async def fold_facts_of(
    event: MemoryChanged, delivery: SummarizeDelivery, fact_ids: Sequence[str]
) -> None:
    """Fold the facts ``fact_ids`` (created in ``event``'s conversation; ``event`` is the
    last of their changes) and any other current fact the summary lacks, in one model
    call: what one change asks, or the changes of one batch together."""
    settings, memories = delivery.settings, delivery.memories
    tenant = event.tenant
    fact_ids = list(dict.fromkeys(fact_ids))
    summary_id = core.summary_memory_id(tenant, event.user_id, event.conversation_id)
    async with _conversation_lock(delivery, "summary", event):
        found = await memories.get(tenant, [summary_id, *fact_ids])
        previous = found.get(summary_id)
        folded = core.folded_ids(previous)
        if all(fact_id in folded for fact_id in fact_ids):
            log.info("summary.already_folded", fact_ids=fact_ids)
            if delivery.attempt > 1 and previous is not None:
                # The first delivery may have written the summary and died before
                # publishing; the same event id makes this a no-op otherwise.
                op: MemoryChangeOp = (
                    "created" if previous.metadata.get("revision") == "1" else "updated"
                )
                await delivery.worker.publish(
                    lifecycle.change(tenant, previous, op, cause="summarize:summary")
                )
            return
        others = await memories.list_page(
            tenant, _scope(event, *FOLDED_KINDS), page_size=core.FOLD_BATCH
        )
        triggers = [fact for fact_id in fact_ids if (fact := found.get(fact_id)) is not None]
        facts = core.facts_to_fold(None, [*triggers, *others.records], set(folded))
        if not facts:
            log.info(
                "summary.nothing_to_fold", fact_ids=fact_ids, reason="facts gone or superseded"
            )
            return

        previous_text = previous.text if previous is not None else ""
        written = await core.write_summary(
            previous_text,
            [f.text for f in facts],
            _ask(delivery, await _chat_models(delivery, event, facts)),
            settings.summary_max_chars,
        )
        if written.fell_back:
            log.warning("summary.fallback", reason=written.how["fallback_reason"], facts=len(facts))
        summary = core.next_summary(
            tenant,
            event.user_id,
            event.conversation_id,
            previous,
            written.text,
            core.fold_metadata(previous, facts, written.how),
        )
        await _write(delivery, tenant, summary, "summarize:summary")
        log.info(
            "summary.updated",
            memory_id=summary.id,
            revision=summary.metadata["revision"],
            summarizer=written.how["summarizer"],
            cause=event.op,
        )


async def drop_superseded(event: MemoryChanged, delivery: SummarizeDelivery) -> None:
    """Take a superseded (or user-deleted) fact's sentences out of the summary where it
    holds them word for word (the rule-based fallback appends facts verbatim); a
    model-written summary is corrected by the next fold, which sees the new fact. A
    summary left with nothing is deleted (and announced as deleted)."""
    tenant, memories = event.tenant, delivery.memories
    summary_id = core.summary_memory_id(tenant, event.user_id, event.conversation_id)
    async with _conversation_lock(delivery, "summary", event):
        previous = await memories.get_one(tenant, summary_id)
        if previous is None:
            return
        kept = core.without_sentences(previous, event.memory.text)
        if kept is None:
            return
        if not kept:
            await memories.delete(tenant, [summary_id])
            await delivery.worker.publish(
                lifecycle.change(tenant, previous, "deleted", cause="summarize:summary")
            )
            log.info("summary.deleted", memory_id=summary_id, reason="every sentence superseded")
            return
        metadata = {k: v for k, v in previous.metadata.items() if k != "revision"}
        summary = core.next_summary(
            tenant, event.user_id, event.conversation_id, previous, " ".join(kept), metadata
        )
        await _write(delivery, tenant, summary, "summarize:summary")


async def _chat_models(
    delivery: SummarizeDelivery, event: MemoryChanged, facts: Sequence[MemoryRecord]
) -> list[str]:
    """The chat models of the turns the facts came from: the model to use when none is
    configured (ingest records it on each turn, as reconcile does not on facts)."""
    settings = delivery.settings
    recorded = [f.metadata["model"] for f in facts if f.metadata.get("model")]
    if recorded or settings.summarize_model or settings.llm_model:
        return recorded
    turn_ids = lifecycle.source_turn_ids(facts)[: core.FOLD_BATCH]
    if not turn_ids:
        return []
    turns = await delivery.memories.get(event.tenant, turn_ids)
    newest_first = sorted(turns.values(), key=core.age_key, reverse=True)
    return [t.metadata["model"] for t in newest_first if t.metadata.get("model")]


# --- episodes ------------------------------------------------------------------------------


async def update_episodes(event: MemoryChanged, delivery: SummarizeDelivery) -> None:
    # Most turns close no window: found out without the lock (a stale anchor only
    # counts more turns, so it can never hide a window that closes).
    if delivery.attempt == 1 and not await _window_may_close(
        delivery, event, delivery.settings.episode_turns
    ):
        return
    try:
        async with _conversation_lock(delivery, "episodes", event):
            await _build_closed_windows(event, delivery)
    finally:
        # Episodes may have been built: the next turn reads the boundary afresh.
        delivery.resources.boundaries.drop(_conversation(event))


async def _build_closed_windows(event: MemoryChanged, delivery: SummarizeDelivery) -> None:
    """Every window that closed, as an episode (the caller holds the lock)."""
    settings, memories, tenant = delivery.settings, delivery.memories, event.tenant
    recent = await _recent_episodes(delivery, event)
    if delivery.attempt > 1:
        for episode in recent:
            if episode.metadata.get("trigger_event_id") == event.event_id:
                await delivery.worker.publish(
                    lifecycle.change(tenant, episode, "created", cause="summarize:episode")
                )
    anchor = core.anchor_of(recent)
    # Newest first: only the uncovered tail of the conversation is read.
    tail: list[MemoryRecord] = []
    turns_scope = _scope(event, *EPISODE_SOURCE_KINDS, current_only=False)
    async for turn in memories.iter_list(tenant, turns_scope, page_size=LIST_PAGE):
        if anchor.boundary is not None and turn.created_at and turn.created_at < anchor.boundary:
            break
        tail.append(turn)
    turns = core.uncovered(tail, anchor)
    for first, window in core.closed_windows(turns, anchor, settings.episode_turns):
        await _write_episode(delivery, event, window, first)


async def _recent_episodes(delivery: SummarizeDelivery, event: MemoryChanged) -> list[MemoryRecord]:
    page = await delivery.memories.list_page(
        event.tenant, _scope(event, "episode", current_only=False), page_size=ANCHOR_PAGE
    )
    return page.records


async def _window_may_close(delivery: SummarizeDelivery, event: MemoryChanged, size: int) -> bool:
    """Whether more than ``size`` turns may be uncovered: the turns from the newest
    episode's newest covered turn on, counted (an upper bound of the uncovered ones),
    which is far cheaper than reading them."""
    boundaries, key = delivery.resources.boundaries, _conversation(event)
    remembered, boundary = boundaries.get(key)
    if not remembered:
        boundary = core.anchor_of(await _recent_episodes(delivery, event)).boundary
        boundaries.put(key, boundary)
    since = replace(
        _scope(event, *EPISODE_SOURCE_KINDS, current_only=False), created_after=boundary
    )
    counted = await delivery.memories.count(event.tenant, since)
    return counted.total > size


async def _write_episode(
    delivery: SummarizeDelivery, event: MemoryChanged, window: list[MemoryRecord], first: int
) -> None:
    settings = delivery.settings
    last = first + len(window) - 1
    numbered = core.numbered_turns(window, first)
    chat_models = [t.metadata.get("model", "") for t in reversed(window)]
    written = await core.write_episode(
        numbered, _ask(delivery, chat_models), settings.episode_max_chars
    )
    metadata = {"turns": str(len(window)), "trigger_event_id": event.event_id, **written.how}
    if written.fell_back:
        log.warning(
            "episode.fallback",
            reason=written.how["fallback_reason"],
            first_turn=first,
            last_turn=last,
        )
    episode = core.episode_record(
        event.tenant, event.conversation_id, event.user_id, window, first, written.text, metadata
    )
    await _write(delivery, event.tenant, episode, "summarize:episode")
    log.info(
        "episode.created",
        memory_id=episode.id,
        first_turn=first,
        last_turn=last,
        summarizer=metadata["summarizer"],
    )


# --- batches -------------------------------------------------------------------------------


SummarizeItem = BatchItem[MemoryChanged, SummarizeSettings, SummarizeResources]
_GROUPED: tuple[SummarizeJob, ...] = (fold_facts, update_episodes)


async def summarize_batch(items: Sequence[SummarizeItem]) -> list[Outcome]:
    """The batch hook. In a conversation whose changes in the batch are all first
    deliveries of new facts and turns, the facts are folded into its summary together
    (one lock, one read, one model call) and its episode windows are checked once, at
    its last turn (a change is published after its memory is stored, so that check
    counts every turn the batch announced). Each change's outcome is its group's: a
    failed fold retries every fact of it, and folding or checking again is harmless.
    A conversation with anything else in the batch (a removal, a redelivery) runs its
    changes one by one in stream order, as without batches."""
    jobs = [job_for(item.event.memory.kind, item.event.op) for item in items]
    by_conversation: dict[tuple[str, str, str], list[int]] = {}
    for index, (item, job) in enumerate(zip(items, jobs, strict=True)):
        if job is not None:
            by_conversation.setdefault(item.conversation, []).append(index)
    units: list[tuple[SummarizeItem, list[int], Callable[[], Awaitable[None]]]] = []
    for indexes in by_conversation.values():
        grouped = all(jobs[i] in _GROUPED and items[i].delivery.attempt == 1 for i in indexes)
        if not grouped:
            for i in indexes:
                item = items[i]
                units.append((item, [i], partial(summarize, item.event, item.delivery)))
            continue
        facts = [i for i in indexes if jobs[i] is fold_facts]
        turns = [i for i in indexes if jobs[i] is update_episodes]
        if facts:
            last = items[facts[-1]]
            ids = [items[i].event.memory.id for i in facts]
            units.append((last, facts, partial(fold_facts_of, last.event, last.delivery, ids)))
        if turns:
            last = items[turns[-1]]
            units.append((last, turns, partial(update_episodes, last.event, last.delivery)))
    work = {id(item): run for item, _, run in units}
    worker = items[0].delivery.worker
    results = await worker.each([item for item, _, _ in units], lambda item: work[id(item)]())
    outcomes: list[Outcome] = [None] * len(items)
    for (_, indexes, _), result in zip(units, results, strict=True):
        for i in indexes:
            outcomes[i] = result if isinstance(result, Exception) else None
    return outcomes


SUMMARIZE = WorkerSpec(
    name="summarize",
    event=MemoryChanged,
    handle=summarize,
    handle_batch=summarize_batch,
    resources=open_resources,
    subjects=MemoryChanged.subjects_where(lambda kind, op: job_for(kind, op) is not None),
)


def main() -> None:
    run_worker(SUMMARIZE, SummarizeSettings)
